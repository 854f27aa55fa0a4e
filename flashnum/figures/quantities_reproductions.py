"""The named quantities of the other reproductions: Golden et al.'s length sweep
(repro_is_flash_stable) and the fp8 P cast (repro_fp8_pcast) (flashnum.figures.quantities)."""

from __future__ import annotations

import math
from collections.abc import Callable

from flashnum.figures.pooling import pcast_by_config


def _golden_length(policy: str, how: Callable, per: str = "median"
                   ) -> Callable[[object], object]:
    """Golden et al.: the flash / standard deviation ratio over the length sweep
    (repro_is_flash_stable), per N its `per` (median, min or max) over the seeds, reduced
    by how(Series indexed by N)."""
    def value(F):
        df = F.table("repro_is_flash_stable")
        if df is None or "ratio_to_standard" not in df:
            return None
        d = df[(df.sweep == "length") & (df.policy == policy)]
        r = d.groupby("n").ratio_to_standard.agg(per)
        return float(how(r)) if len(r) else math.nan
    return value


def _at(n: int) -> Callable:
    return lambda r: r.get(n, math.nan)


def _pcast(order: str, col: str, how: Callable, height=None) -> Callable[[object], object]:
    """The fp8 P cast (repro_fp8_pcast): a gain at the largest static scale in `order`,
    each configuration's median over its seeds, reduced by how() over every length and
    sink height or at one height (col ratio_min / ratio_max: the seeds' extremes)."""
    def value(F):
        df = F.table("repro_fp8_pcast")
        if df is None or "ratio_vs_forward" not in df:
            return None
        c = pcast_by_config(df)
        if col not in c:
            return None
        d = c[(c.order == order) & (c.p_scale == c.p_scale.max())]
        if height is not None:
            d = d[d.height == height]
        return float(how(d[col])) if len(d) else math.nan
    return value
