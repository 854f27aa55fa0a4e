"""Correctly rounded float64 exp, exp2 and log: the same value on every machine.

    from flashnum.numerics.elementary import exp, exp2, log
    y = exp(x)        # float64 tensor in, float64 out: each value the double nearest e^x

torch's float64 exp, exp2 and log are MKL's, SLEEF's or the C library's, chosen by CPU and
by ATen's capability (exp2 already gives other bits under ATEN_CPU_CAPABILITY=default
than under avx2 on one machine): each within an ulp, not the same ulp. The correctly
rounded value is unique, so these give it, by Ziv's method:

  exp(x)   x = n ln2 + j ln2 / 2^12 + r: k = rint(x 2^12 / ln2) (|k| < 2^23, so k C1 and
           k C2 are exact, ln2 / 2^12 = C1 + C2 + C3 with C1, C2 of 29 bits), r in
           double-double, |r| <= ln2 / 2^13 < 2^-13.5; e^r = 1 + r + r^2/2 (double-double:
           Dekker's square) + r^3/6 + r^4/24 + r^5/120 (float64, < 2^-43, its error below
           2^-94) with truncation |r|^6 / 720 < 2^-90; times 2^(j / 2^12) from a table of
           double-doubles (mpmath, 2^-106); 2^n exact. Relative error below 2^-86.
  exp2(x)  the same with k = rint(x 2^12) (x - k / 2^12 exact) and r = that times ln 2 in
           double-double.
  log(x)   y0 = torch.log(x) (any faithful value), then one Newton step in double-double:
           w = x e^-y0 - 1, y = y0 + w - w^2/2 (|w| <= 2^-42: the step's error w^3/3 is
           below 2^-127); absolute error below 2^-85 (e^-y0's).

Each value is decided where its double-double interval lies inside one rounding cell of
float64 (ERR above, with margin); the rest (about one in 2^30, the results near
subnormal or overflow, and log near 1 where the absolute error is not small enough) are
computed by mpmath at 256 bits and rounded exactly (fractions). tests/test_elementary.py
checks them against mpmath.

    expm1(x), log1p(x)   for the a-priori bounds: not correctly rounded but a fixed
             sequence of IEEE operations (so the same bits everywhere), within a few ulps:
             |x| < 2^-10 a degree-7 (degree-9) Taylor polynomial in Horner form (its
             truncation below 2^-70 relative); otherwise from the double-double exp
             (e^x - 1 = (yh - 1) + yl, yh - 1 exact) and log(1 + x) = log(a) + b / a
             with a + b = 1 + x exactly (two_sum).
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import torch

T_BITS = 12
N_T = 1 << T_BITS
EXP_ERR = 2.0**-84  # relative, exp and exp2 (derived: 2^-86), with margin
LOG_ERR = 2.0**-83  # absolute, log (derived: 2^-85)
EXP_RANGE = (-708.0, 709.0)  # the double-double path (normal results, no overflow)
EXP2_RANGE = (-1021.0, 1023.0)
_SPLIT = 134217729.0  # 2^27 + 1, Veltkamp's splitter
CHUNK = 1 << 16


def _two_sum(a, b):
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _fast_two_sum(a, b):
    s = a + b
    return s, b - (s - a)


def _split(a):
    t = _SPLIT * a
    hi = t - (t - a)
    return hi, a - hi


def _two_prod(a, b):
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


@functools.cache
def _constants():
    """ln2 / 2^12 = C1 + C2 + C3 (C1, C2 of 29 bits), ln 2 as a double-double, and the
    table 2^(j / 2^12) as double-doubles, from mpmath at 200 bits."""
    import mpmath as mp

    with mp.workprec(200):
        step = mp.log(2) / N_T
        c1 = math.ldexp(round(math.ldexp(float(step), 29 + 13)), -29 - 13)
        rest = step - c1
        c2 = math.ldexp(round(math.ldexp(float(rest), 29 + 13 + 29)), -29 - 13 - 29)
        c3 = float(rest - c2)
        ln2 = mp.log(2)
        ln2_hi = float(ln2)
        ln2_lo = float(ln2 - ln2_hi)
        hi, lo = [], []
        for j in range(N_T):
            t = mp.mpf(2) ** (mp.mpf(j) / N_T)
            h = float(t)
            hi.append(h)
            lo.append(float(t - h))
    table = torch.tensor([hi, lo], dtype=torch.float64)
    return c1, c2, c3, ln2_hi, ln2_lo, table


def _scaled_exp(k, rh, rl):
    """(yh, yl) ~ e^(rh + rl) 2^(j / 2^12) with j = k mod 2^12, in [0.5, 2) (unscaled by
    2^n), and n = (k - j) / 2^12."""
    table = _constants()[5]
    sh, sl = _two_prod(rh, rh)
    u = rh * sh * ((1.0 / 6) + rh * ((1.0 / 24) + rh * (1.0 / 120)))
    eh, el = _fast_two_sum(torch.ones_like(rh), rh)
    fh, fl = _two_sum(eh, 0.5 * sh)
    low = (el + fl) + ((rl + 0.5 * sl) + (rh * rl + u))
    eh, el = _fast_two_sum(fh, low)
    ki = k.to(torch.int64)
    j = ki & (N_T - 1)
    th, tl = table[0][j], table[1][j]
    p, e = _two_prod(th, eh)
    yh, yl = _fast_two_sum(p, e + (th * el + tl * eh))
    return yh, yl, (ki - j) >> T_BITS


def _decided(yh, yl, err_abs):
    """Where the double nearest yh + yl is yh for every value within err_abs of it."""
    up = torch.nextafter(yh, torch.full_like(yh, math.inf)) - yh
    down = yh - torch.nextafter(yh, torch.full_like(yh, -math.inf))
    room = torch.where(yl >= 0, 0.5 * up - yl, 0.5 * down + yl)
    return room > err_abs


def _exp_chunk(x, base2: bool):
    c1, c2, c3, ln2_hi, ln2_lo, _ = _constants()
    lo, hi = EXP2_RANGE if base2 else EXP_RANGE
    inside = (x >= lo) & (x <= hi)
    # |x| < 2^-60: e^x (2^x) rounds to 1 (within 2^-54 of it, below half an ulp either side);
    # taking x = 0 there keeps subnormal numbers, slow on x86, out of the evaluation
    xs = torch.where(inside & (x.abs() >= 2.0**-60), x, torch.zeros_like(x))
    if base2:
        k = torch.round(xs * N_T)
        rx = xs - k / N_T  # exact: |rx| <= 2^-13, a multiple of min(ulp(x), 2^-12)
        rh, rl = _two_prod(rx, torch.full_like(rx, ln2_hi))
        rl = rl + rx * ln2_lo
        rh, rl = _fast_two_sum(rh, rl)
    else:
        k = torch.round(xs * (N_T / math.log(2)))
        r1, e1 = _two_sum(xs, -(k * c1))
        rh, e2 = _two_sum(r1, -(k * c2))
        rl = ((e1 + e2) + 0.0) - k * c3
        rh, rl = _two_sum(rh, rl)
    yh, yl, n = _scaled_exp(k, rh, rl)
    ok = inside & _decided(yh, yl, EXP_ERR * yh.abs())
    y = torch.ldexp(yh, n.to(torch.float64))
    return y, ok


def _exp_any(x: torch.Tensor, base2: bool) -> torch.Tensor:
    x = x.to(torch.float64)
    flat = x.reshape(-1).contiguous()
    out = torch.empty_like(flat)
    for i in range(0, flat.numel(), CHUNK):
        xc = flat[i : i + CHUNK]
        y, ok = _exp_chunk(xc, base2)
        rest = (~ok).nonzero().flatten()
        if rest.numel():
            y[rest] = torch.tensor([_exp_mp(float(v), base2) for v in xc[rest].tolist()],
                                   dtype=torch.float64)
        out[i : i + CHUNK] = y
    return out.reshape(x.shape)


def exp(x: torch.Tensor) -> torch.Tensor:
    """e^x for every entry, correctly rounded to float64 (nearest, ties to even)."""
    return _exp_any(x, False)


def exp2(x: torch.Tensor) -> torch.Tensor:
    """2^x for every entry, correctly rounded to float64 (nearest, ties to even)."""
    return _exp_any(x, True)


def log(x: torch.Tensor) -> torch.Tensor:
    """The natural log of every entry, correctly rounded to float64 (log 0 = -inf, log of a
    negative number or NaN is NaN)."""
    x = x.to(torch.float64)
    flat = x.reshape(-1).contiguous()
    out = torch.empty_like(flat)
    for i in range(0, flat.numel(), CHUNK):
        xc = flat[i : i + CHUNK]
        normal = (xc >= 2.0**-1022) & (xc < 2.0**1000)  # e^-y0 normal
        xs = torch.where(normal, xc, torch.ones_like(xc))
        y0 = torch.log(xs)
        # e^-y0 as a double-double (|y0| < 745: in exp's range)
        c1, c2, c3 = _constants()[:3]
        xm = -y0
        k = torch.round(xm * (N_T / math.log(2)))
        r1, e1 = _two_sum(xm, -(k * c1))
        rh, e2 = _two_sum(r1, -(k * c2))
        rh, rl = _two_sum(rh, (e1 + e2) - k * c3)
        eh, el, n = _scaled_exp(k, rh, rl)
        eh, el = torch.ldexp(eh, n.to(torch.float64)), torch.ldexp(el, n.to(torch.float64))
        ph, pl = _two_prod(xs, eh)
        pl = pl + xs * el
        wh, wl = _two_sum(ph, -torch.ones_like(ph))
        w = wh + (wl + pl)
        yh, yl = _fast_two_sum(y0, w - 0.5 * w * w)
        ok = normal & _decided(yh, yl, torch.full_like(yh, LOG_ERR)) & (yh != 0)
        y = torch.where(xc == 1.0, torch.zeros_like(yh), yh)
        ok = ok | (xc == 1.0)
        rest = (~ok).nonzero().flatten()
        if rest.numel():
            y[rest] = torch.tensor([_log_mp(v) for v in xc[rest].tolist()], dtype=torch.float64)
        out[i : i + CHUNK] = y
    return out.reshape(x.shape)


def expm1(x: torch.Tensor) -> torch.Tensor:
    """e^x - 1 for every entry (module docstring: deterministic, within a few ulps)."""
    x = x.to(torch.float64)
    flat = x.reshape(-1).contiguous()
    out = torch.empty_like(flat)
    for i in range(0, flat.numel(), CHUNK):
        xc = flat[i : i + CHUNK]
        c = [1.0 / math.factorial(n) for n in range(2, 8)]  # 1/2, 1/6, ..., 1/5040
        t = torch.full_like(xc, c[-1])
        for cn in reversed(c[:-1]):
            t = cn + xc * t
        small = xc + xc * (xc * t)
        big = xc.abs() >= 2.0**-10
        y = small
        if bool(big.any()):
            y = torch.where(big, _expm1_big(torch.where(big, xc, torch.zeros_like(xc))), small)
        out[i : i + CHUNK] = y
    return out.reshape(x.shape)


def _expm1_big(x):
    """(yh - 1) + yl with yh + yl the double-double e^x, |x| >= 2^-10."""
    c1, c2, c3 = _constants()[:3]
    lo, hi = EXP_RANGE
    inside = (x >= lo) & (x <= hi)
    xs = torch.where(inside, x, torch.zeros_like(x))
    k = torch.round(xs * (N_T / math.log(2)))
    r1, e1 = _two_sum(xs, -(k * c1))
    rh, e2 = _two_sum(r1, -(k * c2))
    rh, rl = _two_sum(rh, (e1 + e2) - k * c3)
    yh, yl, n = _scaled_exp(k, rh, rl)
    nf = n.to(torch.float64)
    yh, yl = torch.ldexp(yh, nf), torch.ldexp(yl, nf)
    d, e = _two_sum(yh, -torch.ones_like(yh))
    y = d + (e + yl)
    return torch.where(inside, y, torch.where(x > 0, torch.full_like(x, math.inf),
                                                  -torch.ones_like(x)))


def log1p(x: torch.Tensor) -> torch.Tensor:
    """log(1 + x) for every entry (module docstring: deterministic, within a few ulps)."""
    x = x.to(torch.float64)
    flat = x.reshape(-1).contiguous()
    out = torch.empty_like(flat)
    for i in range(0, flat.numel(), CHUNK):
        xc = flat[i : i + CHUNK]
        t = torch.full_like(xc, 1.0 / 9)
        for n in range(8, 1, -1):
            t = (1.0 / n if n % 2 else -1.0 / n) + xc * t
        small = xc + xc * (xc * t)
        a, b = _two_sum(torch.ones_like(xc), xc)
        big = log(torch.where(a > 0, a, torch.ones_like(a))) + b / a
        big = torch.where(a > 0, big, torch.where(a == 0, torch.full_like(a, -math.inf),
                                                  torch.full_like(a, math.nan)))
        big = torch.where(xc == math.inf, xc, big)
        out[i : i + CHUNK] = torch.where(xc.abs() < 2.0**-10, small, big)
    return out.reshape(x.shape)


def _nearest(v) -> float:
    """The double nearest an mpmath value (exact rational rounding: subnormals included)."""
    import mpmath as mp

    if mp.isinf(v) or mp.isnan(v):
        return float(v)
    sign, man, e, _ = mp.mpf(v)._mpf_
    q = Fraction(-int(man) if sign else int(man)) * (Fraction(2) ** int(e))
    if abs(q) >= Fraction(2) ** 1024 - Fraction(2) ** 970:  # at or past the overflow tie
        return math.inf if q > 0 else -math.inf
    return float(q)


def _exp_mp(x: float, base2: bool) -> float:
    import mpmath as mp

    if math.isnan(x) or x == math.inf:
        return x
    if x == -math.inf or x < (-1076.0 if base2 else -746.0):
        return 0.0
    if x > (1025.0 if base2 else 711.0):
        return math.inf
    with mp.workprec(256):
        return _nearest(mp.mpf(2) ** mp.mpf(x) if base2 else mp.exp(mp.mpf(x)))


def _log_mp(x: float) -> float:
    import mpmath as mp

    if math.isnan(x) or x < 0:
        return math.nan
    if x == 0:
        return -math.inf
    if x == math.inf:
        return math.inf
    with mp.workprec(256):
        return _nearest(mp.log(mp.mpf(x)))


__all__ = ["exp", "exp2", "log", "expm1", "log1p"]
