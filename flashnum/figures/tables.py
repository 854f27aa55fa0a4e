"""The paper's tables from the sweeps and the presets (booktabs, via tex.tabular).

    tab_tightness   the bf16/fp16/fp32 sweeps: bound / measured error per precision, policy
    tab_worst_case  worst_case: the searched inputs and near_overflow against gaussian
    tab_presets     the presets' format per site (flashnum.numerics.policy: no experiment)

A new table: a function tab_<name>(F) here, declared with @figure(its tables).
The reproductions' tables are written by flashnum.figures.reproductions.
"""

from __future__ import annotations

import math

import pandas as pd

from flashnum.figures.context import ERR, SWEEPS, Figures, Unplottable
from flashnum.figures.pooling import worst_case_ratios
from flashnum.figures.registry import figure
from flashnum.figures.tex import tabular, tex_num, tex_word
from flashnum.numerics.policy import PRESETS, PRODUCT_SITES, SITES, make_policy


@figure("bf16_sweep", "fp16_sweep", "fp32_sweep")
def tab_tightness(F: Figures) -> None:
    frames = [F.table(s) for s in SWEEPS]
    frames = [f for f in frames if f is not None and "bound" in f]
    if not frames:
        return F.placeholder("tab_tightness", "bf16_sweep")
    df = pd.concat(frames, ignore_index=True)
    df = df[df["bound"].notna()]
    # an infinite bound is vacuous: it is counted apart, never as held
    fin = df["bound"].apply(math.isfinite)
    df = df.assign(fin=fin, held=fin & (df[ERR] <= df["bound"]),
                   t=df["bound"] / df[ERR].where(df[ERR] > 0))
    rows = []
    for (prec, pol), d in df.groupby(["precision", "policy"], sort=True):
        t = d.t[d.fin].dropna()
        rows.append([tex_word(prec), tex_word(pol), tex_num(len(d)), tex_num(int(d.held.sum())),
                     tex_num(t.median()), tex_num(t.min()),
                     tex_num(int((d.fin & ~d.held).sum())), tex_num(int((~d.fin).sum()))])
    F.num("BoundCases", len(df))
    F.num("BoundViolations", int((df.fin & ~df.held).sum()))
    F.num("BoundHeld", int(df.held.sum()))
    F.num("BoundVacuous", int((~df.fin).sum()))
    fa = df[(df.policy == "fa2") & df.fin].t.dropna()
    if len(fa):
        F.num("TightnessMedian", float(fa.median()))
        F.num("TightnessWorst", float(fa.min()))
    cols = ["precision", "policy", "cases", "finite and held", "median bound/error",
            "min bound/error", "violations", "vacuous"]
    F.write_table("tab_tightness", tabular(cols, rows, "llrrrrrr"))


def _med_range(s: pd.Series) -> str:
    """median (min--max) over the seeds, or the one value."""
    s = s.dropna()
    if not len(s):
        return r"\nyr"
    if len(s) == 1:
        return tex_num(float(s.iloc[0]))
    return f"{tex_num(float(s.median()))} ({tex_num(float(s.min()))}--{tex_num(float(s.max()))})"


@figure("worst_case")
def tab_worst_case(F: Figures) -> None:
    """The searched inputs and the catalogue's largest absolute error (near_overflow) beside
    gaussian inputs of the same precision, N and seed: max error, normwise relative error
    and ulps; median and range over the seeds (the numbers the text quotes are named
    quantities, flashnum.figures.quantities)."""
    df = F.table("worst_case")
    if df is None:
        return F.placeholder("tab_worst_case", "worst_case")
    if "normwise_rel_err" not in df or not (df.distribution == "worst_case").any():
        raise Unplottable("has no searched rows with a normwise relative error")
    found, near = worst_case_ratios(df, "worst_case"), worst_case_ratios(df, "near_overflow")
    rows = []
    for (prec, n), d in found.groupby(["precision", "seq_len_k"], sort=True):
        o = near[(near.precision == prec) & (near.seq_len_k == n)]
        rows.append([tex_word(prec), tex_num(int(n)), _med_range(d["abs"]), _med_range(d.rel),
                     _med_range(d.ulp), _med_range(d.gauss_ulp), _med_range(o["abs"]),
                     _med_range(o.rel)])
    cols = ["precision", "$N$", "found: max err", "rel.\\ err", "ulps", "gaussian ulps",
            "near\\_overflow: max err", "rel.\\ err"]
    F.write_table("tab_worst_case", tabular(cols, rows, "lrrrrrrr"))


@figure("policy")
def tab_presets(F: Figures) -> None:
    """The presets' format per site (from flashnum.numerics.policy, not from an experiment)."""
    pols = [make_policy(name, "bf16") for name in PRESETS if name != "exact"]
    # the product sites are exact in every preset (a kernel's model sets them): no row
    rows = [[tex_word(site)] + [tex_word(getattr(p, site)) for p in pols] for site in SITES
            if site not in PRODUCT_SITES]
    rows += [[tex_word(a)] + [tex_word(getattr(p, a)) for p in pols]
             for a in ("structure", "l_from")]
    F.write_table("tab_presets", tabular(["site"] + [tex_word(p.name) for p in pols], rows))
