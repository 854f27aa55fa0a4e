"""The certified reference's fast path: attention in double-double with a rigorous error
bound per value, from float64 GEMMs and numpy; every value whose bound settles its
rounding to float64 is final, every other row goes to the arb path (certified.py).

Per head, per block of query rows i (exact inputs q, k, v as float64; c = the exact
scale, a power of two when d = 4^m, else the double-double ch + cl of 1/sqrt(d) or the
float given, |c - ch - cl| <= 2^-104 |c|):

 1. S = Q K^T as a double-double with |S_ij - S^_ij| <= eps_S,i = ERR_S Gamma_i
    (slices.logits: Ozaki splitting, exact GEMMs plus one float64 GEMM with gamma).
 2. x^ = c (S^ - M_i), M_i the float64 row max of S^ (of c S^; any shift gives the same
    softmax), as a double-double: two_sum(sh, -M) is exact, adding sl errs by <= u(|dl| +
    |sl|) <= u (3.1 u + 2.1 2^-2beta) Gamma; the product by (ch, cl) by 3u^2 + 2^-104 of
    |x| <= 2|c| Gamma. eps_x,i = |c| (eps_S + u (3.1 u + 2.1 2^-2beta) Gamma) (+ 2^-101 |c|
    Gamma when c is not a power of 2) + 2^-1000 (float64 products that may underflow).
    The largest x^ is c sl ~ |c| u Gamma, not 0: a row where it exceeds 1/2 (logits beyond
    ~2^55) gets eps_x = inf (P must stay below 2 for its slicing), i.e. goes to arb.
 3. p^ = exp_dd(x^) (dd.py: relative error <= EXP_REL + EXP_PER_XL |xl| <= 2^-99.5 +
    4.1 u^2 86 =: ETA) for x^ >= X_MIN = -85; smaller x^ are dropped: e^x <= e^(-85 +
    2^-30) < 2^-122 each. Then p^ = e^x (1 + delta), |delta| <= (1 + ETA) e^eps_x - 1 =
    rho, and |p^ - e^x| <= rho' p^ with rho' = rho / (1 - rho).
 4. [o^ | l^] = P^ [V | 1] (slices.pv_products) with |o^ - sum p^ v| <= eps_o (pv_error).
    With o* = sum e^x v, l* = sum e^x: |o^ - o*| <= E_o = eps_o + rho' L vmax_c +
    n_drop 2^-122 vmax_c and |l^ - l*| <= E_l likewise (vmax_c < 2^F_c, L >= sum p^).
 5. out = o*/l*: y = o^/l^ in double-double (div_dd: <= 2^-98 |y|); |o*/l* - o^/l^| <=
    (E_o + |o^/l^| E_l) / (l^ - E_l). lse = c M + log l*: log l^ by one Newton step on
    float64's log (log_dd); |log l* - log l^| <= E_l / (l^ - E_l). row_max = c M + max_j
    x_j, within eps_x + 2^-52 |x^_max| of c M + x^_max (the largest double-double has the
    largest high part).
 6. Each value is rounded by rounding.certify; err_bound per row is round_ball's for a
    certain value, max_c up(up(half_ulp(y_c) + up(0))) (rounding.err_term): a function
    of the correctly rounded outputs alone, so the arb path gives the same number.

Every bound is evaluated in float64 and inflated by 1 + 2^-40 (slices.SAFE), far above
the relative rounding of a few dozen float64 operations. Heads whose exponents leave the
safe range (slices.in_range) go to the arb path whole.
"""

from __future__ import annotations

import math

import numpy as np

from flashnum.reference.dd import (
    EXP_PER_XL,
    EXP_REL,
    X_MIN,
    U,
    exp_dd,
    fast_two_sum,
    mul_dd,
    two_prod,
    two_sum,
)
from flashnum.reference.rounding import certify, err_term
from flashnum.reference.slices import (
    SAFE,
    beta_for,
    err_s,
    exponents,
    in_range,
    k_side,
    logits,
    p_slices,
    pv_error,
    pv_products,
    v_side,
)

ETA = EXP_REL + EXP_PER_XL * U * 86
DROP = 2.0**-122  # e^x for a dropped x^ < X_MIN
GROUP = 1 << 20  # logits per group of rows: their GEMMs at once (arrays of 8 MB)
BLOCK = 1 << 16  # logits per block of rows in the elementwise passes (in cache)


def scale_dd(d: int, scale):
    """(ch, cl, pow2, sign): the exact scale as a double-double (error <= 2^-104 |c|)."""
    if scale is None:
        e4 = round(math.log(d, 4))
        if 4**e4 == d:
            return 2.0**-e4, 0.0, True, 1.0
        import flint
        from flint import arb

        old = flint.ctx.prec
        flint.ctx.prec = 160
        try:
            c = arb(d).rsqrt()
            ch = float(c)
            return ch, float(c - ch), False, 1.0
        finally:
            flint.ctx.prec = old
    pow2 = scale != 0 and math.frexp(abs(scale))[0] == 0.5
    return float(scale), 0.0, pow2, (-1.0 if scale < 0 else 1.0)


def div_dd(ah, al, bh, bl):
    """(ah + al) / (bh + bl), bh > 0: one float64 quotient and a correction from the exact
    remainder (two_prod); error <= 20 u^2 |a / b| < 2^-98 |a / b| for normalised inputs."""
    q1 = ah / bh
    p, e = two_prod(q1, bh)
    r = (((ah - p) - e) + al) - q1 * bl
    return fast_two_sum(q1, r / bh)


def log_dd(lh, ll):
    """log(lh + ll) for 1 <= l < e^80 as (y, bound): y0 = log(lh) (float64), t = l e^-y0 - 1
    from exp_dd (relative ETA) and mul_dd (3u^2), log l = y0 + t - t^2/2 + theta, |theta| <=
    |t|^3 / 3; the bound is +inf when |t| > 2^-40 (a float64 log that far off)."""
    y0 = np.log(lh)
    eh, el = exp_dd(-y0, np.zeros_like(y0))
    mh, ml = mul_dd(lh, ll, eh, el)
    t = (mh - 1.0) + ml
    yh, yl = two_sum(y0, t - 0.5 * t * t)
    b = (1 + 2**-40) * (ETA + 3 * U * U + 2 * U * np.abs(t)) + np.abs(t) ** 3 / 3 + 2 * U * U
    b = np.where(np.abs(t) <= 2.0**-40, b * (1 + SAFE), np.inf)
    return yh, yl, b


class Head:
    """What every block of one head shares: K's and [V | 1]'s slices, the scale."""

    def __init__(self, k, v, scale):
        nk, d = k.shape
        self.n, self.d, self.dv = nk, d, v.shape[1]
        self.beta_s = beta_for(d)
        kmax = np.abs(k).max(axis=1) if nk else np.zeros(0)
        self.k2 = exponents(kmax)[:, None]
        self.kt = k_side(k, self.k2, self.beta_s)
        self.f_max = float(self.k2.max(initial=0.0))
        tot = 53 - math.ceil(math.log2(max(nk, 2)))
        self.beta_p, self.beta_v = tot // 2, tot - tot // 2
        self.v1 = np.hstack([v, np.ones((nk, 1))])
        self.f2 = exponents(np.abs(self.v1).max(axis=0, initial=0.0))[None, :]
        self.vt = v_side(self.v1, self.f2, self.beta_v)
        self.ch, self.cl, self.pow2, self.sign = scale_dd(d, scale)
        self.ok = (in_range(self.k2, self.beta_s, 3) and in_range(self.f2, self.beta_v, 3)
                   and self.beta_p >= 12)


def _shifted(h: Head, parts, vis):
    """x^ = c (S^ - M) as a double-double, M, the inside mask and eps_x per row (step 2),
    from logits' parts (L2, L3, L4R, 2^E) of some rows."""
    l2, l3, l4r, e2 = parts
    sh, lo = two_sum(l2, l3)
    sl = lo + l4r
    gam = h.d * e2 * h.f_max * (1 + SAFE)  # Gamma_i >= sum_t |q_it k_jt|
    if (vis == h.n).all():  # no mask: spare the passes of np.where
        inside = None
        m = sh.max(axis=1) if h.sign > 0 else sh.min(axis=1)
    else:
        inside = np.arange(h.n)[None, :] < vis[:, None]
        m = np.where(inside, sh * h.sign, -np.inf).max(axis=1) * h.sign
        m = np.where(np.isfinite(m), m, 0.0)  # a row that sees no key (left out at the end)
    dh, dl = two_sum(sh, -m[:, None])
    dh, dl = two_sum(dh, dl + sl)  # the + rounds: <= u (u 2.02 + 2.05 2^-2beta) Gamma
    if h.pow2:
        xh, xl = dh * h.ch, dl * h.ch
    else:
        xh, xl = mul_dd(dh, dl, h.ch, h.cl)
    c = abs(h.ch)
    eps = c * (err_s(h.beta_s, h.d) + U * (3.1 * U + 2.1 * 2.0**(-2 * h.beta_s))) * gam
    if not h.pow2:
        eps = eps + c * 2.0**-101 * gam
    # products of tiny remainders in the float64 GEMM may underflow (2^-1074 each)
    eps = eps + np.where(e2 > 0, 2.0**-1000, 0.0)
    return xh, xl, m, inside, eps * (1 + SAFE)


def _weights(h: Head, qb, vis):
    """Steps 1-3 for rows qb, the GEMMs of S and P V over all of them, the elementwise
    passes BLOCK logits at a time: P^'s slices (p_slices), the row's M, eps_x, number of
    dropped logits, and its largest x^ (a double-double)."""
    r, n = qb.shape[0], h.n
    parts = logits(qb, h.kt, h.beta_s)
    a_s, a123, rp = np.empty((3, r, n)), np.empty((r, n)), np.empty((r, n))
    m, eps_x, xm_h, xm_l = (np.empty(r) for _ in range(4))
    n_drop = np.empty(r, dtype=np.int64)
    step = max(1, BLOCK // n)
    for i in range(0, r, step):
        b = slice(i, min(i + step, r))
        xh, xl, m[b], inside, eps_x[b] = _shifted(h, [x[b] for x in parts], vis[b])
        j = np.argmax(xh if inside is None else np.where(inside, xh, -np.inf), axis=1)
        xm_h[b], xm_l[b] = xh[np.arange(len(j)), j], xl[np.arange(len(j)), j]
        if (xm_h[b] > 0.5).any():  # logits so large that S's low part moves the max:
            eps_x[b] = np.where(xm_h[b] > 0.5, np.inf, eps_x[b])  # nothing known, and P
            xh = np.minimum(xh, 0.5)  # stays below 2 for p_slices all the same
        keep = xh >= X_MIN if inside is None else inside & (xh >= X_MIN)
        n_drop[b] = (vis[b] if inside is None else inside.sum(axis=1)) - keep.sum(axis=1)
        if keep.all():
            ph, pl = exp_dd(xh, xl)
        else:
            ph, pl = exp_dd(np.where(keep, xh, 0.0), np.where(keep, xl, 0.0))
            ph, pl = np.where(keep, ph, 0.0), np.where(keep, pl, 0.0)
        p_slices(ph, pl, h.beta_p, a_s[:, b], a123[b], rp[b])
    oh, ol = pv_products(a_s, a123, rp, h.vt)
    return oh, ol, m, eps_x, n_drop, xm_h, xm_l


def approx_block(h: Head, qb, vis):
    """Steps 1-5 for rows qb (r, d) seeing vis keys each: double-doubles and their bounds,
    {"out": (yh, yl, b) (r, dv), "lse": (zh, zl, b) (r,), "row_max": (wh, wl, b) (r,)}
    with |exact - (hi + lo)| <= b (b = inf where nothing is known)."""
    r = qb.shape[0]
    oh, ol, m, eps_x, n_drop, xm_h, xm_l = _weights(h, qb, vis)
    rho = ((1 + ETA) * np.expm1(eps_x) + ETA) * (1 + SAFE)
    rho = np.where(rho < 2.0**-30, rho / (1 - rho), np.inf)  # huge logits: nothing known
    lh, ll = oh[:, -1], ol[:, -1]
    l_up = ((lh + np.abs(ll)) * (1 + 2.0**-80) + h.n * 2.0**-100)[:, None]
    e_o = pv_error(l_up, h.n, h.beta_p, h.beta_v, h.f2)
    e_o = (e_o + (rho[:, None] * l_up + n_drop[:, None] * DROP) * h.f2) * (1 + SAFE)
    e_l = e_o[:, -1:]
    yh, yl = div_dd(oh[:, :-1], ol[:, :-1], lh[:, None], ll[:, None])
    denom = lh[:, None] * (1 - 2.0**-50) - e_l
    b_out = (e_o[:, :-1] + np.abs(yh) * (1 + 2.0**-50) * e_l) / denom
    b_out = (b_out + np.abs(yh) * 2.0**-98) * (1 + SAFE)
    b_out = np.where(denom > 0, b_out, np.inf)
    zero_col = h.f2[:, :-1] == 0  # a zero column of V: o = 0 exactly
    yh, yl = np.where(zero_col, 0.0, yh), np.where(zero_col, 0.0, yl)
    b_out = np.where(zero_col, 0.0, b_out)

    cmh, cml = (m * h.ch, np.zeros(r)) if h.pow2 else two_prod(m, h.ch)
    cml = cml + (0.0 if h.pow2 else m * h.cl)
    b_cm = 0.0 if h.pow2 else np.abs(m * h.ch) * 2.0**-102
    gh, gl, b_log = log_dd(lh, ll)
    zh, zl = two_sum(cmh, gh)
    low = 4.01 * U * U * (np.abs(zh) + np.abs(cmh) + np.abs(gh))  # the low parts' sum
    b_lse = (e_l[:, 0] / denom[:, 0] + b_log + b_cm + low) * (1 + SAFE)
    b_lse = np.where(denom[:, 0] > 0, b_lse, np.inf)

    wh, wl = two_sum(cmh, xm_h)
    low = 4.01 * U * U * (np.abs(wh) + np.abs(cmh) + np.abs(xm_h))
    b_mx = (eps_x + 2.0**-52 * np.abs(xm_h) + b_cm + low) * (1 + SAFE)
    return {"out": (yh, yl, b_out), "lse": (*two_sum(zh, zl + (cml + gl)), b_lse),
            "row_max": (*two_sum(wh, wl + (cml + xm_l)), b_mx)}


def fast_block(h: Head, qb, vis):
    """Step 6 on approx_block: (out, lse, mx, err, ok) for rows qb; ok False where a value
    of the row is not settled (the arb path decides the row)."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        a = approx_block(h, qb, vis)
        out, ok_o = certify(*a["out"])
        lse, ok_l = certify(*a["lse"])
        mx, ok_m = certify(*a["row_max"])
    err = err_term(out, 0.0).max(axis=1, initial=0.0) if h.dv else np.zeros(qb.shape[0])
    live = vis > 0
    ok = np.where(live, ok_o.all(axis=1) & ok_l & ok_m, True)
    out = np.where(live[:, None], out, 0.0)
    lse = np.where(live, lse, -np.inf)
    mx = np.where(live, mx, -np.inf)
    err = np.where(live, err, 0.0)
    return out, lse, mx, err, ok


def fast_head(q, k, v, vis, scale):
    """The fast path on one head: (out, lse, mx, err, ok) for every row; ok False where
    the arb path must decide (every row when the head is outside the safe range)."""
    nq, nk, dv = q.shape[0], k.shape[0], v.shape[1]
    out, err = np.zeros((nq, dv)), np.zeros(nq)
    lse, mx = np.full(nq, -np.inf), np.full(nq, -np.inf)
    ok = np.zeros(nq, dtype=bool)
    if nq == 0 or nk == 0:
        return out, lse, mx, err, ok
    h = Head(k, v, scale)
    q2 = exponents(np.abs(q).max(axis=1))
    if not (h.ok and in_range(q2, h.beta_s, 3)):
        return out, lse, mx, err, ok
    step = max(1, GROUP // nk)
    for i in range(0, nq, step):
        sl = slice(i, min(i + step, nq))
        out[sl], lse[sl], mx[sl], err[sl], ok[sl] = fast_block(h, q[sl], vis[sl])
    return out, lse, mx, err, ok
