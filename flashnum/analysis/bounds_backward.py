"""A-priori error bounds for the emulated backward (flashnum.engine.backward), per gradient.

    from flashnum.analysis.bounds_backward import bound_backward
    b = bound_backward(q, k, v, do, policy="fa2", precision="bf16", block_m=64, block_n=64)
    b["dq"], b["dk"], b["dv"]       elementwise bounds >= |computed - exact| (float64 tensors)
    b["max"]                         {"dq": ..., "dk": ..., "dv": ...} the largest of each
    b["terms"], b["dominant_site"]   per gradient: each site's bound alone (at the entry with
                                     the largest bound) and the largest of them

`exact` is the real gradient of the given inputs (flashnum.reference_backward). The bound
holds for every dq_order, block_m and forward key-block order with the given block sizes,
for round to nearest (rounding="stochastic": every u doubled). The derivation is in
docs/backward.md; in short, every rounding is fl(x) = x (1 + delta) + eta, |delta| <= u of
its site (2^-53 for exact sites, which run on the float64 carrier), |eta| <= half the
format's smallest subnormal, and every accumulation of n products errs by at most
gamma_{n+1} sum |a||b| (any order). Through the algorithm, entry by entry:

    logits      |s^ - s| <= e_s = a_A scale |q|.|k|        (inputs, dot, scale, s roundings)
    stored LSE  |L^ - L| <= eps_L = E_s + -log(1 - theta) + lse's rounding, with theta the
                relative error of the forward's l (its exps, the rescales whose arguments
                telescope to at most the logit range R, the row sums)
    P           |P^ - P| <= pi P + eta, pi = exp(e_s + eps_L + u_diff |s - L| + u_p + ...) - 1
    dV          sum_i |P^ - P| |dO| + gamma (sum_i P^ |dO|) + rounding of dO, output
    dP, D       gamma (|dO| |V|^T);  |dO|.E_O (E_O: the forward bound of O per row,
                flashnum.analysis.bounds) + gamma (|dO|.|O^|)
    dS          |P^ - P| |dP - D| + P^ (e_dP + e_D) + the two roundings of P (dP - D)
    dQ, dK      scale (e_dS |K| + gamma |dS^| |K| + input roundings) + scale and output
                roundings

Past a format's largest number the rounding model fails: wherever a value some site rounds
may exceed it (its exact magnitude plus its error bound), every gradient the value reaches
gets an infinite bound for that head; an unbounded term against an exact zero gives inf,
never NaN.

The bound is rigorous (the higher-order products are kept: (1 + u)^k - 1, exp(x) - 1,
-log(1 - x)) but it is a worst case over the signs of the roundings; it is evaluated in
float64 with the exact P, dP, D, dS of the inputs and a relative slack of 2^-30.
"""

from __future__ import annotations

import math

import torch

from flashnum.analysis.bound_data import dot, rowsum
from flashnum.numerics import elementary
from flashnum.numerics.constants import gamma
from flashnum.numerics.formats import EXACT, FORMATS
from flashnum.numerics.policy import BWD_SITES, PRODUCT_SITES, make_backward_policy
from flashnum.numerics.tiling import causal_visible, check_causal, n_blocks

U64 = 2.0**-53
EXP64 = 2.0**-52  # torch's float64 exp: within 1 ulp
EVAL_SLACK = 2.0**-30
GROUPS = (*BWD_SITES, "inputs", "forward")  # sites a term can come from
_ROWS = 1 << 22  # logits per chunk of the evaluation


def _u(f, sr: bool) -> tuple[float, float]:
    """(u, eta) of one rounding into format f: exact sites run on the float64 carrier."""
    if f is EXACT or f.p >= 53:
        return U64, 2.0**-1075
    return (2 * f.u if sr else f.u), f.min_subnormal / 2 * (2 if sr else 1)


def _acc(f, n: int, sr: bool) -> float:
    """gamma_{n+1} of an accumulation of n products in format f (tf32: operands to tf32)."""
    if f is not EXACT and f.name == "tf32":
        u_op, u = FORMATS["tf32"].u * (2 if sr else 1), FORMATS["fp32"].u * (2 if sr else 1)
        g = gamma(n + 1, u)
        return (1 + u_op) ** 2 * (1 + g) - 1
    u = _u(f, sr)[0]
    return gamma(n + 1, u)


def _units(pol, sr: bool, only: str | None, on_grid=(False, False)) -> dict:
    """u and eta of every backward site, the inputs and the forward's sites; with `only`
    set, every group but that one is exact (u = eta = 0): its term alone. on_grid: whether
    (q, k, v) and dO are already values of their formats (then storing them is exact)."""
    U = {}
    for site in BWD_SITES:
        U[site] = _u(pol.fmt(site), sr)
    fwd = pol.forward
    U["inputs"] = (0.0, 0.0) if on_grid[0] else _u(fwd.fmt("inputs"), sr)
    if on_grid[1]:
        U["do"] = (0.0, 0.0)
    for site in ("qk_acc", "s", "m", "p", "l_acc", "l", "div", "p_cast"):
        U["fwd." + site] = _u(fwd.fmt(site), sr)
    if only is not None:
        for key in U:
            group = "forward" if key.startswith("fwd.") else key
            if group != only:
                U[key] = (0.0, 0.0)
    return U


def bound_backward(q, k, v, do, *, policy="fa2", precision="bf16", block_m: int = 64,
                   block_n: int = 64, causal: bool = False, scale=None,
                   rounding: str = "nearest", terms: bool = True) -> dict:
    """Elementwise a-priori bounds on the errors of dQ, dK, dV; see the module docstring."""
    if rounding not in ("nearest", "stochastic"):
        raise ValueError(f"unknown rounding {rounding!r}; valid: nearest, stochastic")
    pol = make_backward_policy(policy, precision)
    rounded = [x for x in PRODUCT_SITES if getattr(pol.forward, x) != "exact"]
    if rounded:  # the forward's recomputed S and its P V: the terms above do not carry it
        raise ValueError(f"the backward bound does not cover a product rounded before its "
                         f"sum ({', '.join(rounded)}); valid: those sites exact")
    causal = check_causal(causal)  # either alignment (flashnum.numerics.tiling.visible)
    sr = rounding == "stochastic"
    q3, k3, v3, do3 = (x.detach().to("cpu", torch.float64).reshape(-1, *x.shape[-2:])
                       for x in (q, k, v, do))
    d = q3.shape[-1]
    sc = 1 / math.sqrt(d) if scale is None else float(scale)
    E_O = _forward_bound(q, k, v, pol, block_n, causal, sc, rounding)
    geo = dict(bm=block_m, bn=block_n, causal=causal, scale=sc, B=q3.shape[0], sr=sr)

    def grid(x, f):
        return f is not EXACT and f.p < 53 and f.representable(x)

    fin = pol.forward.fmt("inputs")
    on_grid = (all(grid(x, fin) for x in (q3, k3, v3)), grid(do3, pol.fmt("do")))

    groups = GROUPS if terms else ()
    runs = {None: (_units(pol, sr, None, on_grid), E_O, True)}
    for s in groups:  # each group's term alone: the others exact, carrier rounding off
        runs[s] = (_units(pol, sr, s, on_grid), E_O if s == "forward" else torch.zeros_like(E_O),
                   False)
    parts = _evaluate(q3, k3, v3, do3, runs, pol, geo)
    full = parts[None]
    lead = q.shape[:-2]
    shapes = dict(dq=q.shape, dk=k.shape, dv=v.shape)
    # a NaN entry comes from an infinite term times 0 or minus another (inf * 0 in a GEMM of
    # magnitudes): some term of it is unbounded, so the entry's bound is inf
    out = {g: (full[g] * (1 + EVAL_SLACK)).nan_to_num(nan=math.inf, posinf=math.inf)
           .reshape(shapes[g]) for g in ("dq", "dk", "dv")}
    out["max"] = {g: float(out[g].max()) if out[g].numel() else 0.0 for g in ("dq", "dk", "dv")}
    out["terms"], out["dominant_site"] = {}, {}
    if terms:
        for g in ("dq", "dk", "dv"):
            worst = int(torch.argmax(full[g].reshape(-1))) if full[g].numel() else 0
            t = {s: float(parts[s][g].reshape(-1)[worst]) for s in GROUPS}
            out["terms"][g] = t
            out["dominant_site"][g] = max(t, key=t.get)
    out["info"] = dict(policy=pol.name, precision=precision, block_m=block_m, block_n=block_n,
                       causal=causal, scale=sc, rounding=rounding, lead=tuple(lead))
    return out


def _forward_bound(q, k, v, pol, block_n, causal, scale, rounding) -> torch.Tensor:
    """Per row, a bound on max_c |O^_c - O_c| of the forward the backward reads (flash
    structure only: the standard backward does not read O)."""
    if pol.structure == "standard":
        return torch.zeros(math.prod(q.shape[:-2]), q.shape[-2], dtype=torch.float64)
    from flashnum.analysis.bounds import bound

    b = bound(q, k, v, policy=pol.forward, block_n=block_n, causal=causal, scale=scale,
              rounding=rounding)
    return b["bound_rows"].reshape(-1, q.shape[-2]).to(torch.float64)


def _evaluate(q3, k3, v3, do3, runs, pol, geo) -> dict:
    """Elementwise bounds for every head, in chunks of query rows (dK, dV summed over them),
    for each run {key: (U, E_O, carrier)}: the full bound and each group's term alone. The
    chunk's exact quantities (S, P, dP, D, dS and their products) do not depend on the run's
    units, so they are computed once per chunk and shared by every run."""
    B, nq, d = q3.shape
    nk, dv = k3.shape[1], v3.shape[2]
    rows = max(1, min(nq, _ROWS // max(1, nk)))
    vis_all = causal_visible(nq, nk, causal=geo["causal"]) if geo["causal"] else \
        torch.ones(nq, nk, dtype=torch.bool)
    out = {key: dict(dq=torch.zeros(B, nq, d, dtype=torch.float64),
                     dk=torch.zeros(B, nk, d, dtype=torch.float64),
                     dv=torch.zeros(B, nk, dv, dtype=torch.float64)) for key in runs}
    for b in range(B):
        acc = {key: [None, None] for key in runs}
        mags: dict = {}  # the full run's largest magnitude per site, over the chunks
        for r0 in range(0, nq, rows):
            sl = slice(r0, r0 + rows)
            ex = _exact(q3[b, sl], k3[b], v3[b], do3[b, sl], vis_all[sl], pol, geo)
            for key, (U, E_O, carrier) in runs.items():
                res = _chunk(ex, E_O[b, sl], pol, U, geo, carrier, nq)
                out[key]["dq"][b, sl] = res["dq"]
                acc[key][0] = _add(acc[key][0], res["dk_parts"])
                acc[key][1] = _add(acc[key][1], res["dv_parts"])
                _merge(mags, res["mags"])
        for key, (U, _, _) in runs.items():
            out[key]["dk"][b], m_dk = _finish_kv(acc[key][0], "dk", pol, U, geo, nq, nk)
            out[key]["dv"][b], m_dv = _finish_kv(acc[key][1], "dv", pol, U, geo, nq, nk)
            if runs[key][2]:  # the full run (carrier): past a format's largest number, inf
                _merge(mags, {**m_dk, **m_dv})
                for g in _overflowing(mags, pol):
                    out[key][g][b] = math.inf
    return out


# which gradients a value that overflows at each site reaches (the sites of _chunk's mags)
_REACH = {**{s: ("dq", "dk", "dv") for s in ("inputs", "do", "qk_acc", "s", "lse", "p")},
          **{s: ("dv",) for s in ("p_cast", "dv_acc", "dv", "out.dv")},
          **{s: ("dq", "dk") for s in ("dp_acc", "dp", "delta", "ds", "ds_cast")},
          **{s: ("dq",) for s in ("dq_acc", "dq", "out.dq")},
          **{s: ("dk",) for s in ("dk_acc", "dk", "out.dk")}}


def _merge(into: dict, mags: dict) -> None:
    for site, x in mags.items():
        into[site] = max(into.get(site, 0.0), x)


def _overflowing(mags: dict, pol) -> set:
    """The gradients some of whose values may exceed their site's largest finite number."""
    bad = set()
    for site, x in mags.items():
        f = pol.forward.fmt("inputs") if site == "inputs" else pol.fmt(site.split(".")[0])
        if not x <= _fmax(f):
            bad.update(_REACH[site])
    return bad


class _Workspace:
    """N x N buffers of one row chunk, allocated once and reused by every run: a fresh
    tensor of that size is a fresh mapping, whose page faults cost more than the arithmetic.
    ws(name) is the buffer `name`; each holds one temporary at a time (see _chunk)."""

    def __init__(self, shape):
        self.shape, self.bufs = shape, {}

    def __call__(self, name: str) -> torch.Tensor:
        if name not in self.bufs:
            self.bufs[name] = torch.empty(self.shape, dtype=torch.float64)
        return self.bufs[name]


def _add(acc, parts):
    return parts if acc is None else [a + c for a, c in zip(acc, parts, strict=True)]


def _exact(q, k, v, do, vis, pol, geo) -> dict:
    """The quantities of some query rows that do not depend on the units: the logits and
    their magnitudes, P, L, dP, D, dS and the exact products that the bound's terms reuse."""
    mask = None if bool(vis.all()) else ~vis  # masked_fill under an all-false mask: a copy
    fill = (lambda x, val: x) if mask is None else (lambda x, val: x.masked_fill(mask, val))
    fill_ = (lambda x, val: x) if mask is None else (lambda x, val: x.masked_fill_(mask, val))
    sc = abs(geo["scale"])
    A = sc * dot(q.abs(), k.abs().T)
    S = geo["scale"] * dot(q, k.T)
    S_abs = S.abs()
    S = fill(S, -math.inf)
    live = vis.any(-1)
    m = torch.where(live, S.amax(-1), torch.zeros(()))
    smin = torch.where(live, fill(S, math.inf).amin(-1), torch.zeros(()))
    P = torch.softmax(S, -1).nan_to_num()
    L = m + elementary.log(rowsum(elementary.exp(S - m[:, None])).clamp_min(1e-300))
    aO = do.abs()
    dP = dot(do, v.T)
    O = dot(P, v)
    D = rowsum(do * O)
    dS = P * (dP - D[:, None])
    ex = dict(q=q, k=k, v=v, do=do, vis=vis, fill_=fill_, ws=_Workspace(S.shape), A=A, S=S,
              S_abs=S_abs, live=live, m=m, smin=smin, P=P, L=L,
              SL=(S - L[:, None]).abs().nan_to_num(0.0),
              visf=None if mask is None else vis.to(torch.float64), aO=aO, dP=dP,
              dP_abs=dP.abs(),
              aOv=dot(aO, v.abs().T), O=O, O_abs=O.abs(), D=D, G=(dP - D[:, None]).abs(), dS=dS,
              dS_abs=dS.abs(), ak=k.abs(), aq=q.abs(), PtdO=dot(P.T, do), dSk=dot(dS, k),
              dStq=dot(dS.T, q))
    # the largest magnitudes, for the overflow check (every run shares them)
    ex["top"] = dict(A=_amax(A), S=_amax(S_abs), aOv=_amax(ex["aOv"]), G=_amax(ex["G"]),
                     dS=_amax(ex["dS_abs"]), io=max(_amax(x.abs()) for x in (q, k, v)))
    return ex


def _fmax(f) -> float:
    """The largest magnitude that rounds to a finite value of format f (exact: none)."""
    return math.inf if f is EXACT or f.p >= 53 else f.max


def _amax(x: torch.Tensor) -> float:
    """The largest finite entry (0 for none). A magnitude is an exact value plus an error
    bound; where the bound is inf (or NaN) the gradient entries the value reaches get an
    infinite bound through the evaluation already, so the overflow check needs only the
    finite ones."""
    if not x.numel():
        return 0.0
    top = float(x.amax())  # one read-only pass; the copy below only when some entry is not
    return top if math.isfinite(top) else float(x.nan_to_num(nan=0.0, posinf=0.0).amax())


def _p_errors(ex, pol, U, geo, carrier, mags, std, x64, exp64, n_kb):
    """The error of the logits and of P as computed (eP0) and as it enters P^T dO (eP), for
    _chunk's rows; the overflow magnitudes of their sites go into mags (carrier runs)."""
    fill, ws = ex["fill_"], ex["ws"]
    m, smin, P, L = ex["m"], ex["smin"], ex["P"], ex["L"]
    sc, bn = abs(geo["scale"]), geo["bn"]
    nk, d = ex["k"].shape[0], ex["q"].shape[1]
    u_in = U["inputs"][0]

    # -- logits: inputs, the dot, the scale and the two roundings of s --
    u_s = max(U["s"][0], U["fwd.s"][0])
    f_qk = pol.forward.fmt("qk_acc") if std else pol.fmt("qk_acc")
    # the dot's error is relative to A = scale |q|.|k|, the roundings of s to |s|
    a_A = (1 + u_in) ** 2 * (1 + _acc(f_qk, d, geo["sr"]) * (U["qk_acc"][0] > 0 or
                                                          U["fwd.qk_acc"][0] > 0)) - 1
    e_s = torch.mul(ex["A"], a_A, out=ws("e_s0"))
    # in place where a temporary is free: the same roundings, fewer N x N allocations
    t = torch.add(ex["S_abs"], e_s, out=ws("e_s")).mul_((1 + u_s) ** 3 - 1)
    e_s = _plus_(_plus_(t.add_(e_s), 2 * U["s"][1]), 2 * U["fwd.s"][1])
    e_s = fill(e_s, 0.0)
    Es = e_s.amax(-1)
    if carrier:
        top, es_max = ex["top"], _amax(Es)
        # the dot before the scale (every partial sum) and the scaled logit
        mags["qk_acc"] = (top["A"] + es_max) / sc if sc > 0 else math.inf
        mags["s"] = max(mags["qk_acc"], top["S"] + es_max)
        mags["inputs"] = top["io"]
        mags["do"] = _amax(ex["do"].abs())
    ulog = lambda u: -math.log1p(-u) if u < 1 else math.inf  # noqa: E731
    if std:
        u_fd = max(U["fwd.s"][0], U["fwd.m"][0])
        R = (m - smin) + 2 * Es + U["fwd.m"][0] * m.abs()
        theta = elementary.exp(Es + u_fd * R) * (1 + U["fwd.p"][0]) * (
            1 + _acc(pol.forward.fmt("l_acc"), nk, geo["sr"]) * (U["fwd.l_acc"][0] > 0)) * (
            1 + U["fwd.l"][0]) - 1
        lg = (e_s + u_fd * R[:, None] + ulog(U["fwd.p"][0]) + exp64
              + _nlog1m(theta)[:, None] + ulog(U["fwd.div"][0]) + ulog(U["fwd.p_cast"][0]))
        pi = elementary.expm1(lg)
        eta_p = 2 * (U["fwd.p"][1] + U["fwd.div"][1] + U["fwd.p_cast"][1])
        rho, eta_pc = pi, eta_p
    else:
        T = n_kb
        u_fd = max(U["fwd.s"][0], U["fwd.m"][0])
        R = (m - smin) + 2 * Es + 2 * U["fwd.m"][0] * m.abs()
        theta = elementary.exp((U["fwd.m"][0] + u_fd) * R) * (1 + U["fwd.p"][0]) ** T * (
            1 + U["fwd.l"][0]) ** (2 * T + 1) * (
            1 + _acc(pol.forward.fmt("l_acc"), bn, geo["sr"]) * (U["fwd.l_acc"][0] > 0)) - 1
        # the forward's lse in float64 (m + log l), then the lse site
        eps_L = Es + _nlog1m(theta) + 4 * x64 * (m.abs() + L.abs() + 1)
        eps_L = eps_L + U["lse"][0] * (L.abs() + eps_L) + U["lse"][1]
        if carrier:
            mags["lse"] = _amax(L.abs() + eps_L)
        u_bd = max(U["s"][0], U["lse"][0])
        t = torch.add(ex["SL"], e_s, out=ws("e_s0")).add_(eps_L[:, None]).mul_(u_bd)
        lg = torch.add(e_s, eps_L[:, None], out=ws("lg"))
        lg = _plus_(_plus_(lg.add_(t), ulog(U["p"][0])), exp64)
        pi = elementary.expm1(lg)
        eta_p = 2 * U["p"][1]
        rho = torch.add(pi, 1, out=ws("e_s0")).mul_(1 + U["p_cast"][0]).sub_(1)
        eta_pc = 2 * (U["p"][1] + U["p_cast"][1])
    visf = ex["visf"]
    eP0 = fill(_plus_(torch.mul(pi, P, out=ws("eP0")), eta_p, visf), 0.0)  # P as computed
    # P as it enters P^T dO
    eP = fill(_plus_(torch.mul(rho, P, out=ws("eP")), eta_pc, visf), 0.0)
    if carrier:  # P <= 1
        mags["p"], mags["p_cast"] = 1 + _amax(eP0), 1 + _amax(eP)
    return eP0, eP


def _ds_errors(ex, E_O, pol, U, geo, carrier, mags, std, x64, eP0, eP, aOh):
    """The errors of dP, D, dS and dS's cast (e_dSc; with mag >= |dS cast| and k_err the
    magnitude its K-side error multiplies), for _chunk's rows."""
    fill, ws, P, aO = ex["fill_"], ex["ws"], ex["P"], ex["aO"]
    sc = abs(geo["scale"])
    nk, dv = ex["k"].shape[0], ex["v"].shape[1]
    u_in, u_do = U["inputs"][0], U["do"][0]
    visf = ex["visf"]

    # -- dP and D --
    g_dp = (1 + u_do) * (1 + u_in) * (1 + _acc(pol.fmt("dp_acc"), dv, geo["sr"]) *
                                      (U["dp_acc"][0] > 0)) * (1 + U["dp"][0]) - 1
    dP_abs = ex["dP_abs"]
    e_dP = _plus_(torch.mul(ex["aOv"], g_dp, out=ws("e_dP")), U["dp"][1])
    if carrier:  # every partial sum of dP_ij is at most sum_c |dO_ic| |V_jc|
        mags["dp_acc"] = mags["dp"] = ex["top"]["aOv"] * (1 + g_dp) + U["dp"][1]
    f_delta = pol.fmt("delta")
    u_dacc = min(_u(f_delta, geo["sr"])[0], FORMATS["fp32"].u) if U["delta"][0] > 0 else 0.0
    g_delta = (1 + (dv + 1) * u_dacc / (1 - (dv + 1) * u_dacc)) * (1 + U["delta"][0]) - 1
    if std:
        Pc = P + eP
        d_mag = rowsum(Pc * (dP_abs + e_dP))  # every partial sum of D's terms
        e_D = (rowsum(eP * dP_abs + P * e_dP + eP * e_dP)
               + (g_delta + 2 * x64 * nk) * d_mag + U["delta"][1])
        P_ds, eP_ds = P, eP
    else:
        O_abs = ex["O_abs"]
        d_mag = rowsum(aOh * (O_abs + E_O[:, None]))  # every partial sum of D's terms
        e_D = (rowsum(aOh) * E_O + u_do * rowsum(aO * O_abs)
               + g_delta * d_mag + U["delta"][1])
        P_ds, eP_ds = P, eP0
    G = ex["G"]
    e_G = e_dP.add_(e_D[:, None])  # e_dP is not read again

    # -- dS and its cast --
    u_ds = U["ds"][0]
    Ph = torch.add(P_ds, eP_ds, out=ws("Ph"))
    e_dS = torch.mul(eP_ds, G, out=ws("e_dS")).add_(torch.mul(Ph, e_G, out=ws("e_s0")))
    _plus_(e_dS.add_(Ph.mul_((1 + u_ds) ** 2 - 1).mul_(e_G.add_(G))), 2 * U["ds"][1], visf)
    dS_abs = ex["dS_abs"]
    if carrier:  # e_G now holds |dP - D| + its error; dS = P (dP - D)
        mags["delta"] = _amax(d_mag) * (1 + g_delta) + U["delta"][1]
        mags["ds"] = max(_amax(e_G), ex["top"]["dS"] + _amax(e_dS))
    u_c = U["ds_cast"][0]
    if std:  # fl(fl(dS) * scale): the cast, the scale rounded to ds, the product
        g_sc = (1 + u_c) ** 2 * (1 + u_ds) - 1
        e_dSc = sc * (e_dS * (1 + g_sc) + g_sc * dS_abs) + _on(2 * U["ds_cast"][1], visf)
        mag = sc * dS_abs + e_dSc  # >= |dS^ scaled|
        k_err = sc * dS_abs
    else:
        e_dSc = torch.add(dS_abs, e_dS, out=ws("lg")).mul_(u_c).add_(e_dS)
        e_dSc = _plus_(e_dSc, U["ds_cast"][1], visf)
        mag = torch.add(dS_abs, e_dSc, out=ws("mag"))
        k_err = dS_abs
    e_dSc = fill(e_dSc, 0.0)
    mag = fill(mag, 0.0)
    return e_dSc, mag, k_err


def _chunk(ex, E_O, pol, U, geo, carrier, nq_total):
    """The bound's ingredients for some query rows (see the module docstring); ex: _exact's."""
    k, ws, live, P = ex["k"], ex["ws"], ex["live"], ex["P"]
    std = pol.structure == "standard"
    sc, bn = abs(geo["scale"]), geo["bn"]
    nk = k.shape[0]
    n_kb = n_blocks(nk, bn)
    u_in, u_do = U["inputs"][0], U["do"][0]
    # mags[site]: an upper bound of every value the site rounds (before its rounding), for
    # the overflow check (the full run only: carrier); the model fl(x) = x (1 + delta) + eta
    # holds only up to the format's largest number
    mags: dict = {}
    x64 = U64 if carrier else 0.0
    exp64 = EXP64 if carrier else 0.0

    eP0, eP = _p_errors(ex, pol, U, geo, carrier, mags, std, x64, exp64, n_kb)
    aO = ex["aO"]
    aOh = aO * (1 + u_do)

    # -- dV: row chunk contributions (summed over chunks by the caller) --
    dv_parts = [dot(eP.T, aOh) + dot(P.T, u_do * aO), dot(torch.add(P, eP, out=ws("Ph")).T, aOh),
                ex["PtdO"]]

    e_dSc, mag, k_err = _ds_errors(ex, E_O, pol, U, geo, carrier, mags, std, x64, eP0, eP,
                                   aOh)
    ak, aq = ex["ak"], ex["aq"]
    if carrier:
        mags["ds_cast"] = _amax(mag)
    # -- dQ (complete for these rows) --
    if std:
        g_dq = _acc(pol.fmt("dq_acc"), nk, geo["sr"]) * (U["dq_acc"][0] > 0)
        X = sc * ex["dSk"]
        MK = dot(mag, ak * (1 + u_in))  # every partial sum of dQ's magnitude
        e_X = dot(e_dSc, ak * (1 + u_in)) + dot(k_err, u_in * ak) + g_dq * MK
        pre = e_X + 2 * x64 * nk * dot(mag, ak)
    else:
        g_dq = (1 + _acc(pol.fmt("dq_acc"), bn, geo["sr"]) * (U["dq_acc"][0] > 0)) * (
            1 + U["dq"][0]) ** (n_kb + 1) - 1
        Xu = ex["dSk"]
        MK = dot(mag, ak * (1 + u_in))  # every partial sum of dQ's magnitude
        e_X = dot(e_dSc, ak * (1 + u_in)) + dot(k_err, u_in * ak) + g_dq * MK
        u_q = U["dq"][0]
        pre = sc * (e_X * (1 + u_q) ** 2 + ((1 + u_q) ** 2 - 1) * Xu.abs())
        X = sc * Xu
    dq = pre + U["out"][0] * (X.abs() + pre) + U["out"][1]
    dq = torch.where(live[:, None], dq, torch.zeros_like(dq))
    if carrier:  # the accumulator (unscaled in flash), then the scaled value
        mags["out.dq"] = _amax(X.abs() + pre)
        mags["dq_acc"] = mags["dq"] = max(_amax(MK) * (1 + g_dq), mags["out.dq"])
    # -- dK: row chunk contributions --
    dk_parts = [dot(e_dSc.T, aq * (1 + u_in)) + dot(k_err.T, u_in * aq),
                dot(mag.T, aq * (1 + u_in)), ex["dStq"]]
    return dict(dq=dq, dk_parts=dk_parts, dv_parts=dv_parts, mags=mags)


def _on(c: float, visf):
    """c on the visible entries: c itself when every entry is visible (visf None), where
    c * 1.0 == c makes the broadcast scalar give the same sums bit for bit."""
    return c if visf is None else c * visf


def _plus_(t: torch.Tensor, c: float, visf=None) -> torch.Tensor:
    """t += c (on the visible entries, visf given), in place; nothing when c == 0: every
    tensor this is applied to is >= +0 or NaN (no -0), so t + 0.0 is t bit for bit."""
    return t if c == 0.0 else t.add_(_on(c, visf))


def _nlog1m(x: torch.Tensor) -> torch.Tensor:
    """-log(1 - x), inf where x >= 1."""
    return torch.where(x < 1, -elementary.log1p(-x.clamp(max=1 - 1e-16)),
                       torch.full_like(x, math.inf))


def _finish_kv(parts, g: str, pol, U, geo, nq: int, nk: int) -> tuple[torch.Tensor, dict]:
    """dK or dV from the row sums: accumulation, the scale (dK), the output rounding; and
    the largest magnitudes of its accumulator and its scaled value (the overflow check)."""
    err, mag, exact = parts
    std = pol.structure == "standard"
    sc = abs(geo["scale"])
    acc_site = g + "_acc"
    if std:
        rows = max(1, min(nq, (1 << 24) // max(1, geo["B"] * nk)))
        n_ch = n_blocks(nq, rows)
        gam = (1 + _acc(pol.fmt(acc_site), rows, geo["sr"]) * (U[acc_site][0] > 0)) * (
            1 + U[g][0]) ** (n_ch + 1) - 1
    else:
        n_qb = n_blocks(nq, geo["bm"])
        gam = (1 + _acc(pol.fmt(acc_site), geo["bm"], geo["sr"]) * (U[acc_site][0] > 0)) * (
            1 + U[g][0]) ** (n_qb + 1) - 1
    e = err + gam * mag
    if g == "dk":
        if std:
            X = sc * exact  # dsc already carries the scale (its errors in err)
            pre = e
        else:
            u_k = U["dk"][0]
            X = sc * exact
            pre = sc * (e * (1 + u_k) ** 2 + ((1 + u_k) ** 2 - 1) * exact.abs())
    else:
        X, pre = exact, e
    top = _amax(X.abs() + pre)
    # every partial sum of the accumulator is at most mag (plus its error e)
    mags = {f"out.{g}": top, acc_site: max(_amax(mag + e), top)}
    mags[g] = mags[acc_site]
    return pre + U["out"][0] * (X.abs() + pre) + U["out"][1], mags
