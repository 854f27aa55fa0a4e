"""Sweeps through Hydra's launchers, as a cluster runs them: submitit_local (the plugin code
path of SLURM) and joblib with 4 shards, one of which is killed mid-run and resumed.
Every case of the grid ends up stored exactly once: none lost, none computed twice."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from flashnum import store
from flashnum.harness.grid import expand
from flashnum.store.paths import CONF

REPO = Path(__file__).resolve().parents[1]
# 2 inputs x 2 N x 2 policies x 2 precisions = 16 cases, a few seconds of work: most of the
# time goes into starting the launchers' processes (each imports torch, pandas and hydra:
# about 4.5 s of CPU); n_jobs=1: each job computes in its own process, with no worker pool
# of its own
GRID = ["experiment=smoke", "grid.0.seed=[0]", "progress=false", "n_jobs=1"]


def grid_ids() -> set[str]:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return {c.case_id for c in expand(compose("config", overrides=GRID))}


def multirun(root: Path, *args, background=False):
    cmd = [sys.executable, "-m", "flashnum.run", "-m", *GRID, *args, f"store.root={root}",
           f"hydra.sweep.dir={root}/multirun"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # as a cluster job runs: one thread a job
    if background:
        return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True, env=env)
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env=env)


def stored_rows(exp: Path) -> pd.DataFrame:
    """Every row on disk, the compacted table and every part: a case run twice shows twice."""
    files = ([exp / store.RESULTS] if (exp / store.RESULTS).exists() else []) + sorted(
        (exp / store.PARTS).glob("part-*.parquet"))
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


@pytest.mark.slow
def test_a_sweep_through_the_submitit_launcher_stores_every_case_once(tmp_path):
    p = multirun(tmp_path, "num_shards=2", "shard=0,1", "hydra/launcher=submitit_local",
                 "hydra.launcher.timeout_min=10")
    assert p.returncode == 0, p.stderr[-3000:]
    rows = stored_rows(tmp_path / "smoke")
    assert not rows.case_id.duplicated().any() and set(rows.case_id) == grid_ids()
    assert rows.m_ok.all() and rows.l_ok.all()
    for shard in (0, 1):  # each job ran under submitit and recorded itself
        assert (tmp_path / "smoke" / f"manifest.shard-{shard}-of-2.json").exists()
    assert list((tmp_path / "multirun" / ".submitit").iterdir())


@pytest.mark.slow
def test_four_joblib_shards_one_killed_mid_run_resume_with_no_case_lost_or_doubled(tmp_path):
    args = ["num_shards=4", "shard=range(4)", "hydra/launcher=joblib", "hydra.launcher.n_jobs=4"]
    parts = tmp_path / "smoke" / store.PARTS
    p = multirun(tmp_path, *args, background=True)
    deadline = time.time() + 240
    first = []
    while not first and p.poll() is None:
        assert time.time() < deadline
        first = sorted(parts.glob("part-*.parquet")) if parts.is_dir() else []
        time.sleep(0.02)
    assert first, p.communicate()[1][-3000:]
    victim = int(first[0].name.split("-")[2])  # part-<time>-<pid>-<id>: the shard's process
    os.kill(victim, signal.SIGKILL)
    p.wait(timeout=240)
    try:
        os.killpg(p.pid, signal.SIGKILL)  # no straggler may write while the resume runs
    except ProcessLookupError:
        pass
    p.stdout.close()
    p.stderr.close()
    killed = stored_rows(tmp_path / "smoke")
    grid = grid_ids()
    assert not killed.case_id.duplicated().any()
    assert len(killed) < len(grid)  # the kill cost cases: there is something to resume

    # the same sweep resumes, its 4 shards through joblib on 2 workers (a worker's process
    # imports torch once and runs two shards: half the start-up cost of 4 workers)
    r = multirun(tmp_path, *args[:-1], "hydra.launcher.n_jobs=2")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = stored_rows(tmp_path / "smoke")
    assert not rows.case_id.duplicated().any()  # nothing stored was computed again
    assert set(rows.case_id) == grid  # nothing lost
    assert set(killed.case_id) <= set(rows.case_id)
    resumed = rows.set_index("case_id").loc[killed.case_id, "max_abs_err"]
    assert (resumed.to_numpy() == killed["max_abs_err"].to_numpy()).all()
