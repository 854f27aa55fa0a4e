"""The reproductions' tables, and the numbers and facts the paper's sentences about them read.

Each reproduction (flashnum.reproduce) stores a table of published numbers beside ours;
its renderer here writes tab_<name>.tex and sets the numbers (F.num, declared in NUMBERS)
and yes/no facts (F.fact, declared in FACTS) that paper.tex quotes and branches on:
agreement is decided from the numbers (AGREE), the sentences live in paper.tex.

    REPRO  name -> (macro key, renderer(F, df, key), the columns it needs)
    tab_repro(F, name)   the table, its numbers and facts (\\if<Key>Incomplete and the
                         table as stored when columns lack)

A new reproduction: a renderer here, a line in REPRO, its numbers in NUMBERS, its facts
in FACTS, its sentences in paper.tex.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from flashnum.figures.context import Figures, slope
from flashnum.figures.pooling import QY_KEYS, pcast_by_config, qiu_yao_pooled, seeded
from flashnum.figures.quantities import QUANTITIES
from flashnum.figures.tex import (
    cell,
    pm,
    tabular,
    tex_escape,
    tex_num,
    tex_word,
)

AGREE = 2.0  # a published number and ours "agree" within this factor (and in sign)


def _agrees(ours: float, published: float) -> bool:
    r = ours / published
    return bool(1 / AGREE <= r <= AGREE)


def _sort(df: pd.DataFrame, **keys) -> pd.DataFrame:
    """Rows in reading order: by each key in turn, by the given value order (None: natural)."""
    cols, tmp = [], {}
    for col, order in keys.items():
        if col not in df.columns:
            continue
        if order is None:
            cols.append(col)
        else:
            rank = {v: i for i, v in enumerate(order)}
            tmp[f"_{col}"] = df[col].map(lambda v, r=rank: r.get(v, len(r)))
            cols.append(f"_{col}")
    return df.assign(**tmp).sort_values(cols, kind="stable") if cols else df


def _dump(F: Figures, stem: str, df: pd.DataFrame) -> None:
    """A table whose columns the paper does not know: shown as stored (first 30 rows)."""
    cols = [c for c in df.columns if c not in ("experiment", "case_id")][:8]
    rows = [[cell(r[c]) for c in cols] for _, r in df[cols].head(30).iterrows()]
    F.write_table(stem, tabular([tex_escape(c) for c in cols], rows))

def repro_fa3(F: Figures, df: pd.DataFrame, key: str) -> None:
    """FA3 Table 3: the best-matching protocol of each section, published beside ours."""
    b = df[df["best"].astype(bool)]
    # the paper's row order: the larger published error first, our diagnostics last
    b = b.assign(_p=-b.published.fillna(-np.inf)).sort_values(["section", "_p", "row"])
    rows = []
    for section in ("fp16", "fp8"):
        part = b[b.section == section]
        if rows and len(part):
            rows.append(None)
        for _, r in part.iterrows():
            rows.append([cell(r.row), tex_num(int(r.n)), tex_num(int(r.d)),
                         cell(r.published), pm(r.ours, r.get("ours_se")),
                         cell(r.ours / r.published if np.isfinite(r.published) else None)])
    cols = ["row", "$N$", "$d$", "published", "ours", "ours / published"]
    F.write_table("tab_repro_fa3_table3", tabular(cols, rows, "lrrrrr"))
    f16 = b[b.section == "fp16"]
    if len(f16):
        r0 = f16.iloc[0]
        proto = (f"$N={int(r0.n)}$, $d={int(r0.d)}$, outlier std {cell(r0.get('outlier_std'))}, "
                 f"softmax scale {cell(r0.get('scale_rule'))}, reference on the "
                 f"{cell(r0.get('ref_inputs'))} inputs")
        F.num(f"{key}Protocol", proto)
        # N, d, both RMSEs, their ratio and the match are named quantities (README quotes them)
        F.fact(f"{key}Pair", (f16.policy == "naive").any() and (f16.policy == "fa2").any())
    f8 = b[b.section == "fp8"]
    F.fact(f"{key}Eight", len(f8) and "match" in f8 and f8["match"].notna().any())
    if "best_joint" in df and df["best_joint"].astype(bool).any():
        j = df[df["best_joint"].astype(bool)]
        F.fact(f"{key}Joint", True)
        F.num(f"{key}JointMatch", float(j["match_joint"].dropna().iloc[0]))
        F.num(f"{key}JointN", str(int(j.n.iloc[0])))
        F.num(f"{key}JointD", str(int(j.d.iloc[0])))
    pub = b[np.isfinite(b.published)]
    off = [r for _, r in pub.iterrows() if not _agrees(r.ours, r.published)]
    F.fact(f"{key}Published", bool(len(pub)))
    F.fact(f"{key}Disagree", bool(off))
    F.num(f"{key}Disagreements", "; ".join(
        f"{cell(r.row)} ({tex_num(float(r.ours / r.published))}$\\times$ the published)"
        for r in off))


GOLDEN_KEYS = ["sweep", "policy", "n", "block_m", "block_n", "sram", "swapped"]


def golden_by_cell(df: pd.DataFrame) -> pd.DataFrame:
    """Golden et al.'s cells over their seeds: the median max deviation (`ours`), the median
    flash / standard ratio (`ratio_to_standard`) with its seeds' min and max, how many."""
    df = seeded(df)
    keys = [k for k in GOLDEN_KEYS if k in df]
    g = df.groupby(keys, sort=False, dropna=False)
    out = g.agg(ours=("ours", "median"), ratio_to_standard=("ratio_to_standard", "median"),
                ratio_min=("ratio_to_standard", "min"), ratio_max=("ratio_to_standard", "max"),
                published_ratio=("published_ratio", "first"), seeds=("seed", "nunique"))
    if "block_m_effect" in df:
        out["block_m_effect"] = g.block_m_effect.max()
    return out.reset_index()


def repro_golden(F: Figures, df: pd.DataFrame, key: str) -> None:
    """Golden et al.: flash / standard max deviation over N, tiles and swapped tiles, each
    cell the median over its seeds with the seeds' range of the ratio beside."""
    cells = golden_by_cell(df)
    cells = _sort(cells, sweep=("length", "tiles"), policy=("naive", "fa2", "lowp"), n=None,
                  sram=None, swapped=None)
    rows = []
    for _, r in cells.iterrows():
        tiles = "--" if r.policy == "naive" else f"{int(r.block_m)}$\\times${int(r.block_n)}"
        spread = (f"{cell(r.ratio_min)}--{cell(r.ratio_max)}"
                  if r.seeds > 1 and r.policy != "naive" else "--")
        rows.append([cell(r.sweep), cell(r.policy), tex_num(int(r.n)), tiles,
                     "yes" if bool(r.get("swapped", False)) else "",
                     cell(r.ours), cell(r.ratio_to_standard), spread, cell(r.published_ratio)])
    cols = ["sweep", "policy", "$N$", "$B_r\\times B_c$", "swapped", r"max$|\hat o - o|$",
            "/ standard", "per seed", "published"]
    F.write_table("tab_repro_is_flash_stable", tabular(cols, rows, "llrrlrrrr"))
    _golden_facts(F, cells, key)  # its seeds are a named quantity (GoldenSeeds)


def _golden_facts(F: Figures, cells: pd.DataFrame, key: str) -> None:
    """The numbers and facts of the length and tile sweeps, from the cells' medians (a
    statement about every N or every seed reads the seeds' extremes)."""
    length = cells[cells.sweep == "length"]
    pub = (float(cells.published_ratio.dropna().iloc[0]) if cells.published_ratio.notna().any()
           else 10)
    F.num(f"{key}Published", pub)
    near, below = {}, {}
    for pol, name in (("fa2", "Fa"), ("lowp", "Lowp")):
        d = length[length.policy == pol].sort_values("n")
        if not len(d):
            continue
        F.num(f"{key}Ratio{name}", float(d.ratio_to_standard.median()))
        lo, hi = d.iloc[0], d.iloc[-1]
        F.fact(f"{key}Length{name}", True)
        F.num(f"{key}From{name}", float(lo.ratio_to_standard))
        F.num(f"{key}FromN{name}", int(lo.n))
        F.num(f"{key}To{name}", float(hi.ratio_to_standard))
        F.num(f"{key}ToN{name}", int(hi.n))
        ok = d[[_agrees(r, pub) for r in d.ratio_to_standard]]
        if len(ok):
            near[pol] = ", ".join(tex_num(int(n)) for n in ok.n)
        below[pol] = bool((d.ratio_max < 1).all())  # in every seed at every N
    F.fact(f"{key}Matched", bool(near))
    F.fact(f"{key}Measured", bool(below))
    F.num(f"{key}Near", " and ".join(f"\\texttt{{{p}}} at $N={n}$" for p, n in near.items()))
    F.fact(f"{key}FaBelow", bool(below.get("fa2")))
    F.fact(f"{key}OnlyLowState", bool(near) and "fa2" not in near)
    slopes = []
    for pol, name in (("naive", "LenSlopeStd"), ("fa2", "LenSlopeFa"), ("lowp", None)):
        d = length[length.policy == pol].sort_values("n")
        if d.n.nunique() >= 2:
            a = slope(d.n, d.ours)
            if name:
                F.num(f"{key}{name}", a)
            slopes.append(f"$N^{{{a:.2f}}}$ ({'standard' if pol == 'naive' else pol})")
    F.fact(f"{key}Slopes", bool(slopes))
    F.num(f"{key}SlopeList", ", ".join(slopes))
    tiles = cells[(cells.sweep == "tiles") & ~cells.swapped.astype(bool)]
    for pol, name in (("fa2", "Fa"), ("lowp", "Lowp")):
        d = tiles[tiles.policy == pol].sort_values("sram")
        if len(d) >= 2:
            F.fact(f"{key}Tiles{name}", True)
            F.num(f"{key}Tiles{name}", float(d.ours.iloc[-1] / d.ours.iloc[0]))
    if "block_m_effect" in cells and cells.block_m_effect.notna().any():
        e = float(cells.block_m_effect.max())
        F.num(f"{key}SwapEffect", e)
        F.fact(f"{key}Swap", True)
        F.fact(f"{key}SwapExact", e == 0)


def repro_qiu_yao(F: Figures, df: pd.DataFrame, key: str) -> None:
    """Qiu & Yao: the bias (mean signed error, z over heads) without the fix, with the
    paper's idealised fix and with their released code's, pooled over the seeds with each
    seed's z beside, at every logit std; the released clamp's onset."""
    sweep = df[df.distribution == "clamp_sweep"] if "max_logit" in df else df.iloc[:0]
    pooled = _sort(qiu_yao_pooled(df), distribution=("ties", "ties_broken", "gaussian"),
                   logit_std=None, policy=("lowp", "fa2"),
                   variant=("fa2", "qiu_yao", "qiu_yao_released"))
    F.write_table("tab_repro_qiu_yao", tabular(_QY_COLS, _qiu_yao_rows(pooled, df),
                                               "lrlrrrrrrrl"))
    # the pooled z per logit std and what the sentences branch on are named quantities
    # (flashnum.figures.quantities: QiuYaoZ<Std>, \\ifQiuYaoFixHelps<Std>, ...)
    F.fact(f"{key}Ties", bool(((pooled.distribution == "ties") & (pooled.policy == "lowp")).any()))
    _qiu_yao_onset(F, sweep, key)
    e_rel = QUANTITIES[f"{key}ReleasedErr"].value(F)
    F.fact(f"{key}HaveReleased", bool(e_rel is not None and np.isfinite(e_rel)))


_QY_COLS = ["inputs", "logit std", "policy", "mean signed error", "$z$", "$z$ per seed",
            "$z$ with fix", "$z$ of the fix", "released fix: error", "$z$", "published"]


def _qiu_yao_rows(pooled: pd.DataFrame, df: pd.DataFrame) -> list[list[str]]:
    """One table row per input, logit std and policy: without the fix, with it (pooled z,
    the fix's paired z), with the release; each seed's z range without the fix; what the
    paper published for the row (their finding, where it speaks of it)."""
    said = {}
    if "published_finding" in df:
        for _, r in df[df.published_finding.astype(str) != ""].iterrows():
            k = (r.distribution, r.get("logit_std"), r.policy)
            said.setdefault(k, [])
            if r.published_finding not in said[k]:
                said[k].append(r.published_finding)
    rows = []
    for _, g in pooled.groupby(QY_KEYS, sort=False, dropna=False):
        by = {r.variant: r for _, r in g.iterrows()}
        r, rf, rr = by.get("fa2"), by.get("qiu_yao"), by.get("qiu_yao_released")
        if r is None:
            continue
        finding = " / ".join(said.get((r.distribution, r.logit_std, r.policy), [])) or "--"
        per_seed = (f"{cell(r.z_min)} to {cell(r.z_max)}" if r.seeds > 1 else "--")
        rows.append([cell(r.distribution), cell(r.logit_std), cell(r.policy),
                     pm(r.ours, r.ours_se), cell(r.z), per_seed,
                     "--" if rf is None else cell(rf.z),
                     "--" if rf is None else cell(rf.get("z_fix")),
                     "--" if rr is None else pm(rr.ours, rr.ours_se),
                     "--" if rr is None else cell(rr.z), finding])
    return rows


def _qiu_yao_onset(F: Figures, sweep: pd.DataFrame, key: str) -> None:
    """The released fix's clamp: the derived onset beside the measured one (lowp rows)."""
    sw = sweep[(sweep.variant == "qiu_yao_released") & (sweep.policy == "lowp")]
    if not len(sw) or "onset" not in sw:
        return
    # the onset, derived and measured, and the last exact max logit are named quantities
    collapsed = sw[sw.ours < 0.99].max_logit
    last_ok = sw[sw.ours >= 0.99].max_logit
    F.fact(f"{key}HaveOnset", True)
    if len(last_ok) and len(collapsed):
        F.fact(f"{key}OnsetStraddled", True)
        F.num(f"{key}CollapseMin", float(sw.ours.min()))
        F.num(f"{key}CollapseAt", float(sw.max_logit.max()))

def repro_pcast(F: Figures, df: pd.DataFrame, key: str) -> None:
    """fp8 P cast: MSE by key order and static scale, its gain over forward order, each
    the median over the seeds (the best gain's range over them beside)."""
    c = _sort(pcast_by_config(df), n=None, height=None, p_scale=None,
              order=("forward", "reverse"))
    # one row per length and sink: the baseline (forward, no scale) and the gains over it
    top = c.p_scale.max()
    rows = []
    for _, g in c.groupby(["n", "height"], sort=False):
        def at(order, sc, col, g=g):
            d = g[(g.order == order) & (g.p_scale == sc)]
            return d[col].iloc[0] if len(d) else math.nan
        best = g[(g.order == "reverse") & (g.p_scale == top)]
        pub = (f"{cell(best.published_ratio_lo.iloc[0])}--{cell(best.published_ratio_hi.iloc[0])}"
               if len(best) and np.isfinite(best.published_ratio_lo.iloc[0]) else "--")
        lo, hi = at("reverse", top, "ratio_min"), at("reverse", top, "ratio_max")
        spread = f"{cell(lo)}--{cell(hi)}" if at("reverse", top, "seeds") > 1 else "--"
        rows.append([tex_num(int(g.n.iloc[0])), cell(g.realised_height.median()),
                     pm(at("forward", 1, "ours"), at("forward", 1, "ours_se")),
                     cell(at("forward", 1, "underflow_fraction")),
                     cell(at("reverse", 1, "ratio_vs_forward")),
                     cell(at("forward", top, "ratio_vs_forward")),
                     cell(at("reverse", top, "ratio_vs_forward")), spread,
                     cell(at("reverse", top, "underflow_fraction")), pub])
    cols = ["$N$", "sink height", "MSE, forward", "underflow", "reverse",
            f"$S={tex_num(top)}$", f"reverse, $S={tex_num(top)}$", "per seed", "underflow",
            "published"]
    F.write_table("tab_repro_fp8_pcast", tabular(cols, rows, "rrrrrrrrrr"))
    _pcast_facts(F, c, key)


def _pcast_facts(F: Figures, c: pd.DataFrame, key: str) -> None:
    """The gains the sentences quote (medians over the seeds) and whether they agree."""
    top = c.p_scale.max()
    best = c[(c.order == "reverse") & (c.p_scale == top)].ratio_vs_forward
    rev = c[(c.order == "reverse") & (c.p_scale == 1)].ratio_vs_forward
    sc = c[(c.order == "forward") & (c.p_scale == top)].ratio_vs_forward
    und = c[(c.order == "forward") & (c.p_scale == 1)].underflow_fraction
    F.fact(f"{key}Best", bool(len(best)))
    if not len(best):
        return
    F.num(f"{key}Scale", top)
    F.num(f"{key}PublishedLo", float(c.published_ratio_lo.dropna().min()))
    F.num(f"{key}PublishedHi", float(c.published_ratio_hi.dropna().max()))
    F.num(f"{key}Ratio", float(best.median()))  # its min and max are named quantities
    F.fact(f"{key}OneCase", len(best) == 1)
    if len(rev) and len(sc):
        F.fact(f"{key}Alone", True)
        F.num(f"{key}ScaleOnly", float(sc.median()))
    if len(rev):
        F.num(f"{key}ReverseOnly", float(rev.median()))
    if len(und):
        F.fact(f"{key}Underflow", True)
        F.num(f"{key}UnderflowForward", float(und.median()))
    lo_pub = float(c.published_ratio_lo.dropna().min())
    hi_pub = float(c.published_ratio_hi.dropna().max())
    F.fact(f"{key}Agrees", bool(best.min() >= lo_pub / AGREE and best.max() <= hi_pub * AGREE))
    F.fact(f"{key}Larger", bool(best.median() > hi_pub))


REPRO = {
    "repro_fa3_table3": ("FaThree", repro_fa3,
                         {"row", "section", "best", "n", "d", "policy", "ours", "published"}),
    "repro_is_flash_stable": ("Golden", repro_golden,
                              {"sweep", "policy", "n", "block_m", "block_n", "swapped",
                               "sram", "ours", "ratio_to_standard", "published_ratio"}),
    "repro_qiu_yao": ("QiuYao", repro_qiu_yao,
                      {"distribution", "policy", "variant", "ours", "z_heads", "z_fix"}),
    "repro_fp8_pcast": ("Pcast", repro_pcast,
                        {"n", "realised_height", "p_scale", "order", "ours",
                         "underflow_fraction", "ratio_vs_forward", "published_ratio_lo",
                         "published_ratio_hi"}),
}
REPROS = tuple(REPRO)


def tab_repro(F: Figures, name: str) -> None:
    """A reproduction's table, its numbers and facts (\\if<Key>Incomplete when columns lack)."""
    key, render, needs = REPRO[name]
    stem = f"tab_{name}"
    df = F.table(name)
    if df is None:
        return F.placeholder(stem, name)
    F.num("AgreeFactor", AGREE)
    missing = sorted(needs - set(df.columns))
    F.fact(f"{key}Incomplete", bool(missing))
    F.num(f"{key}Missing", ", ".join(tex_word(c) for c in missing))
    if missing:
        _dump(F, stem, df)
        return
    render(F, df, key)
