"""Matrix products with a rigorous error bound from float64 GEMMs: the two products of
the certified reference's fast path (fast.py), S = Q K^T and [o | l] = P [V | 1].

The splitting of Ozaki, Ogita, Oishi and Rump (2012, "Error-free transformation of matrix
multiplication by using fast routines of matrix multiplication"): each row (of A) or
column (of B) is cut into slices A = A_1 + A_2 + ... + R with

    E      the row's exponent: max |a| < 2^E (E = 0 for a zero row),
    A_s    = unit_s rint(r_{s-1} / unit_s), unit_s = 2^(E - s beta), r_0 = a, r_s = r_{s-1} - A_s
           (exact: x - rint(x) is a float for every float x, and powers of two scale
           exactly away from under/overflow, which `in_range` checks),
    |A_1| <= 2^E, |A_s| <= 2^(E - (s-1) beta - 1) (1 + 2^-40) for s >= 2 (the remainder
           after slice s-1 is at most unit_{s-1} / 2 plus, for P, its low part), and
    |R|   <= 2^(E - S beta - 1) (1 + 2^-40) after S slices.

A_s B_t holds integers of at most beta_A and beta_B bits times a common unit per entry,
so a product over n terms with n 2^(beta_A + beta_B) <= 2^53 is exact whatever the order
of summation or the use of FMA in the GEMM (every partial sum is an integer below 2^53
times the unit). The terms left out go through ordinary float64 GEMMs, whose error is at
most gamma_n sum |a||b| (gamma_n = n u / (1 - n u)) for any order (Higham, 2nd ed., 3.1).
"""

from __future__ import annotations

import math

import numpy as np

from flashnum.reference.dd import U, two_sum

SAFE = 2.0**-40  # relative slack for bounds evaluated in float64


def gamma(n: int) -> float:
    return n * U / (1 - n * U) * (1 + SAFE)


def exponents(amax: np.ndarray) -> np.ndarray:
    """E with amax < 2^E (0 for amax = 0), as float64 powers of two 2^E (0.0 for zero)."""
    _, e = np.frexp(amax)
    return np.where(amax > 0, np.ldexp(1.0, e), 0.0)


def in_range(p2: np.ndarray, beta: int, slices: int) -> bool:
    """Every slice unit and every product of units stays far from under/overflow."""
    nz = p2[p2 > 0]
    return nz.size == 0 or (float(nz.min()) >= 2.0**(-400 + beta * (slices + 1))
                            and float(nz.max()) <= 2.0**400)


def split(a: np.ndarray, p2: np.ndarray, beta: int, count: int, low=None):
    """Slices A_1..A_count of a (+ low, a double-double's low part), rows scaled by
    p2 = 2^E (broadcast); returns (slices, remainder high, remainder low)."""
    out = []
    r = a
    p2 = np.where(np.asarray(p2) > 0, p2, 1.0)
    for s in range(1, count + 1):
        unit = p2 * 2.0**(-s * beta)
        inv = (1.0 / p2) * 2.0**(s * beta)
        A = np.rint(r * inv) * unit
        r = r - A
        if low is not None:
            r, low = two_sum(r, low)
        out.append(A)
    return out, r, low


def logits(qb, kt, beta):
    """S = qb K^T as three float64 matrices (L2, L3, L4R) and 2^E_i (r,): (h, lo) =
    two_sum(L2, L3) and low = lo + L4R give |S - (h + low)| <= ERR_S(beta, d) Gamma_i for
    every j, Gamma_i = d 2^(E_i + max_j F_j) >= sum_t |q_it k_jt| (kt: k_side's stacks).

    L2 = A1 B1^T, L3 = [A1 | A2] [B2 | B1]^T, L4 = A2 B2^T are exact (all of units
    2^(E_i + F_j - m beta)); REM = [R | A1 + A2] [K | RB]^T in float64 (A1 + A2 holds 2 beta
    bits: exact), |its terms| <= d 2^(E+F-2beta) (1 + 2^-20), so its error <= gamma_2d of
    that. L4R = fl(L4 + REM), then lo + L4R: <= 2.01u (u 1.01 + 2.02 2^-2beta) Gamma.
    """
    qmax = np.abs(qb).max(axis=1)
    p2 = exponents(qmax)[:, None]
    (a1, a2), ra, _ = split(qb, p2, beta, 2)
    b1t, b21t, b2t, krt = kt
    l4r = a2 @ b2t
    l4r += np.hstack([ra, a1 + a2]) @ krt
    return a1 @ b1t, np.hstack([a1, a2]) @ b21t, l4r, p2[:, 0]


def k_side(k, p2, beta):
    """K's slices (rows scaled by p2 = 2^F_j) stacked as logits multiplies them."""
    (b1, b2), rb, _ = split(k, p2, beta, 2)
    return (np.ascontiguousarray(b1.T), np.ascontiguousarray(np.hstack([b2, b1]).T),
            np.ascontiguousarray(b2.T), np.ascontiguousarray(np.hstack([k, rb]).T))


def err_s(beta: int, d: int) -> float:
    """ERR_S of `logits`: |S - (sh + sl)| <= ERR_S Gamma_i (docstring there)."""
    g = 2.0**(-2 * beta) * (1 + 2.0**-20)
    return (gamma(2 * d) * g + 2.01 * U * (U * 1.01 + 2.02 * g)) * (1 + SAFE)


def p_slices(ph, pl, beta_p, a_s, a123, rp) -> None:
    """P = ph + pl (0 <= P < 2: E = 1 for every row) cut for pv_products, into the given
    arrays: ph = A1 + A2 + A3 + R, slices of beta_p bits (a_s (3, r, n)), |R| <= 2^(-3
    beta_p); A123 = ph - R (ph truncated: a float64); rp = fl(R + pl)."""
    (a_s[0], a_s[1], a_s[2]), rem, _ = split(ph, 2.0, beta_p, 3)
    a123[...] = ph - rem
    rp[...] = rem + pl


def pv_products(a_s, a123, rp, vt):
    """[o | l] = P [V | 1] as a double-double (oh, ol) from p_slices' parts (its bound is
    pv_error's): [V | 1] = B1 + B2 + RV (vt: v_side's stacks); A_s B_t exactly in one
    GEMM; A123 RV and fl(R + pl) [V | 1] in float64; the eight sums by a two_sum cascade."""
    _, r, n = a_s.shape
    b12, v_rem, v1 = vt
    c = v1.shape[1]
    g = a_s.reshape(3 * r, n) @ b12  # (3r, 2c): A_s B_t, exact
    terms = [g[s * r:(s + 1) * r, t * c:(t + 1) * c] for s in range(3) for t in range(2)]
    terms.append(a123 @ v_rem)
    terms.append(rp @ v1)
    h, lo = terms[0], np.zeros_like(terms[0])
    for t in terms[1:]:
        h, e = two_sum(h, t)
        lo = lo + e
    return two_sum(h, lo)


def v_side(v1, f2, beta_v):
    """[V | 1]'s two slices side by side, its remainder, and itself (pv_products)."""
    (b1, b2), rv, _ = split(v1, f2, beta_v, 2)
    return np.hstack([b1, b2]), rv, v1


def pv_error(l_up, n, beta_p, beta_v, f2):
    """Bound (r, c) on |[o|l] - (oh + ol)| of pv_products, l_up (r, 1) >= sum_j P_ij,
    f2 (1, c) = 2^F_c > max |V_c|, from: gamma_n sum |A123| |RV| with sum |A123| <= l_up +
    n 2^(-3 beta_p) and |RV| <= 2^(F - 2 beta_v - 1); gamma_(n+1) (n 2^(-3 beta_p) + u l_up)
    2^F for fl(R + pl) [V | 1] (its rounding and the GEMM's); the summation of the 8
    terms (two_sum cascade, Ogita-Rump-Oishi's Sum2): gamma_7^2 times the sum of their
    magnitudes, <= (l_up + n 2^(1 - beta_p)) 2^(F + 1)."""
    r3 = 2.0**(-3 * beta_p)
    a = gamma(n) * (l_up + n * r3) * f2 * 2.0**(-2 * beta_v - 1)
    b = gamma(n + 1) * (1 + U) * (n * r3 + U * l_up) * f2
    c = gamma(7) ** 2 * (l_up + n * 2.0**(1 - beta_p)) * f2 * 2
    return (a + b + c + n * 8 * 2.0**-1074) * (1 + SAFE)


def beta_for(n: int) -> int:
    """Bits per slice such that n terms of two slices' integers stay below 2^53."""
    return (53 - math.ceil(math.log2(max(n, 2)))) // 2
