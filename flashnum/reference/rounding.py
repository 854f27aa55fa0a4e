"""Certified rounding of a double-double with an error bound to float64, vectorised: the
last step of the certified reference's fast path (fast.py).

A value known to lie in [a - B, a + B] (a = ah + al a double-double, B >= 0) has the
float64 Y = RN(a) as its correctly rounded value when the whole interval lies strictly
inside Y's rounding cell (Y - ulp_down/2, Y + ulp_up/2): the cell's ends are ties, which
are left to the arb path (balls.round_ball accepts a ball holding a tie only when it is
exact, and then rounds it to even).
Y = fl(ah + al) is RN(a) (IEEE addition rounds correctly). The gaps to the cell's ends,
(Y - ah) + ulp_up/2 - al and its mirror, are evaluated in float64: Y - ah is exact
(Sterbenz), the two further roundings err by at most 2u * 2 ulp(Y), which the test
charges as 2^-48 ulp(Y). Values below 2^-1000 in magnitude are not accepted (the arb path
handles subnormal results), except an exact zero (a = 0 with B = 0), which is +0.0 as
round_ball returns it.

err_term(Y, B) is round_ball's bound up(up(half_ulp(Y) + up(B))); with B = 0 it is what
round_ball gives for a certain value (fast.py uses that).
"""

from __future__ import annotations

import numpy as np

TINY = 5e-324
MIN_OK = 2.0**-1000


def up(x):
    return np.nextafter(x, np.inf)


def half_ulp(y):
    ay = np.abs(y)
    return np.where(ay >= 2.0**-1022, np.spacing(ay) * 0.5, TINY)


def err_term(y, b):
    return up(up(half_ulp(y) + up(b)))


def certify(ah, al, b):
    """(Y, ok): Y = RN(ah + al) and whether every real within b of ah + al rounds to Y."""
    y = ah + al
    with np.errstate(invalid="ignore", over="ignore"):
        hu = (np.nextafter(y, np.inf) - y) * 0.5
        hd = (y - np.nextafter(y, -np.inf)) * 0.5
        d = y - ah
        slack = np.spacing(np.abs(y)) * 2.0**-48
        gap_up = (d + hu) - al
        gap_dn = al - (d - hd)
        ok = (np.abs(y) >= MIN_OK) & np.isfinite(y) & (b + slack < gap_up) & (b + slack < gap_dn)
    zero = (ah == 0) & (al == 0) & (b == 0)
    y = np.where(zero, 0.0, y)
    return y, ok | zero
