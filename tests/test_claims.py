"""The speed figures README.md and docs/ quote from the stored benchmark results
(bench/results/engine.json, reference.json, backward.json, exp_exhaustive.json) are the
figures in those results.

Each claim below is the exact text a document carries, rebuilt from the stored result
with the document's own rounding. Every other quoted number, fact and passage is a named
quantity checked by tests/test_quoted.py (flashnum.figures.docs); a new one goes there.
"""

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def table(name):
    return pd.read_parquet(ROOT / "experiments" / name / "results.parquet")


def doc(path):
    """The text as read: line breaks as spaces, quoted-quantity markers (tests/test_quoted.py,
    `1.84<!--q:Name-->`) invisible."""
    return " ".join(re.sub(r"<!--q:\w+-->", "", (ROOT / path).read_text()).split())


def sci(x, digits=2):
    """2.5e-4 style: `digits` significant digits, no exponent padding."""
    mant, exp = f"{x:.{digits - 1}e}".split("e")
    return f"{mant}e{int(exp)}"


def thousands(n):
    return f"{n:,}"


def engine_bench():
    e = json.loads((RESULTS / "engine.json").read_text())
    s, m = e["speed"], e["memory"]
    loads = (*e["load_average_before"], *e["load_average_after"])
    return [f"{s['emulate_bf16_fa2_s']:.3f} s vs {s['sdpa_fp32_s']:.3f} s: ratio "
            f"{s['ratio']:.2f} (one thread: {s['ratio_one_thread']:.2f})",
            f"{s['emulate_in_place_s']:.3f} s: ratio {s['ratio_in_place']:.2f}",
            f"ratio {s['cpu_ratio_one_thread']:.2f}; {s['cpu_ratio_one_thread_in_place']:.2f}",
            f"{s['emulate_torch_path_s']:.3f} s: ratio {s['ratio_torch_path']:.2f}",
            f"{e['cpu_model']}",
            f"load average between {min(loads):.1f} and {max(loads):.1f}",
            f"| {s['gemms_s']:.3f} s |",
            f"{m['peak_rss_gib']:.2f} GiB, {m['wall_s']:.1f} s",
            f"| {e['mp']['wall_s']:.2f} s |"]


def pct_floor(frac, digits=2):
    """99.99% style, rounded down: a '>=' claim must not round up."""
    return f"{math.floor(frac * 100 * 10**digits) / 10**digits:.{digits}f}%"


def exp_claims():
    """Hard inputs: torch's float64 value within 4 float64 ulps of an fp32 boundary; the
    exact (mpmath) distance of some is above 4."""
    e = json.loads((RESULTS / "exp_exhaustive.json").read_text())
    fs = ("exp", "exp2")
    hard = sum(len(e[f]["hard_inputs"]) for f in fs)
    exact = sum(d < 4 for f in fs for d in e[f]["hard_boundary_distance_ulps"])
    misses = sum(len(e[f]["torch_float64_misses"]) for f in fs)
    dist = dict(zip(e["exp2"]["hard_inputs"], e["exp2"]["hard_boundary_distance_ulps"],
                    strict=True))
    nonzero = {x: d for x, d in dist.items() if d > 0}
    closest = min(nonzero, key=nonzero.get)
    miss = [x for x in e["exp2"]["torch_float64_misses"] if x < 0][0]
    n = sum(e[f]["inputs"] for f in fs)
    return [f"over all {n / 1e9:.1f}e9 float32 arguments of exp and exp2",
            f"{hard} have a float64 value (torch's) within 4 float64 ulps of an fp32 "
            f"rounding boundary ({exact} of them lie that close exactly, by mpmath)",
            f"rounds {misses} of them to the wrong fp32 value (exp2({miss!r}) lies "
            f"{dist[miss]:.3f} float64 ulp from the boundary; the closest, "
            f"exp2({closest!r}), {nonzero[closest]:.3f} ulp)",
            f"{n / 1e9:.1f}e9 arguments of exp and exp2, no difference, all correctly rounded; "
            f"{hard} arguments have a float64 value within 4 float64 ulps of an fp32 rounding "
            f"boundary, and float64 alone rounds {misses} of them"]


def reference_readme():
    r = json.loads((RESULTS / "reference.json").read_text())
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


def engine_docs():
    e = json.loads((RESULTS / "exp_exhaustive.json").read_text())
    rows = [f"| {f} | {thousands(e[f]['inputs'])} | {e[f]['p_differences']} differences | "
            f"{len(e[f]['hard_inputs'])} | {len(e[f]['torch_float64_misses'])}"
            for f in ("exp", "exp2")]
    x2 = e["exp2"]
    dist = dict(zip(x2["hard_inputs"], x2["hard_boundary_distance_ulps"], strict=True))
    nonzero = {x: d for x, d in dist.items() if d > 0}
    closest = min(nonzero, key=nonzero.get)
    lo, hi = sorted(x2["torch_float64_misses"])
    s = json.loads((RESULTS / "engine.json").read_text())["speed"]
    return rows + [
        f"exp2({closest!r}), {nonzero[closest]:.3f} float64 ulp away",
        f"torch's float64 exp2 misses exp2({lo!r}) ({dist[lo]:.3f} ulp away:",
        f"exp2({hi!r}) ({dist[hi]:.2f} ulp away)",
        f"{s['emulate_bf16_fa2_s']:.3f} s against {s['sdpa_fp32_s']:.3f} s, a ratio of "
        f"{s['ratio']:.2f} ({s['ratio_one_thread']:.2f} on one thread; "
        f"{s['ratio_torch_path']:.2f} through the torch path)",
        f"key block alone take {s['gemms_s']:.3f} s",
        f"{s['ratio_in_place']:.2f} in the in-place path",
        f"fused loop takes {s['cpu_ratio_one_thread']:.2f}x SDPA's and the in-place path "
        f"{s['cpu_ratio_one_thread_in_place']:.2f}x",
        f"of {s['step_overhead_us']:.0f} us"]


def reference_docs():
    r = json.loads((RESULTS / "reference.json").read_text())
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
    assert all(v["mpmath_rows_bitwise_equal_certified"] for v in b.values())
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


def bwd_bench_docs():
    b = json.loads((RESULTS / "backward.json").read_text())
    s, c = b["speed"], b["certified"]
    mem = {m["n"]: m for m in b["memory"]}
    mb = lambda n: f"{mem[n]['peak_rss_over_base_gib'] * 1024:.0f} MB"  # noqa: E731
    assert c["uncertain"] == 0 and c["max_prec"] == 128
    peak = {n: m["peak_rss_over_base_gib"] for n, m in mem.items()}
    fb = s["torch_fp32_sdpa_forward_backward_s"]
    return [f"load average {b['load_average']:.1f}, recorded in the file",
            f"| {s['emulate_bf16_fa2_backward_s']:.2f} s vs {s['torch_fp32_sdpa_backward_s']:.2f} "
            f"s (backward alone): ratio {s['ratio_vs_backward']:.2f}; vs forward + backward "
            f"{fb:.2f} s: {s['ratio_vs_forward_backward']:.2f} |",
            f"| {mb(2048)} (N=2048), {mb(4096)} (4096), {mb(8192)} (8192), {mb(16384)} (16384), "
            f"{mb(65536)} (65536, `--only memory --sizes 65536`: "
            f"{mem[65536]['backward_cpu_s']:.0f} s of CPU for the call): linear; an N x N fp32 "
            f"matrix is {mem[16384]['n_by_n_fp32_gib']:.0f} GiB at 16384, "
            f"{mem[65536]['n_by_n_fp32_gib']:.0f} GiB at 65536",
            f"| {c['wall_s']:.1f} s wall ({c['cpu_s']:.1f} s CPU); 128 bits sufficed",
            f"is {peak[65536] / peak[16384]:.1f}x that at N = 16384"]


CLAIMS = {
    "README.md": [engine_bench, exp_claims, reference_readme],
    "docs/engine.md": [engine_docs],
    "docs/reference.md": [reference_docs],
    "docs/backward.md": [bwd_bench_docs],
}


@pytest.mark.parametrize("path, build", [(p, b) for p, bs in CLAIMS.items() for b in bs],
                         ids=lambda x: x if isinstance(x, str) else getattr(x, "__name__", ""))
def test_every_quoted_number_is_the_number_in_its_table(path, build):
    text = doc(path)
    missing = [c for c in build() if " ".join(c.split()) not in text]
    assert not missing, f"{path} does not say (from its table): {missing}"
