"""Figures and tables of the low-precision measurements (flashnum.reproduce.lowprec).

    pcast_threshold     repro_pcast_threshold: non-sink mass lost by the e4m3 P cast vs the
                        sink's lead Delta, forward and reverse order, S = 1 and 256, the
                        predicted collapse 10 ln 2 + ln S - delta_k marked
    fp8_offset          repro_fp8_offset: e4m3 error over the rounding bound u max|V| vs
                        the late sink's growth, per offset (threshold 4), e5m2 beside
    tab_block_scaled    repro_block_scaled: median max error per format and site
    tab_splitkv_decode  repro_splitkv_decode: error per shape, splits and partial precision
"""

from __future__ import annotations

import math

import numpy as np

from flashnum.figures.context import Figures
from flashnum.figures.plots import _style
from flashnum.figures.registry import figure
from flashnum.figures.tex import cell, tabular, tex_num, tex_word


@figure("repro_pcast_threshold")
def pcast_threshold(F: Figures) -> None:
    df = F.table("repro_pcast_threshold")
    if df is None:
        return F.placeholder("pcast_threshold", "repro_pcast_threshold")
    plt = _style()
    spread = float(df.spread.min())
    d = df[df.spread == spread]
    F.select("pcast_threshold", [f"spread (delta_k) {spread:g}", "all scales and orders"])
    fig, ax = plt.subplots(figsize=(5.5, 3.0))
    for i, s in enumerate(sorted(d.p_scale.unique())):
        for order, style in (("forward", "o-"), ("reverse", "s--")):
            g = d[(d.p_scale == s) & (d.order == order)].sort_values("delta")
            ax.plot(g.delta, g.rel_err.clip(lower=1e-7), style, color=f"C{i}",
                    label=f"S={s:g}, {order}")
        pred = float(d[d.p_scale == s].delta_c.iloc[0])
        ax.axvline(pred, color=f"C{i}", lw=0.8, ls=":")
        key = "Scaled" if s > 1 else "One"
        F.num(f"Thresh{key}Pred", pred, 3)
        fwd = d[(d.p_scale == s) & (d.order == "forward")].sort_values("delta")
        hit = fwd[fwd.rel_err > 0.5]
        F.num(f"Thresh{key}Meas", float(hit.delta.iloc[0]) if len(hit) else math.nan, 3)
    ax.set_yscale("log")
    ax.set_xlabel(r"sink lead $\Delta$ (natural-log units)")
    ax.set_ylabel("relative error (non-sink mass lost)")
    ax.legend(loc="lower right")
    F.save(fig, "pcast_threshold")


@figure("repro_fp8_offset")
def fp8_offset(F: Figures) -> None:
    df = F.table("repro_fp8_offset")
    if df is None:
        return F.placeholder("fp8_offset", "repro_fp8_offset")
    plt = _style()
    thr = 4.0 if (df.threshold == 4.0).any() else float(df.threshold.max())
    d = df[df.threshold == thr]
    F.select("fp8_offset", [f"threshold {thr:g} (log2 units)", "e4m3 every offset",
                            "e5m2 the largest offset"])
    fig, ax = plt.subplots(figsize=(5.5, 3.0))
    for i, off in enumerate(sorted(d.offset.unique())):
        g = d[(d["format"] == "fp8_e4m3") & (d.offset == off)].sort_values("growth")
        ax.plot(g.growth, g.err_over_u_vmax, "o-", color=f"C{i}", label=f"e4m3, offset {off}")
    top = d.offset.max()
    g = d[(d["format"] == "fp8_e5m2") & (d.offset == top)].sort_values("growth")
    ax.plot(g.growth, g.err_over_u_vmax, "k--", label=f"e5m2, offset {top}")
    ax.axhline(1.0, color="0.4", lw=0.8, ls=":")
    ax.axvline(thr * math.log(2), color="0.4", lw=0.8, ls="-.")
    ax.set_yscale("log")
    ax.set_xlabel("growth of the row max at the sink (natural-log units)")
    ax.set_ylabel(r"max error / ($u$ max$|V|$)")
    ax.legend(loc="upper right", ncol=2)
    ok = df[df.budget_ok & np.isfinite(df.err_over_u_vmax)]
    bad = df[(df["format"] == "fp8_e4m3") & ~df.budget_ok]
    F.num("OffsetBudgetMax", float(ok.err_over_u_vmax.max()))
    F.num("OffsetWorst", float(bad.err_over_u_vmax.max()) if len(bad) else math.nan)
    F.save(fig, "fp8_offset")


@figure("repro_block_scaled")
def tab_block_scaled(F: Figures) -> None:
    df = F.table("repro_block_scaled")
    if df is None:
        return F.placeholder("tab_block_scaled", "repro_block_scaled")
    d = df[df["transform"] == "none"]
    sites = ["qkv", "p", "qkv+p"]
    rows = []
    for fmt in sorted(d["format"].unique()):
        g = d[d["format"] == fmt]
        rows.append([tex_word(fmt)] + [cell(float(g[g.site == s].max_abs_err.median()))
                                      for s in sites])
    t = df[(df.site == "qkv")]
    for tr in ("smooth_k", "hadamard", "smooth_k+hadamard"):
        gain = []
        for fmt in sorted(t[t["transform"] == tr]["format"].unique()):
            base = t[(t["format"] == fmt) & (t["transform"] == "none")].set_index("distribution")
            with_tr = t[(t["format"] == fmt) & (t["transform"] == tr)].set_index("distribution")
            gain.append(float((base.max_abs_err / with_tr.max_abs_err).median()))
        if gain:
            key = {"smooth_k": "Smooth", "hadamard": "Hadamard",
                   "smooth_k+hadamard": "SmoothHadamard"}[tr]
            F.num(f"BlockGain{key}", float(np.median(gain)))
    F.num("BlockDists", str(d.distribution.nunique()))
    F.write_table("tab_block_scaled", tabular(["format", "Q, K, V", "P", "both"], rows, "lrrr"))


@figure("repro_splitkv_decode")
def tab_splitkv_decode(F: Figures) -> None:
    df = F.table("repro_splitkv_decode")
    if df is None:
        return F.placeholder("tab_splitkv_decode", "repro_splitkv_decode")
    splits = sorted(df.num_splits.unique())
    precs = sorted(df.split_precision.unique(), key=lambda p: p != "fp32")
    cols = ["$N_k$", "$N_q$", "partials"] + [f"$S={s}$" for s in splits]
    rows = []
    for (nk, nq), g in df.groupby(["nk", "nq"]):
        for p in precs:
            h = g[g.split_precision == p].set_index("num_splits").max_abs_err
            rows.append([tex_num(int(nk)), str(int(nq)), tex_word(p)]
                        + [cell(float(h.get(s, math.nan))) for s in splits])
    F.write_table("tab_splitkv_decode", tabular(cols, rows, "rrl" + "r" * len(splits)))
    top = max(splits)
    one = df[df.num_splits == 1].set_index(["nk", "nq", "split_precision"]).max_abs_err
    many = df[df.num_splits == top].set_index(["nk", "nq", "split_precision"]).max_abs_err
    r = (many / one).dropna()
    fp32 = r[r.index.get_level_values(2) == "fp32"]
    low = r[r.index.get_level_values(2) != "fp32"]
    F.num("SplitFpRatioMax", float(fp32.max()) if len(fp32) else math.nan)
    F.num("SplitLowRatio", float(low.median()) if len(low) else math.nan)
    F.num("SplitTop", str(int(top)))
    F.num("SplitNkMax", tex_num(int(df.nk.max())))
