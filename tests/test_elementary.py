"""flashnum.numerics.elementary: exp, exp2 and log correctly rounded to float64 (so the same on
every machine, whatever torch's own exp does there); expm1 and log1p within a few ulps.

Oracle: mpmath at 300 bits, printed to 110 digits and rounded to the nearest double by exact
rational arithmetic (Python's int / int division is correctly rounded, subnormals
included); it shares no code with the double-double evaluation or with elementary's own
mpmath fallback (256 bits, its binary mantissa rounded).
"""

import math
from fractions import Fraction

import mpmath as mp
import pytest
import torch

from flashnum.numerics import elementary as el


def nearest(v) -> float:
    if mp.isinf(v):
        return math.inf if v > 0 else -math.inf
    q = Fraction(mp.nstr(v, 110, strip_zeros=False))  # 110 digits: far below half an ulp
    if abs(q) >= Fraction(2) ** 1024 - Fraction(2) ** 970:
        return math.inf if q > 0 else -math.inf
    return q.numerator / q.denominator


def oracle(fn: str, x: float) -> float:
    if math.isnan(x):
        return math.nan
    with mp.workprec(300):
        if fn == "exp":
            return 0.0 if x == -math.inf else nearest(mp.exp(x))
        if fn == "exp2":
            return 0.0 if x == -math.inf else nearest(mp.mpf(2) ** x)
        if x < 0:
            return math.nan
        return -math.inf if x == 0 else nearest(mp.log(x))


def arguments(fn: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(len(fn))
    r = torch.randn(2000, generator=g, dtype=torch.float64)
    if fn == "log":
        xs = [r.abs() * torch.exp(30 * torch.randn(2000, generator=g, dtype=torch.float64)),
              1 + r * 2.0**-30, 1 + r * 2.0**-12,
              torch.tensor([1.0, 2.0, 0.5, 5e-324, 2.0**-1022, 1.7e308, 0.0, math.inf])]
    else:
        hi, lo = (709.78, -745.2) if fn == "exp" else (1023.99, -1075.5)
        xs = [r * s for s in (1e-9, 1e-3, 1.0, 30.0, 300.0)] + [
            torch.linspace(lo, lo + 40, 500, dtype=torch.float64),  # subnormal results
            torch.linspace(hi - 2, hi + 1, 300, dtype=torch.float64),  # overflow threshold
            torch.tensor([0.0, -0.0, 1.0, -1.0, 64.0, math.inf, -math.inf])]
    return torch.cat(xs)


@pytest.mark.parametrize("fn", ["exp", "exp2", "log"])
def test_every_value_is_the_correctly_rounded_double(fn):
    x = arguments(fn)
    got = getattr(el, fn)(x)
    for xv, gv in zip(x.tolist(), got.tolist(), strict=True):
        want = oracle(fn, xv)
        assert gv == want or (math.isnan(gv) and math.isnan(want)), (fn, xv, gv, want)


def test_nan_propagates_and_log_of_negatives_is_nan():
    nan = torch.tensor([math.nan, -1.0])
    assert torch.isnan(el.exp(nan[:1])).all() and torch.isnan(el.log(nan)).all()


@pytest.mark.parametrize("fn", ["expm1", "log1p"])
def test_expm1_and_log1p_stay_within_two_ulps(fn):
    g = torch.Generator().manual_seed(3)
    x = torch.cat([torch.randn(400, generator=g, dtype=torch.float64) * s
                   for s in (1e-12, 1e-5, 1e-3, 2.0**-10, 0.1, 3.0)])
    if fn == "log1p":
        x = x.clamp(min=-0.999)
    got = getattr(el, fn)(x)
    for xv, gv in zip(x.tolist(), got.tolist(), strict=True):
        with mp.workprec(300):
            want = nearest(mp.expm1(xv) if fn == "expm1" else mp.log1p(xv))
        assert abs(gv - want) <= 2 * math.ulp(want), (fn, xv, gv, want)
