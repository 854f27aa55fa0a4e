"""The summary a run prints: counts, reference quality, invariants, worst cases, growth.

    print(summary(df, cfg, counts, wall, n_workers, failures))
    growth(df, "seq_len_k")     # {policy: (slope, groups, points)}: error ~ N^slope

growth fits the exponent within groups of rows that differ only in the swept axis
(a fixed-effects log-log least-squares fit), so axes that differ between slices of
the grid do not leak into it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from flashnum.analysis.bounds import accounting, accounting_phrase
from flashnum.harness.grid import CASE_FIELDS


def growth(df, x: str, y: str = "max_abs_err", by: str = "policy") -> dict:
    """Fitted exponent of y ~ x^slope per `by`: log-log least squares within groups.

    Rows are grouped by every case field except x (so a group differs only in x:
    same distribution, seed, tiling, ...); the slope pools the within-group
    variation (a fixed-effects fit), so axes that differ between slices do not
    leak into it. Returns {value of by: (slope, number of groups used, points)}.
    """
    out = {}
    if df is None or not len(df) or x not in df or y not in df:
        return out
    skip = {x, "seq_len_q"} if x == "seq_len_k" else {x}
    keys = [f for f in CASE_FIELDS if f not in skip and f != by and f in df]
    for val, sub in df.groupby(by, sort=True):
        sub = sub[(sub[y] > 0) & np.isfinite(sub[y])]
        if not len(sub):
            continue
        lx, ly = np.log(sub[x].astype(float)), np.log(sub[y].astype(float))
        g = sub[keys].astype(str).agg("|".join, axis=1) if keys else np.zeros(len(sub))
        n_x = lx.groupby(g).transform("nunique")
        use = n_x > 1
        if not use.any():
            continue
        dx = (lx - lx.groupby(g).transform("mean"))[use]
        dy = (ly - ly.groupby(g).transform("mean"))[use]
        den = float((dx * dx).sum())
        if den > 0:
            out[val] = (float((dx * dy).sum() / den), int(g[use].nunique()), int(use.sum()))
    return out


def summary(df, cfg, counts, wall, n_workers, failures) -> str:
    """The text a run prints at its end (df: the rows of the cases it selected)."""
    lines = [f"== {cfg.experiment}: {counts['grid']} cases in the grid, {counts['selected']} "
             f"selected, {counts['done_before']} already done, {counts['run']} run now, "
             f"{counts['failed']} failed; wall {wall:.1f} s on {n_workers} worker(s)"]
    for cid, msg in failures[:5]:
        lines.append(f"  failed {cid}: {msg}")
    if df is None or not len(df):
        return "\n".join(lines)
    n = len(df)
    meth = df["reference_method"].value_counts().to_dict()
    lines.append(f"reference: {', '.join(f'{k} {v}' for k, v in sorted(meth.items()))} rows; "
                 f"err_bound <= {cfg.reference.ok_ratio:g} x the error in "
                 f"{int(df['ref_ok'].sum())}/{n} rows (max err_bound "
                 f"{df['ref_err_bound'].max():.2g}; max err_bound / error "
                 f"{(df['ref_err_bound'] / df['max_abs_err']).replace(np.inf, np.nan).max():.2g})")
    bad = df[~df["ref_ok"].astype(bool)]
    if len(bad):
        lines.append(f"  FLAG: {len(bad)} rows whose reference is not far below their error "
                     f"(e.g. {bad['case_id'].iloc[0]}): read their errors as upper bounds only")
    acc = accounting(df["bound"], df["bound_holds"])
    lines.append(f"invariants: m_ok {int(df['m_ok'].sum())}/{n}, l_ok {int(df['l_ok'].sum())}/{n};"
                 f" a-priori bound {accounting_phrase(acc)} rows")
    cols = [c for c in ("case_id", "precision", "policy", "distribution", "seq_len_k", "block_n",
                        "order", "variant", "backend", "max_abs_err", "max_ulp_err", "bound")
            if c in df and df[c].nunique() > 0]
    worst = df.sort_values("max_abs_err", ascending=False).head(cfg.worst)
    lines.append(f"worst {len(worst)} cases by max_abs_err:")
    lines.append(_table(worst[cols]))
    rows = []
    for y in ("max_abs_err", "normwise_rel_err"):
        gn, gb = growth(df, "seq_len_k", y), growth(df, "block_n", y)
        for pol in sorted(set(gn) | set(gb)):
            a, b = gn.get(pol), gb.get(pol)
            rows.append(dict(error=y, policy=pol,
                             slope_N=f"{a[0]:+.2f} ({a[1]} groups)" if a else "-",
                             slope_block_n=f"{b[0]:+.2f} ({b[1]} groups)" if b else "-"))
    if rows:
        lines.append("growth: error ~ N^slope_N and ~ block_n^slope_block_n (log-log least "
                     "squares within groups differing only in N = seq_len_k, or in block_n)")
        lines.append(_table(pd.DataFrame(rows)))
    return "\n".join(lines)


def _table(df) -> str:
    def fmt(x):
        if isinstance(x, float):
            return f"{x:.3g}"
        return str(x)

    return df.to_string(index=False, formatters={c: fmt for c in df.columns})
