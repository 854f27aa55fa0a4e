"""The paper's tables from the sweeps and the presets (booktabs, via tex.tabular).

    tab_tightness   the bf16/fp16/fp32 sweeps: bound / measured error per precision, policy
    tab_worst_case  worst_case: the worst distributions against gaussian
    tab_presets     the presets' format per site (flashnum.numerics.policy: no experiment)

A new table: a function tab_<name>(F) here and a line in flashnum.figures.FIGURES.
The reproductions' tables are written by flashnum.figures.reproductions.
"""

from __future__ import annotations

import math

import pandas as pd

from flashnum.figures.context import ERR, SWEEPS, Figures
from flashnum.figures.tex import tabular, tex_escape, tex_num, tex_word
from flashnum.numerics.policy import PRESETS, SITES, make_policy


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


def tab_worst_case(F: Figures) -> None:
    df = F.table("worst_case")
    if df is None:
        return F.placeholder("tab_worst_case", "worst_case")
    keys = [c for c in ("precision", "policy", "seq_len_k") if c in df]
    worst = df.loc[df.groupby("distribution")[ERR].idxmax()].sort_values(ERR, ascending=False)
    base = df[df.distribution == "gaussian"].groupby(keys)[ERR].max() if keys else None
    rows = []
    for _, r in worst.head(10).iterrows():
        ratio = math.nan
        if base is not None:
            k = tuple(r[c] for c in keys)
            k = k[0] if len(k) == 1 else k
            if k in base.index and base[k] > 0:
                ratio = r[ERR] / base[k]
        rows.append([tex_word(r.distribution)] + [tex_word(r[c]) for c in keys]
                    + [tex_num(r[ERR]), tex_num(ratio)])
    top = worst.iloc[0]
    F.num("WorstCaseDist", tex_word(top.distribution))
    F.num("WorstCaseErr", float(top[ERR]))
    if rows and rows[0][-1] != r"\nyr":
        F.num("WorstCaseRatio", rows[0][-1])
    cols = ["distribution"] + [tex_escape(c) for c in keys] + [r"max$|\hat o - o|$",
                                                               "/ gaussian"]
    F.write_table("tab_worst_case", tabular(cols, rows, "l" * (1 + len(keys)) + "rr"))


def tab_presets(F: Figures) -> None:
    """The presets' format per site (from flashnum.numerics.policy, not from an experiment)."""
    pols = [make_policy(name, "bf16") for name in PRESETS if name != "exact"]
    rows = [[tex_word(site)] + [tex_word(getattr(p, site)) for p in pols] for site in SITES]
    rows += [[tex_word(a)] + [tex_word(getattr(p, a)) for p in pols]
             for a in ("structure", "l_from")]
    F.write_table("tab_presets", tabular(["site"] + [tex_word(p.name) for p in pols], rows))
