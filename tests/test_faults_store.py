"""The store's files under faults: corrupt, unreadable, read-only, a full disk, lost races.

Each is one line, never a traceback: the file, what is wrong and the command that
repairs it, exit status 2; `python -m flashnum.stored check|repair` find (check: exit
status 1, a check failed) and quarantine unreadable files and never delete a readable
one; a finished read-only store still prints its summary; a full disk at compaction keeps
a store the next run uses.
"""

import errno
import json
import os
import shutil
import subprocess
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from hydra import compose, initialize_config_dir

import flashnum.stored as store_command  # the command line, python -m flashnum.stored
from flashnum import store
from flashnum.harness import run as runmod
from flashnum.reference import clear_cache, reference, reference_cache_dir
from flashnum.store import manifest, owners
from flashnum.store.paths import CONF

REPO = Path(__file__).resolve().parents[1]
SMOKE = ["experiment=smoke", "grid.0.seed=[0]", "progress=false", "n_jobs=1"]


def cfg_of(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides))


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A finished store of 8 cases: results.parquet, no parts."""
    root = tmp_path_factory.mktemp("stored")
    runmod.run(cfg_of(*SMOKE, "max_cases=8", f"store.root={root}"))
    return root / "smoke"


@pytest.fixture
def exp(stored, tmp_path):
    """A fresh copy of the stored experiment, with 4 more cases in two parts."""
    exp = tmp_path / "smoke"
    shutil.copytree(stored, exp)
    df = store.load(exp)
    extra = df.assign(case_id=df.case_id + "x").iloc[:4].to_dict("records")
    store.write_part(exp, extra[:2])
    store.write_part(exp, extra[2:])
    return exp


def command_fails(main, argv, capsys) -> str:
    """main(argv) exits with status 2 and one line on stderr; that line."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    return err


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("which", ["results", "part"])
def test_a_truncated_table_file_is_one_line_naming_it_and_the_repair(exp, which, capsys):
    bad = exp / store.RESULTS if which == "results" else store._part_files(exp)[0]
    truncate(bad)
    for main, argv in ((runmod.main, [*SMOKE, f"store.root={exp.parent}"]),
                       (store_command.main, ["smoke", f"store.root={exp.parent}"])):
        err = command_fails(main, argv, capsys)
        assert str(bad) in err and "is unreadable" in err, err
        assert f"python -m flashnum.stored repair smoke store.root={exp.parent}" in err
    with pytest.raises(store.StoreError, match="repair smoke"):
        store.load(exp)


def test_a_garbage_manifest_is_one_line_naming_it(exp, capsys):
    (exp / store.MANIFEST).write_text("{ not json")
    err = command_fails(runmod.main, [*SMOKE, f"store.root={exp.parent}"], capsys)
    assert f"{exp / store.MANIFEST} is unreadable (JSONDecodeError" in err
    assert "python -m flashnum.stored repair smoke" in err


def test_check_finds_every_unreadable_file_and_repair_quarantines_them_deleting_nothing(
        exp, capsys):
    readable = set(store.load(exp, all_rows=True).case_id)
    lost = set(pd.read_parquet(exp / store.RESULTS).case_id)
    truncate(exp / store.RESULTS)
    (exp / store.MANIFEST).write_text("garbage")
    bad = {exp / store.RESULTS: (exp / store.RESULTS).read_bytes(),
           exp / store.MANIFEST: b"garbage"}
    root = f"store.root={exp.parent}"
    assert store_command.main(["check", "smoke", root]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all("is unreadable" in ln for ln in err)
    assert {ln.split(" is unreadable")[0] for ln in err} == {str(p) for p in bad}

    assert store_command.main(["repair", "smoke", root]) == 0
    out = capsys.readouterr().out
    assert "quarantined results.parquet" in out and "quarantined manifest.json" in out
    assert "16 of the grid's 16 cases have no row" in out
    for path, data in bad.items():  # moved aside byte for byte, not deleted
        assert (exp / store.QUARANTINE / path.name).read_bytes() == data
    assert set(store.load(exp, all_rows=True).case_id) == readable - lost  # the rest kept
    repairs = json.loads((exp / store.MANIFEST).read_text())["repairs"]
    assert {q["file"] for q in repairs[0]["quarantined"]} == {"manifest.json",
                                                              "results.parquet"}
    assert store_command.main(["check", "smoke", root]) == 0
    # the cases lost with the table are computed again by the next run
    out = runmod.run(cfg_of(*SMOKE, "max_cases=8", f"store.root={exp.parent}"))
    assert out["counts"]["run"] == len(lost) == 8


@contextmanager
def read_only(path: Path):
    """`path` made read-only for this process and its children: by permissions, or, for
    root (whom permissions do not bind), by a read-only bind mount of it over itself."""
    if os.geteuid() != 0:
        for p in sorted(path.rglob("*"), reverse=True) + [path]:
            p.chmod(0o555 if p.is_dir() else 0o444)
        try:
            yield
        finally:
            for p in [path, *path.rglob("*")]:
                p.chmod(0o755 if p.is_dir() else 0o644)
        return
    mount = shutil.which("mount")
    ok = mount and subprocess.run([mount, "--bind", str(path), str(path)],
                                  capture_output=True).returncode == 0
    if ok and subprocess.run([mount, "-o", "remount,ro,bind", str(path)],
                             capture_output=True).returncode != 0:
        subprocess.run(["umount", str(path)], capture_output=True)
        ok = False
    if not ok:
        pytest.skip("root is not bound by permissions and may not mount here: no read-only "
                    "store to test")
    try:
        yield
    finally:
        subprocess.run(["umount", str(path)], check=True)


@pytest.mark.slow
def test_a_read_only_finished_store_prints_its_summary(stored, tmp_path):
    ro = tmp_path / "ro"
    shutil.copytree(stored, ro / "smoke")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    before = {p: p.stat().st_mtime_ns for p in ro.rglob("*")}
    with read_only(ro):
        with pytest.raises(OSError):
            (ro / "smoke" / "probe").write_text("")  # it is read-only
        for args in (["flashnum.run", *SMOKE, "max_cases=8"], ["flashnum.stored", "smoke"]):
            p = subprocess.run([sys.executable, "-m", *args, f"store.root={ro}"], cwd=REPO,
                               env=env, capture_output=True, text=True, timeout=240)
            assert p.returncode == 0, p.stderr[-3000:]
            assert "8 rows" in p.stdout or "8 already in" in p.stdout, p.stdout
        # a read-only store with work left: one line, exit status 2
        p = subprocess.run([sys.executable, "-m", "flashnum.run", *SMOKE, "max_cases=9",
                            f"store.root={ro}"], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=240)
        assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr[-3000:]
        assert p.stderr.startswith("flashnum.run: error: cannot write"), p.stderr
    assert {p: p.stat().st_mtime_ns for p in ro.rglob("*")} == before


def full_disk_at(monkeypatch, name: str) -> None:
    """Writes of `name` fail with ENOSPC, as on a full disk (nothing else does)."""
    real = pq.write_table

    def write_table(table, where, *a, **kw):
        if name in str(where):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(where))
        return real(table, where, *a, **kw)

    monkeypatch.setattr(pq, "write_table", write_table)


def test_a_full_disk_at_compaction_keeps_a_store_the_next_run_uses(tmp_path, monkeypatch,
                                                                  capsys):
    full_disk_at(monkeypatch, store.RESULTS)
    out = runmod.run(cfg_of(*SMOKE, "max_cases=6", f"store.root={tmp_path}"))
    err = capsys.readouterr().err
    exp = tmp_path / "smoke"
    assert out["counts"]["run"] == 6 and len(out["table"]) == 6
    (line,) = [ln for ln in err.splitlines() if "no space left" in ln]
    assert line.startswith("flashnum.run: warning: no space left on the device of")
    assert not (exp / store.RESULTS).exists() and len(store.load(exp)) == 6  # rows in parts
    (rec,) = manifest.runs(exp / store.MANIFEST)
    assert rec["end_time"] and rec["counts"]["run"] == 6  # a true record
    assert not list(exp.rglob(".tmp-*")) and not (exp / owners.OLD_LOCK).exists()
    monkeypatch.undo()  # space again: the next run compacts
    out = runmod.run(cfg_of(*SMOKE, "max_cases=8", f"store.root={tmp_path}"))
    assert out["counts"]["run"] == 2
    assert pq.read_metadata(exp / store.RESULTS).num_rows == 8
    assert not store._part_files(exp)


def test_a_full_disk_at_a_part_stops_the_run_with_one_line_and_a_true_record(
        tmp_path, monkeypatch, capsys):
    calls = {"n": 0}
    real = store._write_table

    def third_part_fails(df, path, *a):
        if path.name.startswith("part-"):
            calls["n"] += 1
            if calls["n"] == 3:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(df, path, *a)

    monkeypatch.setattr(store, "_write_table", third_part_fails)
    err = command_fails(runmod.main, [*SMOKE, f"store.root={tmp_path}"], capsys)
    assert "no space left on the device" in err and "run the same command to resume" in err
    exp = tmp_path / "smoke"
    (rec,) = manifest.runs(exp / store.MANIFEST)
    assert rec["counts"]["run"] == len(store.load(exp)) > 0 and rec["reconciled"]


def test_a_dead_runs_open_record_is_reconciled_by_the_next_run_with_nothing_to_do(
        stored, tmp_path):
    exp = tmp_path / "smoke"
    shutil.copytree(stored, exp)
    dead = subprocess.Popen(["true"])
    dead.wait()
    rec = manifest.record("flashnum.run", ["experiment=smoke"], counts=dict(run=0),
                          owner=f"{owners.host()} {dead.pid} 0 r")
    manifest.begin(exp / store.MANIFEST, "smoke", rec)  # killed after writing its rows:
    df = store.load(exp).assign(case_id=lambda d: d.case_id + "y").iloc[:3]
    store.write_part(exp, df.to_dict("records"), rec["run_id"])  # end_time null, run=0
    out = runmod.run(cfg_of(*SMOKE, "max_cases=8", f"store.root={tmp_path}"))
    assert out["counts"]["run"] == 0  # nothing to compute, and yet:
    (r,) = [r for r in manifest.runs(exp / store.MANIFEST) if r["run_id"] == rec["run_id"]]
    assert r["counts"]["run"] == 3 and r["reconciled"]["rows_on_disk"] == 3
    assert r["end_time"] is not None


def test_a_load_that_loses_races_against_compactions_still_gives_every_row(tmp_path,
                                                                          monkeypatch):
    # another process compacts between this reader's listing and its reading, five times
    # in a row (a busy store): each time a part the reader listed is gone
    for i in range(3):
        store.write_part(tmp_path, [{"case_id": f"c{i}", "max_abs_err": 1.0}])
    real, lost = pq.read_table, {"n": 0, "inside": False}

    def read_after_a_compaction(f, *a, **kw):
        if Path(f).parent.name == store.PARTS and lost["n"] < 5 and not lost["inside"]:
            lost["n"] += 1
            lost["inside"] = True  # the compaction's own reads go through
            store.compact(tmp_path)  # merges the part about to be read, and removes it
            store.write_part(tmp_path, [{"case_id": f"n{lost['n']}", "max_abs_err": 2.0}])
            lost["inside"] = False
        return real(f, *a, **kw)

    monkeypatch.setattr(pq, "read_table", read_after_a_compaction)
    df = store.load(tmp_path)
    assert lost["n"] == 5
    assert set(df.case_id) >= {"c0", "c1", "c2"} and not df.case_id.duplicated().any()
    lost["n"] = 0
    assert store.done_ids(tmp_path) >= {"c0", "c1", "c2"} and lost["n"] == 5


def test_a_corrupt_reference_cache_entry_is_recomputed_with_a_warning(tmp_path):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 4, 8, generator=g, dtype=torch.float64) for _ in range(3))
    old = reference_cache_dir(tmp_path)
    try:
        clear_cache()
        first = reference(q, k, v, method="fp64")
        (entry,) = tmp_path.glob("*.pt")
        entry.write_bytes(entry.read_bytes()[:40])  # truncated
        clear_cache()
        with pytest.warns(UserWarning, match=f"reference cache entry {entry} is unreadable"):
            again = reference(q, k, v, method="fp64")
        assert torch.equal(again.out, first.out) and torch.equal(again.lse, first.lse)
        clear_cache()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # rewritten whole: read back without a word
            assert torch.equal(reference(q, k, v, method="fp64").out, first.out)
    finally:
        reference_cache_dir(old)
        clear_cache()
