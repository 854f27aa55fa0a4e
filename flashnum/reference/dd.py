"""Double-double arithmetic on numpy float64 arrays, with the error bounds the fast path of
the certified reference uses (fast.py). A double-double (hi, lo) stands for hi + lo.

Error-free transformations (exact for finite inputs away from overflow):
  two_sum(a, b) -> (s, e), s = fl(a + b), s + e = a + b exactly (Knuth; 6 flops, any order)
  fast_two_sum(a, b) -> the same when |a| >= |b| or a = 0 (Dekker; 3 flops)
  two_prod(a, b) -> (p, e), p = fl(a b), p + e = a b exactly: Dekker's product with
      Veltkamp's split by 2^27 + 1 (numpy has no fma), exact while |a|, |b| < 2^995 and
      the product's error term does not underflow (Dekker 1971; Higham, 2nd ed., 4.4).

exp_dd(xh, xl): e^(xh + xl) for -86 <= x <= 1/2, as (ph, pl) with relative error below
EXP_REL + EXP_PER_XL * |xl| (both derived below):
  k = rint(x 2^16 / ln 2), j = k mod 2^16, e = (k - j) / 2^16; r = x - k ln2 / 2^16
      (|k| < 2^24 since |x| <= 86, so k C1 and k C2 are exact, C1 and C2 holding 29 bits;
      two_sum keeps xh - k C1 - k C2 exact; the rest, xl + e1 + e2 - k C3, costs <= 4u of
      its terms: |e1|, |e2| <= u 2^-16, |xl| (<= u |xh| in a normalised dd) and |k C3| <=
      2^24 2^-69; ln2/2^16 - C1 - C2 - C3 is below 2^-121 and |k| 2^-121 <= 2^-97).
      |r| <= ln2 / 2^17 (1 + 2^-20) < 2^-17.
  e^r = 1 + r + r^2/2 + r^3 (1/6 + r/24 + r^2/120) + t, |t| <= |r|^6/720 (1 + 2^-16)
      < 2^-111; r^2 from two_prod(rh, rh) plus 2 rh rl (its error <= 2^-140); the cubic
      tail (< 2^-53) in float64 (error <= 6u of it < 2^-104); 1 + rh and + rh^2/2 by
      two_sum (exact); the remaining six terms, each < 2^-52, in float64 (<= 5u 2^-50).
      In all |E - e^r| < 2^-100 with e^r >= 1 - 2^-17: relative < 2^-99.9.
  2^(j/2^16) from a table of double-doubles (rounded from arb at 160 bits: relative
      error <= 2^-105); the double-double product T E: two_prod plus two cross terms,
      relative error <= 3u^2 (1 + 2^-50) < 2^-104; 2^e scales exactly (results >= 2^-123).
  EXP_REL = 2^-99.5 covers 2^-99.9 + 2^-105 + 2^-104 + 2^-97 (reduction) with margin;
      EXP_PER_XL = 4.1u covers the xl term of the reduction (relative error of e^x per
      unit |xl|, as |e^(x + d) / e^x - 1| <= 1.01 |d| for |d| < 2^-40).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

U = 2.0**-53
SPLIT = 134217729.0  # 2^27 + 1: Veltkamp's splitter for float64
T_BITS = 16  # table of 2^(j / 2^16)
X_MIN = -85.0  # exp_dd's domain: e^-85 < 2^-122 (smaller logits are dropped with a bound)
EXP_REL = 2.0**-99.5
EXP_PER_XL = 4.1 * U


def two_sum(a, b):
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def fast_two_sum(a, b):
    s = a + b
    return s, b - (s - a)


def split(a):
    t = SPLIT * a
    hi = t - (t - a)
    return hi, a - hi


def two_prod(a, b):
    p = a * b
    ah, al = split(a)
    bh, bl = split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def square(a):
    """two_prod(a, a) with one split."""
    p = a * a
    ah, al = split(a)
    return p, ((ah * ah - p) + 2 * ah * al) + al * al


def mul_dd(ah, al, bh, bl):
    """(ah + al)(bh + bl) as a double-double; relative error <= 3u^2 (1 + 2^-50) for
    normalised inputs (|al| <= u|ah|, |bl| <= u|bh|), results away from underflow."""
    p, e = two_prod(ah, bh)
    e = e + (ah * bl + al * bh)
    return fast_two_sum(p, e)


@lru_cache(maxsize=1)
def _constants():
    """C1 + C2 + C3 = ln2 / 2^16 (C1, C2 with 29 bits), and the table of 2^(j/2^16) as
    double-doubles, all from arb at 160 bits."""
    import flint
    from flint import arb

    old = flint.ctx.prec
    flint.ctx.prec = 160
    try:
        L = arb(2).log() / 2**T_BITS
        c1 = math.ldexp(round(math.ldexp(float(L), 29 + 16)), -29 - 16)
        rest = L - c1
        c2 = math.ldexp(round(math.ldexp(float(rest), 29 + 45)), -29 - 45)
        c3 = float(rest - c2)
        base = arb(2).log() / 2**T_BITS
        th = np.empty(2**T_BITS)
        tl = np.empty(2**T_BITS)
        for j in range(2**T_BITS):
            t = (base * j).exp()
            h = float(t)
            th[j], tl[j] = h, float(t - h)
    finally:
        flint.ctx.prec = old
    inv = 2.0**T_BITS / math.log(2.0)
    # one row of four per j (th, its split, tl): one cache line per lookup
    return c1, c2, c3, inv, np.stack([th, *split(th), tl], axis=1)


CHUNK = 4096  # elements per pass of exp_dd: its ~40 temporaries stay in the L2 cache


def exp_dd(xh, xl):
    """e^(xh + xl) for X_MIN - 1 <= xh <= 1/2 (module docstring: the error bound), in
    chunks of CHUNK elements."""
    ph, pl = np.empty_like(xh), np.empty_like(xh)
    fh, fl, oh, ol = xh.reshape(-1), xl.reshape(-1), ph.reshape(-1), pl.reshape(-1)
    for i in range(0, fh.size, CHUNK):
        oh[i:i + CHUNK], ol[i:i + CHUNK] = _exp_dd(fh[i:i + CHUNK], fl[i:i + CHUNK])
    return ph, pl


def _exp_dd(xh, xl):
    c1, c2, c3, inv, table = _constants()
    k = np.rint(xh * inv)
    r1, e1 = two_sum(xh, -(k * c1))
    rh, e2 = two_sum(r1, -(k * c2))
    rl = ((e1 + e2) + xl) - k * c3
    rh, rl = two_sum(rh, rl)
    sh, sl = square(rh)
    tail = rh * rh * rh * ((1.0 / 6) + rh * ((1.0 / 24) + rh * (1.0 / 120)))
    eh, el = fast_two_sum(1.0, rh)
    fh, fl = two_sum(eh, 0.5 * sh)
    low = ((el + fl) + (rl + 0.5 * sl)) + (rh * rl + tail)
    eh, el = fast_two_sum(fh, low)
    ki = k.astype(np.int64)
    j = ki & (2**T_BITS - 1)
    th, th_hi, th_lo, tl = np.take(table, j, axis=0).T
    p = th * eh  # mul_dd(th, tl, eh, el) with th's split from the table
    bh, bl = split(eh)
    err = ((th_hi * bh - p) + th_hi * bl + th_lo * bh) + th_lo * bl
    ph, pl = fast_two_sum(p, err + (th * el + tl * eh))
    e = (ki - j) >> T_BITS
    return np.ldexp(ph, e), np.ldexp(pl, e)
