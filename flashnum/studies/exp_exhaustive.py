"""Exhaustive check of the exp site: every float32 argument, native kernel against the torch path;
the table of the experiment exp_exhaustive (conf/table/exp_exhaustive.yaml; README and
docs/engine.md quote it through flashnum.figures.quantities and flashnum.figures.docs).

    python -m flashnum.run experiment=exp_exhaustive      # every argument, minutes

The engine rounds exp(x) (and exp2(x), the exp2 variant) into fp32 from a float64
evaluation. It has two implementations: the torch path (flashnum.numerics.elementary's
correctly rounded float64 exp, then a cast) and flashnum.engine.native (one fused C pass,
its own float64 exp). For every float32 x in the
range where the fp32 result is neither 0 nor inf ([-104, 89] for exp, [-151, 129]
for exp2; outside it both give 0 or inf), the rows `exp` and `exp2`

1. compare the two fp32 results, and the bf16 cast of P the kernel also makes against
   torch's cast: the count of differences must be 0;
2. prove both correctly rounded: an input is "hard" when the correctly rounded float64 value lies
   within 4 float64 ulps of an fp32 rounding boundary (a midpoint between two fp32
   values); every other input rounds correctly for any float64 evaluation with an error
   under 2 ulps, and the hard ones are checked against mpmath at 200 bits (their exact
   distance to the boundary is recorded);
3. check that the hard inputs are exactly flashnum.engine.native.HARD, the list both
   paths correct themselves on (a float64 evaluation alone misses a few of them);

and the row `round_bf16` compares the kernel's bf16 rounding (inputs and output sites)
with torch's cast on every float32 bit pattern (2^32), NaNs compared as NaN. List columns
(hard_inputs, ...) are canonical JSON; `summary(df)` decodes them, one dict per check.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd
import torch

from flashnum.engine import native
from flashnum.numerics import elementary

RANGES = {"exp": (-104.0, 89.0), "exp2": (-151.0, 129.0)}
WINDOW = 4  # float64 ulps around an fp32 midpoint that make an input "hard"
CHUNK = 1 << 24
LISTS = ("hard_inputs", "hard_boundary_distance_ulps", "hard_not_correctly_rounded",
         "float64_misses")
COUNTS = ("step", "inputs", "p_differences", "bf16_cast_differences", "differences", "threads")


def f32_bits(x: float) -> int:
    return int(np.float32(x).view(np.uint32))


def inputs(lo: float, hi: float, step: int):
    """Every `step`-th float32 in [lo, hi], by bit pattern, in chunks (both signs)."""
    spans = [(f32_bits(0.0), f32_bits(hi)), (f32_bits(-0.0), f32_bits(lo))]
    for a, b in spans:
        for c in range(a, b + 1, CHUNK * step):
            idx = torch.arange(c, min(c + CHUNK * step, b + 1), step, dtype=torch.int64)
            yield idx.to(torch.int32).view(torch.float32)  # two's complement wrap: same bits


def near_midpoint(y: torch.Tensor) -> torch.Tensor:
    """y (float64) within WINDOW ulps of a midpoint between consecutive fp32 values."""
    normal = y >= 2.0**-126
    low = (y.view(torch.int64) & ((1 << 29) - 1)) - (1 << 28)
    near = normal & (low.abs() <= WINDOW)
    # subnormal fp32 range: midpoints are the odd multiples of 2^-150
    sub = ~normal & (y > 0)
    ys = y[sub] * 2.0**150  # exact
    d = (ys - 2 * torch.floor(ys / 2) - 1).abs()  # distance to the odd integer
    ulp = torch.nextafter(ys, torch.full_like(ys, np.inf)) - ys
    near[sub] = d <= WINDOW * ulp
    return near


def boundary_distance(x: float, base2: bool) -> float:
    """Distance of exp(x) (exp2) from the nearest fp32 rounding boundary, in float64 ulps."""
    import mpmath as mp

    with mp.workprec(200):
        v = mp.mpf(2) ** x if base2 else mp.exp(x)
        f = np.float32(float(v))
        nb = np.nextafter(f, np.float32(0) if mp.mpf(float(f)) > v else np.float32(np.inf))
        mid = (mp.mpf(float(f)) + mp.mpf(float(nb))) / 2
        return float(abs(v - mid) / mp.mpf(np.spacing(float(v))))


def check(fn: str, step: int) -> dict:
    """The row of exp or exp2: every step-th argument of its range."""
    base2 = fn == "exp2"
    lo, hi = RANGES[fn]
    n = diff_p = diff_pc = 0
    hard = []
    t0 = time.perf_counter()
    for x in inputs(lo, hi, step):
        y = elementary.exp2(x.double()) if base2 else elementary.exp(x.double())
        ref = y.float()
        native.fix_float64(x, ref, base2)  # the engine's torch path, as Arith.exp runs it
        p, pc = torch.empty_like(x), torch.empty_like(x)
        if not native.exp_rows(x, None, p, pc, "bf16", base2):
            raise RuntimeError(f"native kernel unavailable: {native.status()}")
        n += x.numel()
        diff_p += int((p != ref).sum())
        diff_pc += int((pc != ref.bfloat16().float()).sum())
        near = near_midpoint(y)
        hard += [(float(a), float(b), float(c))
                 for a, b, c in zip(x[near], ref[near], p[near], strict=True)]
    wrong = [h for h in hard if not (native.correctly_rounded(h[0], base2) == h[1] == h[2])]
    return {"check": fn, "step": step, "lo": lo, "hi": hi, "inputs": n,
            "p_differences": diff_p, "bf16_cast_differences": diff_pc,
            "hard_inputs": [h[0] for h in hard],
            "hard_boundary_distance_ulps": [boundary_distance(h[0], base2) for h in hard],
            "hard_inputs_known": sorted(h[0] for h in hard) == sorted(native.HARD[fn]),
            "hard_not_correctly_rounded": [w[0] for w in wrong],
            "float64_misses": [h for h, _ in native.float64_fixes(base2)],
            "seconds": time.perf_counter() - t0}


def check_bf16(step: int) -> dict:
    """flashnum.engine.native.round_bf16 against torch's cast on every float32 bit pattern."""
    n = diff = 0
    t0 = time.perf_counter()
    for a in range(0, 1 << 32, CHUNK * step):
        bits = torch.arange(a, min(a + CHUNK * step, 1 << 32), step, dtype=torch.int64)
        x = bits.to(torch.int32).view(torch.float32)
        y, ref = native.round_bf16(x), x.bfloat16().float()
        nan = torch.isnan(ref)
        diff += int(((y != ref) & ~nan).sum()) + int((torch.isnan(y) != nan).sum())
        n += x.numel()
    return {"check": "round_bf16", "step": step, "inputs": n, "differences": diff,
            "hard_inputs_known": None,
            "seconds": time.perf_counter() - t0}


def exp_exhaustive_table(step: int = 1) -> pd.DataFrame:
    """The rows exp, exp2 and round_bf16 (every step-th argument; 1: all of them)."""
    if not native.available():
        raise RuntimeError(f"exp_exhaustive checks the native kernel: {native.status()}")
    rows = []
    for fn in RANGES:
        r = check(fn, step)
        print(f"{fn}: {r['inputs']:,} inputs in {r['seconds']:.0f} s: {r['p_differences']} "
              f"differences in P, {r['bf16_cast_differences']} in its bf16 cast; "
              f"{len(r['hard_inputs'])} hard inputs, {len(r['hard_not_correctly_rounded'])} "
              f"not correctly rounded", flush=True)
        rows.append({**r, **{k: json.dumps(r[k]) for k in LISTS}})
    r = check_bf16(step)
    print(f"bf16 rounding: {r['inputs']:,} float32 bit patterns in {r['seconds']:.0f} s: "
          f"{r['differences']} differences from torch's cast", flush=True)
    rows.append(r)
    return pd.DataFrame(rows).assign(native=native.status(), threads=torch.get_num_threads())


def summary(df: pd.DataFrame) -> dict:
    """{check: {column: value}} of the stored rows, the JSON lists decoded (the layout of
    the former bench/results/exp_exhaustive.json)."""
    out = {}
    for rec in df.to_dict("records"):
        row = {k: v for k, v in rec.items() if v is not None
               and not (isinstance(v, float) and np.isnan(v))}
        out[rec["check"]] = {k: json.loads(v) if k in LISTS else int(v) if k in COUNTS else v
                             for k, v in row.items()}
    return out
