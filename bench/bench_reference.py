"""Benchmark of the exact reference: certified (arb) on one head against mpmath.

    python bench/bench_reference.py                 # N=4096, d=64, bits=256
    python bench/bench_reference.py --n 1024 --bits 128 --mp-rows 2

Times `reference(method="certified")` on one head (N x N, d), the fp64 method on
the same head, and the mpmath row loop (method="mpmath") on a few rows; the
mpmath time of the whole head is extrapolated linearly from those rows (every
row of a non-causal head does the same work: N dots, N exps, dv dots of length N),
and the table says so. Prints a table; writes bench/results/reference.json.
Timings are wall-clock on whatever else the machine is running.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import time

import torch

from flashnum.reference import reference


def cpu() -> float:
    """CPU seconds of this process and its finished children (the certified workers):
    a measure that other jobs on a shared machine disturb far less than wall time."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096, help="sequence length (Nq = Nk)")
    ap.add_argument("--d", type=int, default=64, help="head dim (d = dv)")
    ap.add_argument("--bits", type=int, default=256, help="working precision of both")
    ap.add_argument("--mp-rows", type=int, default=3, help="rows timed in the mpmath loop")
    ap.add_argument("--workers", type=int, default=None, help="processes for certified")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "reference.json")
    )
    a = ap.parse_args()

    load0 = os.getloadavg()[0]  # the machine is shared: say how busy it was
    g = torch.Generator().manual_seed(a.seed)
    q, k, v = (torch.randn(1, a.n, a.d, generator=g, dtype=torch.float64) for _ in range(3))

    t, c = time.perf_counter(), cpu()
    cert = reference(q, k, v, bits=a.bits, cache=False, workers=a.workers)
    t_cert, c_cert = time.perf_counter() - t, cpu() - c

    t = time.perf_counter()
    f64 = reference(q, k, v, method="fp64", cache=False)
    t_fp64 = time.perf_counter() - t

    # mpmath: time 1 row and 1 + rows rows; the difference is the per-row cost, the rest
    # is the one-off conversion of K and V to mpf (charged once to the whole head)
    rows = a.mp_rows
    reference(q[:, :1, :4], k[:, :4, :4], v[:, :4], method="mpmath", cache=False)  # imports
    t, c = time.perf_counter(), cpu()
    reference(q[:, :1], k, v, method="mpmath", bits=a.bits, cache=False)
    t_one, c_one = time.perf_counter() - t, cpu() - c
    t, c = time.perf_counter(), cpu()
    mp = reference(q[:, : 1 + rows], k, v, method="mpmath", bits=a.bits, cache=False)
    t_more, c_more = time.perf_counter() - t, cpu() - c
    per_row, c_per_row = (t_more - t_one) / rows, (c_more - c_one) / rows
    setup, c_setup = max(0.0, t_one - per_row), max(0.0, c_one - c_per_row)
    t_mp = setup + per_row * a.n  # extrapolated: every row of the head costs the same
    c_mp = c_setup + c_per_row * a.n
    rows += 1

    same = torch.equal(mp.out, cert.out[:, :rows])
    err64 = (f64.out - cert.out).abs().amax(-1)
    res = {
        "n": a.n,
        "d": a.d,
        "bits": a.bits,
        "seed": a.seed,
        "certified_s": t_cert,
        "certified_cpu_s": c_cert,
        "certified_workers": cert.info["workers"],
        "certified_max_prec": cert.info["max_prec"],
        "certified_uncertain_rows": cert.info["uncertain_rows"],
        "fp64_s": t_fp64,
        "mpmath_rows": rows,
        "mpmath_per_row_s": per_row,
        "mpmath_setup_s": setup,
        "mpmath_head_s_extrapolated": t_mp,
        "mpmath_head_cpu_s_extrapolated": c_mp,
        "speedup_vs_mpmath": t_mp / t_cert,
        "speedup_vs_mpmath_cpu": c_mp / c_cert,
        "mpmath_rows_bitwise_equal_certified": same,
        "fp64_max_err": err64.max().item(),
        "fp64_max_bound": f64.err_bound.max().item(),
        "fp64_bound_holds": bool((err64 <= f64.err_bound).all()),
        "cpu_count": os.cpu_count(),
        "loadavg_1min_start_end": [load0, os.getloadavg()[0]],
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    w = len("certified (arb)")
    print(
        f"one head, N={a.n}, d={a.d}, bits={a.bits}; shared machine, "
        f"load average {load0:.1f} at start, {os.cpu_count()} cores"
    )
    print(f"{'method':<{w}}  {'wall s':>9}  {'cpu s':>9}  note")
    print(
        f"{'certified (arb)':<{w}}  {t_cert:9.2f}  {c_cert:9.2f}  "
        f"{cert.info['workers']} process(es), max precision {cert.info['max_prec']} bits"
    )
    print(
        f"{'fp64':<{w}}  {t_fp64:9.2f}  {'':>9}  max err {res['fp64_max_err']:.2e} <= "
        f"bound {res['fp64_max_bound']:.2e}: {res['fp64_bound_holds']}"
    )
    print(
        f"{'mpmath':<{w}}  {t_mp:9.1f}  {c_mp:9.1f}  extrapolated: setup + {a.n} x "
        f"{per_row:.3f} s/row, timed on {rows} rows; bitwise equal to certified: {same}"
    )
    print(
        f"certified vs the mpmath row loop: {res['speedup_vs_mpmath']:.0f}x faster in wall "
        f"time, {res['speedup_vs_mpmath_cpu']:.0f}x in CPU time"
    )
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as fh:
        json.dump(res, fh, indent=2)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
