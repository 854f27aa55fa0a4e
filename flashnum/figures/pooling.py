"""What a table measured over several seeds says as one number, and how far its seeds spread.

    seeded(df)                  the table with a `seed` column (one seed when it has none)
    spread(s)                   {median, min, max, seeds} of one measure over its seeds
    pool_bias(df, keys)         the mean signed error of every group of `keys`, pooled over
                                seeds: mean, se, z, and each seed's z (min, max)
    pool_fix(df, keys)          the paired z of a fix's shrinkage of |bias|, pooled likewise
    qiu_yao_pooled(df)          repro_qiu_yao pooled: per input, logit std, policy, variant

A reproduction draws each input at several seeds (flashnum.reproduce); each seed's row
holds a mean over independent heads and its standard error. With the same number of heads
per seed the pooled mean is the mean of the seeds' means and its standard error
sqrt(sum se_i^2) / k: the z-score of all k x heads heads at once. Each seed's own z is
kept beside it, so a sentence can say whether every draw agrees.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd


def seeded(df: pd.DataFrame) -> pd.DataFrame:
    """df with a `seed` column: a table stored before it drew several seeds is one seed."""
    return df if "seed" in df else df.assign(seed=0)


def spread(s: pd.Series) -> dict:
    """The median, min and max of a measure over its seeds, and how many there are."""
    s = pd.Series(s).dropna()
    if not len(s):
        return dict(median=math.nan, min=math.nan, max=math.nan, seeds=0)
    return dict(median=float(s.median()), min=float(s.min()), max=float(s.max()),
                seeds=len(s))


def _pooled(means: pd.Series, ses: pd.Series) -> tuple[float, float, float]:
    k = len(means)
    m = float(means.mean())
    se = float(np.sqrt((ses**2).sum())) / k
    z = m / se if se > 0 else (0.0 if m == 0 else math.copysign(math.inf, m))
    return m, se, z


def pool_bias(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """One row per group of `keys`: the mean signed error (`ours`, its standard error
    `ours_se`) pooled over the group's seeds, its z, each seed's z_heads' min and max, and
    how many seeds and how many of them have z of the pooled sign with |z| >= 3."""
    out = []
    for key, g in seeded(df).groupby(keys, sort=False, dropna=False):
        m, se, z = _pooled(g.ours, g.ours_se)
        zs = g.z_heads
        agree = int(((np.sign(zs) == np.sign(z)) & (zs.abs() >= 3)).sum())
        out.append(dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True),
                        ours=m, ours_se=se, z=z, z_min=float(zs.min()), z_max=float(zs.max()),
                        seeds=len(g), seeds_significant=agree))
    return pd.DataFrame(out)


def _diff_se(g: pd.DataFrame, plain: pd.DataFrame) -> pd.Series:
    """Each seed's standard error of the paired difference (bias without - with the fix):
    stored as fix_diff_se, or recovered from z_fix = shrink / se where it is not."""
    if "fix_diff_se" in g and g.fix_diff_se.notna().all():
        return g.fix_diff_se
    shrink = plain.ours.abs().to_numpy() - g.ours.abs().to_numpy()
    return pd.Series(shrink / g.z_fix.to_numpy(), index=g.index)


def pool_fix(df: pd.DataFrame, keys: list[str], variant: str) -> pd.DataFrame:
    """One row per group of `keys`: |pooled bias without the fix| - |pooled bias with
    `variant`| over the pooled paired standard error (z_fix; > 0: the fix shrinks the
    bias), and each seed's z_fix min and max."""
    df = seeded(df)
    out = []
    for key, g in df[df.variant == variant].groupby(keys, sort=False, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        plain = df[(df.variant == "fa2")
                   & np.logical_and.reduce([df[k] == v if v == v else df[k].isna()
                                            for k, v in zip(keys, key, strict=True)])]
        plain = plain.set_index("seed").loc[g.seed]
        k = len(g)
        shrink = abs(float(plain.ours.mean())) - abs(float(g.ours.mean()))
        se = float(np.sqrt((_diff_se(g, plain) ** 2).sum())) / k
        out.append(dict(zip(keys, key, strict=True), z_fix=shrink / se if se > 0 else math.nan,
                        z_fix_min=float(g.z_fix.min()), z_fix_max=float(g.z_fix.max())))
    return pd.DataFrame(out)


QY_KEYS = ["distribution", "logit_std", "policy"]


def qiu_yao_pooled(df: pd.DataFrame) -> pd.DataFrame:
    """Qiu & Yao's bias (repro_qiu_yao) per input, logit std, policy and variant, pooled
    over the seeds, with the fixes' pooled z_fix beside (NaN for no fix)."""
    df = df[df.distribution != "clamp_sweep"]
    if "logit_std" not in df:
        df = df.assign(logit_std=math.nan)
    bias = pool_bias(df, [*QY_KEYS, "variant"])
    fixes = [pool_fix(df, QY_KEYS, v).assign(variant=v)
             for v in ("qiu_yao", "qiu_yao_released") if (df.variant == v).any()]
    fixes = [f for f in fixes if len(f)]
    if fixes and "z_fix" in df:
        bias = bias.merge(pd.concat(fixes), on=[*QY_KEYS, "variant"], how="left")
    return bias


WORST_KEYS = ["precision", "seq_len_k", "seed"]


def worst_case_ratios(df: pd.DataFrame, dist: str) -> pd.DataFrame:
    """worst_case's rows of `dist` beside gaussian's of the same precision, N and seed:
    max error over gaussian's (`abs`; for the searched inputs the search's own
    search_ratio, gaussian inputs with |V| in the same range), normwise relative error over
    gaussian's (`rel`), max ulp error (`ulp`) and gaussian's (`gauss_ulp`), per seed."""
    df = seeded(df)
    base = df[df.distribution == "gaussian"].set_index(WORST_KEYS)
    d = df[df.distribution == dist].set_index(WORST_KEYS)
    g = base.reindex(d.index)
    abs_ratio = (d.search_ratio if dist == "worst_case" and "search_ratio" in d
                 else d.max_abs_err / g.max_abs_err)
    return pd.DataFrame(dict(abs=abs_ratio, rel=d.normwise_rel_err / g.normwise_rel_err,
                             ulp=d.max_ulp_err, gauss_ulp=g.max_ulp_err,
                             err=d.max_abs_err, rel_err=d.normwise_rel_err,
                             gauss_rel_err=g.normwise_rel_err)).reset_index()


PCAST_KEYS = ["n", "height", "order", "p_scale"]


def pcast_by_config(df: pd.DataFrame) -> pd.DataFrame:
    """repro_fp8_pcast per length, asked sink height, order and scale over its seeds: the
    median of each measure, the seeds' min and max of the gains, how many seeds."""
    df = seeded(df)
    if "height" not in df:  # a table stored before the asked height was kept
        df = df.assign(height=df.realised_height)
    g = df.groupby(PCAST_KEYS, sort=False)
    med = g[["ours", "ours_se", "underflow_fraction", "ratio_vs_forward",
             "realised_height"] + (["ratio_vs_forward_same_scale"]
                                   if "ratio_vs_forward_same_scale" in df else [])].median()
    out = med.assign(ratio_min=g.ratio_vs_forward.min(), ratio_max=g.ratio_vs_forward.max(),
                     seeds=g.seed.nunique(),
                     published_ratio_lo=g.published_ratio_lo.first(),
                     published_ratio_hi=g.published_ratio_hi.first())
    return out.reset_index()
