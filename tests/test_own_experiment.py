"""A user's own question, asked as a new user asks it: an ad-hoc sweep from overrides,
read back whole; a renamed copy of a shipped experiment in the user's own folder, run by
its name; one line and exit status 2 for a mistyped experiment or a folder that is not a
store. Every command runs from a folder outside the repository."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flashnum import store

REPO = Path(__file__).resolve().parents[1]
# small cases: 32 queries, head_dim 16, blocks of 16 keys (late_max needs two)
SMALL = ["shape.seq_len_q=32", "shape.head_dim=16", "tiling.block_n=16", "progress=false",
         "n_jobs=1"]


def flashnum(*args, cwd, timeout=300):
    """python -m flashnum.<args> from `cwd`, with this checkout's flashnum importable."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env)


def test_a_2_by_2_multirun_reads_back_as_4_rows(tmp_path):
    p = flashnum("flashnum.run", "-m", "precision=fp16", "policy=lowp",
                 "shape.seq_len_k=32,64", "distribution=gaussian,late_max", *SMALL,
                 "store.root=S", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    df = store.load("single", root=tmp_path / "S")
    assert len(df) == 4
    assert sorted(zip(df.seq_len_k, df.distribution, strict=True)) == [
        (32, "gaussian"), (32, "late_max"), (64, "gaussian"), (64, "late_max")]
    # the view of the grid last run: the last job's one case
    assert len(store.load("single", root=tmp_path / "S", grid=True)) == 1


@pytest.mark.slow
def test_a_multirun_leaves_no_hydra_folder_in_the_working_folder(tmp_path):
    p = flashnum("flashnum.run", "-m", "precision=fp16,bf16", "name=my_adhoc", *SMALL,
                 cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-2000:]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["experiments"]
    assert sorted(x.name for x in (tmp_path / "experiments").iterdir()) == [
        ".hydra", "my_adhoc"]  # the table by its name, not the shared single
    assert len(store.load("my_adhoc", root=tmp_path / "experiments")) == 2


def your_first_experiment() -> list[tuple[str, str]]:
    """(language, code) of each block of docs/experiments.md's "Your first experiment"."""
    text = (REPO / "docs" / "experiments.md").read_text()
    section = text.split("## Your first experiment", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(bash|python)\n(.*?)```", section, re.S)
    assert [lang for lang, _ in blocks] == ["bash", "python"]
    return blocks


@pytest.mark.slow
def test_your_first_experiment_runs_as_written_from_a_folder_outside_the_repository(
        tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for lang, code in your_first_experiment():
        cmd = ["bash", "-euo", "pipefail", "-c", code] if lang == "bash" else [
            sys.executable, "-c", code]
        p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=600)
        assert p.returncode == 0, p.stderr[-2000:]
    df = store.load("my_sweep", root=tmp_path / "experiments")
    assert len(df) == 72 and sorted(set(df.seq_len_k)) == [32, 64, 128]
    assert set(df.experiment) == {"my_sweep"}
    assert (tmp_path / "my_sweep.png").stat().st_size > 0
    assert sorted(x.name for x in tmp_path.iterdir()) == ["experiments", "my_sweep.png",
                                                          "myconf"]


@pytest.mark.slow
def test_hydra_searchpath_finds_the_users_experiment_as_config_dir_does(tmp_path):
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    body = (REPO / "conf" / "experiment" / "smoke.yaml").read_text()
    (tmp_path / "conf" / "experiment" / "mine.yaml").write_text(body)
    for how in (["--config-dir", "conf"], [f"hydra.searchpath=[file://{tmp_path}/conf]"]):
        p = flashnum("flashnum.run", *how, "experiment=mine", "dry_run=true", cwd=tmp_path)
        assert p.returncode == 0, p.stderr[-2000:]
        assert p.stdout.startswith("mine: 48 cases in the grid")


@pytest.mark.parametrize("typo", ["bwd_ordr", "bf16_swep", "repro_qiu_yoa", "kernel_tabel"])
def test_a_mistyped_experiment_of_any_kind_is_one_line_with_every_valid_name(tmp_path, typo):
    p = flashnum("flashnum.run", f"experiment={typo}", cwd=tmp_path)
    assert p.returncode == 2 and not p.stdout
    line, = p.stderr.splitlines()
    assert line.startswith(f"flashnum.run: error: unknown experiment '{typo}'; valid: ")
    for name in ("bwd_order", "bf16_sweep", "repro_qiu_yao", "kernel_table", "attribution"):
        assert name in line.split("valid: ")[1].split(", ")


COMMANDS = [("flashnum.run", "experiment=smoke"), ("flashnum.run", "experiment=bwd_order"),
            ("flashnum.stored", "check", "smoke"), ("flashnum.figures",),
            ("flashnum.reproduce", "qiu_yao"), ("flashnum.audit", "experiment=kernel_table"),
            ("flashnum.harness.backward", "bwd_order"), ("flashnum.attribute",
                                                         "experiment=true")]


# one command in the fast suite, every command in the slow one (each starts a process)
@pytest.mark.parametrize("command", COMMANDS[:1] + [pytest.param(c, marks=pytest.mark.slow)
                                                    for c in COMMANDS[1:]], ids=" ".join)
def test_a_store_that_is_not_a_store_is_one_line_and_status_2_from_every_command(
        tmp_path, command):
    (tmp_path / "notes.txt").write_text("not a store")
    (tmp_path / "exp" / "parts").mkdir(parents=True)  # one experiment's folder
    for root, why in (("notes.txt", "is a file, not a store"),
                      ("exp", "is one experiment's folder, not a store")):
        p = flashnum(*command, f"store.root={root}", cwd=tmp_path)
        assert p.returncode == 2, (p.stdout[-500:], p.stderr[-1500:])
        line, = p.stderr.splitlines()
        assert why in line


def test_every_stored_table_is_an_experiment_that_flashnum_run_names():
    from flashnum.run import find

    stored = sorted(p.name for p in (REPO / "experiments").iterdir() if p.is_dir())
    assert stored and [n for n in stored if find(n) is None] == []


def test_the_runner_names_every_reproduction_the_registry_holds():
    """REPRODUCTIONS is defined once, by the reproductions' registry; the router reads it."""
    from flashnum import reproduce
    from flashnum.harness import experiments
    from flashnum.run import find, names

    assert not hasattr(experiments, "REPRODUCTIONS")
    for r in reproduce.REPRODUCTIONS:
        assert f"repro_{r}" in names() and find(f"repro_{r}").kind == "reproduction"
