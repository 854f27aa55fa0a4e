"""Qiu & Yao 2025: biased bf16 rounding of P @ V under repeated row maxima (mean signed
error, z-score), with and without their max adjustment.

    python -m flashnum.run experiment=repro_qiu_yao
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from flashnum.api import attention
from flashnum.engine.variants import VARIANTS, Variant
from flashnum.inputs.distributions import make
from flashnum.inputs.draws import COMMON
from flashnum.numerics.accumulate import mean
from flashnum.numerics.policy import make_policy
from flashnum.reproduce.measure import (
    errors,
    head_mean_z,
    reference64,
)
from flashnum.reproduce.reproduction import Reproduction

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
