"""The named quantities of the worst-case search (worst_case): the searched inputs and
near_overflow beside gaussian inputs (flashnum.figures.quantities)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

from flashnum.figures.pooling import worst_case_ratios
from flashnum.figures.quoting import Fact, Quantity, fixed, sci


def _worst_case(col: str, precision: str = "bf16", how=None) -> Callable[[object], object]:
    """A column of worst_case's searched rows (distribution worst_case) at d = 64 and the
    largest N: reduced by how over precisions and seeds, or (how None) the median over the
    seeds of `precision`."""
    def value(F):
        df = F.table("worst_case")
        if df is None or col not in df:
            return None
        w = df[(df.distribution == "worst_case") & (df.head_dim == 64)]
        w = w[w.seq_len_k == w.seq_len_k.max()]
        if how is not None:
            return how(w[col]) if len(w) else math.nan
        w = w[w.precision == precision]
        return float(w[col].median()) if len(w) else math.nan
    return value


def _worst(dist: str, col: str, how: Callable, precision: str | None = "bf16",
           n: str | None = "max") -> Callable[[object], object]:
    """A measure of worst_case's `dist` rows beside gaussian's (flashnum.figures.pooling.
    worst_case_ratios: abs, rel, ulp, gauss_ulp, err), reduced over the seeds by how, at
    `precision` (None: every precision) and the largest N (None: every N)."""
    def value(F):
        df = F.table("worst_case")
        if df is None or "normwise_rel_err" not in df:
            return None
        r = worst_case_ratios(df, dist)
        if precision is not None:
            r = r[r.precision == precision]
        if n is not None:
            r = r[r.seq_len_k == r.seq_len_k.max()]
        return float(how(r[col])) if len(r) else math.nan
    return value


def _near_overflow_v(F):
    """The level of near_overflow's V (its dist_params' v_level)."""
    df = F.table("worst_case")
    if df is None:
        return None
    d = df[df.distribution == "near_overflow"]
    return float(json.loads(d.dist_params.iloc[0])["v_level"]) if len(d) else math.nan


def _worst_quantities() -> dict:
    """The worst-case search and the catalogue's largest absolute error (near_overflow),
    each beside gaussian inputs in absolute, normwise relative and ulp terms."""
    med, lo, hi = (lambda s: s.median()), min, max
    w = "worst_case: the searched inputs'"
    out = {
        "WorstCaseSeeds": Quantity("worst_case: searches per precision and N (seeds)",
                                   _worst_case("seed", how=lambda c: c.nunique()), tex=str),
        "WorstCaseN": Quantity("worst_case: the largest N searched",
                               _worst("worst_case", "seq_len_k", max), tex=lambda x: str(int(x)),
                               md=lambda x: str(int(x))),
        **{f"WorstCaseSearch{k}{m}": Quantity(f"{w} max error / gaussian's (|V| in the same "
                                              f"range), {p}, largest N, {mw} over the seeds",
                                              _worst("worst_case", "abs", how, p), md=fixed(0))
           for k, p in (("Bf", "bf16"), ("Fp", "fp16"))
           for m, mw, how in (("", "median", med), ("Min", "smallest", lo),
                              ("Max", "largest", hi))},
        **{f"WorstCaseSearch{k}": Quantity(f"{w} max error / gaussian's, {mw} over every "
                                           "precision, N and seed",
                                           _worst("worst_case", "abs", how, None, None),
                                           md=fixed(0))
           for k, mw, how in (("Lo", "smallest", lo), ("Hi", "largest", hi))},
        "WorstCaseRelBf": Quantity(f"{w} normwise relative error / gaussian's, bf16, largest "
                                   "N, median over the seeds", _worst("worst_case", "rel", med),
                                   md=fixed(2)),
        **{f"WorstCaseRel{k}": Quantity(f"{w} normwise relative error / gaussian's, {mw} over "
                                        "every precision, N and seed",
                                        _worst("worst_case", "rel", how, None, None),
                                        md=fixed(2))
           for k, mw, how in (("Lo", "smallest", lo), ("Hi", "largest", hi))},
        "WorstCaseUlp": Quantity(f"{w} max error in ulps of the output, bf16, largest N, "
                                 "median over the seeds", _worst("worst_case", "ulp", med),
                                 md=fixed(1)),
        "WorstCaseUlpHi": Quantity(f"{w} largest max ulp error over every precision, N and "
                                   "seed", _worst("worst_case", "ulp", hi, None, None),
                                   md=fixed(1)),
        "WorstCaseGaussUlp": Quantity("worst_case: gaussian inputs' max ulp error, bf16, "
                                      "largest N, median over the seeds",
                                      _worst("worst_case", "gauss_ulp", med), md=sci(2)),
        "WorstCaseRelBelow": Fact(f"{w} normwise relative error is below gaussian's at "
                                  "every precision, N and seed",
                                  lambda F: (lambda x: None if x is None else x < 1)(
                                      _worst("worst_case", "rel", hi, None, None)(F)),
                                  "below", "not below", paper=True),
        "NearOverflowV": Quantity("worst_case: the level of near_overflow's V",
                                  _near_overflow_v, md=lambda x: f"{x:.0e}".replace("e+0", "e")),
        "NearOverflowErr": Quantity("worst_case: near_overflow's max error, bf16, largest N, "
                                    "median over the seeds", _worst("near_overflow", "err", med),
                                    md=fixed(0)),
        "NearOverflowAbsBf": Quantity("worst_case: near_overflow's max error / gaussian's, "
                                      "bf16, largest N, median over the seeds",
                                      _worst("near_overflow", "abs", med), md=sci(2)),
        "NearOverflowRelBf": Quantity("worst_case: near_overflow's normwise relative error / "
                                      "gaussian's, bf16, largest N, median over the seeds",
                                      _worst("near_overflow", "rel", med), md=fixed(2)),
        "NearOverflowRelHi": Quantity("worst_case: near_overflow's largest normwise relative "
                                      "error / gaussian's over every precision, N and seed",
                                      _worst("near_overflow", "rel", hi, None, None),
                                      md=fixed(2)),
        "NearOverflowUlpHi": Quantity("worst_case: near_overflow's largest max ulp error over "
                                      "every precision, N and seed",
                                      _worst("near_overflow", "ulp", hi, None, None),
                                      md=fixed(2)),
    }
    return out
