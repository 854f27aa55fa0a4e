"""Manifests: each run that wrote rows is recorded with the code, command and machine; a run
that wrote none leaves the manifest byte for byte as it was."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from flashnum import store
from flashnum.harness.run import run
from flashnum.store import manifest
from flashnum.store.paths import CONF

REPO = Path(__file__).resolve().parents[1]
SMOKE = ["experiment=smoke", "progress=false", "n_jobs=1"]


def cfg_of(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def git(repo, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                   check=True, capture_output=True)


@pytest.mark.slow
def test_runs_that_write_rows_append_records_and_a_run_that_writes_none_changes_no_byte(
        tmp_path):
    # the command line, as a user runs it: the record names the module and the overrides
    cmd = [sys.executable, "-m", "flashnum.run", *SMOKE, "max_cases=2", f"store.root={tmp_path}",
           f"hydra.run.dir={tmp_path}/hydra"]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    path = tmp_path / "smoke" / store.MANIFEST
    first = json.loads(path.read_text())
    assert first["experiment"] == "smoke" and len(first["runs"]) == 1
    rec = first["runs"][0]
    assert rec["command"] == {"module": "flashnum.run", "overrides": SMOKE + ["max_cases=2"]}
    assert str(tmp_path) not in json.dumps(rec["command"])  # nothing of this machine's paths
    assert rec["counts"]["run"] == 2 and rec["end_time"] >= rec["start_time"]
    assert rec["git"]["commit"] and isinstance(rec["git"]["dirty"], bool)
    assert ("diff_sha256" in rec["git"]) == rec["git"]["dirty"]
    assert len(rec["code_sha256"]) == 64 and rec["versions"]["torch"] and rec["machine"]["cpus"]
    assert "argv" not in rec

    # two more cases: a second record; the first is kept as it was
    out = run(cfg_of(*SMOKE, "max_cases=4", f"store.root={tmp_path}"))
    assert out["counts"]["run"] == 2
    runs = manifest.runs(path)
    assert len(runs) == 2 and runs[0] == rec and runs[1]["counts"]["done_before"] == 2

    # every case already stored: nothing computed, the manifest untouched
    before = path.read_bytes()
    out = run(cfg_of(*SMOKE, "max_cases=4", f"store.root={tmp_path}"))
    assert out["counts"]["run"] == 0 and out["counts"]["done_before"] == 4
    assert path.read_bytes() == before


def test_a_run_whose_every_case_fails_takes_its_own_record_out_and_nothing_else(tmp_path):
    path = tmp_path / "manifest.json"
    rec = manifest.record("flashnum.run", ["experiment=x"], counts={})
    manifest.begin(path, "x", rec)
    assert manifest.runs(path)[0]["end_time"] is None  # visible while it runs
    manifest.finish(path, "x", rec, wrote_rows=False)
    assert not path.exists()

    manifest.append(path, "x", manifest.record("flashnum.run", ["experiment=x"]))
    before = path.read_bytes()
    rec = manifest.record("flashnum.run", ["experiment=x"])
    manifest.begin(path, "x", rec)
    assert len(manifest.runs(path)) == 2
    manifest.finish(path, "x", rec, wrote_rows=False)
    assert path.read_bytes() == before


def test_a_failed_run_overlapping_a_successful_one_keeps_the_other_record(tmp_path):
    # the failing run starts first; the other begins and finishes while it runs
    path = tmp_path / "manifest.json"
    failing = manifest.record("flashnum.run", ["experiment=x", "seed=9"])
    manifest.begin(path, "x", failing)
    other = manifest.record("flashnum.run", ["experiment=x"], counts=dict(run=3))
    manifest.begin(path, "x", other)
    manifest.finish(path, "x", other, wrote_rows=True)
    manifest.finish(path, "x", failing, wrote_rows=False)
    assert [r["run_id"] for r in manifest.runs(path)] == [other["run_id"]]
    assert manifest.runs(path)[0]["end_time"] is not None


def test_git_state_hashes_the_code_that_differs_from_the_commit_and_nothing_else(tmp_path):
    (tmp_path / "flashnum").mkdir()
    (tmp_path / "conf").mkdir()
    (tmp_path / "flashnum" / "core.py").write_text("x = 1\n")
    (tmp_path / "conf" / "config.yaml").write_text("a: 1\n")
    (tmp_path / "README.md").write_text("hello\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", ".")
    git(tmp_path, "commit", "-q", "-m", "c")
    clean = manifest.git_state(tmp_path)
    assert len(clean["commit"]) == 40 and clean == {"commit": clean["commit"], "dirty": False}

    (tmp_path / "README.md").write_text("changed prose\n")  # not code: still clean
    (tmp_path / "experiments").mkdir()
    (tmp_path / "experiments" / "t.parquet").write_bytes(b"rows")
    assert manifest.git_state(tmp_path)["dirty"] is False

    (tmp_path / "flashnum" / "core.py").write_text("x = 2\n")
    a = manifest.git_state(tmp_path)
    assert a["dirty"] is True and a["changed"] == ["flashnum/core.py"]
    (tmp_path / "flashnum" / "core.py").write_text("x = 3\n")
    b = manifest.git_state(tmp_path)
    assert b["diff_sha256"] != a["diff_sha256"]  # the hash tells two diffs apart
    (tmp_path / "flashnum" / "new.py").write_text("y = 1\n")  # untracked code counts too
    c = manifest.git_state(tmp_path)
    assert c["changed"] == ["flashnum/core.py", "flashnum/new.py"]
    assert c["diff_sha256"] != b["diff_sha256"]
    (tmp_path / "flashnum" / "new.py").write_text("y = 2\n")
    assert manifest.git_state(tmp_path)["diff_sha256"] != c["diff_sha256"]

    assert manifest.git_state(tmp_path / "conf") == {"commit": None, "dirty": None}


def test_the_code_hash_changes_with_any_source_or_config_file(tmp_path):
    pkg, conf = tmp_path / "flashnum", tmp_path / "conf"
    (pkg / "sub").mkdir(parents=True)
    conf.mkdir()
    (pkg / "sub" / "a.py").write_text("a = 1\n")
    (pkg / "k.c").write_text("int k;\n")
    (conf / "config.yaml").write_text("x: 1\n")
    h0 = manifest.code_sha256(pkg, conf)
    (pkg / "notes.txt").write_text("not code\n")
    assert manifest.code_sha256(pkg, conf) == h0
    for f, text in ((pkg / "sub" / "a.py", "a = 2\n"), (pkg / "k.c", "int j;\n"),
                    (conf / "config.yaml", "x: 2\n")):
        old = f.read_text()
        f.write_text(text)
        assert manifest.code_sha256(pkg, conf) != h0, f
        f.write_text(old)
    assert manifest.code_sha256(pkg, conf) == h0


def test_a_manifest_of_the_earlier_layout_reads_as_runs_with_rerunnable_commands(tmp_path):
    old = dict(experiment="bf16_sweep", overrides=["experiment=bf16_sweep"],
               argv=["/somewhere/flashnum/run.py", "experiment=bf16_sweep"],
               git=dict(commit="4bcce39", dirty=True), start_time="t1", end_time="t2",
               counts=dict(run=5),
               history=[dict(start_time="t0", end_time="t0b", git=dict(commit="1a", dirty=True),
                             counts=dict(run=3), overrides=[])])
    path = tmp_path / "manifest.json"
    store.write_json(path, old)
    runs = manifest.runs(path)
    assert [r["start_time"] for r in runs] == ["t0", "t1"]
    assert runs[1]["command"] == {"module": "flashnum.run", "overrides": ["experiment=bf16_sweep"]}
    assert "argv" not in runs[1] and runs[1]["git"]["commit"] == "4bcce39"
    assert runs[0]["command"]["module"] == "flashnum.run"  # the history's entry point
    for r in runs:  # a dirty run of the old layout says its diff is unknown
        assert r["git"]["diff_sha256"] is None and "not recorded" in r["git"]["note"]
    manifest.append(path, "bf16_sweep", manifest.record("flashnum.run", []))
    assert len(json.loads(path.read_text())["runs"]) == 3
