"""What docs/benchmarks.md and docs/engine.md show of the engine: its benchmark against
torch (bench/results/engine.json, python bench/bench_engine.py) and the exhaustive check of
the exp site (experiments/exp_exhaustive), as tables generated whole.
"""

from __future__ import annotations

import pandas as pd

from flashnum.figures.docs.sources import bench, table
from flashnum.figures.docs.views import cell, goal, record
from flashnum.studies.exp_exhaustive import summary as exp_summary

FUNCTIONS = ("exp", "exp2")


def exp_table(F) -> pd.DataFrame:
    """Per function: its arguments, the kernel's differences from the torch path, the hard
    arguments (float64 value within 4 float64 ulps of an fp32 boundary) and float64's misses."""
    e = exp_summary(table(F, "exp_exhaustive"))
    return pd.DataFrame([{"": f, "arguments": f"{e[f]['inputs']:,}",
                          "kernel vs torch path": f"{e[f]['p_differences']} differences",
                          "within 4 ulps of a boundary": len(e[f]["hard_inputs"]),
                          "not correctly rounded by float64 alone": len(e[f]["float64_misses"])}
                         for f in FUNCTIONS])


def exp_hard(F) -> pd.DataFrame:
    """Each hard argument, its exact (mpmath) distance to the boundary, float64's verdict."""
    e = exp_summary(table(F, "exp_exhaustive"))
    return pd.DataFrame([{"function": f, "argument": repr(x), "float64 ulps from the boundary":
                          cell(d), "correctly rounded float64, rounded again":
                          "wrong" if x in e[f]["float64_misses"] else "right"}
                         for f in FUNCTIONS for x, d in zip(e[f]["hard_inputs"],
                         e[f]["hard_boundary_distance_ulps"], strict=True)])


# docs/benchmarks.md's table: (what, measured, goal), read from the record bench_engine wrote
S = "speed"
BENCH = [
    ("machine", "{cpu_model}, {cpus} CPUs, torch {torch} ({torch_cpu_capability})", ""),
    ("load average before, after (1 min)",
     "{load_average_before[0]:.1f}, {load_average_after[0]:.1f}", ""),
    ("emulated bf16 `fa2`, 8 heads x N=4096 x d=64, 64x64 blocks, vs torch SDPA fp32 (the "
     "fused C loop)", f"{{{S}[emulate_bf16_fa2_s]:.3f}} s vs {{{S}[sdpa_fp32_s]:.3f}} s: ratio "
     f"{{{S}[ratio]:.2f}} (one thread: {{{S}[ratio_one_thread]:.2f}})",
     goal("<= 2", lambda r: r[S]["ratio"] <= 2)),
    ("the same, one thread, process CPU time: the fused loop; the in-place path",
     f"ratio {{{S}[cpu_ratio_one_thread]:.2f}}; {{{S}[cpu_ratio_one_thread_in_place]:.2f}}",
     goal("<= 2 (the fused loop)", lambda r: r[S]["cpu_ratio_one_thread"] <= 2)),
    ("emulated bf16 `lowp` (every softmax site bf16), the same shape (the fused C loop)",
     f"{{{S}[emulate_bf16_lowp_s]:.3f}} s: ratio {{{S}[ratio_lowp]:.2f}}", ""),
    ("the same in the in-place path (the fused loop off, identical output)",
     f"{{{S}[emulate_in_place_s]:.3f}} s: ratio {{{S}[ratio_in_place]:.2f}}", ""),
    ("the same without a C compiler (torch path, identical output)",
     f"{{{S}[emulate_torch_path_s]:.3f}} s: ratio {{{S}[ratio_torch_path]:.0f}}", ""),
    ("the two fp32 GEMMs per key block alone, as torch.bmm calls", f"{{{S}[gemms_s]:.3f}} s", ""),
    ("peak RSS, one head, N = 65536, d = 64 (a dense N x N fp32 matrix: 16 GiB)",
     "{memory[peak_rss_gib]:.2f} GiB, {memory[wall_s]:.1f} s",
     goal("<= 1 GiB", lambda r: r["memory"]["peak_rss_gib"] <= 1)),
    ("mp backend, one head, N = 64, d = 16, 256 bits", "{mp[wall_s]:.2f} s", ""),
]
def against(F) -> pd.DataFrame:
    """bench/results/against_202234e.json: each workload here and before the redesign, and
    whether both gave the same bits."""
    r = bench(F, "against_202234e")
    return pd.DataFrame([{"workload": k, "now s": cell(w["now_s"]), "at 202234e s":
                          cell(w["then_s"]), "now / then": f"{w['ratio']:.2f}",
                          "rounds": w["rounds"], "same bits": "yes" if w["same_bits"] else "no"}
                         for k, w in r["workloads"].items()])


TABLES = {"EngineExp": exp_table, "BenchAgainst": against, "EngineExpHard": exp_hard,
          "BenchEngine": record("engine", BENCH, ["what", "measured", "goal"])}
