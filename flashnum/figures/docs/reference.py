"""What README.md and docs/reference.md quote from the reference's benchmark: the certified
reference against the mpmath row loop and fp64 (bench/results/reference.json,
python bench/bench_reference.py), as passages.
"""

from __future__ import annotations

from flashnum.figures.docs.digits import sci
from flashnum.figures.docs.sources import bench
from flashnum.figures.quoting import Passage, require


def reference_readme(F):
    r = bench(F, "reference")
    b = {x["bits"]: x for x in r["runs"]}
    r256 = b[256]
    per_row = r256["certified_wall_s"] / r["n"]
    return [f"certified at 256 bits in {r256['certified_wall_s']:.1f} s wall "
            f"({r256['certified_cpu_s']:.1f} s CPU over {r256['certified_workers']} processes; "
            f"{b[128]['certified_wall_s']:.1f} s at 128 bits)",
            f"fp64 method {r['fp64_wall_s']:.1f} s",
            f"({r256['mpmath_rows_timed']} rows timed",
            f"{r256['speedup_wall']:.0f}x faster in wall time",
            f"({r256['speedup_cpu']:.0f}x in CPU time)",
            f"~{round(r256['textbook_row_wall_s'] / per_row, -2):.0f}x faster than a textbook",
            f"{r256['textbook_row_wall_s']:.1f} s per row"]


def reference_docs(F):
    r = bench(F, "reference")
    b = {x["bits"]: x for x in r["runs"]}
    rows = []
    for bits in (256, 128):
        x = b[bits]
        rows.append(f"| certified (arb), 2 processes | {bits} | {x['certified_wall_s']:.1f} | "
                    f"{x['certified_cpu_s']:.1f} |")
        rows.append(f"extrapolated from {x['mpmath_rows_timed']} rows | {bits} | "
                    f"{x['mpmath_head_wall_s_extrapolated']:.0f} | "
                    f"{x['mpmath_head_cpu_s_extrapolated']:.0f} "
                    f"({x['mpmath_per_row_wall_s']:.3f} s/row) |")
    x = b[256]
    per_row = x["certified_wall_s"] / r["n"]
    per_row_cpu = x["certified_cpu_s"] / r["n"]
    lo, hi = r["loadavg_1min_start_end"]
    require(all(v["mpmath_rows_bitwise_equal_certified"] for v in b.values()),
            "the mpmath rows equal the certified ones bit for bit")
    return rows + [
        f"| fp64 (torch) | 53 | {r['fp64_wall_s']:.1f} | |",
        f"one row | 256 | {x['textbook_row_wall_s']:.1f} | {x['textbook_row_cpu_s']:.1f} |",
        f"load average {lo:.1f}-{hi:.1f} during the run",
        f"certified takes {x['certified_wall_s']:.1f} s wall at 256 bits "
        f"({b[128]['certified_wall_s']:.1f} s at 128)",
        f"**{x['speedup_wall']:.0f}x (256 bits) and {b[128]['speedup_wall']:.0f}x (128 bits) "
        f"faster in wall time**, {x['speedup_cpu']:.0f}x and {b[128]['speedup_cpu']:.0f}x in "
        f"CPU time",
        f"2.3 s per row) is {x['textbook_row_wall_s'] / x['mpmath_per_row_wall_s']:.0f}x slower "
        f"per row than the `fdot` loop; against it certified is "
        f"~{round(x['textbook_row_wall_s'] / per_row, -2):.0f}x faster in wall time "
        f"(~{round(x['textbook_row_cpu_s'] / per_row_cpu, -1):.0f}x in CPU time)",
        f"fp64's error on the head ({sci(r['fp64_max_err'])}) sat below its bound "
        f"({sci(r['fp64_max_bound'])})"]


PASSAGES = {
    "ReadmeReference": Passage("README.md: the certified reference's speed "
                               "(bench/results/reference.json)", reference_readme),
    "ReferenceSpeed": Passage("docs/reference.md: the references' times and errors "
                              "(bench/results/reference.json)", reference_docs),
}
