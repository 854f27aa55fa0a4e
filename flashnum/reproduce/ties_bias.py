"""Where the bias of low-precision attention on `ties` comes from: the table of the
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

import pandas as pd
import torch

from flashnum.analysis.attribution import attribute
from flashnum.analysis.metrics import signed_err
from flashnum.api import attention
from flashnum.inputs.distributions import make
from flashnum.numerics.accumulate import mean
from flashnum.numerics.formats import FORMATS
from flashnum.numerics.policy import make_policy
from flashnum.reference import reference

N, D, HEADS, BLOCK_N = 512, 64, 4, 64


def _cases() -> dict:
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


def _bias_rows(v_means) -> list[dict]:
    rows = []
    for v_mean in v_means:
        for name in ("ties", "gaussian"):
            inp = make(name, heads=HEADS, seq_len_q=N, head_dim=D, seed=0, block_n=BLOCK_N,
                       **({"v_mean": v_mean} if name == "ties" else {}))
            v = inp.v if name == "ties" else 0.5 * inp.v + v_mean
            ref = reference(inp.q, inp.k, v).out
            for label, (pol, kw) in _cases().items():
                kw = {"block_n": BLOCK_N, **kw}
                out = attention(inp.q, inp.k, v, precision="bf16", policy=pol, **kw).out
                s = signed_err(out, ref)
                rows.append(dict(kind="bias", section=f"{name}, V ~ N({v_mean}, 0.5^2)",
                                 run=label, mean_signed_err=float(s["mean_signed_err"]),
                                 z=float(s["signed_err_z"])))
    return rows


def _ulp_rows() -> list[dict]:
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


def _attribution_rows() -> list[dict]:
    inp = make("ties", heads=HEADS, seq_len_q=N, head_dim=D, seed=0, block_n=BLOCK_N)
    t = attribute(inp.q, inp.k, inp.v, precision="bf16", policy="lowp", block_n=BLOCK_N)
    t = t[t.metric == "mean_signed"]
    return [dict(kind="attribution", section="ties, lowp bf16", run=r["site"],
                 format=str(r["format"]), err_only=float(r["err_only"]),
                 err_without=float(r["err_without"]), total=float(r["total"]))
            for _, r in t.iterrows()]


def ties_bias_table(v_means=(-1.0, -0.75, 1.0)) -> pd.DataFrame:
    torch.set_num_threads(1)
    return pd.DataFrame(_bias_rows(v_means) + _ulp_rows() + _attribution_rows())
