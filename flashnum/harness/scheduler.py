"""The scheduler: cases into tasks, tasks onto worker processes, Ctrl-C stops them.

    groups = tasks_of(cases, n_workers)      # lists of cases; search cases alone, first
    failures = execute([(fn, group), ...], (experiment, exp_dir, opts), n_workers, progress)

Cases that share their inputs go into one task (each reference is computed once); big
groups are split so that every worker has work, and tasks run largest first. Workers
are spawned processes with one torch thread each, so a result does not depend on how
many run; each task is `fn(cases, *args)` returning {"n", "rows", "failures", ...}.
Ctrl-C (KeyboardInterrupt in the parent) terminates the workers at once: a task's rows
are written whole or not at all, so the store keeps every finished task.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import sys
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor, as_completed

import torch
from hydra.core.hydra_config import HydraConfig
from tqdm import tqdm

from flashnum.harness.grid import Case


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


def _init_worker() -> None:
    torch.set_num_threads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle


def execute(tasks, args: tuple, n_workers: int, progress: bool) -> list:
    """Run (fn, cases) tasks as fn(cases, *args) on n_workers processes; the failures."""
    total = sum(len(t) for _, t in tasks)
    failures: list = []
    # a terminal gets a live bar; a log file one line every 30 s
    bar = tqdm(total=total, unit="case", disable=not progress or total == 0, file=sys.stderr,
               dynamic_ncols=True, smoothing=0.05,
               mininterval=0.1 if sys.stderr.isatty() else 30.0)
    if n_workers <= 1:
        n_threads = torch.get_num_threads()
        try:
            for fn, t in tasks:
                r = fn(t, *args)
                failures += r["failures"]
                bar.update(r["n"])
        finally:
            torch.set_num_threads(n_threads)
            bar.close()
        return failures
    # spawn, not fork: a forked torch may hang in its thread pool; children inherit the env
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(n_workers, mp_context=ctx, initializer=_init_worker)
    finished = False
    try:
        futures = [pool.submit(fn, t, *args) for fn, t in tasks]
        for f in as_completed(futures):
            r = f.result()
            failures += r["failures"]
            bar.update(r["n"])
            if failures:
                bar.set_postfix(failed=len(failures))
        finished = True
    finally:
        if not finished:
            # interrupted: stop the workers now (a part is written whole or not at all);
            # otherwise they would finish every queued task before the process can exit
            for proc in list(getattr(pool, "_processes", {}).values()):
                proc.terminate()
        pool.shutdown(wait=finished, cancel_futures=True)
        bar.close()
    return failures
