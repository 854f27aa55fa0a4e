"""The named quantities of the sweeps: their sizes, how the error grows with N and block_n,
the invariants on every row, the exhaustive exp check and the bounds' tightness
(flashnum.figures.quantities)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from flashnum.figures.quoting import Fact, Quantity
from flashnum.studies.exp_exhaustive import summary as exp_summary


def _exp(key: Callable[[dict], int]) -> Callable[[object], object]:
    """A count of the exhaustive check of the exp site (experiments/exp_exhaustive,
    python -m flashnum.run experiment=exp_exhaustive), summed over exp and exp2."""
    def value(F):
        df = F.table("exp_exhaustive")
        if df is None:
            return None
        r = exp_summary(df)
        try:
            return sum(key(r[f]) for f in ("exp", "exp2") if f in r)
        except KeyError:  # a table stored before the check had this column: not measured
            return None
    return value


def _rows(name: str) -> Callable[[object], object]:
    """How many rows an experiment's stored table holds."""
    def value(F):
        df = F.table(name)
        return None if df is None else len(df)
    return value


# the sweeps besides bf16_sweep
SWEEPS = ("fp16_sweep", "fp32_sweep", "block_order", "block_size", "seqlen_growth",
          "precision_bits", "kernel_vs_emulator", "worst_case")
# the sweeps whose every row the invariants m_ok and l_ok are checked on
INVARIANT_SWEEPS = ("bf16_sweep", *SWEEPS)


def _slope(x, y) -> float:
    """Least-squares exponent a of y ~ x^a over the positive points (as the figures fit)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = (x > 0) & (y > 0) & np.isfinite(y)
    if len(np.unique(x[ok])) < 2:
        return math.nan
    return float(np.polyfit(np.log(x[ok]), np.log(y[ok]), 1)[0])


def _exponents(F, name: str, x: str, policy: str, precision: str,
               col: str = "normwise_rel_err") -> dict | None:
    """{distribution: the exponent a of col ~ x^a} of one policy and precision of a sweep,
    each fitted to the median over the seeds at each x (block_size: at its largest N and
    block_m 64, the swapped slice aside); None without the table."""
    df = F.table(name)
    if df is None:
        return None
    d = df[(df.policy == policy) & (df.precision == precision)]
    if name == "block_size":
        d = d[(d.block_m == 64) & (d.seq_len_k == d.seq_len_k.max())]
    out = {}
    for dist, g in d.groupby("distribution"):
        med = g.groupby(x)[col].median().sort_index()
        out[dist] = _slope(med.index.to_numpy(float), med.to_numpy(float))
    return out


def _growth(name: str, x: str, policy: str, precisions: tuple, how: Callable
            ) -> Callable[[object], object]:
    """how(the exponents of every distribution and precision in `precisions`)."""
    def value(F):
        per = [_exponents(F, name, x, policy, p) for p in precisions]
        if any(e is None for e in per):
            return None
        vals = [a for e in per for a in e.values()]
        return how(vals) if vals else math.nan
    return value


def _seeds(name: str) -> Callable[[object], object]:
    """How many seeds a table's rows were drawn at."""
    def value(F):
        df = F.table(name)
        return None if df is None else int(df.seed.nunique())
    return value


def _growth_quantities() -> dict:
    """How the normwise relative error grows with N (seqlen_growth) and with block_n
    (block_size) per distribution: the range of the exponents of fa2 and lowp, and
    whether lowp's has one sign on every distribution."""
    out = {}
    quoted = (("N", "seqlen_growth", "seq_len_k", "fa2", ("bf16", "fp16")),
              ("NLowpBf", "seqlen_growth", "seq_len_k", "lowp", ("bf16",)),
              ("NLowpFp", "seqlen_growth", "seq_len_k", "lowp", ("fp16",)),
              ("BlockN", "block_size", "block_n", "fa2", ("bf16",)),
              ("BlockNLowp", "block_size", "block_n", "lowp", ("bf16",)))
    for key, name, x, pol, precs in quoted:
        for m, mw, how in (("Lo", "smallest", min), ("Hi", "largest", max)):
            out[f"Growth{key}{m}"] = Quantity(
                f"{name}: the {mw} exponent a of normwise relative error ~ {x}^a over its "
                f"distributions, {pol}, {'/'.join(precs)} (median over seeds per point)",
                _growth(name, x, pol, precs, how), md=lambda a: f"{a:+.2f}", paper=False)
    for key, name in (("SeqlenGrowth", "seqlen_growth"), ("BlockSize", "block_size"),
                      ("Attribution", "attribution")):
        out[f"{key}Seeds"] = Quantity(f"{name}: seeds", _seeds(name), paper=False)
    out["GrowthNLowpAllGrow"] = Fact(
        "seqlen_growth: lowp's normwise relative error grows with N on every distribution, "
        "bf16 and fp16", _growth("seqlen_growth", "seq_len_k", "lowp", ("bf16", "fp16"),
                                 lambda v: all(a > 0 for a in v)),
        "on every one", "not on every one")
    out["GrowthBlockNLowpAllFall"] = Fact(
        "block_size: lowp's normwise relative error falls with block_n on every distribution",
        _growth("block_size", "block_n", "lowp", ("bf16",), lambda v: all(a < 0 for a in v)),
        "on every one", "not on every one")
    return out


def _invariants_hold(F):
    """Whether m_ok and l_ok hold in every row of every sweep (None: a sweep is missing)."""
    tables = [F.table(n) for n in INVARIANT_SWEEPS]
    if any(t is None for t in tables):
        return None
    return all(bool(t[c].astype(bool).all()) for t in tables for c in ("m_ok", "l_ok"))


def _tightness_median(F):
    """The median bound / error of fa2 in bf16 and fp16 where the bound is finite
    (experiments/bound_tightness, python -m flashnum.run experiment=bound_tightness)."""
    t = F.table("bound_tightness")
    if t is None:
        return None
    fa = t[(t.policy == "fa2") & t.precision.isin(["bf16", "fp16"]) & t.bound.map(math.isfinite)]
    return float(fa.tightness.median())
