"""The named quantities of the stored bench results (bench/results/*.json): the project's
own jobs (flashnum.figures.quantities)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from flashnum.figures.quoting import fixed


def _bench(F, name: str) -> dict | None:
    """A stored bench result (bench/results/<name>.json), or None."""
    path = Path(F.experiments).parent / "bench" / "results" / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _job(name: str, key: Callable[[dict], object]) -> Callable[[object], object]:
    """A figure of one of the project's own jobs (python bench/bench_jobs.py): `name` is
    run (make run), test (make test-fast) or test_slow (make test-slow)."""
    def value(F):
        r = _bench(F, "jobs")
        job = None if r is None else r["jobs"].get(name)
        return None if job is None else key(job)
    return value


JOBS = (("Run", "run", "the main job (make run)"),
        ("Test", "test", "the fast tests (make test-fast)"),
        ("TestSlow", "test_slow", "the slow tests (make test-slow)"))
JOB_FIGURES = (("Wall", "wall s", lambda j: j["wall_s"], fixed(0)),
               ("Cpu", "CPU s of its processes", lambda j: j["cpu_s"], fixed(0)),
               ("Load", "1-minute load average before it", lambda j: j["load_average_before"][0],
                fixed(1)))
