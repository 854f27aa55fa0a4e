"""The named quantities of the stored bench results (bench/results/*.json): the project's
own jobs, the reference's speed, the backward's speed (flashnum.figures.quantities)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from flashnum.figures.quoting import Quantity, fixed


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


def _ref(key: Callable[[dict], object], bits: int | None = 256) -> Callable[[object], object]:
    """A figure of the reference benchmark (python bench/bench_reference.py): of its run at
    `bits`, or of the whole result (bits None)."""
    def value(F):
        r = _bench(F, "reference")
        if r is None:
            return None
        if bits is None:
            return key(r)
        run = next((x for x in r["runs"] if x["bits"] == bits), None)
        return None if run is None else key(run)
    return value


def _bwd_speed(key: Callable[[dict], object]) -> Callable[[object], object]:
    """A figure of the backward benchmark's speed part (bench/bench_backward.py)."""
    def value(F):
        r = _bench(F, "backward")
        return None if r is None or "cpu_model" not in r else key(r)
    return value


_BWD = "bench/results/backward.json"
_BWD_BENCH = {
    **{f"BwdBench{k}": Quantity(f"{_BWD}: {w}", _bwd_speed(f), md=fixed(2), paper=False)
       for k, w, f in (
           ("Seconds", "the fused bf16 fa2 backward, 8 x 4096 x 64, best wall s",
            lambda r: r["speed"]["emulate_bf16_fa2_backward_s"]),
           ("TorchSeconds", "torch's fp32 SDPA backward, best wall s",
            lambda r: r["speed"]["torch_fp32_sdpa_backward_s"]),
           ("Ratio", "the fused backward / torch's fp32 SDPA backward",
            lambda r: r["speed"]["ratio_vs_backward"]),
           ("RatioFwdBwd", "the fused backward / torch's fp32 SDPA forward + backward",
            lambda r: r["speed"]["ratio_vs_forward_backward"]),
           ("RatioMedian", "the median over the interleaved pairs of their ratio",
            lambda r: r["speed"]["ratio_vs_backward_median_pair"]),
           ("CpuRatio", "the same ratio in one-thread process CPU time",
            lambda r: r["speed"]["cpu_ratio_one_thread"]),
           ("LoopRatio", "the torch loop (fused off) / torch's fp32 SDPA backward",
            lambda r: r["speed"]["ratio_torch_loop"]))},
    **{f"BwdBenchLoad{k}": Quantity(f"{_BWD}: {w} load average before and after the speed part",
                                    _bwd_speed(lambda r, how=how: how(
                                        r["load_average_before"][0],
                                        r["load_average_after"][0])),
                                    md=fixed(1), paper=False)
       for k, w, how in (("Min", "the lower", min), ("Max", "the higher", max))},
    "BwdBenchCpu": Quantity(f"{_BWD}: the CPU model", _bwd_speed(lambda r: r["cpu_model"]),
                            md=str, paper=False),
}
