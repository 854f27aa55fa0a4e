"""The scheduler: cases into tasks, tasks onto worker processes, Ctrl-C stops them.

    groups = tasks_of(cases, n_workers)      # lists of cases; search cases alone, first
    out = execute([(fn, group), ...], (experiment, exp_dir, opts), n_workers, progress)
    out["failures"], out["rows"], out["skipped"]  # summed over the tasks

Before any worker starts, the engine's C kernels are built (or loaded from the cache:
flashnum.models.libraries), so that the workers load one build instead of each compiling
its own on a first run. Cases that share their inputs go into one task (each reference
is computed once); big groups are split so that every worker has work, and tasks run
largest first. Workers are spawned processes with one torch thread each, so a result
does not depend on how many run; each task is `fn(cases, *args)` returning {"n", "rows",
"failures", ...} (and "skipped": cases another run has in flight).
Ctrl-C or SIGTERM (KeyboardInterrupt in the parent, flashnum.harness.cli.Terminated)
terminates the workers at once and waits for them: a task's rows are written whole or not
at all, so the store keeps every finished task. Workers die with their parent: a worker
asks the kernel for SIGKILL when its parent dies (prctl PR_SET_PDEATHSIG, Linux) as soon
as its interpreter imports flashnum, before torch (flashnum.harness.lifeline), dies at
once if its parent is gone already, and watches its parent's pid besides (elsewhere), so a
runner killed by SIGKILL or the OOM killer, even while its workers start, leaves no worker
running.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager

import torch
from hydra.core.hydra_config import HydraConfig
from tqdm import tqdm

from flashnum.harness import lifeline
from flashnum.harness.grid import Case
from flashnum.models import libraries


def cost(case: Case) -> float:
    """Relative cost of a case (for ordering tasks, largest first)."""
    n = case.batch * case.heads * case.seq_len_q * case.seq_len_k * case.head_dim
    w = {"triton": 40.0, "mp": 2000.0}.get(case.backend, 1.0)
    w *= {"uniform": 20.0, "lowp": 2.0}.get(case.policy, 1.0)
    return n * w * (64.0 / case.block_n) ** 0.5


def tasks_of(cases: list[Case], n_workers: int) -> list[list[Case]]:
    """Groups of cases to run as one task: cases grouped by inputs, big groups split so
    that every worker has work, one task per search case; searches first, then largest
    first."""
    groups: dict = defaultdict(list)
    plain = [c for c in cases if not c.is_search]
    for c in plain:
        groups[c.input_key()].append(c)
    chunk = max(1, math.ceil(len(plain) / (3 * max(1, n_workers))))
    tasks = [g[i : i + chunk] for g in groups.values() for i in range(0, len(g), chunk)]
    tasks = sorted(tasks, key=lambda t: -sum(cost(c) for c in t))
    return [[c] for c in cases if c.is_search] + tasks


def n_workers(cfg) -> int:
    """cfg.n_jobs, or every core this process may use (1 under the joblib launcher)."""
    if cfg.n_jobs > 0:
        return cfg.n_jobs
    try:
        n = len(os.sched_getaffinity(0))  # honours SLURM's cpus_per_task
    except AttributeError:
        n = os.cpu_count() or 1
    try:
        if "joblib" in str(HydraConfig.get().launcher.get("_target_", "")):
            return 1  # joblib already runs one job per core
    except (ValueError, AttributeError):
        pass
    return n


def _die_with(parent: int) -> None:
    """SIGKILL this process when `parent` dies (lifeline.die_with, done already when the
    worker imported flashnum), and a thread that polls the parent's pid every 0.5 s (other
    systems than Linux)."""
    lifeline.die_with(parent)

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)  # no clean-up: nothing may be written now

    threading.Thread(target=watch, daemon=True, name="flashnum-parent-watch").start()


def _init_worker(parent: int) -> None:
    _die_with(parent)
    torch.set_num_threads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle


def _add(out: dict, r: dict) -> None:
    out["failures"] += r["failures"]
    out["rows"] += r.get("rows", r["n"] - len(r["failures"]))
    out["skipped"] += r.get("skipped", [])


@contextmanager
def _workers_tied():
    """While inside, a spawned process is told it is this runner's worker (lifeline.ENV):
    it ties itself to the runner the moment it imports flashnum."""
    old = os.environ.get(lifeline.ENV)
    os.environ[lifeline.ENV] = str(os.getpid())
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(lifeline.ENV, None)
        else:
            os.environ[lifeline.ENV] = old


def execute(tasks, args: tuple, n_workers: int, progress: bool) -> dict:
    """Run (fn, cases) tasks as fn(cases, *args) on n_workers processes.
    Returns {"failures", "rows", "skipped"} summed over the tasks."""
    total = sum(len(t) for _, t in tasks)
    out: dict = dict(failures=[], rows=0, skipped=[])
    if total:  # the C kernels built once, here, not by every worker (announced if compiled)
        libraries.build_all()
    # a terminal gets a live bar; a log file one line every 30 s
    bar = tqdm(total=total, unit="case", disable=not progress or total == 0, file=sys.stderr,
               dynamic_ncols=True, smoothing=0.05,
               mininterval=0.1 if sys.stderr.isatty() else 30.0)
    if n_workers <= 1:
        n_threads = torch.get_num_threads()
        try:
            for fn, t in tasks:
                r = fn(t, *args)
                _add(out, r)
                bar.update(r["n"])
        finally:
            torch.set_num_threads(n_threads)
            bar.close()
        return out
    # spawn, not fork: a forked torch may hang in its thread pool; children inherit the env
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(n_workers, mp_context=ctx, initializer=_init_worker,
                               initargs=(os.getpid(),))
    finished = False
    try:
        with _workers_tied():  # the workers spawn during the submits
            futures = [pool.submit(fn, t, *args) for fn, t in tasks]
        for f in as_completed(futures):
            r = f.result()
            _add(out, r)
            bar.update(r["n"])
            if out["failures"]:
                bar.set_postfix(failed=len(out["failures"]))
        finished = True
    finally:
        if not finished:
            # stopped: end the workers now (a part is written whole or not at all) and wait
            # for them, so that nothing is written after this returns; otherwise they would
            # finish every queued task before the process can exit
            procs = list(getattr(pool, "_processes", {}).values())
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.join(timeout=10)
        pool.shutdown(wait=finished, cancel_futures=True)
        bar.close()
    return out
