"""The named quantities of Qiu & Yao's rounding bias (repro_qiu_yao): the pooled z per
logit spread, the facts the sentences branch on, the released fix's clamp sweep
(flashnum.figures.quantities)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pandas as pd

from flashnum.figures.pooling import qiu_yao_pooled
from flashnum.figures.quoting import Fact, Quantity, fixed, two
from flashnum.figures.tex import tex_name
from flashnum.reproduce.qiu_yao_bias import QY_SIZES

QY_STDS = QY_SIZES["full"]["logit_stds"]  # the logit spreads repro_qiu_yao measures


def _qy_row(F, dist: str, policy: str, variant: str, std: float | None):
    """One row of repro_qiu_yao pooled over its seeds (flashnum.figures.pooling), or None."""
    df = F.table("repro_qiu_yao")
    if df is None or "z_heads" not in df:
        return None
    p = qiu_yao_pooled(df)
    d = p[(p.distribution == dist) & (p.policy == policy) & (p.variant == variant)]
    d = d[d.logit_std == std] if std is not None else d
    return d.iloc[0] if len(d) else math.nan


def _qy(dist: str, policy: str, variant: str, col: str, std: float | None,
        how: Callable = float) -> Callable[[object], object]:
    """A column of one pooled row of repro_qiu_yao (NaN when the row is not there)."""
    def value(F):
        r = _qy_row(F, dist, policy, variant, std)
        return r if r is None or not isinstance(r, pd.Series) else how(r[col])
    return value


def _qy_fact(test: Callable[[dict], bool], **cols) -> Callable[[object], object]:
    """A yes/no of pooled repro_qiu_yao numbers: test({name: value}) over cols, each
    name -> (dist, policy, variant, col, std)."""
    def value(F):
        vals = {k: _qy(*spec)(F) for k, spec in cols.items()}
        if any(v is None for v in vals.values()):
            return None
        return bool(test(vals))
    return value


def _qy_quantities() -> dict:
    """Qiu & Yao's pooled numbers and the facts the sentences branch on, per logit std:
    QiuYaoZ<Std> (ties, lowp, no fix), ZMin/ZMax (its seeds' range), ZFixed (the
    idealised fix), ZFix (the fix's paired z, > 0: it shrinks |bias|), ZBroken (ties
    broken), ZFaTwo (fa2 state); NaN where not measured."""
    out = {}
    for std in QY_STDS:
        S, at = tex_name(str(int(std))), f"logit std {std:g}"
        tie, fix = ("ties", "lowp", "fa2"), ("ties", "lowp", "qiu_yao")
        for k, spec, w in (
                ("Z", (*tie, "z"), "z of the bias pooled over seeds, ties, lowp, no fix"),
                ("ZMin", (*tie, "z_min"), "the smallest z of one seed, ties, lowp, no fix"),
                ("ZMax", (*tie, "z_max"), "the largest z of one seed, ties, lowp, no fix"),
                ("ZFixed", (*fix, "z"), "pooled z with the idealised fix, ties, lowp"),
                ("ZFix", (*fix, "z_fix"), "pooled paired z of the fix's shrinkage of "
                                            "|bias| (> 0: smaller), ties, lowp"),
                ("ZFixMin", (*fix, "z_fix_min"), "the smallest z_fix of one seed"),
                ("ZFixMax", (*fix, "z_fix_max"), "the largest z_fix of one seed"),
                ("ZBroken", ("ties_broken", "lowp", "fa2", "z"), "pooled z, ties broken, "
                                                                 "lowp, no fix"),
                ("ZFaTwo", ("ties", "fa2", "fa2", "z"), "pooled z, ties, fa2, no fix")):
            out[f"QiuYao{k}{S}"] = Quantity(f"repro_qiu_yao, {at}: {w}",
                                            _qy(*spec[:3], spec[3], std), md=two)
        # how many seeds are significant alone: without the fix at every spread, with it
        # where the text says what it leaves (the peaked rows)
        counted = [("SeedsBiased", tie, "ties, lowp, no fix")] + (
            [("SeedsBiasedFixed", fix, "ties, lowp, the idealised fix")]
            if std == QY_STDS[-1] else [])
        for k, spec, w in counted:
            out[f"QiuYao{k}{S}"] = Quantity(
                f"repro_qiu_yao, {at}: seeds whose own z has the pooled sign and |z| >= 3, {w}",
                _qy(*spec, "seeds_significant", std, int), tex=str)
        z, zf, zb = ((*tie, "z", std), (*fix, "z_fix", std),
                     ("ties_broken", "lowp", "fa2", "z", std))
        for k, test, cols, w, yes, no in (
                ("Negative", lambda v: v["z"] <= -3, dict(z=z),
                 "pooled z <= -3 on ties, lowp (the published negative bias)",
                 "a negative bias", "no negative bias"),
                ("FixHelps", lambda v: v["zf"] >= 3, dict(zf=zf),
                 "the idealised fix shrinks |bias| by >= 3 paired standard errors",
                 "shrinks it", "does not shrink it"),
                ("FixHurts", lambda v: v["zf"] <= -3, dict(zf=zf),
                 "the idealised fix grows |bias| by >= 3 paired standard errors",
                 "makes it larger", "does not make it larger"),
                ("BrokenBiased", lambda v: abs(v["zb"]) >= 3, dict(zb=zb),
                 "|pooled z| >= 3 with the ties broken", "biased", "not biased"),
                ("BrokenSameSign", lambda v: v["zb"] * v["z"] > 0, dict(z=z, zb=zb),
                 "the control's pooled z has the sign of the ties'", "same sign",
                 "opposite sign")):
            out[f"QiuYao{k}{S}"] = Fact(f"repro_qiu_yao, {at}: {w}", _qy_fact(test, **cols),
                                        yes, no, paper=True)
    top, others = tex_name(str(int(QY_STDS[-1]))), [tex_name(str(int(x))) for x in QY_STDS[:-1]]

    def only_peaked(F):
        helps = {S: out[f"QiuYaoFixHelps{S}"].value(F) for S in (top, *others)}
        if any(v is None for v in helps.values()):
            return None
        return bool(helps[top] and not any(helps[S] for S in others))

    out["QiuYaoFixHelpsOnlyPeaked"] = Fact(
        f"repro_qiu_yao: the idealised fix shrinks |bias| at logit std {QY_STDS[-1]:g} and at "
        "no smaller spread", only_peaked, "only on the peaked rows", "not only there",
        paper=True)
    out["QiuYaoSeeds"] = Quantity("repro_qiu_yao: seeds pooled per cell",
                                  _qy("ties", "lowp", "fa2", "seeds", QY_STDS[-1], int),
                                  tex=str)
    out["QiuYaoZGauss"] = Quantity("repro_qiu_yao: pooled z on gaussian inputs, lowp, no fix",
                                   _qy("gaussian", "lowp", "fa2", "z", None), md=fixed(1))
    return out


def _clamp(how: Callable) -> Callable[[object], object]:
    """The released fix's clamp sweep (repro_qiu_yao, lowp rows of clamp_sweep), reduced
    by how(rows); None without a sweep."""
    def value(F):
        df = F.table("repro_qiu_yao")
        if df is None or not {"max_logit", "onset"} <= set(df.columns):
            return None
        sw = df[(df.distribution == "clamp_sweep") & (df.variant == "qiu_yao_released")
                & (df.policy == "lowp")]
        return how(sw) if len(sw) else None
    return value


def _max_or_nan(s) -> float:
    return float(s.max()) if len(s) else math.nan


def _min_or_nan(s) -> float:
    return float(s.min()) if len(s) else math.nan
