"""Randomised stress test of flashnum's deterministic bound (far beyond the unit tests).

    python bench/bound_stress.py --cases 7000 --climb 200 --seed 0
    python bench/bound_stress.py --family overflow --seconds 300 --seed 0

--cases N draws exactly N cases (the same N cases for a seed, at any machine load);
without it, cases are drawn until --seconds of wall time have passed. --climb S then
hill-climbs S steps from each of the 4 tightest cases found (perturbing a few entries of
q, k or v, or copying one key over another to make ties; keeping a step that lowers
bound / measured while the bound stays finite).

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


def check(case, family, use_n_rescales):
    """Run one case: (bound, bound_rows, err_rows, finite output) with err_rows =
    max_j |out_ij - ref_ij| - ref.err_bound_i."""
    q, k, v, kw, run, _ = case
    ref = reference(q, k, v, causal=kw["causal"], scale=kw["scale"],
                    method="fp64" if family == "overflow" else "certified")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # inputs that overflow the format: expected here
        res = attention(q, k, v, **run, **kw)
    b = bound(q, k, v, n_rescales=res.n_rescales if use_n_rescales else None, **kw)
    err = (res.out - ref.out).abs().amax(-1) - ref.err_bound
    return b["bound"], b["bound_rows"], err, bool(torch.isfinite(res.out).all())


def ratio(b_rows, err):
    """The smallest bound / measured over the rows with a positive measured error."""
    pos = err > 0
    return float((b_rows[pos] / err[pos]).min()) if bool(pos.any()) else math.inf


def climb(start, steps, family, rng):
    """Hill-climb from one case: perturb q, k, v (a few entries scaled by 1 + 2^-e * N(0,1),
    or one key copied over another, which makes ties) and keep a perturbation that lowers
    bound / measured while the bound stays finite. (best ratio, exceeded, steps run)."""
    q, k, v, kw, run, label = start
    _, rows, err, _ = check(start, family, False)
    best, bad = ratio(rows, err), 0
    g = torch.Generator().manual_seed(rng.randint(0, 2**31))
    for _ in range(steps):
        q2, k2, v2 = q.clone(), k.clone(), v.clone()
        x = rng.choice([q2, k2, v2])
        if x is k2 and k2.shape[-2] > 1 and rng.random() < 0.3:
            i, j = rng.sample(range(k2.shape[-2]), 2)
            k2[..., j, :] = k2[..., i, :]
        else:
            mask = torch.rand(x.shape, generator=g) < 0.1
            eps = 2.0 ** -rng.randint(1, 12)
            x.mul_(torch.where(mask, 1 + eps * torch.randn(x.shape, generator=g), 1.0))
        case = (q2, k2, v2, kw, run, label)
        b, rows, err, ok = check(case, family, False)
        if not math.isfinite(b):
            continue
        if not ok or bool((err > rows).any()):
            bad += 1
            print("VIOLATION (climb)", label, kw, run, float(err.max()), b, flush=True)
            continue
        r = ratio(rows, err)
        if r < best:
            best, q, k, v = r, q2, k2, v2
    return best, bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=600,
                    help="draw until this much wall time has passed (unless --cases)")
    ap.add_argument("--cases", type=int, default=None,
                    help="draw exactly this many cases (deterministic for a seed)")
    ap.add_argument("--climb", type=int, default=0,
                    help="then hill-climb this many steps from each of the 4 tightest cases")
    ap.add_argument("--report-every", type=int, default=0,
                    help="print the running accounting every this many cases")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--family", choices=("catalogue", "overflow"), default="catalogue")
    a = ap.parse_args()
    torch.set_num_threads(1)
    draw = catalogue_case if a.family == "catalogue" else overflow_case
    names = [n for n in DISTRIBUTIONS if n != "worst_case"]
    rng = random.Random(a.seed)
    t0, cpu0, cases, finite, held, bad = time.time(), time.process_time(), 0, 0, 0, 0
    tight = []  # (ratio, label, case)
    infinite = Counter()
    more = (lambda: cases < a.cases) if a.cases else (lambda: time.time() - t0 < a.seconds)
    reported = 0
    while more():
        if a.report_every and cases % a.report_every == 0 and cases > reported:
            reported = cases  # the first `cases` cases of this seed: rerun with --cases
            print(f"after {cases} cases ({time.process_time() - cpu0:.0f} s CPU): finite and "
                  f"held in {held} of {cases}, vacuous in {cases - finite}, exceeded in {bad}",
                  flush=True)
        case = draw(rng, names)
        if case is None:
            continue
        label, kw, run = case[5], case[3], case[4]
        b, rows, err, ok = check(case, a.family, rng.random() < 0.5)
        cases += 1
        pname = kw["policy"] if isinstance(kw["policy"], str) else label[0]
        if not math.isfinite(b):
            infinite[(kw["precision"], pname)] += 1
            continue
        finite += 1
        if not ok or bool((err > rows).any()):
            bad += 1
            print("VIOLATION", label, kw, run, float(err.max()), b, flush=True)
            continue
        held += 1
        r = ratio(rows, err)
        if r < math.inf:
            tight = sorted(tight + [(r, (*label, kw["precision"], pname, kw["variant"]), case)],
                           key=lambda t: t[0])[:4]
    print(f"{a.family}: {cases} cases in {time.time() - t0:.0f} s ({time.process_time() - cpu0:.0f}"
          f" s CPU); bound finite and held in {held} of {cases}, vacuous (infinite) in "
          f"{cases - finite}, finite and exceeded in {bad}")
    if tight:
        print(f"tightest: bound / measured = {tight[0][0]:.3f} at {tight[0][1]}")
    print("infinite bounds (precision, policy):", dict(infinite))
    if a.climb:
        c0, climbed = time.process_time(), []
        for r, label, case in tight:
            best, b2 = climb(case, a.climb, a.family, rng)
            bad += b2
            climbed.append((best, label, b2))
            print(f"climb from {label} (bound / measured {r:.3f}): {best:.3f} after {a.climb} "
                  f"steps, exceeded in {b2}", flush=True)
        print(f"hill-climb: {a.climb} steps from each of the {len(tight)} tightest cases "
              f"({time.process_time() - c0:.0f} s CPU); tightest bound / measured = "
              f"{min(c[0] for c in climbed):.3f}, exceeded in {sum(c[2] for c in climbed)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
