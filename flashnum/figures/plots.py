"""The paper's plots: one function per figure, each F -> stem.pdf/.png/.tex and its numbers.

Each function reads one experiment through F.table, selects its rows (the selection is
written into its \\Sel macro), sets the numbers the text quotes (F.num) and saves the
figure (F.save); with no table it leaves a placeholder. A new plot: a function here
declared with @figure(its tables), its numbers in flashnum.figures.numbers.NUMBERS.
matplotlib is imported inside _style() only (heavy optional dependency).
"""

from __future__ import annotations

import math

import numpy as np

from flashnum.figures.context import (
    ERR,
    PRECISIONS,
    Figures,
    Unplottable,
    nonempty,
    prefer,
    slope,
    trusted,
)
from flashnum.figures.registry import figure
from flashnum.figures.tex import tex_name, tex_word
from flashnum.harness.grid import CASE_FIELDS
from flashnum.numerics.formats import get_format
from flashnum.numerics.policy import SITES

COLORS = {
    "bf16": "C0", "fp16": "C1", "fp32": "C2", "tf32": "C3", "fp8_e4m3": "C4",
    "fp8_e5m2": "C5", "fp64": "C7", "fa2": "C0", "naive": "C1", "lowp": "C3",
    "exact": "C7", "uniform": "C4", "emulate": "C0", "triton": "C1",
}



def _style():
    """pyplot with the paper's style (8 pt text, Agg backend: no display needed)."""
    import matplotlib  # heavy optional dependency: only when drawing

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"): no display needed

    plt.rcParams.update({
        "font.size": 8, "axes.titlesize": 8, "axes.labelsize": 8, "legend.fontsize": 7,
        "xtick.labelsize": 7, "ytick.labelsize": 7,
        "axes.grid": True, "grid.alpha": 0.3,
        "svg.hashsalt": "flashnum", "figure.constrained_layout.use": True,
        "lines.markersize": 4,
    })
    return plt


def _log2_ticks(ax, values) -> None:
    """Tick a log axis at the swept values themselves (powers of two, mostly)."""
    v = sorted({int(x) for x in values})
    ax.set_xticks(v, [str(x) for x in v])
    ax.minorticks_off()


def _color(key: str) -> str:
    return COLORS.get(key, "C9")


@figure("seqlen_growth")
def error_vs_n(F: Figures) -> None:
    df = F.table("seqlen_growth")
    if df is None:
        return F.placeholder("error_vs_n", "seqlen_growth")
    plt = _style()
    sel = []
    _growth_beyond_gaussian(F, trusted(df, []))
    df = prefer(trusted(df, sel), sel, policy="fa2", distribution="gaussian", variant="fa2",
                 order="forward", backend="emulate")
    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    for prec in sorted(df.precision.unique()):
        d = df[df.precision == prec]
        g = d.groupby("seq_len_k")
        n, med = np.array(sorted(g.groups)), g[ERR].median().sort_index()
        c = _color(prec)
        ax.plot(n, med.values, "o-", color=c, label=f"{prec} measured")
        ax.fill_between(n, g[ERR].min().sort_index().values, g[ERR].max().sort_index().values,
                        color=c, alpha=0.15, lw=0)
        if "bound" in d and d["bound"].notna().any():
            bnd = g["bound"].median().sort_index()
            ax.plot(n, bnd.values, "--", color=c, label=f"{prec} bound")
            if prec in PRECISIONS:
                F.num(f"BoundOverErrN{tex_name(prec)}", float(np.median(bnd / med)))
        if "bound_prob" in d and d["bound_prob"].notna().any():
            ax.plot(n, g["bound_prob"].median().sort_index().values, ":", color=c,
                    label=f"{prec} probabilistic bound")
        if prec in PRECISIONS:
            F.num(f"SlopeN{tex_name(prec)}", slope(n, med.values))
    F.num("NMin", int(df.seq_len_k.min()))
    F.num("NMax", int(df.seq_len_k.max()))
    ax.set(xscale="log", yscale="log", xlabel="sequence length N",
           ylabel=r"max$|\hat o - o|$ (median over seeds)")
    _log2_ticks(ax, df.seq_len_k)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    F.select("error_vs_n", sel + [f"median and range over {df.seed.nunique()} seeds"])
    F.save(fig, "error_vs_n", width=0.85)


def _growth_beyond_gaussian(F: Figures, df) -> None:
    """The bf16 fa2 exponent of median max error ~ N^a seed by seed on gaussian inputs, on
    each of the sweep's other distributions (median over seeds per N; their range), and
    over all of them pooled: the abstract quotes the gaussian one, and these say how far
    it holds."""
    d = df[(df.policy == "fa2") & (df.precision == "bf16")]
    if "variant" in d:
        d = d[d.variant == "fa2"]
    if not len(d) or d.seq_len_k.nunique() < 2:
        return

    def fit(x, col=ERR):
        med = x.groupby("seq_len_k")[col].median().sort_index()
        return slope(med.index.values, med.values)

    g = d[d.distribution == "gaussian"]
    if len(g) and "normwise_rel_err" in g:
        F.num("SlopeNBfSixteenRel", fit(g, "normwise_rel_err"))
    per_seed = [fit(x) for _, x in g.groupby("seed")] if len(g) else [math.nan]
    F.num("SlopeNBfSixteenSeedMin", min(per_seed))
    F.num("SlopeNBfSixteenSeedMax", max(per_seed))
    F.num("SlopeNSeeds", str(int(g.seed.nunique())) if len(g) else r"\nyr")
    by = {dist: fit(x) for dist, x in d.groupby("distribution") if dist != "gaussian"}
    if not by:
        return
    lo, hi = min(by, key=by.get), max(by, key=by.get)
    F.num("SlopeNBfSixteenAll", fit(d))
    F.num("SlopeNDists", str(d.distribution.nunique()))
    F.num("SlopeNOthers", str(len(by)))
    F.num("SlopeNDistLo", by[lo])
    F.num("SlopeNDistLoName", tex_word(lo))
    F.num("SlopeNDistHi", by[hi])
    F.num("SlopeNDistHiName", tex_word(hi))


@figure("block_size")
def error_vs_block_n(F: Figures) -> None:
    df = F.table("block_size")
    if df is None:
        return F.placeholder("error_vs_block_n", "block_size")
    plt = _style()
    sel = []
    df = prefer(trusted(df, sel), sel, precision="bf16", distribution="gaussian", variant="fa2",
                 order="forward", backend="emulate")
    # one block_m (rows are independent, but keep the swapped-tile slice out of the line)
    bm = int(df.block_m.mode().min())
    df = df[df.block_m == bm]
    sel.append(f"block_m {bm}")
    # one N: the largest, where the number of rescales differs most between block sizes
    n = int(df.seq_len_k.max())
    df = df[df.seq_len_k == n]
    sel.append(f"N {n}")
    fig, ax = plt.subplots(figsize=(5.5, 3.0))
    for pol in sorted(df.policy.unique()):
        g = df[df.policy == pol].groupby("block_n")[ERR]
        b, med = np.array(sorted(g.groups)), g.median().sort_index().values
        if len(b) == 1:  # standard attention has no key blocks: one level for every block_n
            ax.axhline(med[0], color=_color(pol), ls="--", label=f"{pol} (no blocks)")
            continue
        ax.plot(b, med, "o-", color=_color(pol), label=pol)
        if pol == "fa2":
            F.num("SlopeBlockN", slope(b, med))
            F.num("BlockNRatio", med[0] / med[-1] if med[-1] > 0 else math.nan)
            # the same ratio seed by seed: how far one draw moves it
            per = df[df.policy == pol].pivot_table(index="seed", columns="block_n",
                                                   values=ERR, aggfunc="median")
            seed_ratio = per[b[0]] / per[b[-1]]
            F.num("BlockNRatioMin", float(seed_ratio.min()))
            F.num("BlockNRatioMax", float(seed_ratio.max()))
            F.num("BlockNSeeds", str(int(per.index.nunique())))
            F.num("BlockNAtN", n)
    F.num("BlockNMin", int(df.block_n.min()))
    F.num("BlockNMax", int(df.block_n.max()))
    ax.set(xscale="log", yscale="log", xlabel="keys per block (block_n)",
           ylabel=r"max$|\hat o - o|$ (median)")
    _log2_ticks(ax, df.block_n)
    ax.legend()
    F.select("error_vs_block_n", sel + [f"median over {df.seed.nunique()} seeds"])
    F.save(fig, "error_vs_block_n", width=0.8)


@figure("block_order")
def error_by_order(F: Figures) -> None:
    df = F.table("block_order")
    if df is None:
        return F.placeholder("error_by_order", "block_order")
    plt = _style()
    from matplotlib.ticker import FormatStrFormatter  # heavy optional dependency
    sel = []
    df = prefer(trusted(df, sel), sel, precision="bf16", policy="fa2", variant="fa2",
                 backend="emulate", policy_sites="{}")
    med = df.groupby(["distribution", "order"])[ERR].median().unstack("order")
    if "forward" not in med:
        raise Unplottable("has no forward-order rows to compare against")
    ratio = med.div(med["forward"], axis=0)
    orders = sorted(o for o in ratio.columns if o != "forward")  # forward is the line at 1
    if not orders:
        raise Unplottable("has no key-block order other than forward")
    dists = sorted(ratio.index)
    fig, ax = plt.subplots(figsize=(6.0, 3.0))
    w = 0.8 / len(orders)
    x = np.arange(len(dists))
    for i, o in enumerate(orders):
        ax.bar(x + (i - (len(orders) - 1) / 2) * w, ratio.loc[dists, o].values, w, label=o)
    ax.set_xticks(x, dists, rotation=30, ha="right")
    ax.set(yscale="log", ylabel="median error / forward order's")
    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(FormatStrFormatter("%g"))
    ax.axhline(1.0, color="k", lw=0.8, label="forward")
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(orders) + 1)
    others = ratio.drop(columns="forward").stack()
    if len(others):
        (wd, wo), (bd, bo) = others.idxmax(), others.idxmin()
        F.num("OrderWorst", tex_word(wo))
        F.num("OrderWorstRatio", float(others.max()))
        F.num("OrderWorstDist", tex_word(wd))
        F.num("OrderBest", tex_word(bo))
        F.num("OrderBestRatio", float(others.min()))
        F.num("OrderBestDist", tex_word(bd))
        # the largest and smallest ratio seed by seed (each seed's median over N): how far
        # one draw moves them
        for name, dist, order in (("OrderWorstRatio", wd, wo), ("OrderBestRatio", bd, bo)):
            per = df[df.distribution == dist].groupby(["seed", "order"])[ERR].median().unstack()
            seed_ratio = per[order] / per["forward"]
            F.num(f"{name}Min", float(seed_ratio.min()))
            F.num(f"{name}Max", float(seed_ratio.max()))
        F.num("OrderSeeds", str(int(df.seed.nunique())))
    F.select("error_by_order", sel + [f"median over seeds and N ({df.seed.nunique()} seeds)"])
    F.save(fig, "error_by_order", width=0.9)


@figure("bf16_sweep")
def heatmap(F: Figures) -> None:
    df = F.table("bf16_sweep")
    if df is None:
        return F.placeholder("heatmap", "bf16_sweep")
    plt = _style()
    import matplotlib  # heavy optional dependency (colormaps)

    sel = []  # its size, SweepCases, is a named quantity (flashnum.figures.quantities)
    df = prefer(trusted(df, sel), sel, precision="bf16", variant="fa2", backend="emulate",
                 order="forward", block_n=64)
    med = df.groupby(["distribution", "policy"])[ERR].median().unstack("policy")
    med = med.sort_index()[sorted(med.columns)]
    fig, ax = plt.subplots(figsize=(4.8, 0.28 * len(med) + 1.2))
    v = med.values.astype(float)
    ok = np.isfinite(v) & (v > 0)
    z = np.ma.masked_array(np.log10(np.where(ok, v, 1.0)), mask=~ok)  # grey: overflow or 0
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="0.8")
    im = ax.imshow(z, aspect="auto", cmap=cmap)
    ax.set_xticks(range(med.shape[1]), med.columns)
    ax.set_yticks(range(med.shape[0]), med.index)
    ax.grid(False)
    mid = float(z.mean()) if ok.any() else 0.0
    for (i, j), x in np.ndenumerate(v):
        text = f"{x:.1e}" if np.isfinite(x) else ("inf" if x > 0 else "n/a")
        light = ok[i, j] and z[i, j] < mid
        ax.text(j, i, text, ha="center", va="center", fontsize=6, color="w" if light else "k")
    fig.colorbar(im, ax=ax, label=r"$\log_{10}$ median max$|\hat o - o|$")
    if "fa2" in med:
        fa = med["fa2"]
        F.num("HeatWorstDist", tex_word(fa.idxmax()))
        if "gaussian" in fa.index:
            F.num("HeatWorstRatio", float(fa.max() / fa["gaussian"]))
            if "normwise_rel_err" in df:  # the same inputs in relative terms
                rel = df[df.policy == "fa2"].groupby("distribution").normwise_rel_err.median()
                F.num("HeatWorstRelRatio", float(rel[fa.idxmax()] / rel["gaussian"]))
        F.num("HeatSeeds", str(int(df.seed.nunique())))
        for pol, name in (("naive", "HeatNaiveOverFa"), ("lowp", "HeatLowpOverFa")):
            if pol in med:
                F.num(name, float((med[pol] / fa).median()))
    F.select("heatmap", sel + ["median over N and seeds"])
    F.save(fig, "heatmap", width=0.75)


@figure("attribution")
def attribution(F: Figures) -> None:
    df = F.table("attribution")
    if df is None:
        return F.placeholder("attribution", "attribution")
    plt = _style()
    sel = []
    if "metric" in df:  # the tidy table holds max_abs, rmse and mean_signed rows
        df = df[df.metric == "max_abs"]
    df = prefer(trusted(df, sel), sel, precision="bf16", policy="fa2")
    dists = sorted(df.distribution.unique()) if "distribution" in df else ["all"]
    first = [d for d in ("gaussian", "ties") if d in dists]
    dists = (first + [d for d in dists if d not in first])[:4]
    fig, axes = plt.subplots(1, len(dists), figsize=(6.3, 2.8), sharey=True, squeeze=False)
    for ax, dist in zip(axes[0], dists, strict=True):
        d = df[df.distribution == dist] if "distribution" in df else df
        d = d.groupby("site")[["err_only", "err_without", "total"]].median()
        sites = [s for s in SITES if s in d.index]
        y = np.arange(len(sites))
        only = d.loc[sites, "err_only"].where(lambda s: s > 0)
        without = d.loc[sites, "err_without"].where(lambda s: s > 0)
        ax.barh(y - 0.2, only.values, 0.4, label="only this site rounded", color="C0")
        ax.barh(y + 0.2, without.values, 0.4, label="all but this site", color="C1")
        total = float(d["total"].median())
        ax.axvline(total, color="k", lw=0.8, label="all sites rounded")
        ax.set_yticks(y, sites)
        ax.set(xscale="log", title=dist, xlabel=r"max$|\hat o - o|$")
        if only.notna().any():
            top = only.idxmax()
            if dist == "gaussian":
                F.num("AttrDominantSite", tex_word(top))
                F.num("AttrDominantShare", float(only.max() / total) if total > 0 else math.nan)
                F.num("AttrRssOverTotal", float(np.sqrt((only.fillna(0) ** 2).sum()) / total)
                      if total > 0 else math.nan)
            if dist == "ties":
                F.num("AttrTiesDominantSite", tex_word(top))
    axes[0][0].invert_yaxis()  # shared y: invert once, so the sites read top-down in data order
    h, lab = axes[0][0].get_legend_handles_labels()
    fig.legend(h, lab, loc="outside lower center", ncol=3)
    _attribution_seeds(F, df)
    seeds = df.seed.nunique() if "seed" in df else 1
    F.select("attribution", sel + [f"median over {seeds} seed{'s' * (seeds > 1)}"])
    F.save(fig, "attribution")


def _attribution_seeds(F: Figures, df) -> None:
    """The dominant site's share of the total on gaussian inputs, seed by seed: its range,
    and whether every seed has the same dominant site."""
    g = df[df.distribution == "gaussian"] if "distribution" in df else df
    if not len(g):
        return
    g = g.assign(seed=g.seed if "seed" in g else 0)
    top = g.loc[g.groupby("seed").err_only.idxmax()]
    share = (top.err_only / top.total.where(top.total > 0)).astype(float)
    F.num("AttrSeeds", str(int(g.seed.nunique())))
    F.num("AttrDominantShareMin", float(share.min()))
    F.num("AttrDominantShareMax", float(share.max()))
    F.fact("AttrDominantEverySeed", bool(top.site.nunique() == 1))


@figure("kernel_vs_emulator")
def kernel_vs_emulator(F: Figures) -> None:
    df = F.table("kernel_vs_emulator")
    if df is None:
        return F.placeholder("kernel_vs_emulator", "kernel_vs_emulator")
    plt = _style()
    keys = [c for c in CASE_FIELDS if c in df.columns and c not in ("backend", "mp_bits")]
    wide = df.pivot_table(index=keys, columns="backend", values=["max_ulp_err", ERR],
                          aggfunc="first")
    if not {"triton", "emulate"} <= set(df.backend):
        raise Unplottable("lacks rows of one backend (needs triton and emulate)")
    wide = wide.dropna()
    ku, eu = wide["max_ulp_err"]["triton"], wide["max_ulp_err"]["emulate"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(6.3, 2.8))
    top = max(float(ku.max()), float(eu.max()), 1.0)
    bins = np.arange(0, math.ceil(top) + 2) - 0.5 if top <= 40 else 40
    a1.hist([eu.values, ku.values], bins=bins, label=["emulator", "Triton kernel"],
            color=[_color("emulate"), _color("triton")])
    a1.set(xlabel="max error in ulps of the output format", ylabel="cases")
    a1.legend(loc="upper right")
    ke, ee = wide[ERR]["triton"], wide[ERR]["emulate"]
    a2.loglog(ee.values, ke.values, ".", ms=3)
    lo, hi = float(min(ee.min(), ke.min())), float(max(ee.max(), ke.max()))
    a2.plot([lo, hi], [lo, hi], "k-", lw=0.6)
    a2.set(xlabel=r"emulator max$|\hat o - o|$", ylabel=r"kernel max$|\hat o - o|$")
    F.num("KernelCases", len(wide))
    F.num("KernelEqualFrac", float((ku == eu).mean()))
    F.num("KernelMedianUlp", float(ku.median()))
    F.num("EmulatorMedianUlp", float(eu.median()))
    F.num("KernelMaxUlpDiff", float((ku - eu).abs().max()))
    F.select("kernel_vs_emulator", [f"{len(wide)} cases run on both backends"])
    F.save(fig, "kernel_vs_emulator")


@figure("precision_bits")
def precision_bits(F: Figures) -> None:
    df = F.table("precision_bits")
    if df is None:
        return F.placeholder("precision_bits", "precision_bits")
    plt = _style()
    sel = []
    df = prefer(trusted(df, sel), sel, distribution="gaussian", variant="fa2",
                 backend="emulate")
    df = nonempty(df[df.precision.str.fullmatch(r"p\d+")], "p<bits> precision")  # mp: not here
    n = int(df.seq_len_k.max())  # the longest rows: the most roundings per output
    df = df[df.seq_len_k == n]
    sel.append(f"N {n}")
    df = df.assign(p=[get_format(pr).p for pr in df.precision])
    fig, ax = plt.subplots(figsize=(5.0, 3.0))
    for pol in sorted(df.policy.unique()):
        g = df[df.policy == pol].groupby("p")[ERR].median().sort_index()
        ax.semilogy(g.index, g.values, "o-", color=_color(pol), label=pol)
        ok = g.values > 0
        if pol == "fa2" and ok.sum() >= 2:
            p = g.index.values.astype(float)
            F.num("SlopeBits", float(np.polyfit(p[ok], np.log2(g.values[ok]), 1)[0]))
    p = np.array(sorted(df.p.unique()), dtype=float)
    ax.semilogy(p, 2.0 ** -p, "k--", lw=0.8, label=r"$u = 2^{-p}$")
    F.num("BitsMin", int(p.min()))
    F.num("BitsMax", int(p.max()))
    ax.set(xlabel="significand bits p", ylabel=r"max$|\hat o - o|$ (median)")
    ax.legend()
    F.select("precision_bits", sel + [f"median over {df.seed.nunique()} seeds"])
    F.save(fig, "precision_bits", width=0.75)


@figure("bwd_bf16_sweep")
def bwd_error(F: Figures) -> None:
    """bwd_bf16_sweep: median relative error of dQ, dK, dV per backward policy, beside
    torch's bf16 autograd of standard attention on the same inputs."""
    df = F.table("bwd_bf16_sweep")
    if df is None:
        return F.placeholder("bwd_error", "bwd_bf16_sweep")
    df = nonempty(df[df["slice"].isin(["flash", "naive"])], "flash/naive slices")
    plt = _style()
    grads = ("dq", "dk", "dv")
    groups = [p for p in ("fa2", "lowp", "naive") if p in set(df.policy)]
    fig, ax = plt.subplots(figsize=(4.2, 2.6))
    width = 0.8 / (len(groups) + 1)
    for i, pol in enumerate([*groups, "torch bf16"]):
        sub = df if pol == "torch bf16" else df[df.policy == pol]
        col = "torch_err_{}" if pol == "torch bf16" else "err_{}"
        med = [float((sub[col.format(g)] / sub[f"ref_{g}"]).median()) for g in grads]
        ax.bar(np.arange(3) + i * width, med, width, label=pol,
               color=_color(pol) if pol != "torch bf16" else "0.5")
    ax.set_xticks(np.arange(3) + width * len(groups) / 2, [r"$dQ$", r"$dK$", r"$dV$"])
    ax.set_yscale("log")
    ax.set(ylabel=r"median max$|\hat g - g|$ / max$|g|$")
    ax.legend(loc="upper right", ncol=2)
    held = df[[f"held_{g}" for g in grads]].astype(bool).all(axis=1)
    fa = df[df.policy == "fa2"]
    rule = fa[[f"rule_{g}" for g in grads]].astype(bool).all(axis=1)
    F.num("BwdCases", len(df))
    F.num("BwdBoundHeld", int(held.sum()))
    F.num("BwdRuleFaFrac", float(rule.mean()) if len(fa) else math.nan)
    F.num("BwdFaOverTorchDq", float((fa.err_dq / fa.torch_err_dq).median()))
    fails = sorted(set(fa.distribution[~rule])) if len(fa) else []
    F.num("BwdRuleFailDists", ", ".join(tex_word(x) for x in fails) or "none")
    F.select("bwd_error", [f"{len(df)} cases", "bf16", "slices flash and naive"])
    F.save(fig, "bwd_error", width=0.7)


@figure("bwd_order")
def bwd_order(F: Figures) -> None:
    """bwd_order: how far the dQ accumulation order moves dQ, against dQ's error."""
    df = F.table("bwd_order")
    if df is None:
        return F.placeholder("bwd_order", "bwd_order")
    df = nonempty(df.dropna(subset=["dq_spread"]), "rows with a dQ order spread")
    plt = _style()
    fig, ax = plt.subplots(figsize=(3.2, 2.6))
    zero = df.dq_spread == 0
    floor = float(df.err_dq.min()) / 100
    for prec in sorted(set(df.precision)):
        sub = df[df.precision == prec]
        ax.loglog(sub.err_dq, sub.dq_spread.clip(lower=floor), ".", color=_color(prec),
                  label=prec)
    lo, hi = floor, float(max(df.err_dq.max(), df.dq_spread.max()))
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.6)
    ax.set(xlabel=r"max$|\hat{dQ} - dQ|$", ylabel="spread over dQ orders")
    ax.legend(loc="upper left")
    ratio = df.dq_spread / df.err_dq
    F.num("BwdOrderCases", len(df))
    F.num("BwdOrderZeroFrac", float(zero.mean()))
    F.num("BwdOrderMaxRatio", float(ratio.max()))
    F.select("bwd_order", [f"{len(df)} cases", "a spread of 0 drawn at the bottom"])
    F.save(fig, "bwd_order", width=0.5)


@figure("bwd_seqlen_growth")
def bwd_growth(F: Figures) -> None:
    """bwd_seqlen_growth: max|g^ - g| / max|g| of dQ, dK, dV vs N (median over seeds,
    gaussian inputs), one line per policy, bf16 solid and fp16 dashed; the exponents alpha
    of that relative error ~ N^alpha fitted per (distribution, seed), their median quoted
    per policy and gradient (bf16). Relative: the gradients themselves shrink with N."""
    df = F.table("bwd_seqlen_growth")
    if df is None:
        return F.placeholder("bwd_growth", "bwd_seqlen_growth")
    df = nonempty(df, "bwd_seqlen_growth")
    plt = _style()
    grads = ("dq", "dk", "dv")
    fig, axes = plt.subplots(1, 3, figsize=(6.6, 2.3), sharex=True)
    gauss = df[df.distribution == "gaussian"]
    for ax, g in zip(axes, grads, strict=True):
        for (pol, prec), sub in sorted(gauss.groupby(["policy", "precision"])):
            rel = sub[f"err_{g}"] / sub[f"ref_{g}"]
            med = rel.groupby(sub.seq_len).median().sort_index()
            ax.loglog(med.index, med.values, "o-" if prec == "bf16" else "s--", ms=2.5,
                      color=_color(pol), label=f"{pol} {prec}")
        ax.set(title=f"${g[0]}{g[1].upper()}$", xlabel="N")
        ticks = [n for n in sorted(df.seq_len.unique()) if math.log2(n) % 2 == 1]
        ax.set_xticks(ticks, [str(n) for n in ticks])
        ax.minorticks_off()
    axes[0].set(ylabel=r"max$|\hat g - g|$ / max$|g|$ (median)")
    axes[-1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    spread = 0.0
    for (pol, prec, g), alphas in _bwd_slopes(df, grads).items():
        if prec == "bf16" and pol in ("fa2", "naive", "lowp"):
            F.num(f"BwdSlope{tex_name(pol)}{tex_name(g)}", float(np.median(alphas)))
            spread = max(spread, float(np.max(alphas) - np.min(alphas)))
    F.num("BwdSlopeSpread", spread)
    F.num("BwdGrowthCases", len(df))
    F.num("BwdGrowthNMax", int(df.seq_len.max()))
    if "ref_method" in df:
        cert = df[df.ref_method == "certified"]
        F.num("BwdGrowthCertMaxN", int(cert.seq_len.max()) if len(cert) else 0)
        rel = max(float((cert[f"ref64_err_{g}"] / cert[f"err_{g}"]).max()) for g in grads)
        F.num("BwdGrowthRefRatio", rel)
    # honest bound accounting per (row, gradient): finite and held, vacuous, exceeded
    bound = np.concatenate([df[f"bound_{g}"].to_numpy(float) for g in grads])
    held = np.concatenate([df[f"held_{g}"].to_numpy(bool) for g in grads])
    err = np.concatenate([df[f"err_{g}"].to_numpy(float) for g in grads])
    fin = np.isfinite(bound)
    F.num("BwdGrowthPairs", len(bound))
    F.num("BwdGrowthBoundHeld", int((fin & held).sum()))
    F.num("BwdGrowthBoundVacuous", int(np.isinf(bound).sum()))
    F.num("BwdGrowthBoundViolated", int((fin & ~held).sum()))
    F.num("BwdGrowthOverflow", int((~np.isfinite(err)).sum()))
    F.select("bwd_growth", [f"{len(gauss)} gaussian cases", "d 64, 64x64 blocks",
                            f"median over {df.seed.nunique()} seeds"])
    F.save(fig, "bwd_growth", width=1.0)


def _bwd_slopes(df, grads) -> dict:
    """{(policy, precision, gradient): [alpha per (distribution, seed)]}, err / max|g| ~
    N^alpha."""
    out: dict = {}
    for (pol, prec, _, _), sub in df.groupby(["policy", "precision", "distribution", "seed"]):
        for g in grads:
            a = slope(sub.seq_len, sub[f"err_{g}"] / sub[f"ref_{g}"])
            if math.isfinite(a):
                out.setdefault((pol, prec, g), []).append(a)
    return out
