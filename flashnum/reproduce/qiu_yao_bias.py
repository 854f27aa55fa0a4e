"""Qiu & Yao 2025 and the bias of low-precision attention under tied row maxima: the
reproduction of their finding (repro_qiu_yao), flashnum's lowp policy against their
released code bit for bit (qiu_yao_agreement), and where the bias on `ties` comes from
(ties_bias). Each section below describes one.

-- repro_qiu_yao --

Qiu & Yao 2025: biased bf16 rounding of P @ V under repeated row maxima (mean signed
error, z-score), with and without their max adjustment.

    python -m flashnum.run experiment=repro_qiu_yao

-- qiu_yao_agreement --

Bitwise agreement of flashnum's lowp policy with Qiu & Yao's released attention.py: the
table of the experiment qiu_yao_agreement (conf/table/qiu_yao_agreement.yaml; docs/audit.md
and README quote it through flashnum.figures.docs, tests/test_quoted.py).

    FLASHNUM_QIU_YAO=PATH/attention.py python -m flashnum.run experiment=qiu_yao_agreement

Their code (github.com/ucker/why-low-precision-training-fails, attention.py at 02f0ab6; no
licence, so it never enters this repository) is imported from PATH and run unchanged on
CPU: its FlashAttentionFunction with 512 x 512 buckets, every tensor bf16. Its only import
outside torch, einops.rearrange, is used for padding masks, which are not passed here; a
stand-in module is provided when einops is not installed. Their fix is switched by the
environment variable STABLE (read at every block). Without the file the run stops with
one line and the stored table stays as it is (flashnum.harness.tables: `external`).

For each case it compares, element by element, their plain forward (STABLE=0) with
flashnum.attention(precision="bf16", policy="lowp", block_m=512, block_n=512), and their
fix (STABLE=1) with variant="qiu_yao_released" (the model of their code) and with the
idealised variant="qiu_yao" (how far the paper's fix is from their release). Cases:
d = 64 and 128, causal and not, gaussian, peaked ties (logit std 16), gaussian inputs
whose row maxima lie in [0.25, 0.5) (sigma 0.34; the median row max is recorded), and
ties at logit std 8, whose row maxima straddle the clamp onset (23.7). One row per
(case, STABLE, variant); `params` is canonical JSON.

-- ties_bias --

Where the bias of low-precision attention on `ties` comes from: the table of the
experiment ties_bias (conf/table/ties_bias.yaml; docs/bounds.md quotes it).

    python -m flashnum.run experiment=ties_bias

Qiu & Yao 2025: with repeated row maxima (several P exactly 1) and V mostly negative,
bf16 attention has a biased error. For the `ties` distribution (and, for comparison,
gaussian logits with the same V ~ N(v_mean, 0.5^2)), N = 512, d = 64, 4 heads, block_n
64, seed 0, the rows are of three kinds:

    bias         the mean signed error and its z-score of the lowp bf16 policy, of
                 policies rounding only some sites to bf16, of lowp with the final
                 division kept in fp32, ... (section: the inputs and V's mean)
    ulp          with only l and o in bf16: where |o / l| sits inside its bf16 ulp
                 (fractions exact, lower half, tie, upper half) and the mean of
                 |rnd_bf16(o/l)| - |o/l| (run: which)
    attribution  flashnum.analysis.attribution of the mean signed error, ties, lowp
                 bf16, per site (err_only, err_without, total)
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import types

import pandas as pd
import torch

from flashnum.analysis.attribution import attribute
from flashnum.analysis.metrics import signed_err
from flashnum.api import attention
from flashnum.engine.variants import VARIANTS, Variant
from flashnum.inputs.distributions import make
from flashnum.inputs.draws import COMMON
from flashnum.numerics.accumulate import dot, mean
from flashnum.numerics.formats import FORMATS
from flashnum.numerics.policy import make_policy
from flashnum.reference import reference
from flashnum.reproduce.measure import (
    errors,
    head_mean_z,
    reference64,
)
from flashnum.reproduce.reproduction import Reproduction

# -- repro_qiu_yao --


# seeds: independent draws (seed, seed + 1, ...) of every input: each cell is reported
# over them, so that no single draw carries a finding
QY_SIZES = dict(
    full=dict(n=512, heads=32, rows=128, d=64, logit_stds=(1.0, 4.0, 16.0),
              policies=("lowp", "fa2"), broken=True, sweep=(20.0, 40.0, 0.25), seeds=5),
    quick=dict(n=512, heads=32, rows=32, d=64, logit_stds=(16.0,), policies=("lowp",),
               broken=False, sweep=(22.0, 26.0, 0.5), seeds=1),
)
QY_VARIANTS = ("fa2", "qiu_yao", "qiu_yao_released")  # no fix, the paper's, their code's
QY_FLOOR = 1e-10  # their block_row_sums.clamp(min=1e-10)


def qiu_yao_onset(policy: str) -> float:
    """The max logit above which the released fix's clamp replaces the row sum of a row
    with two tied maxima t: the largest P is exp(t - 2t) (beta = 2), the row sum
    2 exp(-t) (the other P are smaller by exp(-(t - s_j))), and the clamp takes over
    when 2 exp(-t) < floor, i.e. t > ln(2 / floor), floor = 1e-10 in l's format."""
    f_l = make_policy(policy, "bf16").fmt("l")
    floor = float(torch.tensor(QY_FLOOR).to(f_l.torch_dtype or torch.float32))
    return math.log(2 / floor)


def qiu_yao(quick: bool = False, seed: int = 0, beta: float = 2.0) -> pd.DataFrame:
    """Mean signed error of bf16 attention on tied row maxima, with and without the fix.

    Their attention.py is pure-PyTorch FA2 with 512 x 512 blocks and every tensor in
    bf16: policy lowp (S, m, P, l, o and o / l rounded to bf16; dots accumulate in fp32
    and P @ V is rounded to bf16, where the tie rounding happens; with several blocks the
    P @ V tile and the block row sum are rounded to bf16 before they are added into o
    and l, as their code does). One key block (N = 512) is their "one block also fails"
    case; the scale is applied as their code does (bf16 logits times the float scale, one
    fp32 product rounded to bf16). fa2 (fp32 state, P cast to bf16) is the kernel
    practice, for contrast. Each runs without the fix (variant fa2), with the paper's
    idealised fix (qiu_yao) and with the fix as their code computes it
    (qiu_yao_released: the window in bf16, the block row sum clamped at 1e-10).

    Inputs: `ties` (every logit, the max included, attained twice exactly; V ~ N(-1,
    0.5^2), 98% negative) at several logit spreads (`logit_std`: the tie mechanism needs
    the non-max P to sum to less than half an ulp of the tied sum, i.e. peaked rows), and
    the controls `gaussian` (V ~ N(0, 1)) and `ties_broken` (the same draw with every key
    moved by a small N(0, (0.05 sqrt(logit_std))^2) perturbation on the same grid, so no
    exact ties remain but V is unchanged). The reference is fp64 attention of the same
    (grid-exact) inputs. `z_heads` is the mean signed error over its standard error
    across independent heads; `z_entries` treats every entry as independent (as
    flashnum.analysis.metrics does) and overstates the evidence. For the adjusted variants,
    `z_fix` is |mean bias without fix| - |mean bias with fix| over the standard error of
    the paired difference over heads, `fix_diff_se` (the paired z towards 0 while the fix
    keeps the sign; negative when it makes |bias| larger). Every input is drawn at
    sizes["seeds"] seeds (seed, seed + 1, ...; column `seed`): the figures pool the heads
    of all seeds and show each seed's z beside. The rows `clamp_sweep`
    (qiu_yao_clamp_sweep, no random draw: seed NaN) measure the released fix's collapse
    against the max logit.
    """
    sz = QY_SIZES["quick" if quick else "full"]
    rows = []
    for s in range(int(seed), int(seed) + sz["seeds"]):
        for dist, ls, q, k, v in _draws(sz, s):
            rows += [dict(r, seed=s) for r in _bias_rows(sz, dist, ls, q, k, v, beta)]
    return pd.DataFrame(rows + [dict(r, seed=math.nan) for r in qiu_yao_clamp_sweep(sz, beta)])


def _draws(sz: dict, seed: int) -> list[tuple]:
    """(distribution, logit std, q, k, v) of every input of one seed."""
    n, d, heads, nrows = sz["n"], sz["d"], sz["heads"], sz["rows"]
    draws = []
    for ls in sz["logit_stds"]:
        inp = make("ties", heads=heads, seq_len_q=nrows, seq_len_k=n, head_dim=d, seed=seed,
                   logit_std=ls)
        q, k, v = inp.tensors()
        g = torch.Generator().manual_seed(int(seed) + 1)
        nudge = 0.05 * math.sqrt(ls) * torch.randn(k.shape, generator=g, dtype=torch.float64)
        draws.append(("ties", ls, q, k, v))
        if sz["broken"]:
            draws.append(("ties_broken", ls, q, COMMON.round(k + nudge), v))
    inp = make("gaussian", heads=heads, seq_len_q=nrows, seq_len_k=n, head_dim=d, seed=seed,
               grid="common")
    draws.append(("gaussian", math.nan, *inp.tensors()))
    return draws


def _bias_rows(sz: dict, dist: str, ls: float, q, k, v, beta: float) -> list[dict]:
    """The bias of every policy and variant on one input (one row each)."""
    n, d, heads, nrows = sz["n"], sz["d"], sz["heads"], sz["rows"]
    ref = reference64(q, k, v, 1.0 / math.sqrt(d))
    frac_neg = float((v < 0).double().mean())
    rows = []
    for pol in sz["policies"]:
        head_bias = {}
        for variant in QY_VARIANTS:
            res = attention(q, k, v, precision="bf16", policy=pol, block_m=512,
                            block_n=512, variant=variant, beta=beta)
            e = errors(res.out, ref)
            head_bias[variant] = mean(res.out - ref, (-1, -2)).reshape(-1)
            z_fix = se_d = math.nan
            fix = "beta" in VARIANTS[variant].params()  # a max adjustment, not plain fa2
            if fix:
                # the shrinkage of |mean bias| over the paired standard error (when the
                # fix keeps the sign: the paired z of the difference, towards 0)
                _, se_d, _ = head_mean_z(head_bias["fa2"] - head_bias[variant])
                shrink = (abs(float(mean(head_bias["fa2"])))
                          - abs(float(mean(head_bias[variant]))))
                z_fix = shrink / se_d if se_d > 0 else math.nan
            rows.append(dict(
                distribution=dist, logit_std=ls, precision="bf16", policy=pol,
                variant=variant, beta=beta if fix else math.nan, n=n, d=d,
                heads=heads, query_rows=nrows, block_m=512, block_n=512,
                v_negative_fraction=frac_neg, metric="mean_signed_err",
                ours=e["mean_signed_err"], ours_se=e["signed_err_se"],
                z_heads=e["z_heads"], z_entries=e["z_entries"], z_fix=z_fix,
                fix_diff_se=se_d, rmse=e["rmse"], published=math.nan,
                published_finding=("removed" if fix else "negative bias")
                if dist == "ties" and pol == "lowp" else ""))
    return rows


def qiu_yao_clamp_sweep(sz: dict, beta: float = 2.0) -> list[dict]:
    """The released fix's clamp collapse against the max logit t of a row.

    One query row per t on the grid sz["sweep"] = (start, stop, step) (every t exact in
    bf16): logits t, t (two tied maxima, V = -1 and -1.125) and -t for the other n - 2
    keys (V = 0.5), formed exactly (q = t e_1, k = +-e_1, scale 1), one key block of n.
    `ours` is out / ref (1: no collapse), `predicted` min(1, 2 exp(-t) / floor) from the
    derivation in qiu_yao_onset, `onset` ln(2 / floor).
    """
    n, d = sz["n"], sz["d"]
    start, stop, step = sz["sweep"]
    t = torch.arange(start, stop + step / 2, step, dtype=torch.float64)
    q = torch.zeros(1, 1, len(t), d, dtype=torch.float64)
    q[..., 0] = t
    k = torch.zeros(1, 1, n, d, dtype=torch.float64)
    k[..., 0] = -1.0
    k[..., :2, 0] = 1.0
    v = torch.full((1, 1, n, d), 0.5, dtype=torch.float64)
    v[..., 0, :], v[..., 1, :] = -1.0, -1.125
    ref = reference64(q, k, v, 1.0)
    rows = []
    for pol in sz["policies"]:
        t_on = qiu_yao_onset(pol)
        floor = 2 * math.exp(-t_on)
        for variant in ("qiu_yao", "qiu_yao_released"):
            res = attention(q, k, v, precision="bf16", policy=pol, block_m=512, block_n=n,
                            variant=variant, beta=beta, scale=1.0)
            ratio = (res.out / ref)[0, 0, :, 0]
            # a variant with a floor (their released code) clamps the row sum and collapses
            clamps = VARIANTS[variant].floor is not Variant.floor
            for i, ti in enumerate(t.tolist()):
                pred = min(1.0, 2 * math.exp(-ti) / floor) if clamps else 1.0
                rows.append(dict(
                    distribution="clamp_sweep", logit_std=math.nan, precision="bf16",
                    policy=pol, variant=variant, beta=beta, n=n, d=d, heads=1, query_rows=1,
                    block_m=512, block_n=n, max_logit=ti, metric="out_over_ref",
                    ours=float(ratio[i]), predicted=pred, onset=t_on, published=math.nan,
                    published_finding=""))
    return rows


REPRODUCTION = Reproduction(
    "qiu_yao", qiu_yao, QY_SIZES,
    display=[
        "distribution", "logit_std", "seed", "max_logit", "policy", "variant", "ours",
        "ours_se",
        "z_heads", "z_entries", "z_fix", "predicted", "published_finding"])


# -- qiu_yao_agreement --


CASES = [  # (distribution, params, N, d, causal)
    ("gaussian", {}, 1024, 64, False),
    ("gaussian", {}, 1024, 128, False),
    ("gaussian", {}, 1024, 64, True),
    ("gaussian", {}, 1024, 128, True),
    ("ties", {"logit_std": 16.0}, 1024, 64, False),
    ("ties", {"logit_std": 16.0}, 1024, 128, True),
    ("gaussian", {"sigma": 0.34}, 1024, 64, False),  # median row max of the logits ~0.37
    ("ties", {"logit_std": 8.0}, 1024, 64, True),  # median row max ~24: the clamp onset
]
PAIRS = ((False, "fa2"), (True, "qiu_yao_released"), (True, "qiu_yao"))  # (STABLE, variant)


def load(path: str):
    """Their FlashAttentionFunction, imported from the file at `path`."""
    if importlib.util.find_spec("einops") is None:
        stub = types.ModuleType("einops")

        def rearrange(*a, **k):
            raise NotImplementedError("einops stand-in: padding masks are not supported")

        stub.rearrange = rearrange
        sys.modules["einops"] = stub
    spec = importlib.util.spec_from_file_location("qiu_yao_attention", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.FlashAttentionFunction


def theirs(fn, q, k, v, causal, stable):
    os.environ["STABLE"] = "1" if stable else "0"
    with torch.no_grad():
        return fn.apply(q, k, v, None, causal, 512, 512)


def ulp_diff(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """The largest |ours - ref| in bf16 ulps of the larger of the two (ulp(y) = 2^(e - 8)
    for y = m 2^e, m in [0.5, 1): bf16 keeps 8 significant bits)."""
    ours, ref = ours.double(), ref.double()
    _, e = torch.frexp(torch.maximum(ours.abs(), ref.abs()))
    ulp = torch.ldexp(torch.ones_like(ours), (e - 8).clamp(min=-133))  # bf16's least: 2^-133
    return float(((ours - ref).abs() / ulp).max())


def qiu_yao_agreement_table(path: str) -> pd.DataFrame:
    """One row per case and (STABLE, variant): the share of bitwise equal outputs, the
    largest difference (absolute and in bf16 ulps), the median row max of the logits."""
    fn = load(path)
    rows = []
    for name, params, n, d, causal in CASES:
        inp = make(name, batch=1, heads=4, seq_len_q=n, head_dim=d, seed=0, **params)
        q, k, v = (x.to(torch.bfloat16) for x in (inp.q, inp.k, inp.v))
        row_max = float((dot(q.double(), k.double().transpose(-1, -2), "fp64") / d**0.5)
                        .amax(-1).median())
        refs = {}
        for stable, variant in PAIRS:
            if stable not in refs:
                refs[stable] = theirs(fn, q, k, v, causal, stable)
            ref = refs[stable]
            ours = attention(q, k, v, precision="bf16", policy="lowp", block_m=512,
                             block_n=512, causal=causal, variant=variant).out
            same = float((ours.to(torch.bfloat16) == ref).double().mean())
            diff = (ours - ref.double()).abs().max().item()
            rows.append(dict(distribution=name, params=json.dumps(params, sort_keys=True),
                             n=n, d=d, causal=causal, stable=stable, variant=variant,
                             bitwise=same, max_diff=diff, max_ulp_diff=ulp_diff(ours, ref),
                             median_row_max=row_max))
            print(f"{name} {params} N={n} d={d} causal={causal} STABLE={int(stable)} vs "
                  f"{variant}: bitwise {100 * same:.2f}%, max |diff| {diff:.3g}", flush=True)
    return pd.DataFrame(rows)


# -- ties_bias --


N, D, HEADS, BLOCK_N = 512, 64, 4, 64


def _ties_cases() -> dict:
    lowp, exact = make_policy("lowp", "bf16"), make_policy("exact", "bf16")
    return {
        "lowp": (lowp, {}),
        "lowp, one key block": (lowp, {"block_n": N}),
        "lowp, qiu_yao variant": (lowp, {"variant": "qiu_yao"}),
        "only l, o, div in bf16": (exact.with_sites(l="bf16", o="bf16", div="bf16"), {}),
        "only l, o in bf16": (exact.with_sites(l="bf16", o="bf16"), {}),
        "only div in bf16": (exact.with_sites(div="bf16"), {}),
        "lowp, div and out in fp32": (lowp.with_sites(div="fp32", out="fp32"), {}),
        "lowp, P @ V summed in bf16": (lowp.with_sites(pv_acc="bf16"), {}),
        "fa2": (make_policy("fa2", "bf16"), {}),
    }


def _ties_bias_rows(v_means) -> list[dict]:
    rows = []
    for v_mean in v_means:
        for name in ("ties", "gaussian"):
            inp = make(name, heads=HEADS, seq_len_q=N, head_dim=D, seed=0, block_n=BLOCK_N,
                       **({"v_mean": v_mean} if name == "ties" else {}))
            v = inp.v if name == "ties" else 0.5 * inp.v + v_mean
            ref = reference(inp.q, inp.k, v).out
            for label, (pol, kw) in _ties_cases().items():
                kw = {"block_n": BLOCK_N, **kw}
                out = attention(inp.q, inp.k, v, precision="bf16", policy=pol, **kw).out
                s = signed_err(out, ref)
                rows.append(dict(kind="bias", section=f"{name}, V ~ N({v_mean}, 0.5^2)",
                                 run=label, mean_signed_err=float(s["mean_signed_err"]),
                                 z=float(s["signed_err_z"])))
    return rows


def _ties_ulp_rows() -> list[dict]:
    # the quotient o / l of bf16 state: with every other site exact, the division runs in
    # float64, so the output is that quotient exactly; where does it sit inside its bf16 ulp?
    inp = make("ties", heads=HEADS, seq_len_q=N, head_dim=D, seed=0, block_n=BLOCK_N)
    bf16, exact = FORMATS["bf16"], make_policy("exact", "bf16")
    q = attention(inp.q, inp.k, inp.v, policy=exact.with_sites(l="bf16", o="bf16"),
                  block_n=BLOCK_N).out.abs()
    pos = q / bf16.ulp(q) - torch.floor(q / bf16.ulp(q))
    fractions = {"exact": pos == 0, "lower half": (pos > 0) & (pos < 0.5), "tie": pos == 0.5,
                 "upper half": pos > 0.5}
    rows = [dict(kind="ulp", section="only l, o in bf16", run=k,
                 value=float(m.double().mean())) for k, m in fractions.items()]
    rows.append(dict(kind="ulp", section="only l, o in bf16", run="mean shift",
                     value=float(mean(bf16.round(q) - q))))
    return rows


def _ties_attribution_rows() -> list[dict]:
    inp = make("ties", heads=HEADS, seq_len_q=N, head_dim=D, seed=0, block_n=BLOCK_N)
    t = attribute(inp.q, inp.k, inp.v, precision="bf16", policy="lowp", block_n=BLOCK_N)
    t = t[t.metric == "mean_signed"]
    return [dict(kind="attribution", section="ties, lowp bf16", run=r["site"],
                 format=str(r["format"]), err_only=float(r["err_only"]),
                 err_without=float(r["err_without"]), total=float(r["total"]))
            for _, r in t.iterrows()]


def ties_bias_table(v_means=(-1.0, -0.75, 1.0)) -> pd.DataFrame:
    torch.set_num_threads(1)
    return pd.DataFrame(_ties_bias_rows(v_means) + _ties_ulp_rows() + _ties_attribution_rows())
