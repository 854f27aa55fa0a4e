"""The a-priori bound (flashnum.analysis.bounds) put to the test: a randomised stress test of
the deterministic bound, and how tight the bounds are over the input catalogue. One
function per table experiment (conf/table/NAME.yaml names it); each section below
describes one.

-- bound_stress --

Randomised stress test of the deterministic a-priori bound: the table of the experiment
bound_stress (conf/table/bound_stress.yaml; README and docs/bounds.md quote it through
flashnum.figures.docs.bounds).

    python -m flashnum.run experiment=bound_stress

Two families of cases, each drawn by its own random.Random(seed), a fixed number of them
(so the same cases on any machine, at any load):

* catalogue: every catalogue distribution but worst_case, Nq <= 160, d in {4, 16, 32, 64,
  128}, 1-2 heads, block_n 1..128, block_m, every order, variant (lazy with tau 0.5/2/8),
  rounding (nearest, stochastic), precision (fp64, fp32, tf32, fp16, bf16, fp8) and preset
  policy, causal or not, n_rescales given to the bound or not; certified reference.
* overflow: small cases whose values sit near a format's largest number: fp16, bf16,
  fp8_e4m3, fp8_e5m2; naive, lowp and fa2, and fa2/lowp with the QK^T accumulator in the
  narrow format; the unscaled dot, the scaled logit or V placed within 2^-8..2^3 times the
  format's max, scale 2^-20..1 or 1/sqrt(d), keys of both signs (partial sums larger than
  the dot); reference: float64 with its a-priori err_bound (method="fp64").

A case checks, for a finite bound, that the output is finite and that
max_j |out_ij - ref_ij| - ref.err_bound_i <= bound_rows_i on every row i. Then `climb`
hill-climbs a number of steps from each of the 4 tightest held cases of a family (a few
entries of q, k or v scaled by 1 + 2^-e N(0, 1), or one key copied over another to make
ties; a step is kept when it lowers bound / measured and the bound stays finite).

One row per drawn case (kind "draw": its parameters, then bound, measured, ratio and the
verdict) and one per hill-climb (kind "climb": the start case's parameters, the best ratio
reached, the steps and how many exceeded). `stress_summary(df, family)` gives the accounting
the docs quote. The column is `held`, not `bound_holds`: these per-row checks are not the
max_abs_err verdicts of the sweeps' tables, and stay out of their accounting.

-- bound_tightness --

The bound tightness table: flashnum.analysis.bounds against the measured error over the
input catalogue (the table experiment bound_tightness, conf/table/; docs/bounds.md quotes it).

    from flashnum.studies.bounds import tightness_table
    t = tightness_table(seq_len=128, seeds=range(1))
    flashnum.analysis.bounds.tightness_summary(t)
"""

from __future__ import annotations

import math
import random
import warnings

import pandas as pd
import torch

from flashnum.analysis.bounds import bound, verdict
from flashnum.api import attention
from flashnum.engine.variants import variant_of
from flashnum.inputs.distributions import DISTRIBUTIONS, FROM_FILE, make
from flashnum.numerics.formats import get_format
from flashnum.numerics.policy import make_policy
from flashnum.reference import reference

# -- bound_stress --


TIGHTEST = 4  # hill-climbs start from this many of the tightest cases


def catalogue_case(rng):
    """(q, k, v, attention kwargs, run kwargs, row) of one catalogue case, or None when the
    drawn distribution does not support the drawn shape."""
    name = rng.choice([n for n in DISTRIBUTIONS if n != "worst_case"])
    n, d = rng.randint(8, 160), rng.choice([4, 16, 32, 64, 128])
    nk = None if name != "masked" else n - rng.randint(1, n // 2)
    bn = max(1, min(rng.choice([1, 2, 4, 8, 16, 32, 64, 128]), (nk or n) // 2))
    try:
        inp = make(name, seq_len_q=n, seq_len_k=nk, head_dim=d, seed=rng.randint(0, 99),
                   block_n=bn, heads=rng.choice([1, 2]))
    except ValueError:
        return None
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
    return inp.q, inp.k, inp.v, kw, run, dict(inputs=name, n=n, d=d, policy=kw["policy"])


def overflow_case(rng):
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

    def sign(*shape):
        return torch.where(torch.rand(*shape, generator=g) < 0.5, -1.0, 1.0)

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
    return q, k, v, kw, run, dict(inputs="overflow", n=nq, d=d, policy=preset)


DRAW = {"catalogue": catalogue_case, "overflow": overflow_case}


def check(case, family, use_n_rescales):
    """Run one case: (bound, bound_rows, err_rows, finite output) with err_rows =
    max_j |out_ij - ref_ij| - ref.err_bound_i."""
    q, k, v, kw, run, _ = case
    ref = reference(q, k, v, causal=kw["causal"], scale=kw["scale"],
                    method="fp64" if family == "overflow" else "certified")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # inputs that overflow the format: expected here
        res = attention(q, k, v, **run, **kw)
    # the bound takes the variant with its parameters, as drawn for the run
    bkw = {**{key: x for key, x in kw.items() if key != "tau"},
           "variant": variant_of(kw["variant"], tau=kw["tau"])}
    b = bound(q, k, v, n_rescales=res.n_rescales if use_n_rescales else None, **bkw)
    err = (res.out - ref.out).abs().amax(-1) - ref.err_bound
    return b["bound"], b["bound_rows"], err, bool(torch.isfinite(res.out).all())


def ratio(b_rows, err):
    """The smallest bound / measured over the rows with a positive measured error."""
    pos = err > 0
    return float((b_rows[pos] / err[pos]).min()) if bool(pos.any()) else math.inf


def exceeded(rows, err, finite_out) -> bool:
    """A finite bound under a non-finite output, or below the measured error of a row."""
    return not finite_out or bool((err > rows).any())


def climb(start, steps, family, rng):
    """Hill-climb from one case: perturb q, k, v (a few entries scaled by 1 + 2^-e N(0,1),
    or one key copied over another, which makes ties) and keep a perturbation that lowers
    bound / measured while the bound stays finite. (best ratio, steps that exceeded)."""
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
        b, rows, err, ok = check((q2, k2, v2, kw, run, label), family, False)
        if not math.isfinite(b):
            continue
        if exceeded(rows, err, ok):
            bad += 1
            continue
        r = ratio(rows, err)
        if r < best:
            best, q, k, v = r, q2, k2, v2
    return best, bad


def parameters(family: str, index: int, case, n_rescales: bool) -> dict:
    """The columns that say which case a row is."""
    _, _, _, kw, run, label = case
    return dict(family=family, case=index, **label, precision=kw["precision"],
                variant=kw["variant"], tau=kw["tau"] if kw["variant"] == "lazy" else None,
                rounding=kw["rounding"], block_n=kw["block_n"], block_m=run["block_m"],
                order=run["order"], causal=kw["causal"], n_rescales=n_rescales)


def draws(family: str, cases: int, climb_steps: int, seed: int) -> list[dict]:
    """The rows of one family: `cases` draws, then the hill-climbs from the tightest."""
    rng, rows, tight = random.Random(seed), [], []  # tight: (ratio, index, case)
    while len(rows) < cases:
        case = DRAW[family](rng)
        if case is None:
            continue  # a shape the distribution does not support: not a case
        n_rescales = rng.random() < 0.5
        b, b_rows, err, ok = check(case, family, n_rescales)
        row = parameters(family, len(rows), case, n_rescales)
        finite = math.isfinite(b)
        bad = finite and exceeded(b_rows, err, ok)
        r = ratio(b_rows, err) if finite and not bad else math.nan
        rows.append({**row, "kind": "draw", "bound": b, "measured": float(err.max()),
                     "ratio": r, "output_finite": ok, "bound_finite": finite,
                     "held": (not bad) if finite else None, "exceeded": int(bad),
                     "steps": 0})
        if finite and not bad and r < math.inf:  # the ties keep the earlier case
            tight = sorted(tight + [(r, row["case"], case)], key=lambda t: t[0])[:TIGHTEST]
    for _, index, case in tight if climb_steps else ():
        best, bad = climb(case, climb_steps, family, rng)
        start = {k: rows[index][k] for k in parameters(family, index, case, False)}
        rows.append({**start, "kind": "climb", "bound": math.nan, "measured": math.nan,
                     "ratio": best, "output_finite": None, "bound_finite": None,
                     "held": None, "exceeded": bad, "steps": climb_steps})
    return rows


def bound_stress_table(families: dict, seed: int = 0) -> pd.DataFrame:
    """families: {name: {cases: N, climb: S}}; one thread, so that every dot product sums
    in the same order on any machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rows = [r for family, a in families.items()
                for r in draws(family, a["cases"], a.get("climb", 0), seed)]
    finally:
        torch.set_num_threads(threads)
    df = pd.DataFrame(rows)
    return df[["family", "kind", "case"] + [c for c in df.columns
                                            if c not in ("family", "kind", "case")]]


def stress_summary(df: pd.DataFrame, family: str) -> dict:
    """The accounting of one family: cases, held, vacuous, exceeded, the tightest draw (its
    ratio and row) and the hill-climbs (steps, starts, best ratio, exceeded; None without)."""
    d = df[(df.family == family) & (df.kind == "draw")]
    c = df[(df.family == family) & (df.kind == "climb")]
    held = d[d.held == True]  # noqa: E712 (an object column: True, False or None)
    tightest = held.loc[held.ratio.idxmin()] if len(held) else None
    return dict(cases=len(d), held=len(held), vacuous=int((d.bound_finite == False).sum()),  # noqa: E712
                exceeded=int(d.exceeded.sum()), tightest=tightest,
                climb=(int(c.steps.iloc[0]), len(c), float(c.ratio.min()),
                       int(c.exceeded.sum())) if len(c) else None)


# -- bound_tightness --


def tightness_table(distributions=None, *, policies=("fa2", "naive", "lowp"),
                    precisions=("bf16", "fp16", "fp32"), block_ns=(16, 64),
                    orders=("forward", "reverse"), variant="fa2", seq_len=256, head_dim=64,
                    heads=1, seeds=(0,), prob=True, delta=1e-3):
    """One row per case: the measured max |out - ref|, the bounds, and their ratio.

    measured is max_ij |out - ref| (ref certified, flashnum.reference); holds checks
    measured <= bound + max ref.err_bound. tightness = bound / measured (>= 1 when the
    bound holds; inf bounds, e.g. a site that may overflow, give inf). The naive policy
    ignores tiling and order: it runs once per (distribution, seed, precision, block_n).
    """
    names = [n for n in DISTRIBUTIONS if n not in FROM_FILE] if distributions is None else list(
        distributions)
    rows = []
    for name in names:
        for seed in seeds:
            for bn in block_ns:
                nk = seq_len - seq_len // 4 if name == "masked" else None
                try:
                    inp = make(name, heads=heads, seq_len_q=seq_len, seq_len_k=nk,
                               head_dim=head_dim, seed=seed, block_n=bn)
                except ValueError:
                    continue  # e.g. late_max needs >= 2 key blocks
                ref = reference(inp.q, inp.k, inp.v, causal=inp.causal, scale=inp.scale)
                ref_err = float(ref.err_bound.max())
                for policy in policies:
                    for precision in precisions:
                        for order in (orders if policy != "naive" else orders[:1]):
                            kw = dict(precision=precision, policy=policy, block_n=bn,
                                      causal=inp.causal, scale=inp.scale, variant=variant)
                            res = attention(inp.q, inp.k, inp.v, order=order, **kw)
                            b = bound(inp.q, inp.k, inp.v, n_rescales=res.n_rescales,
                                      prob=prob, delta=delta, **kw)
                            err = float((res.out - ref.out).abs().max())
                            ratio = lambda x, e=err: x / e if e > 0 else math.inf  # noqa: E731
                            fin, holds = verdict(b["bound"], err - ref_err)
                            holds_prob = verdict(b["bound_prob"], err - ref_err)[1]
                            rows.append(dict(
                                distribution=name, seed=seed, policy=policy,
                                precision=precision, block_n=bn, order=order, variant=variant,
                                measured=err, ref_err=ref_err, bound=b["bound"],
                                bound_prob=b["bound_prob"], tightness=ratio(b["bound"]),
                                tightness_prob=ratio(b["bound_prob"]),
                                bound_finite=fin, holds=holds, holds_prob=holds_prob,
                                dominant_site=b["dominant_site"],
                                first_order=b["first_order"],
                            ))
    return pd.DataFrame(rows)
