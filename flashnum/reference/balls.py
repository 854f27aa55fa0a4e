"""Rounding an arb ball or an mpmath number to float64, and flint's precision for one block:
what the certified and mpmath references share. A ball is accepted when both its ends round
to the same float64 and its relative radius is below 2^-60 (REL_BITS)."""

from __future__ import annotations

import math
from contextlib import contextmanager

U = 2.0**-53  # unit roundoff of fp64
TINY = 5e-324  # smallest subnormal fp64
MIN_NORMAL = 2.0**-1022
REL_BITS = 61  # accept a ball when its relative radius is below 2^-60 (with a bit to spare)


def half_ulp(y: float) -> float:
    """An upper bound on |RN(x) - x| for any real x with RN(x) = y."""
    if math.isinf(y):
        return math.inf
    return math.ulp(y) * 0.5 if abs(y) >= MIN_NORMAL else TINY  # 2^-1075 is not a float


def up(x: float) -> float:
    return math.nextafter(x, math.inf)


def round_ball(x) -> tuple[float, bool, float]:
    """(RN(mid), certain, a bound on |RN(mid) - exact|) for an arb ball x.

    certain: both ends of the ball round to the same float64 (so that float64 is the
    correctly rounded exact value) and the relative radius is below 2^-60. The bound is
    up(up(half_ulp(y) + up(radius))), with radius 0 when certain: a correctly rounded y
    is within half an ulp, whatever the ball's width (so the bound is a function of y
    alone, as the fast path (fast.py) computes it; the radius, <= 2^-60 |y|, could move
    it by an ulp of the bound only at low precision)."""
    lo, hi = float(x.lower()), float(x.upper())  # float(arb) rounds the midpoint to nearest
    y = float(x)
    certain = lo == hi and (lo == 0.0 or x.rel_accuracy_bits() >= REL_BITS)
    rad = 0.0 if certain else float(x.rad())
    err = up(up(half_ulp(y) + up(rad)))
    if certain and lo == 0.0:
        y = 0.0
    return y, certain, err


def mpf_to_float(x) -> float:
    """Round an mpmath mpf to the nearest float64, ties to even, subnormals included
    (Python's int / int is correctly rounded; mpmath's own float() may round twice)."""
    sign, man, exp, _ = x._mpf_  # mpmath's raw (sign, |mantissa|, exponent, bitcount)
    man, exp = (-int(man) if sign else int(man)), int(exp)
    try:
        if exp >= 0:
            return float(man << exp)
        return man / (1 << -exp)
    except OverflowError:
        return math.copysign(math.inf, man)


@contextmanager
def flint_prec(prec: int):
    """flint's precision is process-wide state: set it for one block, then restore it."""
    import flint

    old = flint.ctx.prec
    flint.ctx.prec = prec
    try:
        yield
    finally:
        flint.ctx.prec = old
