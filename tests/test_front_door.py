"""One front door: `python -m flashnum VERB`, the same exit codes for every verb (0 ok, 1 a
check failed, 2 bad input in one line), and the backward runner taking the common keys."""

import subprocess
import sys

import pytest

from flashnum import __main__ as door
from flashnum import store, verify
from flashnum.harness import backward

VERBS = ["run", "audit", "figures", "stored", "worst-case", "attribute", "verify"]


def _flashnum(*args, cwd=None, timeout=300):
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout)


@pytest.mark.parametrize("argv", [["--help"], ["-h"], []])
def test_help_lists_the_seven_verbs_each_with_one_line(argv, capsys):
    assert door.main(argv) == 0
    out = capsys.readouterr().out
    listed = [ln.split()[0] for ln in out.split("verbs:\n")[1].split("\n\n")[0].splitlines()]
    assert listed == VERBS
    assert all(len(ln) <= 80 for ln in out.splitlines())


def test_the_shell_command_prints_the_same_help():
    p = _flashnum("flashnum", "--help")
    assert p.returncode == 0 and all(f"  {v} " in p.stdout for v in VERBS)


def test_an_unknown_verb_is_bad_input_in_one_line_naming_it_and_the_valid_verbs(capsys):
    assert door.main(["plot"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'plot'" in err
    assert all(v in err for v in VERBS)


def test_each_verb_runs_its_module_entry_point(monkeypatch):
    """The verb's arguments go unchanged to the module's main, and its status comes back."""
    import importlib

    seen = {}
    for verb, (module, _) in door.VERBS.items():
        mod = importlib.import_module(module)
        monkeypatch.setattr(mod, "main", lambda argv, m=module: seen.setdefault(m, argv) and 7)
        assert door.main([verb, "a=1", "b"]) == 7
    assert seen == {m: ["a=1", "b"] for m, _ in door.VERBS.values()}


def _status(argv) -> int:
    try:
        return door.main(argv)
    except SystemExit as e:
        return e.code


@pytest.mark.parametrize("argv", [
    ["run", "colour=red"], ["run", "experiment=nope"], ["audit", "colour=red"],
    ["figures", "colour=red"], ["stored", "bf16_sweep", "colour=red"], ["stored", "nope"],
    ["worst-case", "colour=red"], ["attribute", "colour=red"], ["verify", "nope"],
], ids=" ".join)
def test_bad_input_is_exit_2_and_one_line_naming_it_from_every_verb(argv, capsys):
    assert _status(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert ("colour" if "colour=red" in argv else "nope") in err and "valid: " in err


def test_run_through_the_door_is_python_m_flashnum_run(tmp_path):
    args = ["experiment=smoke", "dry_run=true", f"store.root={tmp_path}"]
    a, b = _flashnum("flashnum", "run", *args), _flashnum("flashnum.run", *args)
    assert a.returncode == b.returncode == 0
    assert a.stdout == b.stdout and "smoke: 48 cases in the grid" in a.stdout


def test_stored_through_the_door_is_python_m_flashnum_stored():
    a, b = _flashnum("flashnum", "stored", "bwd_order"), _flashnum("flashnum.stored", "bwd_order")
    assert a.returncode == b.returncode == 0 and a.stdout == b.stdout


def test_figures_with_a_missing_store_root_exit_2_in_one_line_and_write_nothing(tmp_path):
    out = tmp_path / "figs"
    p = _flashnum("flashnum", "figures", f"store.root={tmp_path / 'nonexistent'}", f"out={out}")
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and "nonexistent" in p.stderr
    assert "Traceback" not in p.stderr and not out.exists()


def test_the_backward_runner_takes_the_common_keys_into_a_tmp_store(tmp_path):
    """progress=false num_shards=16 shard=0 n_jobs store.root compare_with, as the forward
    runner takes them: one shard's cases, its own manifest, identical to the stored rows."""
    p = _flashnum("flashnum", "run", "experiment=bwd_order", "progress=false",
                  "num_shards=16", "shard=0", "n_jobs=1", f"store.root={tmp_path}",
                  "compare_with=experiments")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "identical to the stored results" in p.stdout
    exp = tmp_path / "bwd_order"
    assert (exp / "manifest.shard-0-of-16.json").is_file()
    assert not (exp / store.MANIFEST).exists()  # shards leave their parts uncompacted
    ids = set(store.load(exp)["case_id"])
    cases = backward.expand(backward.load_conf("bwd_order"))
    assert ids == {c["case_id"] for c in cases if int(c["case_id"], 16) % 16 == 0}


def test_a_bad_shard_is_bad_input_in_one_line(tmp_path):
    p = _flashnum("flashnum", "run", "experiment=bwd_order", "num_shards=4", "shard=4",
                  f"store.root={tmp_path}")
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "shard=4" in p.stderr


def test_block_n_is_the_backward_key_block_size_and_block_still_reads():
    """The case keys (and so the stored tables) do not change with the spelling."""
    grid = [{"name": "s", "seq_len": [32], "seed": [0, 1]}]
    new = backward.expand({"base": {"head_dim": 16, "block_n": 8}, "grid": grid})
    old = backward.expand({"base": {"head_dim": 16, "block": 8}, "grid": grid})
    assert [c["case_id"] for c in new] == [c["case_id"] for c in old]
    assert {c["block"] for c in new} == {8}
    with pytest.raises(ValueError, match="block_n and block"):
        backward.expand({"base": {"block_n": 8, "block": 8}, "grid": grid})


def test_verify_names_an_unknown_experiment_and_refuses_to_overwrite_the_compared_store(
        capsys):
    assert verify.main(["nope"]) == 2
    assert "unknown experiment 'nope'" in capsys.readouterr().err
    assert verify.main(["bwd_order", "store.root=experiments"]) == 2
    assert "store.root=experiments is the store compared with" in capsys.readouterr().err


def test_verify_verdicts_follow_the_runs_exit_status():
    assert verify.verdict(0, "") == "identical"
    assert verify.verdict(1, "") == "DIFFERS"
    assert verify.verdict(2, "") == "not run (exit 2)"
    assert verify.verdict(0, "... compared only on its CPU class").startswith("a real kernel")


@pytest.mark.slow
def test_verify_reruns_into_the_scratch_store_and_says_identical(tmp_path):
    p = _flashnum("flashnum", "verify", "bwd_order", "num_shards=16", "shard=0",
                  f"store.root={tmp_path}")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("bwd_order: identical, ")
    assert (tmp_path / "verify.txt").read_text() == p.stdout


def test_every_experiment_conf_says_its_kind_and_the_router_has_one_runner_per_kind():
    import yaml

    from flashnum import run
    from flashnum.harness import experiments
    from flashnum.store.paths import CONF

    for folder, kinds in experiments.FOLDERS.items():
        for path in sorted((CONF / folder).glob("*.yaml")):
            kind = yaml.safe_load(path.read_text()).get("kind")
            assert kind in kinds, path
            assert run.find(path.stem).kind == kind
    assert set(run.RUNNERS) | {"forward"} == {*experiments.YAML_KINDS, "head_stats",
                                              "reproduction", "attribution"}


def test_a_kind_its_folder_does_not_hold_is_one_line(tmp_path):
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "mine.yaml").write_text("experiment: mine\nkind: audit\n")
    p = _flashnum("flashnum.run", "experiment=mine", f"--config-dir={tmp_path}",
                  f"store.root={tmp_path / 's'}")
    assert p.returncode == 2 and p.stderr.count("\n") == 1
    assert "kind 'audit'; valid in experiment/: forward, backward" in p.stderr


def test_a_rerun_that_differs_from_the_compared_store_is_exit_1(tmp_path):
    """1 is a check that failed: here one changed bit of one stored row."""
    df = store.load("experiments/bwd_order")
    mine = {c["case_id"] for c in backward.expand(backward.load_conf("bwd_order"))
            if int(c["case_id"], 16) % 16 == 0}
    i = df.index[df.case_id.isin(mine)][0]
    df.loc[i, "err_dq"] = float(df.loc[i, "err_dq"]) * (1 + 2 ** -52)
    store.replace(tmp_path / "cmp" / "bwd_order", df)
    p = _flashnum("flashnum", "run", "experiment=bwd_order", "num_shards=16", "shard=0",
                  "progress=false", f"store.root={tmp_path / 'now'}",
                  f"compare_with={tmp_path / 'cmp'}")
    assert p.returncode == 1, p.stdout[-2000:] + p.stderr[-2000:]
    assert "err_dq" in p.stdout
