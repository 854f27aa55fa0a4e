"""What README.md and docs/engine.md quote from the engine's benchmarks: the emulator's speed
and memory against torch (bench/results/engine.json, python bench/bench_engine.py) and the
exhaustive check of the exp site (experiments/exp_exhaustive), as passages.
"""

from __future__ import annotations

from flashnum.figures.docs.digits import thousands
from flashnum.figures.docs.sources import bench, table
from flashnum.figures.quoting import Passage
from flashnum.studies.exp_exhaustive import summary as exp_summary


def engine_bench(F):
    e = bench(F, "engine")
    s, m = e["speed"], e["memory"]
    loads = (*e["load_average_before"], *e["load_average_after"])
    return [f"{s['emulate_bf16_fa2_s']:.3f} s vs {s['sdpa_fp32_s']:.3f} s: ratio "
            f"{s['ratio']:.2f} (one thread: {s['ratio_one_thread']:.2f})",
            f"{s['emulate_in_place_s']:.3f} s: ratio {s['ratio_in_place']:.2f}",
            f"{s['emulate_bf16_lowp_s']:.3f} s: ratio {s['ratio_lowp']:.2f}",
            f"ratio {s['cpu_ratio_one_thread']:.2f}; {s['cpu_ratio_one_thread_in_place']:.2f}",
            f"{s['emulate_torch_path_s']:.3f} s: ratio {s['ratio_torch_path']:.2f}",
            f"{e['cpu_model']}",
            f"load average between {min(loads):.1f} and {max(loads):.1f}",
            f"| {s['gemms_s']:.3f} s |",
            f"{m['peak_rss_gib']:.2f} GiB, {m['wall_s']:.1f} s",
            f"| {e['mp']['wall_s']:.2f} s |"]


def exp_claims(F):
    """Hard inputs: the correctly rounded float64 value within 4 float64 ulps of an fp32
    boundary; the exact (mpmath) distance of some is above 4."""
    e = exp_summary(table(F, "exp_exhaustive"))
    fs = ("exp", "exp2")
    hard = sum(len(e[f]["hard_inputs"]) for f in fs)
    exact = sum(d < 4 for f in fs for d in e[f]["hard_boundary_distance_ulps"])
    misses = sum(len(e[f]["float64_misses"]) for f in fs)
    dist = dict(zip(e["exp2"]["hard_inputs"], e["exp2"]["hard_boundary_distance_ulps"],
                    strict=True))
    nonzero = {x: d for x, d in dist.items() if d > 0}
    closest = min(nonzero, key=nonzero.get)
    miss = [x for x in e["exp2"]["float64_misses"] if x < 0][0]
    n = sum(e[f]["inputs"] for f in fs)
    return [f"over all {n / 1e9:.1f}e9 float32 arguments of exp and exp2",
            f"{hard} have a correctly rounded float64 value within 4 float64 ulps of an fp32 "
            f"rounding boundary ({exact} of them lie that close exactly, by mpmath)",
            f"rounds {misses} of them to the wrong fp32 value (exp2({miss!r}) lies "
            f"{dist[miss]:.3f} float64 ulp from the boundary; the closest, "
            f"exp2({closest!r}), {nonzero[closest]:.3f} ulp)",
            f"{n / 1e9:.1f}e9 arguments of exp and exp2, no difference, all correctly rounded; "
            f"{hard} arguments have a float64 value within 4 float64 ulps of an fp32 rounding "
            f"boundary, and float64 alone rounds {misses} of them"]


def engine_docs(F):
    e = exp_summary(table(F, "exp_exhaustive"))
    rows = [f"| {f} | {thousands(e[f]['inputs'])} | {e[f]['p_differences']} differences | "
            f"{len(e[f]['hard_inputs'])} | {len(e[f]['float64_misses'])}"
            for f in ("exp", "exp2")]
    x2 = e["exp2"]
    dist = dict(zip(x2["hard_inputs"], x2["hard_boundary_distance_ulps"], strict=True))
    nonzero = {x: d for x, d in dist.items() if d > 0}
    closest = min(nonzero, key=nonzero.get)
    lo, hi = sorted(x2["float64_misses"])
    return rows + [
        f"exp2({closest!r}), {nonzero[closest]:.3f} float64 ulp away",
        f"correctly rounded float64 exp2 misses exp2({lo!r}) ({dist[lo]:.3f} ulp away:",
        f"exp2({hi!r}) ({dist[hi]:.2f} ulp away)"]


PASSAGES = {
    "BenchEngineSpeed": Passage("docs/benchmarks.md: the emulator against torch's SDPA "
                                 "(bench/results/engine.json)", engine_bench),
    "ReadmeExpSite": Passage("README.md: the exhaustive check of the fp32 exp site "
                             "(experiments/exp_exhaustive)", exp_claims),
    "EngineSpeed": Passage("docs/engine.md: the exp site's check and the emulator's speed",
                           engine_docs),
}
