"""What docs/reference.md shows of the certified reference's benchmark
(bench/results/reference.json, python bench/bench_reference.py): one table generated whole.
"""

from __future__ import annotations

import pandas as pd

from flashnum.figures.docs.sources import bench
from flashnum.figures.quoting import require


def reference_bench(F) -> pd.DataFrame:
    """One head, N = 4096, d = 64: the certified reference and the mpmath row loop at each
    precision, and torch's fp64; the claims of the text below it checked here."""
    r = bench(F, "reference")
    require(all(x["mpmath_rows_bitwise_equal_certified"] and x["arb_rows_bitwise_equal_certified"]
                for x in r["runs"]), "mpmath and arb alone agree with certified bitwise")
    require(min(x["speedup_cpu"] for x in r["runs"]) >= 100 and r["fp64_bound_holds"],
            "the >= 100x goal holds at every precision; fp64's error sits below its bound")
    rows = []
    for x in r["runs"]:
        rows += [{"method": "certified (fast path, arb for the rest)", "bits": x["bits"],
                  "wall s": f"{x['certified_wall_s']:.1f}", "CPU s": f"{x['certified_cpu_s']:.1f}",
                  "": f"fast path settles {x['certified_fast_rows']:,} of {r['n']:,} rows"},
                 {"method": f"mpmath row loop, extrapolated from {x['mpmath_rows_timed']} rows",
                  "bits": x["bits"], "wall s": f"{x['mpmath_head_wall_s_extrapolated']:.0f}",
                  "CPU s": f"{x['mpmath_head_cpu_s_extrapolated']:.0f} "
                           f"({x['mpmath_per_row_cpu_s']:.3f} s/row)",
                  "": f"certified {x['speedup_cpu']:.0f}x faster in CPU time, "
                      f"{x['speedup_wall']:.0f}x in wall; a textbook row "
                      f"{x['textbook_row_wall_s']:.1f} s wall"}]
    rows.append({"method": "fp64 (torch)", "bits": 53, "wall s": f"{r['fp64_wall_s']:.1f}",
                 "CPU s": "", "": f"largest error {r['fp64_max_err']:.2g}, its bound "
                                  f"{r['fp64_max_bound']:.2g}"})
    load = r["loadavg_1min_start_end"]
    rows.append({"method": "load average (1 min) at the start, the end", "bits": "",
                 "wall s": f"{load[0]:.1f}", "CPU s": f"{load[1]:.1f}", "": ""})
    return pd.DataFrame(rows)


TABLES = {"ReferenceBench": reference_bench}
