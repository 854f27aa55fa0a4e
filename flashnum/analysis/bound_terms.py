"""The a-priori bound (flashnum.analysis.bounds) as a function of its small parameters: the
deterministic bound per output entry (`evaluate`, steps A and B of the derivation), the
check that no site overflows, and the probabilistic bound's linear term (`prob_std`).
"""

from __future__ import annotations

import math

import torch

from flashnum.engine.arith import wider
from flashnum.engine.variants import Variant
from flashnum.numerics import elementary
from flashnum.numerics.constants import LOG2E
from flashnum.numerics.formats import EXACT, Exact
from flashnum.numerics.policy import Policy


def _x(a, b):
    """(1 + a)(1 + b) - 1 without forming 1 + a (excess arithmetic keeps u ~ 1e-20 exact)."""
    return a + b + a * b


def _pw(e, k):
    """(1 + e)^k - 1."""
    if isinstance(e, torch.Tensor) or isinstance(k, torch.Tensor):
        e = torch.as_tensor(e, dtype=torch.float64)
        return elementary.expm1(k * elementary.log1p(e))
    return math.expm1(k * math.log1p(e))


def _logit_errors(P: dict, D: dict, U, scale: float, d: int):
    """Step A of evaluate: (Ebar, Estar), the softmax-weighted and the largest error of a
    row's computed logits (input rounding of Q, K; tf32 operands; the dot; s's roundings);
    U(name) is evaluate's one-rounding excess."""
    sigma = P["sigma"]
    # -- step A: logits (input rounding of Q, K; tf32 operands; accumulation; s roundings) --
    # |q~_t k~_t - q_t k_t| <= ((1 + rho_q)(1 + rho_k) - 1)|q_t k_t| + alp (1 + rho)(|q_t|
    # + |k_t|) + alp^2, q~ = tf32(in(q)): rho, alp the larger of q's and k's
    rho_q, rho_k = _x(U("inq"), U("qktf")), _x(U("ink"), U("qktf"))
    alp_q = P["eta_inq"] * (1 + U("qktf")) + P["eta_qktf"]
    alp_k = P["eta_ink"] * (1 + U("qktf")) + P["eta_qktf"]
    rho, alp = rho_q + rho_k, alp_q + alp_k  # majorants of the larger of the two
    # a product rounded before its sum (qk_product; 0 where exact): fl_p(x) = x (1 + e) + h
    # with |e| <= u_p, |h| <= eta_p, x = q~_t k~_t, so |fl_p(x) - q_t k_t| <= ((1 + cA)
    # (1 + u_p) - 1)|q_t k_t| + (1 + u_p)(alp (1 + rho)(|q_t| + |k_t|) + alp^2) + eta_p:
    # u_p |q_t||k_t| more per term at first order; the sum then bounds |fl_p(x)| as before
    up = U("qkp")
    cA_dot = _x(_x(rho_q, rho_k), up)
    cL_dot = scale * alp * (1 + rho) * (1 + up)
    c0_dot = scale * d * (alp**2 * (1 + up) + P["eta_qkp"])
    Fm1 = _x(_x(sigma, U("sc")), U("sp"))  # F - 1
    F = 1 + Fm1
    cqk = _pw(U("qk"), d)
    a_A = cA_dot * F * (1 + cqk) + F * cqk
    a_L = cL_dot * F * (1 + cqk)
    a_s = Fm1
    a_0 = (c0_dot * F * (1 + cqk) + F * scale * d * P["eta_qk"]
           + scale * (1 + sigma) * (1 + U("sp")) * P["eta_sc"] + P["eta_sp"])
    Ebar = a_A * D["Abar"] + a_s * D["Sbar"] + a_L * D["L1bar"] + a_0
    Estar = a_A * D["Astar"] + a_s * D["Sstar"] + a_L * D["L1star"] + a_0
    return Ebar, Estar


def _standard_terms(P: dict, U, n, bn_eff, key: tuple, M):
    """Step B's terms for the standard structure (S, softmax and P V each rounded once):
    (Ostar, Lstar, H, A_N, A_D, A_out, Fin_m1, eta_fin), as evaluate combines them.
    key: (tf_pv, vabsA, eta_key), the per-key terms of evaluate's step A."""
    tf_pv, vabsA, eta_key = key
    def pw(name, k):
        return _pw(U(name), k)

    def row(x):
        return x[..., None]

    Ostar = _x(_x(_x(U("div"), U("pc")), pw("pv", bn_eff)), tf_pv)
    Lstar = _x(pw("lacc", bn_eff), U("l"))
    H = n * P["eta_p"]
    A_N = torch.zeros_like(M)[..., None]
    A_D = torch.zeros_like(M)
    # p = rnd_pc(rnd_div(e / l)): their eta are absolute errors of normalised weights
    A_out = row(n * (1 + pw("pv", bn_eff)) * (1 + tf_pv)) * (
        (P["eta_div"] * (1 + U("pc")) + P["eta_pc"]) * vabsA + eta_key)
    return Ostar, Lstar, H, A_N, A_D, A_out, U("out"), P["eta_out"]


def _flash_terms(P: dict, U, variant: Variant, n, T, r, bn, key: tuple, M, Xc, wide,
                 pc_common: bool):
    """Step B's terms for the flash structure (the blocked recurrence; fa1's normalised
    steps included): (Ostar, Lstar, H, A_N, A_D, A_out, Fin_m1, eta_fin) for evaluate.
    key: (tf_pv, vabsA, eta_key) as for _standard_terms."""
    tf_pv, vabsA, eta_key = key
    fno = 0.0 if pc_common else U("pc")  # P's cast, where l does not share it
    def pw(name, k):
        return _pw(U(name), k)

    def row(x):
        return x[..., None]

    # +1: a key's P @ V tile and row sum are rounded into o's and l's formats once,
    # before they are added (flashnum.engine.recurrence; a no-op when o and l are fp32)
    k_o = (3 * T + 1) if variant.normalised else (T + r + 1)
    k_l = (2 * T + 1) if variant.normalised else (T + r + 1)
    Ostar = _x(_x(_x(fno, pw("pv", bn)), tf_pv), pw("o", k_o))
    if variant.normalised:
        Ostar = _x(Ostar, pw("div", T))
    Lstar = _x(pw("lacc", bn), pw("l", k_l))
    H = n * P["eta_p"] * Xc + (r * n) * P["eta_p"] * wide
    if pc_common:
        H = H + n * P["eta_pc"] * Xc
    eta_pc_n = 0.0 if pc_common else P["eta_pc"]
    # o * alpha, l * alpha may underflow: eta_o, eta_l, times the later rescales (<= Xc)
    A_N = row(1 + Ostar) * (row(n * Xc) * (eta_pc_n * vabsA + eta_key)
                             + row((r + T) * P["eta_o"] * Xc))
    A_D = (r + T) * P["eta_l"] * (1 + Lstar) * Xc
    if variant.normalised:
        H = H + (T * bn) * P["eta_p"] * wide
        L_hi = n * wide * (1 + Lstar)
        A_N = A_N + row((1 + Ostar) * Xc * (4 * T * P["eta_o"] + T * P["eta_div"] * L_hi))
        A_D = 3 * T * P["eta_l"] * (1 + Lstar) * Xc
        Fin_m1 = U("out")
    else:
        Fin_m1 = _x(U("div"), U("out"))
    A_out = torch.zeros_like(M)[..., None]
    eta_fin = P["eta_div"] * (1 + U("out")) + P["eta_out"]
    return Ostar, Lstar, H, A_N, A_D, A_out, Fin_m1, eta_fin


def evaluate(P: dict, D: dict, *, structure: str, variant: Variant, scale: float,
              l_from: str, r: torch.Tensor, base2: bool, check=None):
    """The deterministic bound per output entry (B, Nq, dv) for parameter values P.

    Factors 1 + e are carried as their excess e (_x, _pw, expm1) so that the bound stays
    accurate for unit roundoffs far below float64's (the t-scaled evaluations).
    """
    def U(name):  # one rounding: (1 + delta_rand)(1 + delta_det) - 1
        return _x(P["u_" + name], P["ud_" + name])

    def pw(name, k):  # k roundings
        return _pw(U(name), k)

    d, bn = D["d"], D["bn"]
    n, T = D["n"], D["T"]
    if structure == "standard":
        bn_eff, T, r = n, torch.ones_like(n), torch.zeros_like(n)
    elif variant.normalised:
        bn_eff, T = bn, torch.full_like(n, float(D["n_kb"]))  # fa1 rounds o at every block
    else:
        bn_eff = bn
    Ebar, Estar = _logit_errors(P, D, U, scale, d)
    KE = elementary.exp(Estar + Ebar)
    row = lambda x: x[..., None]  # noqa: E731  (B, Nq) -> (B, Nq, 1)
    nu, y, delta, vabs = D["nu"], D["y"].abs(), D["delta"], D["vabs"]
    u_v, eta_v = U("inv"), P["eta_inv"]
    bA = row(KE) * (u_v * nu + delta * row(Ebar)) + eta_v
    # -- step B: the recurrence on the computed logits and values --
    M = D["M"]
    tau_m = U("mc") * (D["Sstar"] + Estar) + P["eta_mc"]
    dM = variant.bound_dM(M, Estar + tau_m, U("m"), P["eta_m"])
    tau_eff = tau_m + variant.bound_tau()
    gbar = (M - D["Ms"]) + dM + Ebar + tau_eff
    gstar = (M - D["smin"]) + dM + Estar + tau_eff
    Rm = (M - D["Bmin"]) + dM + Estar + tau_m
    ue = _x(U("p"), P["exp64"])
    pc_common = l_from == "p_cast" and structure != "standard"
    fpc = U("pc") if pc_common else 0.0
    if structure == "standard":
        Xc_m1 = ue * torch.ones_like(M)
    else:
        k_exp = (2 + r) if variant.normalised else (1 + r)
        Xc_m1 = _x(_x(elementary.expm1(U("m") * Rm), _pw(ue, k_exp)), fpc)
    Xc = 1 + Xc_m1
    ud = U("diff")
    Cbar = KE * (Xc * elementary.exp(ud * gstar) * ud * gbar + Xc_m1)
    Dinv = elementary.exp(dM + Estar)  # 1 / (a lower bound of D = sum_j exp(s^_j - m^_T))
    nuA = row(KE) * (1 + u_v) * nu + eta_v
    yA = y + bA
    vabsA = (1 + u_v) * vabs + eta_v
    deltaA = delta + u_v * vabs + eta_v + bA
    # each product's own error before its sum: tf32 operands, or its rounding (pv_product:
    # relative u_p, absolute eta_p per key, as for qk_product in step A)
    tf_pv = _x(_pw(U("pvtf"), 2), U("pvp"))
    p_hi = elementary.exp(tau_eff) * (1 + ue) + P["eta_p"]
    wide = elementary.exp(tau_eff * (1 + ud)) * (1 + ue) * Xc  # a key's weight before rescales
    # per key: the P @ V products' eta and the tf32 operand casts' eta
    eta_key = (row(P["eta_pv"] + P["eta_pvp"] + P["eta_pvtf"] * (1 + U("pvtf")) * p_hi
                   + P["eta_pvtf"] ** 2) + P["eta_pvtf"] * (1 + U("pvtf")) * vabsA)
    if structure == "standard":
        Ostar, Lstar, H, A_N, A_D, A_out, Fin_m1, eta_fin = _standard_terms(
            P, U, n, bn_eff, (tf_pv, vabsA, eta_key), M)
    else:
        Ostar, Lstar, H, A_N, A_D, A_out, Fin_m1, eta_fin = _flash_terms(
            P, U, variant, n, T, r, bn, (tf_pv, vabsA, eta_key), M, Xc, wide, pc_common)
    Hd, AD = H * Dinv, A_D * Dinv
    AN = A_N * row(Dinv)
    Cb, Ls, Hr = row(Cbar), row(Lstar), row(Hd)
    num = (deltaA * (Cb + Hr) + row(Ostar) * (nuA + vabsA * Cb + Hr * vabsA)
           + Ls * yA * (1 + Cb + Hr) + AN + yA * row(AD))
    den = (1 - Cbar - Hd) * (1 - Lstar) - AD
    ok = den > 0
    ratio = num / row(torch.where(ok, den, torch.ones_like(den)))
    bB = (1 + Fin_m1) * (ratio + A_out) + Fin_m1 * yA + eta_fin
    b = bA + bB
    b = torch.where(row(ok), b, torch.full_like(b, math.inf))
    if check is not None:
        b = torch.where(check(P, D, Estar, tau_eff, ue, Xc, Ostar, Lstar, Hd, yA + b, vabsA,
                              dM, T, r), b, torch.full_like(b, math.inf))
    return torch.where(row(D["vis_rows"]), b, torch.zeros_like(b))


def overflow_check(pol: Policy, structure: str, variant: Variant, base2: bool, scale: float):
    """A function returning (B, Nq, dv) bool: True where no site can overflow (else the
    bound is inf: the model fl(x) = x (1 + delta) + eta fails past the largest number).

    Each magnitude is an upper bound of a value *before* its rounding (or of an input
    before its cast); a value <= max rounds to a finite number (and e4m3 does not
    saturate), so `mag <= max` is the condition.
    """
    def fmax(site):
        f = wider(pol.fmt("s"), pol.fmt("m")) if site == "diff" else pol.fmt(site)
        return math.inf if f is EXACT or isinstance(f, Exact) or f.p >= 53 else f.max

    def check(P, D, Estar, tau_eff, ue, Xc, Ostar, Lstar, Hd, out_mag, vabsA, dM, T, r):
        row = lambda x: x[..., None]  # noqa: E731
        n = D["n"]
        s_mag = (D["Sstar"] + Estar + dM) * (LOG2E if base2 else 1.0)
        p_mag = elementary.exp(tau_eff) * (1 + ue)
        l_mag = n * p_mag * Xc * (1 + Lstar) * (1 + Hd)
        o_mag = row(n * p_mag * Xc * (1 + Ostar) * (1 + Hd)) * vabsA
        if variant.normalised and structure != "standard":
            o_mag = o_mag + row(l_mag) * (1 + row(Ostar)) * out_mag  # l * o before / l
        # every partial sum of the unscaled dot q~.k~ (a narrow accumulator rounds each
        # one), and the dot itself, which the engine stores in the logits' format before
        # the scale multiplies it: (A + E) / scale bounds them (Lemma 1 without F)
        dot_mag = (D["Astar"] + Estar) / scale
        # s - m and m_old - m_new: both operands lie in [-(S* + E*), S* + E* + dM]
        gap_mag = (2 * (D["Sstar"] + Estar) + dM) * (LOG2E if base2 else 1.0)
        in_mag = max(D["qmax"], D["kmax"], D["vmax_all"])
        ok = torch.ones_like(out_mag, dtype=torch.bool) & (in_mag <= fmax("inputs"))
        # a rounded product |q~_t k~_t| (p v) is at most the sum of them all: dot_mag (o_mag)
        for mag, site in ((dot_mag, "qk_product"), (dot_mag, "qk_acc"), (dot_mag, "s"),
                          (s_mag, "s"), (s_mag, "m"), (gap_mag, "diff"), (gap_mag, "m"),
                          (p_mag, "p"), (p_mag, "p_cast"), (l_mag, "l_acc"), (l_mag, "l")):
            ok = ok & row(mag <= fmax(site))
        for site in ("pv_product", "pv_acc", "o"):
            ok = ok & (o_mag <= fmax(site))
        for site in ("div", "out"):
            ok = ok & (out_mag <= fmax(site))
        return ok

    return check


def prob_std(params, D, *, structure, variant: Variant, r, l_from):
    """sqrt(sum_k a_k^2 u_k^2) over the random roundings, per output entry: the scale of
    the linear error term that Azuma-Hoeffding bounds (see the module docstring)."""
    u = {name[2:]: p.value for name, p in params.items() if name.startswith("u_")}
    row = lambda x: x[..., None]  # noqa: E731
    n, T, bn, d = D["n"], D["T"], D["bn"], D["d"]
    y2, nu2, delta2 = D["y"] ** 2, D["nu"] ** 2, D["delta"] ** 2
    W1, Wv = D["W1"], D["Wv"]
    M = D["M"]
    Rm0 = torch.clamp(variant.bound_shift(M) + variant.bound_tau() - D["Bmin"], min=0)
    g = u["inv"] ** 2 * Wv + u["inq"] ** 2 * row(D["Qterm"]) * D["var"] + u["ink"] ** 2 * D["Wk"]
    g = g + u["qk"] ** 2 * d * D["WA2"]
    g = g + (u["sc"] ** 2 + u["sp"] ** 2) * D["Ws2"] + u["diff"] ** 2 * D["Wg"]
    g = g + u["p"] ** 2 * W1
    if structure == "standard":
        g = g + u["pc"] ** 2 * Wv + u["div"] ** 2 * Wv
        g = g + row(n) * (u["pv"] ** 2 * nu2 + u["lacc"] ** 2 * y2)
        g = g + u["l"] ** 2 * y2 + u["out"] ** 2 * y2
        return torch.sqrt(g)
    n_alpha = (T + r) if variant.normalised else r
    g = g + row(n_alpha) * u["p"] ** 2 * delta2 + u["m"] ** 2 * row(Rm0**2) * delta2
    g = g + u["pc"] ** 2 * (W1 if l_from == "p_cast" else Wv)
    g = g + bn * (u["pv"] ** 2 * nu2 + u["lacc"] ** 2 * y2)
    if variant.normalised:
        n_kb = float(D["n_kb"])
        g = g + 2 * n_kb * u["l"] ** 2 * y2 + 3 * n_kb * u["o"] ** 2 * nu2
        g = g + n_kb * u["div"] ** 2 * nu2
    else:
        g = g + row(T + r) * (u["l"] ** 2 * y2 + u["o"] ** 2 * nu2) + u["div"] ** 2 * y2
    g = g + u["out"] ** 2 * y2
    return torch.sqrt(g)

