"""SLURM executed for real: a sweep sharded over a SLURM array through `hydra/launcher=slurm`
lands every case exactly once, identical to a one-process run, and resumes after one array
task is cancelled with scancel.

These tests need a running SLURM cluster whose default partition can run two one-CPU jobs.
`.ci/slurm.sh` starts a one-node cluster (Debian's slurm-wlm and munge, as root) and runs
this file; elsewhere every test here skips, saying so."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from flashnum import store
from flashnum.harness.grid import expand, in_shard
from flashnum.store.paths import CONF

REPO = Path(__file__).resolve().parents[1]
# smoke with 24 seeds: 384 cases in 96 inputs (a part per input and shard), 5-10 s of work
# per shard after ~5 s of imports: long enough for a shard to be cancelled half-way
GRID = ["experiment=smoke", f"grid.0.seed=[{','.join(map(str, range(24)))}]",
        "progress=false", "n_jobs=1"]
SLURM = ["hydra/launcher=slurm", "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=2",
         "hydra.launcher.timeout_min=15"]


def _cluster() -> str | None:
    """None when a SLURM controller answers with an idle or mixed node, else why not."""
    if shutil.which("sinfo") is None:
        return "no SLURM client (sinfo) on PATH"
    p = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True)
    states = set(p.stdout.split())
    if p.returncode != 0 or not states & {"idle", "mixed"}:
        return f"no SLURM cluster answers (sinfo: {(p.stderr or p.stdout).strip()[:120]!r})"
    return None


pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(_cluster() is not None,
                                 reason=f"{_cluster()}; .ci/slurm.sh starts a one-node cluster "
                                        "where root and apt-get are available")]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                         os.environ.get("PYTHONPATH")]))}


def one_process(root: Path) -> pd.DataFrame:
    p = subprocess.run([sys.executable, "-m", "flashnum.run", *GRID, f"store.root={root}"],
                       cwd=REPO, capture_output=True, text=True, timeout=600, env=_env())
    assert p.returncode == 0, p.stderr[-3000:]
    return store.load("smoke", root=root, all_rows=True)


def slurm_sweep(root: Path, background: bool = False):
    cmd = [sys.executable, "-m", "flashnum.run", "-m", *GRID, "num_shards=2", "shard=0,1",
           *SLURM, f"store.root={root}", f"hydra.sweep.dir={root}/multirun"]
    kw = dict(cwd=REPO, text=True, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if background:  # stopped by SIGINT below, as its user's Ctrl-C would
        return subprocess.Popen(cmd, preexec_fn=_ctrl_c_as_a_terminal_gives_it, **kw)
    return subprocess.run(cmd, timeout=900, **kw)


def _ctrl_c_as_a_terminal_gives_it():
    # a shell starts a background job (nohup, &) with SIGINT ignored, which its children
    # inherit; a user's Ctrl-C reaches a foreground launcher, whose SIGINT is the default
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def every_row(root: Path) -> pd.DataFrame:
    """Every row on disk, compacted table and parts alike: a case stored twice shows twice."""
    exp = root / "smoke"
    files = ([exp / store.RESULTS] if (exp / store.RESULTS).exists() else []) + sorted(
        (exp / store.PARTS).glob("part-*.parquet"))
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def assert_same_rows(a: pd.DataFrame, b: pd.DataFrame):
    """Equal in every column but the timings (names ending in _s) and the provenance of the
    process that wrote them; matched by case_id."""
    skip = {c for c in a.columns if str(c).endswith("_s")}
    cols = sorted(set(a.columns) - skip)
    assert set(cols) <= set(b.columns)
    a = a.set_index("case_id").sort_index()
    b = b.set_index("case_id").sort_index()
    assert list(a.index) == list(b.index)
    for c in cols:
        if c == "case_id":
            continue
        pd.testing.assert_series_equal(a[c], b[c], check_names=False, check_dtype=False,
                                       obj=f"column {c}")


def grid_ids() -> list[str]:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return [c.case_id for c in expand(compose("config", overrides=GRID))]


def test_a_two_shard_slurm_array_stores_every_case_once_as_one_process_does(tmp_path):
    alone = one_process(tmp_path / "alone")
    p = slurm_sweep(tmp_path / "slurm")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = every_row(tmp_path / "slurm")
    assert not rows.case_id.duplicated().any()
    assert sorted(rows.case_id) == sorted(grid_ids())
    assert_same_rows(store.load("smoke", root=tmp_path / "slurm", all_rows=True), alone)
    for shard in (0, 1):  # each array task ran the runner and recorded itself
        assert (tmp_path / "slurm" / "smoke" / f"manifest.shard-{shard}-of-2.json").exists()


def _array_tasks() -> dict[str, str]:
    out = subprocess.run(["squeue", "-h", "-r", "-o", "%i %T"], capture_output=True,
                         text=True).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def test_scancel_of_one_array_task_half_way_is_resumed_by_rerunning_the_sweep(tmp_path):
    root = tmp_path / "slurm"
    shard0 = {c for c in grid_ids() if in_shard(c, 0, 2)}
    p = slurm_sweep(root, background=True)
    deadline = time.time() + 600
    done0 = 0
    while time.time() < deadline:  # wait for shard 0 to store its first rows, then cancel it
        parts = sorted((root / "smoke" / store.PARTS).glob("part-*.parquet")) \
            if (root / "smoke" / store.PARTS).is_dir() else []
        done0 = len(shard0 & set(pd.concat([pd.read_parquet(f) for f in parts]).case_id)) \
            if parts else 0
        if done0:
            break
        assert p.poll() is None, p.communicate()[1][-3000:]
        time.sleep(0.1)
    task0 = [j for j, s in _array_tasks().items() if j.endswith("_0")]
    assert task0, "array task 0 is not in the queue any more"
    # submitit's job wrapper ignores the SIGTERM that scancel sends first and dies by the
    # SIGKILL that follows KillWait seconds later (2 s on the cluster .ci/slurm-cluster.sh
    # starts; SLURM's default is 30 s, longer than this whole shard)
    subprocess.run(["scancel", task0[0]], check=True)
    while _array_tasks() and time.time() < deadline:  # task 0 dies, task 1 finishes
        time.sleep(0.5)
    assert not _array_tasks()
    # With no accounting database (sacct), submitit cannot learn that a task was cancelled
    # and waits for its result for ever; stop the launcher as its user would. (On a cluster
    # with accounting it raises for the cancelled task and exits with an error by itself.)
    if p.poll() is None:
        p.send_signal(signal.SIGINT)
    p.communicate(timeout=120)
    stored0 = len(shard0 & set(every_row(root).case_id))
    assert 0 < stored0 < len(shard0), f"shard 0 was not cancelled half-way ({stored0} cases)"

    p = slurm_sweep(root)  # the same command again: shard 1 has nothing left, shard 0 resumes
    assert p.returncode == 0, p.stderr[-3000:]
    rows = every_row(root)
    assert not rows.case_id.duplicated().any()
    assert sorted(rows.case_id) == sorted(grid_ids())
    assert_same_rows(store.load("smoke", root=root, all_rows=True),
                     one_process(tmp_path / "alone"))
