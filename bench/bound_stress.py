"""Randomised stress test of flashnum's deterministic bound (far beyond the unit tests).

    python bench/bound_stress.py --seconds 600 --seed 0
    python bench/bound_stress.py --family overflow --seconds 300 --seed 0

--family catalogue (default) draws random cases until the time is up: every catalogue
distribution (but worst_case), Nq <= 160, d in {4, 16, 32, 64, 128}, 1-2 heads, block_n
1..128, block_m, every order, variant (lazy with tau 0.5/2/8), rounding (nearest,
stochastic), precision (fp64, fp32, tf32, fp16, bf16, fp8) and preset policy, causal or
not, n_rescales given or not.

--family overflow draws small cases whose values sit near a format's largest number:
fp16, bf16, fp8_e4m3, fp8_e5m2; naive, lowp and fa2, and fa2/lowp with the QK^T
accumulator in the narrow format; the unscaled dot, the scaled logit or V placed within
2^-8..2^3 times the format's max, scale 2^-20..1 or 1/sqrt(d), keys of both signs (partial
sums larger than the dot), every variant and order; reference: float64 with its
a-priori err_bound (flashnum.reference method="fp64").

Both check, for every finite bound, that the output is finite and max_j |out_ij - ref_ij|
- ref.err_bound_i <= bound_rows_i for every row, and print every violation, then "finite
and held in X of Y, vacuous (infinite) in Z", the tightest case (smallest bound /
measured) and where the infinite bounds were. Exit status 1 if any violation was found.
"""

import argparse
import math
import random
import sys
import time
import warnings
from collections import Counter

import torch

from flashnum.analysis.bounds import bound
from flashnum.engine import attention
from flashnum.inputs.distributions import DISTRIBUTIONS, make
from flashnum.numerics.formats import get_format
from flashnum.numerics.policy import make_policy
from flashnum.reference import reference


def catalogue_case(rng, names):
    """(q, k, v, attention kwargs, bound kwargs) of one catalogue case, or None."""
    name = rng.choice(names)
    n, d = rng.randint(8, 160), rng.choice([4, 16, 32, 64, 128])
    nk = None if name != "masked" else n - rng.randint(1, n // 2)
    bn = max(1, min(rng.choice([1, 2, 4, 8, 16, 32, 64, 128]), (nk or n) // 2))
    try:
        inp = make(name, seq_len_q=n, seq_len_k=nk, head_dim=d, seed=rng.randint(0, 99),
                   block_n=bn, heads=rng.choice([1, 2]))
    except ValueError:
        return None  # a shape the distribution does not support
    causal = inp.causal or rng.random() < 0.2
    kw = dict(precision=rng.choice(["bf16", "fp16", "fp32", "tf32", "fp8_e4m3", "fp8_e5m2",
                                    "fp64"]),
              policy=rng.choice(["fa2", "naive", "lowp", "exact"]), block_n=bn,
              causal=causal, scale=inp.scale,
              variant=rng.choice(["fa2", "fa1", "exp2", "lazy", "qiu_yao"]),
              rounding=rng.choice(["nearest", "nearest", "stochastic"]),
              tau=rng.choice([0.5, 2.0, 8.0]))
    run = dict(block_m=rng.choice([1, 8, 16, 64]),
               order=rng.choice(["forward", "reverse", "random", "max_ascending",
                                 "max_descending"]), seed=rng.randint(0, 9))
    return (inp.q, inp.k, inp.v, kw, run, (name, n, d))


def overflow_case(rng, names=None):
    """One small case with the dot, the logit or V near a format's largest number."""
    precision = rng.choice(["fp16", "bf16", "fp8_e4m3", "fp8_e5m2"])
    fmax = get_format(precision).max
    preset = rng.choice(["naive", "lowp", "fa2"])
    pol = make_policy(preset, precision)
    if rng.random() < 0.3 and pol.structure == "flash":
        pol = pol.with_sites(qk_acc=precision)  # every partial sum rounded in the format
        preset += "+qk_acc"
    nq, nk, d = rng.randint(1, 6), rng.randint(2, 24), rng.choice([1, 2, 4, 8, 16, 64, 256])
    scale = rng.choice([None, 2.0 ** -rng.uniform(0, 20)])
    kappa = scale if scale is not None else d**-0.5
    # the target: the unscaled dot near max, or the scaled logit near max (dot = max/kappa)
    target = fmax * 2.0 ** rng.uniform(-8, 3) * (1.0 if rng.random() < 0.5 else 1 / kappa)
    a = (target / d) ** 0.5
    g = torch.Generator().manual_seed(rng.randint(0, 2**31))
    sign = lambda *s: torch.where(torch.rand(*s, generator=g) < 0.5, -1.0, 1.0)  # noqa: E731
    q = a * sign(nq, d) * (0.5 + 0.5 * torch.rand(nq, d, generator=g))
    k = a * sign(nk, d) * (0.5 + 0.5 * torch.rand(nk, d, generator=g))
    v = torch.randn(nk, rng.choice([1, 4]), generator=g)
    if rng.random() < 0.3:
        v = v * fmax * 2.0 ** rng.uniform(-4, 0) / max(1.0, float(v.abs().max()))
    q, k, v = (x.to(torch.float64).clamp(-fmax, fmax) for x in (q, k, v))
    kw = dict(precision=precision, policy=pol, block_n=rng.choice([1, 2, 4, 8, 16]),
              causal=rng.random() < 0.2, scale=scale,
              variant=rng.choice(["fa2", "fa1", "exp2", "lazy", "qiu_yao"]),
              rounding=rng.choice(["nearest", "nearest", "stochastic"]),
              tau=rng.choice([0.5, 2.0, 8.0]))
    run = dict(block_m=rng.choice([1, 8]), seed=rng.randint(0, 9),
               order=rng.choice(["forward", "reverse", "max_ascending", "max_descending"]))
    return (q, k, v, kw, run, (preset, nq, d))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--family", choices=("catalogue", "overflow"), default="catalogue")
    a = ap.parse_args()
    torch.set_num_threads(1)
    draw = catalogue_case if a.family == "catalogue" else overflow_case
    names = [n for n in DISTRIBUTIONS if n != "worst_case"]
    rng = random.Random(a.seed)
    t0, cases, finite, held, bad = time.time(), 0, 0, 0, 0
    tightest = (math.inf, None)
    infinite = Counter()
    while time.time() - t0 < a.seconds:
        case = draw(rng, names)
        if case is None:
            continue
        q, k, v, kw, run, label = case
        ref = reference(q, k, v, causal=kw["causal"], scale=kw["scale"],
                        method="fp64" if a.family == "overflow" else "certified")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # inputs that overflow the format: expected here
            res = attention(q, k, v, **run, **kw)
        b = bound(q, k, v, n_rescales=res.n_rescales if rng.random() < 0.5 else None, **kw)
        cases += 1
        if not math.isfinite(b["bound"]):
            pname = kw["policy"] if isinstance(kw["policy"], str) else label[0]
            infinite[(kw["precision"], pname)] += 1
            continue
        finite += 1
        err = (res.out - ref.out).abs().amax(-1) - ref.err_bound
        if not bool(torch.isfinite(res.out).all()) or bool((err > b["bound_rows"]).any()):
            bad += 1
            print("VIOLATION", label, kw, run, float(err.max()), b["bound"], flush=True)
            continue
        held += 1
        pos = err > 0
        if bool(pos.any()):
            ratio = float((b["bound_rows"][pos] / err[pos]).min())
            if ratio < tightest[0]:
                pname = kw["policy"] if isinstance(kw["policy"], str) else label[0]
                tightest = (ratio, (*label, kw["precision"], pname, kw["variant"]))
    print(f"{a.family}: {cases} cases in {time.time() - t0:.0f} s; bound finite and held in "
          f"{held} of {cases}, vacuous (infinite) in {cases - finite}, finite and exceeded in "
          f"{bad}")
    print(f"tightest: bound / measured = {tightest[0]:.3f} at {tightest[1]}")
    print("infinite bounds (precision, policy):", dict(infinite))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
