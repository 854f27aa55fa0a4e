"""The store under faults: a runner killed at each write point, concurrent runs, orphans.

A runner in a subprocess stops itself at a chosen write point (flashnum.store.faults:
FLASHNUM_FAULT=POINT[:N]:SIGNAL, deterministic, no sleeps) by SIGKILL, SIGTERM or SIGINT;
then the same experiment is resumed. After each: no row lost, none computed twice, none
twice in `load`; every manifest record complete and its counts the rows on disk; no
process of the runner left (scanned in /proc by an environment tag every child inherits);
nothing a dead process left behind (temporary files, claims, run marks).
The experiment is conf/experiment/smoke.yaml cut to 16 cases (seed 0): seconds a run.
"""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from flashnum import store
from flashnum.harness.grid import expand
from flashnum.harness.run import run
from flashnum.store import manifest, owners
from flashnum.store.paths import CONF

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(),
                                reason="finds leftover processes through /proc (Linux)")

REPO = Path(__file__).resolve().parents[1]
SMOKE = ["experiment=smoke", "grid.0.seed=[0]", "progress=false"]  # 16 cases
TAG = "FLASHNUM_TEST_TAG"


def cfg_of(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def grid_ids() -> set[str]:
    return {c.case_id for c in expand(cfg_of(*SMOKE))}


def start(module_args: list[str], fault: str | None = None) -> tuple[subprocess.Popen, str]:
    """A runner in its own process; returns it and the tag its whole process tree carries."""
    tag = uuid.uuid4().hex
    env = {**os.environ, TAG: tag, "OMP_NUM_THREADS": "1"}
    env.pop("FLASHNUM_FAULT", None)
    if fault:
        env["FLASHNUM_FAULT"] = fault
    p = subprocess.Popen([sys.executable, "-m", *module_args], cwd=REPO, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=_ctrl_c_as_a_terminal_gives_it)
    return p, tag


def _ctrl_c_as_a_terminal_gives_it():
    # a shell starts a background job (nohup, &) with SIGINT ignored, which its children
    # inherit: the runner's own SIGINT would then do nothing. A user's Ctrl-C reaches a
    # foreground run, whose SIGINT is the default one.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def tagged(tag: str) -> list[int]:
    """The pids of live processes whose environment carries the tag."""
    needle = f"{TAG}={tag}".encode()
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if needle in (d / "environ").read_bytes().split(b"\0"):
                    state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
                    if state != "Z":
                        out.append(int(d.name))
            except OSError:
                pass
    return out


def left_running(tag: str, within: float = 5.0) -> list[int]:
    """The runner's processes still alive `within` seconds after it ended."""
    deadline = time.monotonic() + within
    while (pids := tagged(tag)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:  # do not leave them to the next test
        os.kill(pid, signal.SIGKILL)
    return pids


def on_disk(exp: Path) -> pd.DataFrame:
    """Every row on disk, results.parquet and every part: a case stored twice shows twice."""
    files = store._files(exp)
    if not files:
        return pd.DataFrame(columns=["case_id", "wall_s"])
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def records(exp: Path) -> list[dict]:
    return [r for m in sorted(exp.glob("manifest*.json")) for r in manifest.runs(m)]


def assert_truthful(exp: Path, grid: set[str]) -> None:
    """Every case once, every record complete, the records' counts the rows computed."""
    df = store.load(exp)
    assert set(df.case_id) == grid and not df.case_id.duplicated().any()
    rows = on_disk(exp)
    assert not rows.case_id.duplicated().any(), "a case was computed twice"
    recs = records(exp)
    assert all(r["end_time"] is not None for r in recs), recs
    assert sum(r["counts"]["run"] for r in recs) == len(grid)
    leftovers = [p for p in exp.rglob("*") if p.name.startswith((".tmp-", ".stale-"))
                 or p.parent.name in (owners.CLAIMS, owners.RUNS)]
    assert not leftovers, leftovers
    assert not (exp / owners.OLD_LOCK).exists()


SAYS = {signal.SIGTERM: (143, "flashnum.run: error: terminated: finished cases are stored; "
                              "run the same command to resume"),
        signal.SIGINT: (130, "flashnum.run: error: interrupted: finished cases are stored; "
                             "run the same command to resume"),
        signal.SIGKILL: (-signal.SIGKILL, None)}

POINTS = [  # (write point, workers): a part is written by a worker, the rest by the runner
    ("manifest:1", 1),  # the run's record, at its start
    ("part:2", 2),      # the second part of finished cases, in a worker: its parent stopped
    ("manifest:2", 1),  # the record completed, every row written
    ("compact", 1),     # results.parquet of the compaction
    ("cleanup", 1),     # after the compaction's rename, before the merged parts go
]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT],
                         ids=lambda s: s.name)
@pytest.mark.parametrize("point, n_jobs", POINTS, ids=[p for p, _ in POINTS])
def test_a_runner_stopped_at_a_write_point_resumes_with_nothing_lost_or_doubled(
        tmp_path, point, n_jobs, sig):
    exp = tmp_path / "smoke"
    p, tag = start(["flashnum.run", *SMOKE, f"n_jobs={n_jobs}", f"store.root={tmp_path}",
                    f"hydra.run.dir={tmp_path}/hydra"], fault=f"{point}:{sig.name}")
    _, err = p.communicate(timeout=240)
    code, says = SAYS[sig]
    assert p.returncode == code, err[-3000:]
    if says:  # SIGTERM as SIGINT: one line that says how to resume
        assert err.strip().splitlines()[-1] == says, err[-3000:]
    assert not left_running(tag), "a process of the stopped runner is still running"

    before = on_disk(exp)
    assert not before.case_id.duplicated().any() or point == "cleanup"
    if point == "part:2":
        assert 0 < before.case_id.nunique() < 16  # stopped mid-run: there is work left
    for r in records(exp):
        if sig != signal.SIGKILL:  # a stopped run completes its own record on the way out
            assert r.get("end_time") and r["counts"]["run"] == before.case_id.nunique()

    out = run(cfg_of(*SMOKE, "n_jobs=1", f"store.root={tmp_path}"))  # the resume
    assert out["counts"]["run"] == 16 - before.case_id.nunique()
    assert_truthful(exp, grid_ids())
    after = store.load(exp).set_index("case_id")
    kept = before.drop_duplicates("case_id").set_index("case_id")
    # the rows stored before the stop are the same rows (not computed again: same wall_s)
    assert (after.loc[kept.index, "wall_s"] == kept["wall_s"]).all()
    if point in ("part:2", "manifest:2"):
        # stopped with rows on disk and its record open: reconciled with those rows (by the
        # resume after SIGKILL, by the run itself on its way out after SIGTERM or SIGINT)
        (r,) = [r for r in records(exp) if "reconciled" in r]
        assert r["reconciled"]["rows_on_disk"] == r["counts"]["run"] == len(kept)


@pytest.mark.slow
def test_concurrent_runs_into_one_store_compute_each_case_once_and_all_finish(tmp_path):
    # three runs of the whole smoke grid (48 cases) at once, into one store
    args = ["flashnum.run", "experiment=smoke", "progress=false", "n_jobs=1",
            f"store.root={tmp_path}"]
    procs = [start(args + [f"hydra.run.dir={tmp_path}/h{i}"]) for i in range(3)]
    for p, tag in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        assert not left_running(tag)
    exp = tmp_path / "smoke"
    grid = {c.case_id for c in expand(cfg_of("experiment=smoke"))}
    store.compact(exp)
    assert_truthful(exp, grid)


def test_a_case_another_live_run_claimed_is_left_to_it_and_a_dead_runs_claim_is_taken(
        tmp_path):
    exp = tmp_path / "smoke"
    ids = sorted(grid_ids())
    other = subprocess.Popen(["sleep", "120"])  # the other run's worker, alive
    try:
        owner = f"{owners.host()} {other.pid} {owners._start_time(other.pid)} r0"
        (exp / owners.CLAIMS).mkdir(parents=True)
        for cid in ids[:3]:
            (exp / owners.CLAIMS / cid).write_text(owner)
        out = run(cfg_of(*SMOKE, "n_jobs=1", f"store.root={tmp_path}"))
        assert out["counts"]["run"] == 13 and out["counts"]["in_flight_elsewhere"] == 3
        assert not set(ids[:3]) & set(store.load(exp).case_id)
    finally:
        other.kill()
        other.wait()
    out = run(cfg_of(*SMOKE, "n_jobs=1", f"store.root={tmp_path}"))  # its owner is dead
    assert out["counts"]["run"] == 3
    assert_truthful(exp, set(ids))


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=lambda s: s.name)
def test_the_backward_runners_workers_die_with_it(tmp_path, sig):
    args = ["flashnum.harness.backward", "bwd_order", "limit=4", "n_jobs=2",
            "where=seq_len:64+block:32+precision:bf16", f"store.root={tmp_path}"]
    p, tag = start(args, fault=f"part:1:{sig.name}")
    _, err = p.communicate(timeout=240)
    if sig == signal.SIGTERM:
        assert p.returncode == 143, err[-3000:]
        assert err.strip().splitlines()[-1] == (
            "flashnum.harness.backward: error: terminated: what finished is stored; run the "
            "same command to go on"), err[-3000:]
    else:
        assert p.returncode == -signal.SIGKILL, err[-3000:]
    assert not left_running(tag)
    exp = tmp_path / "bwd_order"
    before = on_disk(exp)  # stopped as its first part was renamed: maybe no row yet
    assert not before.case_id.duplicated().any()
    if sig == signal.SIGTERM:  # its own record says what it stored
        assert [r["counts"]["run"] for r in records(exp)] in ([], [len(before)])
        return
    p, tag = start(args)  # resumed: the rest of the 4 cases, none again
    _, err = p.communicate(timeout=240)
    assert p.returncode == 0, err[-3000:]
    store.compact(exp)
    rows = on_disk(exp)
    assert not rows.case_id.duplicated().any()
    assert set(before.case_id) < set(rows.case_id)
    recs = records(exp)
    assert all(r["end_time"] for r in recs)
    assert sum(r["counts"]["run"] for r in recs) == len(rows)


@pytest.mark.slow
def test_a_full_disk_at_compaction_is_one_line_and_the_next_run_compacts(tmp_path):
    exp = tmp_path / "smoke"
    p, tag = start(["flashnum.run", *SMOKE, "n_jobs=1", f"store.root={tmp_path}"],
                   fault="compact:ENOSPC")
    out, err = p.communicate(timeout=240)
    assert p.returncode == 0, err[-3000:]  # every row is stored: the run did its work
    (line,) = [ln for ln in err.splitlines() if "no space" in ln]
    assert line == (f"flashnum.run: warning: no space left on the device of {exp} to compact "
                    f"it: its rows stay in parts/ and the table is whole; after freeing "
                    f"space: python -m flashnum.stored smoke compact=true store.root={tmp_path}")
    assert "16 run now" in out and not (exp / store.RESULTS).exists()
    assert len(store.load(exp)) == 16
    assert not left_running(tag)
    run(cfg_of(*SMOKE, "n_jobs=1", f"store.root={tmp_path}"))  # space again
    assert (exp / store.RESULTS).exists() and not store._part_files(exp)
    assert_truthful(exp, grid_ids())
