"""FlashAttention-3 (Shah et al. 2024), Table 3: its reproduction over a search of protocols
(repro_fa3_table3), and its fp16 pair at one protocol fixed in advance, over seeds (the
table experiments fa3_protocol and fa3_protocol_heldout). Each section below describes one.

-- repro_fa3_table3 --

FlashAttention-3 (Shah et al. 2024), Table 3: RMSE of fp16 standard vs FA2-style attention,
and the fp8 e4m3 rows (scaling, block quantization, incoherent processing), on
N(0,1) + N(0,100) Bernoulli(0.001) inputs.

    python -m flashnum.run experiment=repro_fa3_table3

-- fa3_protocol, fa3_protocol_heldout --

FA3 Table 3's fp16 rows at one protocol fixed in advance, over seeds: the table of the
experiment fa3_protocol (conf/table/fa3_protocol.yaml; README, docs/reproductions.md and
the paper quote it through flashnum.figures.quantities).

    python -m flashnum.run experiment=fa3_protocol

`repro_fa3_table3` searches 36 protocols for the one that best matches the published
numbers (FA3 omits N, d and the seed); a best-of-36 match overstates the agreement. Here
one protocol is measured over seeds. Its shape was chosen after the search had found it
as the best joint match (so seeds 0-7, the table fa3_protocol, include the search's own
seed 0); conf/table/fa3_protocol_heldout.yaml runs it on seeds 100-115, committed before
that table's only run:

* FA3's own description: each entry of Q, K, V is N(0, 1) + N(0, 100) Bernoulli(0.001)
  (variance 100: outlier std 10), softmax scale 1/sqrt(d), RMSE against attention in
  float64 on the *unrounded* inputs;
* what FA3 does not state, chosen once, after the search: d = 128 (the head dimension of
  FA3's fp8 rows and of its headline benchmarks) and N = 8192 (the N of the fp8 rows of
  the same table, so that all six rows share one shape); 8 heads of 128 query rows against
  all N keys per seed (rows are independent, so the subsample estimates the RMSE of all N
  rows); fp16 `naive` (standard attention) and `fa2` with FlashAttention-2's forward tiles
  128 x 64.

One row per seed: the protocol's parameters, then the two RMSEs and their ratio.
`protocol_summary(df)` gives the spread over seeds (mean, min, max, relative standard
deviation).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch

from flashnum.api import attention
from flashnum.inputs.distributions import make
from flashnum.numerics.accumulate import dot
from flashnum.numerics.blockscaled import quantize_tiles, random_hadamard, scaled
from flashnum.numerics.formats import FORMATS
from flashnum.numerics.policy import Policy, make_policy
from flashnum.reference import plain64
from flashnum.reproduce.measure import (
    E4M3,
    head_rmse,
    match_factor,
    reference64,
)
from flashnum.reproduce.reproduction import Reproduction

# -- repro_fa3_table3 --


# Shah et al. 2024 (arXiv 2407.08608), s4.3, Table 3: RMSE against an FP64 reference
FA3_PUBLISHED = {
    "fp16 standard": 3.2e-4,
    "fp16 FlashAttention-2": 1.9e-4,
    "fp8 standard (per-tensor)": 2.4e-2,
    "fp8 FA3 (block quant + Hadamard)": 9.1e-3,
    "fp8 FA3 without block quantization": 9.3e-3,
    "fp8 FA3 without incoherent processing": 2.4e-2,
    "fp8 FA3 P cast only (inputs unquantized)": math.nan,  # a diagnostic of ours
}
FA3_SIZES = dict(
    full=dict(ns=(512, 1024, 2048, 4096, 8192), ds=(64, 128), heads=8, rows=128,
              off_ns=(512, 2048), fp8_ns=(512, 2048, 8192)),
    quick=dict(ns=(256,), ds=(64,), heads=4, rows=64, off_ns=(), fp8_ns=(256,)),
)


def _fp8_models(q, k, v, d: int, heads: int, block_m: int, block_n: int, seed: int):
    """The fp8 e4m3 rows of FA3's Table 3 as (row, policy, Q, K, V, how) tuples.

    What is modelled (Q, K, V quantized in the float64 carrier, dequantized, then fed to
    the engine with its `inputs` site exact):
      standard  Q, K, V per-tensor e4m3 (s = amax / 448); S accumulated in fp32 and stored
                in fp16; softmax (max, exp, sum, division) in fp16 with fp32 row-sum
                accumulation; normalised P cast to e4m3 with the per-tensor scale 448
                (P <= 1); P @ V accumulated in fp32; output bf16.
      FA3       Q H, K H (random-sign Hadamard per head) and V quantized per block
                (a scale per block_m rows of Q, per block_n rows of K and V); then the
                fa2 policy at fp8: fp32 logits, softmax state and accumulators, P cast
                to e4m3 unscaled before P @ V, output bf16.
      without block quantization: the same with per-tensor scales.
      without incoherent processing: the same with block scales and no rotation.
    """
    had = random_hadamard(d, heads, seed)  # (heads, d, d), broadcast over batch
    qh, kh = dot(q, had, "fp64"), dot(k, had, "fp64")
    fa3 = make_policy("fa2", "fp8_e4m3").with_sites(inputs="exact", name="fa3_fp8")
    p_scaled = scaled(E4M3, 448.0)
    std = Policy(inputs="exact", qk_acc="fp32", s="fp16", m="fp16", p="fp16",
                 p_cast=p_scaled, pv_acc="fp32", l_acc="fp32", l="fp16", o="fp32",
                 div="fp16", out="bf16", structure="standard", name="standard_fp8")
    vb = quantize_tiles(v, block=block_n)
    return [
        ("fp8 standard (per-tensor)", std, quantize_tiles(q), quantize_tiles(k), quantize_tiles(v),
         dict(quant="per-tensor", hadamard=False, p_cast="e4m3*448 (normalised P)")),
        ("fp8 FA3 (block quant + Hadamard)", fa3, quantize_tiles(qh, block=block_m),
         quantize_tiles(kh, block=block_n), vb,
         dict(quant="per-block", hadamard=True, p_cast="e4m3")),
        ("fp8 FA3 without block quantization", fa3, quantize_tiles(qh), quantize_tiles(kh),
         quantize_tiles(v),
         dict(quant="per-tensor", hadamard=True, p_cast="e4m3")),
        ("fp8 FA3 without incoherent processing", fa3, quantize_tiles(q, block=block_m),
         quantize_tiles(k, block=block_n), vb,
         dict(quant="per-block", hadamard=False, p_cast="e4m3")),
        ("fp8 FA3 P cast only (inputs unquantized)", fa3, q, k, v,
         dict(quant="none", hadamard=False, p_cast="e4m3")),
    ]


def fa3_table3(quick: bool = False, seed: int = 0) -> pd.DataFrame:
    """FA3 Table 3: RMSE vs an FP64 reference on fa3_outliers inputs, over a protocol grid.

    The paper omits N, d, heads and seed, so we search them. fp16 rows: every N x d with
    outlier std 10 and scale 1/sqrt(d), the reference on the unrounded inputs or on the
    fp16-rounded ones (the same engine outputs serve both); plus outlier std 100
    (N(0,100) read as std 100) and softmax scale 1 at a few N. `match` is the factor by
    which a protocol's fp16 pair (or, in fp8 rows, its four fp8 rows) misses the published
    numbers (exp of the RMS log ratio); `best` marks the protocol with the smallest.
    fp8 rows: see _fp8_models, at a few N x d, reference on the unrounded inputs.
    `match_joint` / `best_joint`: all six published rows at one (N, d), fp16 in the
    paper's stated setting with the unrounded reference. Each case draws `heads` heads of
    `rows` query rows against N keys (rows are independent in both algorithms, so a
    subsample of queries estimates the RMSE of all N; its standard error comes from the
    spread over heads).
    """
    sz = FA3_SIZES["quick" if quick else "full"]
    heads, nrows = sz["heads"], sz["rows"]
    fp16 = FORMATS["fp16"]
    # FlashAttention-2's forward tiles for d = 128 on A100; fa2's error barely depends on
    # them (its softmax state is fp32)
    tiles = dict(block_m=128, block_n=64)
    protocols = [(n, d, 10.0, "1/sqrt(d)") for n in sz["ns"] for d in sz["ds"]]
    protocols += [(n, d, 100.0, "1/sqrt(d)") for n in sz["off_ns"] for d in sz["ds"]]
    protocols += [(n, d, 10.0, "1") for n in sz["off_ns"] for d in sz["ds"]]
    rows = []
    for n, d, ostd, scale_rule in protocols:
        inp = make("fa3_outliers", heads=heads, seq_len_q=nrows, seq_len_k=n, head_dim=d,
                   seed=seed, outlier_std=ostd)
        scale = 1.0 / math.sqrt(d) if scale_rule == "1/sqrt(d)" else 1.0
        q, k, v = inp.tensors()
        refs = {"unrounded": reference64(q, k, v, scale),
                "fp16": reference64(fp16.round(q), fp16.round(k), fp16.round(v), scale)}
        for row, pol in (("fp16 standard", "naive"), ("fp16 FlashAttention-2", "fa2")):
            res = attention(q, k, v, precision="fp16", policy=pol, scale=scale, **tiles)
            for ref_inputs, ref in refs.items():
                r, se = head_rmse(res.out, ref)
                rows.append(dict(
                    section="fp16", row=row, precision="fp16", policy=pol, n=n, d=d,
                    heads=heads, query_rows=nrows, outlier_std=ostd, scale_rule=scale_rule,
                    ref_inputs=ref_inputs, **tiles, quant="none", hadamard=False,
                    p_cast="fp16", metric="rmse", ours=r, ours_se=se,
                    published=FA3_PUBLISHED[row]))
    for n in sz["fp8_ns"]:
        for d in sz["ds"]:
            inp = make("fa3_outliers", heads=heads, seq_len_q=nrows, seq_len_k=n, head_dim=d,
                       seed=seed)
            q, k, v = inp.tensors()
            scale = 1.0 / math.sqrt(d)
            ref = reference64(q, k, v, scale)
            bm, bn = 128, 128  # our choice of tiles; the quantization blocks follow them
            for row, pol, qq, kk, vv, how in _fp8_models(q, k, v, d, heads, bm, bn, seed):
                res = attention(qq, kk, vv, precision="fp8_e4m3", policy=pol, scale=scale,
                                block_m=bm, block_n=bn)
                r, se = head_rmse(res.out, ref)
                rows.append(dict(
                    section="fp8", row=row, precision="fp8_e4m3", policy=pol.name, n=n, d=d,
                    heads=heads, query_rows=nrows, outlier_std=10.0, scale_rule="1/sqrt(d)",
                    ref_inputs="unrounded", block_m=bm, block_n=bn, **how, metric="rmse",
                    ours=r, ours_se=se, published=FA3_PUBLISHED[row]))
    df = pd.DataFrame(rows)
    df["ours_over_published"] = df["ours"] / df["published"]
    return _fa3_match(df)


def _fa3_match(df: pd.DataFrame) -> pd.DataFrame:
    """Add match_fp16 / match_fp8 per protocol, the naive/fa2 ratio, and the best flags."""
    df = df.copy()
    df["match"] = math.nan
    df["best"] = False
    df["ratio_std_over_flash"] = math.nan
    keys = {"fp16": ["n", "d", "outlier_std", "scale_rule", "ref_inputs"], "fp8": ["n", "d"]}
    for section, key in keys.items():
        sub = df[(df["section"] == section) & df["published"].notna()]
        scores = {}
        for k, g in sub.groupby(key):
            scores[k] = match_factor(g["ours"], g["published"])
            idx = g.index
            df.loc[idx, "match"] = scores[k]
            if section == "fp16":
                std = g.loc[g["policy"] == "naive", "ours"].iloc[0]
                fl = g.loc[g["policy"] == "fa2", "ours"].iloc[0]
                df.loc[idx, "ratio_std_over_flash"] = std / fl
        if scores:
            best = min(scores, key=scores.get)
            sel = np.logical_and.reduce([df[c] == b for c, b in zip(key, best, strict=True)])
            df.loc[sel & (df["section"] == section), "best"] = True
    # joint: all six published rows at one (N, d), fp16 with the paper's stated setting
    # (outlier std 10, scale 1/sqrt(d)) and the FP64 reference on the unrounded inputs
    df["match_joint"] = math.nan
    df["best_joint"] = False
    plain = ((df["section"] == "fp8") | ((df["outlier_std"] == 10.0)
             & (df["scale_rule"] == "1/sqrt(d)") & (df["ref_inputs"] == "unrounded")))
    joint = {}
    for (n, d), g in df[plain & df["published"].notna()].groupby(["n", "d"]):
        if set(g["section"]) == {"fp16", "fp8"}:
            joint[(n, d)] = match_factor(g["ours"], g["published"])
            df.loc[g.index, "match_joint"] = joint[(n, d)]
    if joint:
        n, d = min(joint, key=joint.get)
        df.loc[plain & (df["n"] == n) & (df["d"] == d), "best_joint"] = True
    return df


REPRODUCTION = Reproduction(
    "fa3_table3", fa3_table3, FA3_SIZES,
    display=[
        "row", "n", "d", "outlier_std", "scale_rule", "ref_inputs", "ours", "ours_se",
        "published", "match", "best", "match_joint", "best_joint"])


# -- fa3_protocol, fa3_protocol_heldout --


PUBLISHED = {"naive": 3.2e-4, "fa2": 1.9e-4}  # FA3 Table 3, fp16 standard / FlashAttention-2


def rmse_at(seed: int, n: int, d: int, heads: int, rows: int, outlier_std: float, p: float,
            block_m: int, block_n: int) -> dict:
    """The fp16 RMSE of standard attention and of FA2 at one seed, and their ratio."""
    inp = make("fa3_outliers", heads=heads, seq_len_q=rows, seq_len_k=n, head_dim=d,
               seed=seed, outlier_std=outlier_std, p=p)
    q, k, v = (x.to(torch.float64) for x in inp.tensors())
    scale = 1 / math.sqrt(d)
    exact = plain64(q, k, v, scale=scale)  # FA3's "attention in FP64"
    out = {}
    for policy in ("naive", "fa2"):
        res = attention(q, k, v, precision="fp16", policy=policy, scale=scale,
                        block_m=block_m, block_n=block_n)
        out[f"rmse_{policy}"], _ = head_rmse(res.out, exact)
    out["ratio"] = out["rmse_naive"] / out["rmse_fa2"]
    return out


def fa3_protocol_table(seeds: int = 8, n: int = 8192, d: int = 128, heads: int = 8,
                       rows: int = 128, outlier_std: float = 10.0, p: float = 0.001,
                       block_m: int = 128, block_n: int = 64,
                       first_seed: int = 0) -> pd.DataFrame:
    """One row per seed first_seed .. first_seed + seeds - 1 (one torch thread: the float64
    reference's sums). first_seed > 0 draws a seed set no earlier run has seen
    (conf/table/fa3_protocol_heldout.yaml)."""
    torch.set_num_threads(1)
    protocol = dict(n=n, d=d, heads=heads, rows=rows, outlier_std=outlier_std, p=p,
                    block_m=block_m, block_n=block_n)
    out = []
    for seed in range(first_seed, first_seed + seeds):
        r = rmse_at(seed, **protocol)
        out.append(dict(seed=seed, **protocol, **r))
        print(f"seed {seed}: standard {r['rmse_naive']:.3e}, FA2 {r['rmse_fa2']:.3e}, "
              f"ratio {r['ratio']:.2f}", flush=True)
    return pd.DataFrame(out)


def _spread(xs) -> dict:
    xs = list(xs)
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else math.nan
    return dict(mean=m, min=min(xs), max=max(xs), rel_sd=sd / m)


def protocol_summary(df: pd.DataFrame) -> dict:
    """The protocol, the published ratio and the spread over seeds of the stored rows:
    {"protocol", "seeds", "published_ratio", "summary": {naive, fa2, ratio: {mean, min,
    max, rel_sd}, ratio_of_means}}."""
    df = df.sort_values("seed")
    keys = ("n", "d", "heads", "rows", "outlier_std", "p", "block_m", "block_n")
    s = {k: _spread(df[f"rmse_{k}"]) for k in ("naive", "fa2")}
    s["ratio"] = _spread(df["ratio"])
    s["ratio_of_means"] = s["naive"]["mean"] / s["fa2"]["mean"]
    return dict(protocol={k: df[k].iloc[0].item() for k in keys}, seeds=len(df),
                published=PUBLISHED, published_ratio=PUBLISHED["naive"] / PUBLISHED["fa2"],
                summary=s)
