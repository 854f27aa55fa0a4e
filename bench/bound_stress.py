"""Randomised stress test of flashnum's deterministic bound (far beyond the unit tests).

    python bench/bound_stress.py --seconds 600 --seed 0

Draws random cases until the time is up: every catalogue distribution (but worst_case),
Nq <= 160, d in {4, 16, 32, 64, 128}, 1-2 heads, block_n 1..128, block_m, every order,
variant (lazy with tau 0.5/2/8), rounding (nearest, stochastic), precision (fp64, fp32,
tf32, fp16, bf16, fp8) and preset policy, causal or not, n_rescales given or not. Checks
max_j |out_ij - ref_ij| - ref.err_bound_i <= bound_rows_i for every row, and prints every
violation, the number of cases, how many bounds were finite, and the tightest case
(smallest bound / measured). Exit status 1 if any violation was found.
"""

import argparse
import math
import random
import sys
import time
from collections import Counter

import torch

from flashnum.analysis.bounds import bound
from flashnum.engine import attention
from flashnum.inputs.distributions import DISTRIBUTIONS, make
from flashnum.reference import reference


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    names = [n for n in DISTRIBUTIONS if n != "worst_case"]
    rng = random.Random(a.seed)
    t0, cases, finite, bad = time.time(), 0, 0, 0
    tightest = (math.inf, None)
    infinite = Counter()
    while time.time() - t0 < a.seconds:
        name = rng.choice(names)
        n, d = rng.randint(8, 160), rng.choice([4, 16, 32, 64, 128])
        nk = None if name != "masked" else n - rng.randint(1, n // 2)
        bn = max(1, min(rng.choice([1, 2, 4, 8, 16, 32, 64, 128]), (nk or n) // 2))
        try:
            inp = make(name, seq_len_q=n, seq_len_k=nk, head_dim=d, seed=rng.randint(0, 99),
                       block_n=bn, heads=rng.choice([1, 2]))
        except ValueError:
            continue  # a shape the distribution does not support
        causal = inp.causal or rng.random() < 0.2
        kw = dict(precision=rng.choice(["bf16", "fp16", "fp32", "tf32", "fp8_e4m3", "fp8_e5m2",
                                        "fp64"]),
                  policy=rng.choice(["fa2", "naive", "lowp", "exact"]), block_n=bn,
                  causal=causal, scale=inp.scale,
                  variant=rng.choice(["fa2", "fa1", "exp2", "lazy", "qiu_yao"]),
                  rounding=rng.choice(["nearest", "nearest", "stochastic"]),
                  tau=rng.choice([0.5, 2.0, 8.0]))
        ref = reference(inp.q, inp.k, inp.v, causal=causal, scale=inp.scale)
        res = attention(inp.q, inp.k, inp.v, block_m=rng.choice([1, 8, 16, 64]),
                        order=rng.choice(["forward", "reverse", "random", "max_ascending",
                                          "max_descending"]),
                        seed=rng.randint(0, 9), **kw)
        b = bound(inp.q, inp.k, inp.v, n_rescales=res.n_rescales if rng.random() < 0.5 else None,
                  **kw)
        cases += 1
        if not math.isfinite(b["bound"]):
            infinite[(kw["precision"], kw["policy"])] += 1
            continue
        finite += 1
        err = (res.out - ref.out).abs().amax(-1) - ref.err_bound
        if not bool(torch.isfinite(res.out).all()) or bool((err > b["bound_rows"]).any()):
            bad += 1
            print("VIOLATION", name, n, d, kw, float(err.max()), b["bound"], flush=True)
            continue
        pos = err > 0
        if bool(pos.any()):
            ratio = float((b["bound_rows"][pos] / err[pos]).min())
            if ratio < tightest[0]:
                tightest = (ratio, (name, n, d, kw["precision"], kw["policy"], kw["variant"]))
    print(f"{cases} cases in {time.time() - t0:.0f} s, {finite} finite bounds, {bad} violations")
    print(f"tightest: bound / measured = {tightest[0]:.3f} at {tightest[1]}")
    print("infinite bounds (precision, policy):", dict(infinite))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
