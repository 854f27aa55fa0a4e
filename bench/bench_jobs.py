"""Wall and CPU time of the project's own jobs: the main job (`make run`) and the test suites.

    python bench/bench_jobs.py                  # the main job and the fast suite
    python bench/bench_jobs.py --jobs run test test_slow --out bench/results/jobs.json

Each job runs as README states it (without make's set-up step), from the repository root,
in a child process:

    run        python -m flashnum.run experiment=bf16_sweep store.root=<a fresh temporary
               folder> compare_with=experiments progress=false   (make run; exit 0 only if
               every row equals the shipped table)
    test       python -m pytest -q -n 2 -m "not slow"            (make test-fast)
    test_slow  python -m pytest -q -n 2 -m slow                  (make test-slow)

For each: wall seconds, CPU seconds of every process it ran (the children's user + system
time), the exit status and the load average before and after; with the command and the
machine (flashnum.harness.timing). The figures README and docs/experiments.md quote are
the stored ones; on a shared machine the CPU time is the one other jobs disturb least.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flashnum.harness import timing

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "results" / "jobs.json"


def commands(store: str) -> dict[str, list[str]]:
    py = sys.executable
    return {
        "run": [py, "-m", "flashnum.run", "experiment=bf16_sweep", f"store.root={store}",
                "compare_with=experiments", "progress=false"],
        "test": [py, "-m", "pytest", "-q", "-n", "2", "-m", "not slow"],
        "test_slow": [py, "-m", "pytest", "-q", "-n", "2", "-m", "slow"],
    }


def time_job(argv: list[str]) -> dict:
    """Run argv from the repository root: wall and CPU seconds, exit status, load."""
    load = os.getloadavg()
    wall, cpu = time.perf_counter(), timing.cpu_time()
    # Ctrl-C as a terminal gives it: a shell starts background jobs with SIGINT ignored,
    # which the children would inherit (the tests that stop runs with SIGINT need it)
    p = subprocess.run(argv, cwd=REPO, capture_output=True, text=True,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    wall, cpu = time.perf_counter() - wall, timing.cpu_time() - cpu
    tail = (p.stdout + p.stderr).strip().splitlines()[-1:] or [""]
    shown = ["python", *argv[1:]]
    shown = [a if not a.startswith("store.root=") else "store.root=TMP" for a in shown]
    print(f"{' '.join(shown)}: {wall:.1f} s wall, {cpu:.1f} s CPU, exit {p.returncode} "
          f"({tail[0][:120]})", flush=True)
    return dict(command=" ".join(shown), wall_s=wall, cpu_s=cpu, returncode=p.returncode,
                last_line=tail[0], load_average_before=load, load_average_after=os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", nargs="+", default=["run", "test"],
                    choices=["run", "test", "test_slow"])
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args(argv)
    res = timing.facts()
    with tempfile.TemporaryDirectory(prefix="flashnum-bench-jobs-") as store:
        cmds = commands(store)
        res["jobs"] = {name: time_job(cmds[name]) for name in a.jobs}
    timing.write(a.out, res)
    return 0 if all(j["returncode"] == 0 for j in res["jobs"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
