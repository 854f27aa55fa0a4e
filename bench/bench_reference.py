"""Benchmark of the exact reference: certified on one head against the mpmath row loop.

    python bench/bench_reference.py                       # N=4096, d=64, bits 256 and 128
    python bench/bench_reference.py --n 1024 --bits 256 --mp-rows 2

For each working precision: times `reference(method="certified")` (the double-double
fast path, arb for the rows it leaves) on one head
(N x N, d = dv), and the mpmath row loop (`method="mpmath"`, the same bits) on a few
rows, extrapolating its time for the whole head (setup once + N x the per-row time,
from runs of 1 and 1 + mp_rows rows: every row of a non-causal head does the same
work). Also times `method="fp64"` on the head and, for context, a textbook mpmath
row (Python sum of mpf products, as a commonly quoted 3.4 s per N = 128 head was
timed) on one row. Reports wall and CPU seconds (this process and its finished
children, i.e. the certified workers): the machine is shared, and CPU time is far
less disturbed by other jobs. Also checks the certified head bitwise against the arb
path alone (out, lse, row_max, err_bound) on --arb-rows rows spread over the head, and
records the machine, the load average and the command (flashnum.harness.timing).
Prints a table; writes bench/results/reference.json.
"""

from __future__ import annotations

import argparse
import os
import time

import mpmath
import numpy as np
import torch

from flashnum.harness import timing
from flashnum.reference import reference
from flashnum.reference.certified import certified
from flashnum.reference.inputs import visible_len


def timed(fn):
    """(fn(), wall s, CPU s of this process and its ended children: timing.cpu_time)."""
    t, c = time.perf_counter(), timing.cpu_time()
    res = fn()
    return res, time.perf_counter() - t, timing.cpu_time() - c


def textbook_row(q, k, v, bits) -> None:
    """One row the plain way: s_j = sum of mpf products, exp, sum, weighted sums."""
    ctx = mpmath.MPContext()
    ctx.prec = bits
    qi = [ctx.mpf(x) for x in q.tolist()]
    K = [[ctx.mpf(x) for x in row] for row in k.tolist()]
    V = [[ctx.mpf(x) for x in row] for row in v.tolist()]
    sc = 1 / ctx.sqrt(len(qi))
    s = []
    for kj in K:
        acc = ctx.mpf(0)
        for a, b in zip(qi, kj, strict=True):
            acc += a * b
        s.append(acc * sc)
    m = max(s)
    p = [ctx.exp(x - m) for x in s]
    l = sum(p)
    o = [sum(pj * vj[c] for pj, vj in zip(p, V, strict=True)) / l for c in range(len(V[0]))]
    return o


def arb_check(q, k, v, cert, bits, n_rows) -> dict:
    """The certified head against the arb path alone on n_rows rows spread over it."""
    rows = np.unique(np.linspace(0, q.shape[1] - 1, n_rows).round().astype(int))
    vis = visible_len(len(rows), k.shape[1], False)
    arb = certified(q[:, rows], k, v, vis, None, bits, 1, fast=False)
    same = all(torch.equal(a, b[:, rows]) for a, b in
               zip(arb[:4], (cert.out, cert.lse, cert.row_max, cert.err_bound), strict=True))
    return {"arb_rows_checked": len(rows), "arb_rows_bitwise_equal_certified": same}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096, help="sequence length (Nq = Nk)")
    ap.add_argument("--d", type=int, default=64, help="head dim (d = dv)")
    ap.add_argument("--bits", type=int, nargs="+", default=[256, 128], help="precisions")
    ap.add_argument("--mp-rows", type=int, default=3, help="extra rows timed in mpmath")
    ap.add_argument("--workers", type=int, default=None, help="processes for certified")
    ap.add_argument("--arb-rows", type=int, default=64, help="rows checked against arb alone")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "reference.json")
    )
    a = ap.parse_args()

    facts = timing.facts()  # command, CPU model and flags, cores, load, torch
    load0 = os.getloadavg()[0]
    g = torch.Generator().manual_seed(a.seed)
    q, k, v = (torch.randn(1, a.n, a.d, generator=g, dtype=torch.float64) for _ in range(3))
    reference(q[:, :1, :4], k[:, :4, :4], v[:, :4], method="mpmath", cache=False)  # imports

    f64, t_f64, _ = timed(lambda: reference(q, k, v, method="fp64", cache=False))
    runs = []
    cert = None
    for bits in a.bits:
        cert, t_c, c_c = timed(
            lambda b=bits: reference(q, k, v, bits=b, cache=False, workers=a.workers)
        )
        _, t1, c1 = timed(
            lambda b=bits: reference(q[:, :1], k, v, method="mpmath", bits=b, cache=False)
        )
        mp, t2, c2 = timed(
            lambda b=bits: reference(
                q[:, : 1 + a.mp_rows], k, v, method="mpmath", bits=b, cache=False
            )
        )
        row_t, row_c = (t2 - t1) / a.mp_rows, (c2 - c1) / a.mp_rows
        mp_t = max(0.0, t1 - row_t) + a.n * row_t  # extrapolated to the whole head
        mp_c = max(0.0, c1 - row_c) + a.n * row_c
        _, tb_t, tb_c = timed(lambda b=bits: textbook_row(q[0, 0], k[0], v[0], b))
        runs.append(
            {
                "bits": bits,
                "certified_wall_s": t_c,
                "certified_cpu_s": c_c,
                "certified_workers": cert.info["workers"],
                "certified_max_prec": cert.info["max_prec"],
                "certified_uncertain_rows": cert.info["uncertain_rows"],
                "certified_fast_rows": cert.info["fast_rows"],
                "mpmath_per_row_wall_s": row_t,
                "mpmath_per_row_cpu_s": row_c,
                "mpmath_head_wall_s_extrapolated": mp_t,
                "mpmath_head_cpu_s_extrapolated": mp_c,
                "mpmath_rows_timed": 1 + a.mp_rows,
                "mpmath_rows_bitwise_equal_certified": torch.equal(
                    mp.out, cert.out[:, : 1 + a.mp_rows]
                ),
                "speedup_wall": mp_t / t_c,
                "speedup_cpu": mp_c / c_c,
                "textbook_row_wall_s": tb_t,
                "textbook_row_cpu_s": tb_c,
                **arb_check(q, k, v, cert, bits, a.arb_rows),
            }
        )

    err64 = (f64.out - cert.out).abs().amax(-1)
    res = {
        **facts,
        "numpy": np.__version__,
        "n": a.n,
        "d": a.d,
        "seed": a.seed,
        "runs": runs,
        "fp64_wall_s": t_f64,
        "fp64_max_err": err64.max().item(),
        "fp64_max_bound": f64.err_bound.max().item(),
        "fp64_bound_holds": bool((err64 <= f64.err_bound).all()),
        "loadavg_1min_start_end": [load0, os.getloadavg()[0]],
    }

    print(
        f"one head, N={a.n}, d={a.d}; {res['cpu_model']}, {res['cores']} cores, load "
        f"average {load0:.1f} at start and {os.getloadavg()[0]:.1f} at the end"
    )
    print(f"{'method':<28} {'bits':>5} {'wall s':>9} {'cpu s':>9}  note")
    for r in runs:
        b = r["bits"]
        print(
            f"{'certified':<28} {b:>5} {r['certified_wall_s']:9.2f} "
            f"{r['certified_cpu_s']:9.2f}  {r['certified_fast_rows']} rows fast, the rest "
            f"arb in {r['certified_workers']} process(es), max precision "
            f"{r['certified_max_prec']}; {r['arb_rows_checked']} rows bitwise equal to arb "
            f"alone: {r['arb_rows_bitwise_equal_certified']}"
        )
        print(
            f"{'mpmath row loop, whole head':<28} {b:>5} "
            f"{r['mpmath_head_wall_s_extrapolated']:9.1f} "
            f"{r['mpmath_head_cpu_s_extrapolated']:9.1f}  extrapolated from "
            f"{r['mpmath_rows_timed']} rows ({r['mpmath_per_row_cpu_s']:.3f} cpu s/row); "
            f"bitwise equal: {r['mpmath_rows_bitwise_equal_certified']}"
        )
        print(
            f"{'  speedup of certified':<28} {b:>5} {r['speedup_wall']:8.0f}x "
            f"{r['speedup_cpu']:8.0f}x"
        )
        print(
            f"{'textbook mpmath, one row':<28} {b:>5} {r['textbook_row_wall_s']:9.3f} "
            f"{r['textbook_row_cpu_s']:9.3f}  (context: Python sum of mpf products)"
        )
    print(
        f"{'fp64':<28} {53:>5} {t_f64:9.2f} {'':>9}  max err {res['fp64_max_err']:.2e} "
        f"<= bound {res['fp64_max_bound']:.2e}: {res['fp64_bound_holds']}"
    )
    print(f"wrote {timing.write(a.out, res)}")


if __name__ == "__main__":
    main()
