"""Timing for the benchmarks in bench/: the machine a figure was measured on, an interleaved
best-of-k timer, and the JSON result written with the command that made it.

    from flashnum.harness import timing
    res = timing.facts()                         # command, CPU model, SIMD flags, cores,
                                                 # load average now, torch and its threads
    best = timing.interleaved({"sdpa": f, "emulate": g}, repeat=5)
    best["emulate"]["wall_s"] / best["sdpa"]["wall_s"]   # a ratio measured in one run
    timing.write("bench/results/x.json", {**res, "speed": best})   # + load average after

On a shared machine only ratios measured in one run mean something: noise only ever adds
time, so each figure is the best of k, and the callables run round-robin (a, b, a, b, ...)
so that a slow spell does not fall on one side only. Each run is timed in wall time and in
CPU time (`cpu_time`: every thread of this process and of its children that have ended, as
a pool of worker processes is): the CPU time is the figure other processes on the machine
disturb least.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

try:
    import resource
except ImportError:  # not Unix: this process's own CPU time only
    resource = None

REPO = Path(__file__).resolve().parents[2]
SIMD_PREFIXES = ("sse4", "avx", "fma", "amx", "f16c")


def cpu_model() -> tuple[str, list[str]]:
    """(the CPU's model name, its SIMD flags) from /proc/cpuinfo; elsewhere the platform's
    processor name and no flags."""
    info = Path("/proc/cpuinfo")
    text = info.read_text() if info.exists() else ""
    lines = text.splitlines()
    model = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")),
                 platform.processor() or platform.machine())
    flags = next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), [])
    return model, [f for f in flags if f.startswith(SIMD_PREFIXES)]


def cores() -> int:
    """The cores this process may run on (SLURM's and taskset's limits included)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def command(argv: list[str] | None = None) -> str:
    """The command that runs this process again: `python SCRIPT ARGS`, the script's path
    relative to the repository when it lies inside it (never this machine's absolute path)."""
    argv = list(sys.argv if argv is None else argv)
    if not argv or not argv[0]:
        return "python"
    script = Path(argv[0]).resolve()
    if script.is_relative_to(REPO):
        argv[0] = script.relative_to(REPO).as_posix()
    return shlex.join(["python", *argv])


def machine() -> dict:
    """The machine a timing was taken on: CPU model and SIMD flags, cores, the load average
    now (1, 5, 15 minutes), python, torch, its CPU capability and intra-op threads, and the
    GPU when there is one."""
    model, simd = cpu_model()
    return {"machine": platform.machine(), "cpu_model": model, "cpu_simd_flags": simd,
            "cpus": os.cpu_count(), "cores": cores(), "load_average_before": os.getloadavg(),
            "python": platform.python_version(), "torch": torch.__version__,
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def facts(argv: list[str] | None = None) -> dict:
    """{"command": ..., **machine()}: what a result records before it is measured."""
    return {"command": command(argv), **machine()}


def cpu_time() -> float:
    """CPU seconds (user + system) of this process and of its children that have ended."""
    if resource is None:
        return time.process_time()
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime


def interleaved(calls: dict[str, Callable[[], object]], repeat: int,
                warmup: int = 0) -> dict[str, dict]:
    """Time each callable `repeat` times, round-robin, after `warmup` untimed rounds.

    Returns {name: {"wall_s": best, "cpu_s": best, "wall_runs_s": [...], "cpu_runs_s":
    [...]}}: the best (smallest) wall and CPU time (cpu_time) of each, and every run in order.
    """
    if repeat < 1:
        raise ValueError(f"repeat={repeat}: must be at least 1")
    for _ in range(warmup):
        for fn in calls.values():
            fn()
    runs = {name: ([], []) for name in calls}
    for _ in range(repeat):
        for name, fn in calls.items():
            wall, cpu = time.perf_counter(), cpu_time()
            fn()
            runs[name][1].append(cpu_time() - cpu)
            runs[name][0].append(time.perf_counter() - wall)
    return {name: {"wall_s": min(w), "cpu_s": min(c), "wall_runs_s": w, "cpu_runs_s": c}
            for name, (w, c) in runs.items()}


def best(fn: Callable[[], object], repeat: int, clock: str = "wall") -> float:
    """The best of `repeat` runs of one callable, in wall ("wall") or CPU ("cpu", cpu_time)
    seconds."""
    if clock not in ("wall", "cpu"):
        raise ValueError(f"clock={clock!r}: choose 'wall' or 'cpu'")
    return interleaved({"fn": fn}, repeat)["fn"][f"{clock}_s"]


def write(path: str | os.PathLike, result: dict) -> Path:
    """Write `result` (which facts() began) as JSON at `path`, with the command and the load
    average now ("load_average_after") where it has none; returns the path."""
    out = {"command": command(), **result}
    out.setdefault("load_average_after", os.getloadavg())
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    return path
