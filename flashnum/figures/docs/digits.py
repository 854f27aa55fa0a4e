"""How the documents write numbers: the digits and styles their sentences use.

Each function is one style (99.99% rounded down, +8.2e-5, -8.8, ...), so that a table
(flashnum.figures.docs) renders a number as the document prints it.
"""

from __future__ import annotations

import math

from flashnum.figures import quoting

g2 = quoting.two  # 0.30, 4.0, 16, 1400 style: two significant digits, written out


def pct_floor(frac, digits=2):
    """99.99% style, rounded down: a '>=' claim must not round up."""
    return f"{math.floor(frac * 100 * 10**digits) / 10**digits:.{digits}f}%"


def signed(x):
    """+8.2e-5, -3.3e-4, +0.11, +1.00 style: signed mean errors."""
    s = f"{x:+.2f}" if abs(x) >= 0.095 else quoting.sci(2)(x)
    return s if s[0] in "+-" else "+" + s


def zs(z, sign=True):
    """-8.8, +14, +0.28, +967 style: two significant digits, three from 100 on."""
    s = f"{z:.0f}" if abs(z) >= 100 else g2(z)
    return "+" + s if sign and z >= 0 else s


def pct(frac, digits):
    """12.3456% style: a fraction as a percentage with `digits` decimals."""
    return f"{100 * frac:.{digits}f}%"
