"""A-priori forward error bounds for attention through the blocked online softmax.

    from flashnum.analysis.bounds import bound
    b = bound(q, k, v, policy="fa2", precision="bf16", block_n=64)
    b["bound"]          # >= max_ij |out_ij - exact_ij| for every run of the engine
    b["bound_prob"]     # the same with probability >= 1 - delta (prob=True)
    b["terms"]          # {site: first-order contribution} at the worst output entry
    b["dominant_site"]  # the site with the largest term

`exact` is the real attention softmax(scale Q K^T) V of the *given* inputs with the
exact scale (1/sqrt(d) when scale is None), so the rounding of the inputs is one of
the sites. The bound covers every order of the key blocks and every block_m (rows
are independent); it depends on the tiling only through block_n, the number of key
blocks each row visits and the number of rescales.

The derivation is in docs/bounds.md. In one paragraph: every rounding of the engine
(flashnum.engine, Arith) is fl(x) = x (1 + delta) + eta with |delta| <= u of its
site and |eta| <= half the format's smallest subnormal (additions and subtractions
have eta = 0). Step A: the rounding of Q, K and the QK^T accumulation and the logit
roundings perturb each logit by at most E_j = a_A A_j + a_s |s_j| + a_L L1_j + a_0
(A_j = scale |q|.|k_j|), which moves the output by at most
exp(E* + E_mean) (u_v nu + Delta E_mean) (a logit-perturbation lemma; Delta = max_j
|v_j - y|, nu = sum_j pi_j |v_j|). Step B: for the computed logits, the recurrence
returns (N / D) (1 + div)(1 + out) with N = sum_j w_j (1 + C_j)(1 + O_j) v_j and
D = sum_j w_j (1 + C_j)(1 + L_j): C_j collects the errors common to l and o (the
exponent argument s - m, exp, the rescales alpha = exp(m_old - m_new), which cancel
between numerator and denominator up to Delta), O_j the numerator's own (P cast, P @ V
accumulation, the T + r roundings of o), L_j the denominator's (row sum, the T + r
roundings of l). A ratio lemma turns these into the bound. Higher-order terms are
kept exactly ((1 + u)^k - 1, e^x - 1, 1 / (1 - x)), so the bound is rigorous, and it
is a power series in the unit roundoffs with nonnegative coefficients (a majorant),
which is what the probabilistic bound and the per-site terms use.

Options (defaults first):
  policy, precision   a Policy, or a preset name with its precision ("bf16")
  block_n             keys per block (the standard structure ignores it)
  n_rescales=None     None: every visited key block after the first may rescale
                      (T - 1 per row); an int, or a per-row tensor such as
                      Result.n_rescales (the exact count of the run)
  causal=False, scale=None (1/sqrt(d)); causal True/"bottom_right" or "top_left"
  variant="fa2"       a name or a flashnum.engine.variants.Variant whose `bounded` is
                      set (fa2 exp2 lazy qiu_yao fa1), tau / beta its parameters when a
                      name; the variant's hooks bound_shift, bound_tau, bound_dM say how
                      its running max enters the bound
  rounding="nearest"  or "stochastic" (the engine's seeded stochastic rounding: 2u)
  prob=False          also compute the probabilistic bound (costs ~10 more matmuls)
  delta=1e-3          its failure probability
  rows=None           a dict the caller keeps across calls on the same q, k, v tensors
                      (one input under several policies, orders, block sizes): the
                      exact problem's per-row data, which depends only on the inputs,
                      causal, the scale, block_n, prob and the variant, is computed once
                      per such key and kept there (the sweeps' runner passes one per input)

Probabilistic bound (Higham & Mary 2019; Connolly, Higham & Mary 2021): model the
relative errors delta of the roundings as mean-independent with mean zero (true for
stochastic rounding; an assumption for round-to-nearest). The error is L(delta) +
R(delta) with L linear; Azuma-Hoeffding gives |L| <= lambda sqrt(sum_k a_k^2 u_k^2)
for every output entry at once with probability >= 1 - delta, lambda =
sqrt(2 ln(2 K / delta)) (K entries, union bound), and |R| <= bound - (its first-order
part). The sum of squares groups the roundings by site: a chain of n roundings
contributes sqrt(n) u instead of n u, and the per-key roundings average over the keys
(sum_j pi_j^2 (v_j - y)^2 instead of (sum_j pi_j |v_j - y|)^2). Roundings whose error
is not of that kind (underflow eta, the rounded scale, float64 exp's own error, the
tf32 operand casts, round-to-nearest steps of a stochastic run) are kept deterministic.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import mpmath
import torch

from flashnum.analysis.memo import kept
from flashnum.engine.arith import carrier, wider
from flashnum.engine.variants import FA2, Variant, variant_of
from flashnum.engine.variants import VARIANTS as VARIANT_CLASSES
from flashnum.numerics import elementary
from flashnum.numerics.accumulate import dot as _dot
from flashnum.numerics.accumulate import rowsum as _rowsum
from flashnum.numerics.constants import LOG2E
from flashnum.numerics.formats import EXACT, FORMATS, Exact, Format
from flashnum.numerics.policy import SITES, Policy, make_policy
from flashnum.numerics.tiling import check_causal, visible_count


def dot(a, b):
    """a @ b in float64, in flashnum's order (flashnum.numerics.accumulate): a bound's
    bits do not depend on the machine."""
    return _dot(a, b, "fp64")


def rowsum(x):
    """The float64 sum over the last dim, in flashnum's order."""
    return _rowsum(x, "fp64")

U64 = 2.0**-53  # unit roundoff of the float64 carrier
ETA64 = 2.0**-1075  # half of float64's smallest subnormal
EXP64 = 2.0**-52  # torch's float64 exp / exp2: within 1 ulp
T_SCALE = 2.0**-12  # the small t of B(t u) / t (first-order parts of the majorant)
EVAL_SLACK = 2.0**-30  # relative slack for the float64 evaluation of the bound itself
VARIANTS = tuple(n for n, cls in VARIANT_CLASSES.items() if cls.bounded)


# ---------------------------------------------------------------------------
# the small parameters: one unit roundoff (random or deterministic part) or eta per
# rounding kind, each charged to the site whose format it uses



@dataclass(frozen=True)
class Param:
    value: float
    site: str
    kind: str  # "rand": a rounding error delta (mean zero under the model); "det": the rest




def _is_fp32(f) -> bool:
    return isinstance(f, Format) and f.p == 24 and f.emin == -126


def _rounding(f, *, op: bool, carrier, sr: bool, from64: bool = False):
    """(u_rand, u_det, eta) of one rounding into format f, as flashnum.engine.arith.Arith does it.

    op: the value is the result of an arithmetic operation in the carrier (else it is a
    stored value being cast). from64: a float64 value cast on a float32 carrier (the
    inputs), which Arith casts through torch: float64 -> fp32 -> f, two roundings.
    sr: this rounding is stochastic (error < 2u, mean zero given the past).
    """
    exact = f is EXACT or isinstance(f, Exact) or f.p >= 53
    f32car = carrier is torch.float32
    if exact:
        if not op:
            return 0.0, 0.0, 0.0
        # a float64 operation, round to nearest: random under the model, but not under sr
        return (0.0, U64, ETA64) if sr else (U64, 0.0, ETA64)
    u, eta = f.u, f.min_subnormal / 2
    if f32car and _is_fp32(f):
        # fp32 arithmetic on the fp32 carrier is one round to nearest; a cast is a no-op
        # (except a float64 input, cast by .to(float32): one rounding)
        if not op and not from64:
            return 0.0, 0.0, 0.0
        return (0.0, u, eta) if sr else (u, 0.0, eta)
    extra = 0.0  # a carrier rounding before the rounding into f (double rounding)
    if f32car and (from64 or (op and f.p > 11)):
        extra = 2.0**-24
    if not f32car and op and f.p > 25:
        extra = U64
    if sr:
        return 2 * u, extra, 2 * eta
    return u, extra, eta


def _dot_rounding(f, carrier, sr: bool):
    """(u_rand, u_det, eta, tf32_u, tf32_eta) of one accumulation step of a dot in f."""
    exact = f is EXACT or isinstance(f, Exact) or f.p >= 53
    if exact:  # float64 matmul
        return (0.0, U64, ETA64, 0.0, 0.0) if sr else (U64, 0.0, ETA64, 0.0, 0.0)
    if f.name in ("fp32", "tf32"):  # torch fp32 matmul: round to nearest, never stochastic
        u32, eta32 = 2.0**-24, 2.0**-150
        tf = (FORMATS["tf32"].u, FORMATS["tf32"].min_subnormal / 2) if f.name == "tf32" else (0, 0)
        base = (0.0, u32, eta32) if sr else (u32, 0.0, eta32)
        return (*base, *tf)
    ur, ud, eta = _rounding(f, op=True, carrier=carrier, sr=sr)
    return ur, ud, eta, 0.0, 0.0


def _params(pol: Policy, rounding: str, on_grid=(False, False, False)) -> dict[str, Param]:
    """The small parameters of a policy, the larger of their values on the two carriers.

    on_grid: whether q, k, v are already numbers of the inputs' format (their cast is then
    exact: u = eta = 0). Both carriers: a caller may bound a run with a policy that differs
    from the engine's only at sites that are exact on this data (inputs already in the
    format), which can change the engine's carrier; the maximum covers either.
    """
    one = [_params_on(pol, rounding, on_grid, car) for car in (torch.float32, torch.float64)]
    return {name: Param(max(a.value, b.value), a.site, a.kind)
            for (name, a), b in zip(one[0].items(), one[1].values(), strict=True)}


def _params_on(pol: Policy, rounding: str, on_grid, car) -> dict[str, Param]:
    sr = rounding == "stochastic"
    F = pol.fmt
    out: dict[str, Param] = {}

    def put(name, site, f, kind="rand", **kw):
        ur, ud, eta = _rounding(f, carrier=car, **kw)
        out["u_" + name] = Param(ur, site, kind)
        out["ud_" + name] = Param(ud, site, "det")
        out["eta_" + name] = Param(eta, site, "det")

    def put_dot(name, site, f):
        ur, ud, eta, tfu, tfeta = _dot_rounding(f, car, sr)
        out["u_" + name] = Param(ur, site, "rand")
        out["ud_" + name] = Param(ud, site, "det")
        out["eta_" + name] = Param(eta, site, "det")
        out["u_" + name + "tf"] = Param(0.0, site, "rand")
        out["ud_" + name + "tf"] = Param(tfu, site, "det")  # tf32 operand casts
        out["eta_" + name + "tf"] = Param(tfeta, site, "det")

    for name, exact_cast in zip(("inq", "ink", "inv"), on_grid, strict=True):
        # the inputs' cast is always to nearest; a number of the format is kept exactly
        put(name, "inputs", EXACT if exact_cast else F("inputs"), op=False, sr=False,
            from64=True)
    put_dot("qk", "qk_acc", F("qk_acc"))
    put("sc", "s", F("s"), op=False, sr=sr)  # S from the accumulator into the logits' format
    put("sp", "s", F("s"), op=True, sr=sr)  # times the scale
    f_diff = wider(F("s"), F("m"))
    put("diff", "s", f_diff, op=True, sr=sr)  # s - m, in the wider of the two
    # the block max into m's format: a shift that cancels between l and o, so it has
    # no first-order effect (it only moves magnitudes): deterministic
    put("mc", "m", F("m"), kind="det", op=False, sr=sr)
    put("m", "m", F("m"), op=True, sr=sr)  # m_old - m_new, and beta * m (qiu_yao)
    # exp: float64 exp (or exp2), then one rounding into p's format
    fp = F("p")
    if fp is EXACT or isinstance(fp, Exact) or fp.p >= 53:
        ur, ud, eta = 0.0, 0.0, 0.0
    else:
        # Arith.exp rounds the float64 value once (stochastically under sr)
        ur, ud, eta = (2 * fp.u, 0.0, fp.min_subnormal) if sr else (
            fp.u, 0.0, fp.min_subnormal / 2)
    out["u_p"], out["ud_p"], out["eta_p"] = Param(ur, "p", "rand"), Param(ud, "p", "det"), Param(
        eta, "p", "det")
    out["exp64"] = Param(EXP64, "p", "det")
    put("pc", "p_cast", F("p_cast"), op=False, sr=sr)
    put_dot("pv", "pv_acc", F("pv_acc"))
    fl = F("l_acc")
    if fl is EXACT or isinstance(fl, Exact) or fl.p >= 53 or fl.name in ("fp32", "tf32"):
        ur, ud, eta, _, _ = _dot_rounding(fl if fl.name != "tf32" else FORMATS["fp32"], car, sr)
    else:
        ur, ud, eta = _rounding(fl, op=True, carrier=car, sr=sr)
    out["u_lacc"], out["ud_lacc"] = Param(ur, "l_acc", "rand"), Param(ud, "l_acc", "det")
    put("l", "l", F("l"), op=True, sr=sr)
    put("o", "o", F("o"), op=True, sr=sr)
    put("div", "div", F("div"), op=True, sr=sr)
    put("out", "out", F("out"), op=False, sr=sr)
    out["sigma"] = Param(0.0, "s", "det")  # set by _scale_error
    return out




@functools.lru_cache(maxsize=256)  # mpmath at 200 bits: a sweep asks for few distinct ones
def _scale_error(pol: Policy, d: int, scale, base2: bool, rounding: str) -> tuple[float, float]:
    """(scale_exact as float, sigma): |scale_s / scale_exact - 1| for the engine's scale_s.

    The engine holds the scale in the logits' format: scale_s = rnd_s(scale (* log2 e))
    on its carrier. For round to nearest we reproduce it and measure its relative error
    exactly (mpmath); for stochastic rounding we bound it.
    """
    from flashnum.engine.arith import Arith  # the engine's own rounding of the scale

    ctx = mpmath.MPContext()
    ctx.prec = 200
    exact = 1 / ctx.sqrt(d) if scale is None else ctx.mpf(float(scale))
    if base2:
        exact = exact / ctx.ln2
    s64 = (1.0 / math.sqrt(d) if scale is None else float(scale)) * (LOG2E if base2 else 1.0)
    car = carrier(pol)
    fs = pol.fmt("s")
    if rounding == "stochastic" and not (fs is EXACT or isinstance(fs, Exact) or fs.p >= 53):
        rel64 = abs(ctx.mpf(s64) / exact - 1)
        uc = 2.0**-24 if car is torch.float32 else 0.0
        sigma = (1 + float(rel64) * (1 + 2**-40)) * (1 + uc) * (1 + 2 * fs.u) - 1
        return float(exact), sigma
    # the larger of the errors on both carriers: a caller may bound a run with a policy that
    # differs from the engine's only at exact-on-this-data sites (e.g. inputs already in
    # the format), which can change the carrier and so the double rounding of the scale
    sigma = 0.0
    for c in (car, torch.float64 if car is torch.float32 else torch.float32):
        if c is torch.float32 and (fs is EXACT or isinstance(fs, Exact) or fs.p > 24):
            continue  # no fp32 carrier with this logits format
        scale_s = float(Arith(pol, "nearest", 0, c).rnd(torch.tensor(s64, dtype=c), fs))
        sigma = max(sigma, float(abs(ctx.mpf(scale_s) / exact - 1)) * (1 + 2**-40) + 2.0**-200)
    return float(exact), sigma


# ---------------------------------------------------------------------------
# data: the exact quantities of each row the bound is stated in


def _visible_counts(nq: int, nk: int, causal) -> torch.Tensor:
    return visible_count(nq, nk, causal)


def _v_extremes(v3, n, causal):
    """Per row and column, the max, min and max |.| of V over the keys the row sees (a
    prefix of n[i] keys under the causal mask): (B, Nq, dv) each."""
    B, nq, dv = v3.shape[0], n.shape[0], v3.shape[-1]
    if causal:
        vmax_pref = torch.cummax(v3, dim=1).values
        vmin_pref = torch.cummin(v3, dim=1).values
        vabs_pref = torch.cummax(v3.abs(), dim=1).values
        idx = torch.clamp(n - 1, min=0)
        return vmax_pref[:, idx], vmin_pref[:, idx], vabs_pref[:, idx]
    return (v3.amax(1, keepdim=True).expand(B, nq, dv),
            v3.amin(1, keepdim=True).expand(B, nq, dv),
            v3.abs().amax(1, keepdim=True).expand(B, nq, dv))


def _prob_terms(pi, y, qc, S, Sv, Av, Msafe, v3, V2, K2, scale, shift0) -> dict:
    """The probabilistic bound's weighted variances of some rows (softmax pi, output y,
    logits S and their masked forms Sv, Av), as _row_data stores them."""
    out = {"var": torch.clamp(dot(pi, V2) - y * y, min=0)}
    pi2 = pi * pi

    def wsq(W):
        # sum_j W_j (v_jc - y_c)^2, W >= 0
        return torch.clamp(dot(W, V2) - 2 * y * dot(W, v3) + y * y * rowsum(W)[..., None], min=0)

    out["Wv"] = dot(pi2, V2)
    out["W1"] = wsq(pi2)
    out["Ws2"] = wsq(pi2 * Sv * Sv)
    out["WA2"] = wsq(pi2 * Av * Av)
    qk2 = scale * scale * dot(qc * qc, K2.transpose(-1, -2))
    # pi = 0 on masked keys, so the weights need no masking
    out["Wk"] = wsq(pi2 * qk2)
    ms0, tau0 = shift0(Msafe)
    g0 = (ms0 + tau0)[..., None] - S
    out["Wg"] = wsq(pi2 * g0 * g0)
    out["Qterm"] = scale * scale * rowsum((qc * qc) * dot(pi, K2))
    return out


def _row_data(q, k, v, *, causal, scale, prob, shift0):
    """Per row (B, Nq) and per entry (B, Nq, dv) quantities of the exact problem, in float64,
    but those of the key blocks (_block_data).

    shift0(M) -> (Mshift0, tau0): the exact-arithmetic shift of the variant (for the
    probabilistic bound's exponent-argument term).
    """
    q3 = q.detach().to("cpu", torch.float64).reshape(-1, *q.shape[-2:])
    k3 = k.detach().to("cpu", torch.float64).reshape(-1, *k.shape[-2:])
    v3 = v.detach().to("cpu", torch.float64).reshape(-1, *v.shape[-2:])
    B, nq, d = q3.shape
    nk, dv = k3.shape[1], v3.shape[-1]
    n = _visible_counts(nq, nk, causal)  # (nq,)
    vmax, vmin, vabs = _v_extremes(v3, n, causal)
    kabs, qabs = k3.abs(), q3.abs()
    k_l1 = rowsum(kabs)  # (B, nk)
    V2 = v3 * v3
    K2 = k3 * k3
    rows = _chunk_rows(B, nq, nk)
    names_r = ("M", "smin", "Ms", "Sbar", "Sstar", "Abar", "Astar", "L1bar", "L1star", "Qterm")
    names_c = ("y", "nu", "var", "Wv", "W1", "Ws2", "WA2", "Wk", "Wg")
    R = {x: torch.zeros(B, nq, dtype=torch.float64) for x in names_r}
    C = {x: torch.zeros(B, nq, dv, dtype=torch.float64) for x in names_c}
    for r0 in range(0, nq, rows):
        r1 = min(nq, r0 + rows)
        qc = q3[:, r0:r1]
        S = scale * dot(qc, k3.transpose(-1, -2))  # (B, r, nk)
        A = scale * dot(qabs[:, r0:r1], kabs.transpose(-1, -2))
        q_l1 = rowsum(qabs[:, r0:r1])
        ninf = torch.full_like(S, -math.inf)
        if causal:
            vis = (torch.arange(nk)[None, :] < n[r0:r1, None]).expand(B, -1, -1)
            any_vis = vis.any(-1)
            zero = torch.zeros_like(S)
            Sm = torch.where(vis, S, ninf)
            Sv, Av = torch.where(vis, S, zero), torch.where(vis, A, zero)
            smin = torch.where(vis, S, -ninf).amin(-1)
            kl1 = torch.where(vis, k_l1[:, None, :].expand_as(S), zero)
        else:  # every key visible: no masking passes
            vis, any_vis = None, torch.ones(B, r1 - r0, dtype=torch.bool)
            Sm = Sv = S
            Av = A
            smin = S.amin(-1)
            kl1 = k_l1[:, None, :]
        M = Sm.amax(-1)
        Msafe = torch.where(any_vis, M, torch.zeros_like(M))
        e = elementary.exp(Sm - Msafe[..., None])  # exp(-inf) = 0 where masked
        pi = e / torch.where(any_vis, rowsum(e), torch.ones_like(M))[..., None]
        R["M"][:, r0:r1] = Msafe
        R["smin"][:, r0:r1] = torch.where(any_vis, smin, Msafe)
        R["Ms"][:, r0:r1] = rowsum(pi * Sv)
        Sabs = Sv.abs()
        R["Sbar"][:, r0:r1] = rowsum(pi * Sabs)
        R["Sstar"][:, r0:r1] = Sabs.amax(-1)
        R["Abar"][:, r0:r1] = rowsum(pi * Av)
        R["Astar"][:, r0:r1] = Av.amax(-1)
        # L1_j = ||q||_1 + ||k_j||_1 over the visible keys
        R["L1bar"][:, r0:r1] = q_l1 * rowsum(pi) + rowsum(pi * kl1)
        R["L1star"][:, r0:r1] = torch.where(any_vis, q_l1 + kl1.amax(-1), torch.zeros_like(M))
        y = dot(pi, v3)
        C["y"][:, r0:r1] = y
        C["nu"][:, r0:r1] = dot(pi, v3.abs())
        if prob:
            for name, x in _prob_terms(pi, y, qc, S, Sv, Av, Msafe, v3, V2, K2, scale,
                                       shift0).items():
                (R if name == "Qterm" else C)[name][:, r0:r1] = x
    vis_rows = (n > 0).expand(B, nq)
    yv = C["y"]
    delta = torch.maximum(vmax - yv, yv - vmin)
    # evaluation slack: y and the extremes are float64 values of exact quantities
    delta = delta + 2.0**-40 * vabs
    data = dict(
        B=B, nq=nq, nk=nk, d=d, dv=dv,
        n=n.to(torch.float64).expand(B, nq).clone(),
        vis_rows=vis_rows, vabs=vabs, delta=delta,
        qmax=float(q3.abs().max()) if q3.numel() else 0.0,
        kmax=float(k3.abs().max()) if k3.numel() else 0.0,
        vmax_all=float(v3.abs().max()) if v3.numel() else 0.0,
        **R, **C,
    )
    return data


def _chunk_rows(B: int, nq: int, nk: int) -> int:
    """Query rows per pass of _row_data and _block_data: ~2^21 logits at once."""
    return max(1, min(nq, (1 << 21) // max(1, B * nk)))


def _block_data(q, k, *, causal, scale, block_n):
    """What the bound needs of the key blocks: block_n, n_kb, T (key blocks each row
    visits) and Bmin (per row, the min over the visible key blocks of the block max: the
    first m of any order), from the logits formed as _row_data forms them."""
    q3 = q.detach().to("cpu", torch.float64).reshape(-1, *q.shape[-2:])
    k3 = k.detach().to("cpu", torch.float64).reshape(-1, *k.shape[-2:])
    B, nq, nk = q3.shape[0], q3.shape[1], k3.shape[1]
    n = _visible_counts(nq, nk, causal)
    bn = block_n
    n_kb = max(1, math.ceil(nk / bn))
    Bmin = torch.zeros(B, nq, dtype=torch.float64)
    rows = _chunk_rows(B, nq, nk)
    for r0 in range(0, nq, rows):
        r1 = min(nq, r0 + rows)
        S = scale * dot(q3[:, r0:r1], k3.transpose(-1, -2))  # (B, r, nk)
        ninf = torch.full_like(S, -math.inf)
        if causal:
            vis = (torch.arange(nk)[None, :] < n[r0:r1, None]).expand(B, -1, -1)
            any_vis = vis.any(-1)
            Sm = torch.where(vis, S, ninf)
        else:
            any_vis, Sm = torch.ones(B, r1 - r0, dtype=torch.bool), S
        M = Sm.amax(-1)
        Msafe = torch.where(any_vis, M, torch.zeros_like(M))
        pad = n_kb * bn - nk
        Sp = torch.cat([Sm, ninf[..., :1].expand(*Sm.shape[:-1], pad)], -1) if pad else Sm
        bmax = Sp.reshape(B, r1 - r0, n_kb, bn).amax(-1)
        bmax = torch.where(torch.isfinite(bmax), bmax, torch.full_like(bmax, math.inf))
        Bmin[:, r0:r1] = torch.where(any_vis, bmax.amin(-1), Msafe)
    return dict(bn=bn, n_kb=n_kb, Bmin=Bmin,
                T=torch.ceil(n.to(torch.float64) / bn).expand(B, nq).clone())


# ---------------------------------------------------------------------------
# the bound as a function of the small parameters


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
    """Step A of _evaluate: (Ebar, Estar), the softmax-weighted and the largest error of a
    row's computed logits (input rounding of Q, K; tf32 operands; the dot; s's roundings);
    U(name) is _evaluate's one-rounding excess."""
    sigma = P["sigma"]
    # -- step A: logits (input rounding of Q, K; tf32 operands; accumulation; s roundings) --
    # |q~_t k~_t - q_t k_t| <= ((1 + rho_q)(1 + rho_k) - 1)|q_t k_t| + alp (1 + rho)(|q_t|
    # + |k_t|) + alp^2, q~ = tf32(in(q)): rho, alp the larger of q's and k's
    rho_q, rho_k = _x(U("inq"), U("qktf")), _x(U("ink"), U("qktf"))
    alp_q = P["eta_inq"] * (1 + U("qktf")) + P["eta_qktf"]
    alp_k = P["eta_ink"] * (1 + U("qktf")) + P["eta_qktf"]
    rho, alp = rho_q + rho_k, alp_q + alp_k  # majorants of the larger of the two
    cA_dot = _x(rho_q, rho_k)
    cL_dot = scale * alp * (1 + rho)
    c0_dot = scale * d * alp**2
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


def _standard_terms(P: dict, U, n, bn_eff, tf_pv, vabsA, eta_key, M):
    """Step B's terms for the standard structure (S, softmax and P V each rounded once):
    (Ostar, Lstar, H, A_N, A_D, A_out, Fin_m1, eta_fin), as _evaluate combines them."""
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


def _flash_terms(P: dict, U, variant: Variant, n, T, r, bn, tf_pv, vabsA, eta_key, M, Xc,
                 wide, pc_common: bool, fno):
    """Step B's terms for the flash structure (the blocked recurrence; fa1's normalised
    steps included): (Ostar, Lstar, H, A_N, A_D, A_out, Fin_m1, eta_fin) for _evaluate."""
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


def _evaluate(P: dict, D: dict, *, structure: str, variant: Variant, scale: float,
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
    tf_pv = _pw(U("pvtf"), 2)
    p_hi = elementary.exp(tau_eff) * (1 + ue) + P["eta_p"]
    fno = 0.0 if pc_common else U("pc")
    wide = elementary.exp(tau_eff * (1 + ud)) * (1 + ue) * Xc  # a key's weight before rescales
    # per key: the P @ V products' eta and the tf32 operand casts' eta
    eta_key = (row(P["eta_pv"] + P["eta_pvtf"] * (1 + U("pvtf")) * p_hi + P["eta_pvtf"] ** 2)
               + P["eta_pvtf"] * (1 + U("pvtf")) * vabsA)
    if structure == "standard":
        Ostar, Lstar, H, A_N, A_D, A_out, Fin_m1, eta_fin = _standard_terms(
            P, U, n, bn_eff, tf_pv, vabsA, eta_key, M)
    else:
        Ostar, Lstar, H, A_N, A_D, A_out, Fin_m1, eta_fin = _flash_terms(
            P, U, variant, n, T, r, bn, tf_pv, vabsA, eta_key, M, Xc, wide, pc_common, fno)
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


def _overflow_check(pol: Policy, structure: str, variant: Variant, base2: bool, scale: float):
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
        for mag, site in ((dot_mag, "qk_acc"), (dot_mag, "s"), (s_mag, "s"), (s_mag, "m"),
                          (gap_mag, "diff"), (gap_mag, "m"), (p_mag, "p"), (p_mag, "p_cast"),
                          (l_mag, "l_acc"), (l_mag, "l")):
            ok = ok & row(mag <= fmax(site))
        for site in ("pv_acc", "o"):
            ok = ok & (o_mag <= fmax(site))
        for site in ("div", "out"):
            ok = ok & (out_mag <= fmax(site))
        return ok

    return check


# ---------------------------------------------------------------------------
# the public entry point


def _rescales(n_rescales, T: torch.Tensor, B: int, nq: int) -> torch.Tensor:
    if n_rescales is None:
        return torch.clamp(T - 1, min=0)
    if isinstance(n_rescales, int) and not isinstance(n_rescales, bool):
        if n_rescales < 0:
            raise ValueError(f"n_rescales must be >= 0, got {n_rescales}")
        return torch.full_like(T, float(n_rescales))
    r = torch.as_tensor(n_rescales).to(torch.float64)
    if r.numel() != B * nq:
        raise ValueError(
            f"n_rescales has {r.numel()} entries; valid: None, an int, or one per row ({B * nq})"
        )
    if bool((r < 0).any()):
        raise ValueError("n_rescales must be >= 0")
    return r.reshape(B, nq)


def _check_reals(scale, tau, beta, variant: Variant):
    """The real parameters the derivation assumes: scale > 0 finite (a negative one would
    make the logit bounds negative), tau >= 0 finite (the lazy threshold is added to the
    exponent bound), beta >= 1 finite for qiu_yao (a shift below the block max lets P
    exceed 1, which the overflow check assumes impossible)."""
    def real(x):
        try:
            return not isinstance(x, bool) and math.isfinite(float(x))
        except (TypeError, ValueError):
            return False

    if scale is not None and not (real(scale) and float(scale) > 0):
        raise ValueError(f"scale must be a finite number > 0 or None (1/sqrt(d)), got {scale!r}")
    if tau is not None and not (real(tau) and float(tau) >= 0):
        raise ValueError(f"tau must be a finite number >= 0, got {tau!r}")
    beta = getattr(variant, "beta", beta)
    if beta is not None and (not real(beta) or (variant.max_rule == "qiu_yao" and
                                                float(beta) < 1)):
        raise ValueError(f"beta must be a finite number >= 1 for qiu_yao, got {beta!r}")


def _scaled(params: dict[str, Param], t: float, keep=lambda name, p: True) -> dict:
    return {name: (t * p.value if keep(name, p) else 0.0) for name, p in params.items()}


def _bounded_variant(variant, scale, tau, beta) -> Variant:
    """The variant bound() takes (a name with tau, beta, or an object), checked."""
    if isinstance(variant, str) and variant not in VARIANT_CLASSES:
        raise ValueError(f"unknown variant {variant!r}; valid: {', '.join(VARIANTS)}")
    _check_reals(scale, tau, beta, FA2())  # real numbers, whichever variant
    var = variant_of(variant, tau=tau, beta=beta)
    if not var.bounded:
        raise ValueError(f"no bound for variant {var.name!r}; valid: {', '.join(VARIANTS)}")
    _check_reals(scale, tau, beta, var)
    return var


def bound(q, k, v, *, policy, block_n: int, n_rescales=None, causal: bool = False,
          scale=None, variant: str | Variant = "fa2", prob: bool = False,
          delta: float = 1e-3, precision: str = "bf16", rounding: str = "nearest",
          tau: float | None = None, beta: float | None = None, rows: dict | None = None
          ) -> dict:
    """Deterministic (and probabilistic) bound on max_ij |out_ij - exact_ij|; see the module
    docstring. Returns a dict: bound, bound_prob (nan unless prob), terms, dominant_site,
    bound_rows ((..., Nq) per-row bound), first_order, higher_order, lambda, delta."""
    var = _bounded_variant(variant, scale, tau, beta)
    if rounding not in ("nearest", "stochastic"):
        raise ValueError(f"unknown rounding {rounding!r}; valid: nearest, stochastic")
    if isinstance(block_n, bool) or not isinstance(block_n, int) or block_n <= 0:
        raise ValueError(f"block_n must be a positive integer, got {block_n!r}")
    if not (0 < delta < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    causal = check_causal(causal)  # either alignment: rows see a prefix of the keys
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.ndim < 2:
            raise ValueError(f"{name} must be a tensor of shape (..., N, d)")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} "
                         "do not fit (..., Nq, d), (..., Nk, d), (..., Nk, dv)")
    pol = make_policy(policy, precision)
    structure = pol.structure
    # the standard structure forms S: the variant's running max does not enter it
    rec = var if structure != "standard" else FA2()
    base2 = rec.base2
    d = q.shape[-1]
    fin = pol.fmt("inputs")
    on_grid = kept(rows, (q, k, v), ("on_grid", fin), lambda: tuple(
        isinstance(fin, Format) and fin.p < 53 and fin.representable(x.detach().cpu())
        for x in (q, k, v)))
    params = _params(pol, rounding, on_grid)
    scale_exact, sigma = _scale_error(pol, d, None if scale is None else float(scale), base2,
                                      rounding)
    params["sigma"] = Param(sigma, "s", "det")
    scale_nat = scale_exact / (1 / math.log(2) if base2 else 1.0)  # natural-unit scale

    def shift0(M):
        return rec.bound_shift(M), rec.bound_tau()

    # what depends on the inputs alone, then on the key blocks (rows= keeps both)
    D = {**kept(rows, (q, k, v), ("bound", causal, scale_nat, prob, rec),
                lambda: _row_data(q, k, v, causal=causal, scale=scale_nat, prob=prob,
                                  shift0=shift0)),
         **kept(rows, (q, k, v), ("bound_blocks", causal, scale_nat, block_n),
                lambda: _block_data(q, k, causal=causal, scale=scale_nat, block_n=block_n))}
    r = _rescales(n_rescales, D["T"], D["B"], D["nq"])
    if rec.normalised:
        r = torch.clamp(r, max=float(D["n_kb"]))
    kw = dict(structure=structure, variant=rec, scale=scale_nat, l_from=pol.l_from, r=r,
              base2=base2)
    check = _overflow_check(pol, structure, rec, base2, scale_nat)
    full = {name: p.value for name, p in params.items()}
    Bfull = _evaluate(full, D, check=check, **kw)
    t = T_SCALE
    Bt = _evaluate(_scaled(params, t), D, **kw) / t  # >= the first-order part B1
    lead = q.shape[:-2]
    nq, dv = D["nq"], D["dv"]
    finite = torch.isfinite(Bfull)
    flat = torch.where(finite, Bfull, torch.full_like(Bfull, math.inf)).reshape(-1)
    worst = int(torch.argmax(flat)) if flat.numel() else 0
    total = float(flat.max()) * (1 + EVAL_SLACK) if flat.numel() else 0.0
    terms = {}
    for site in SITES:
        Bs = _evaluate(_scaled(params, t, lambda name, p, s=site: p.site == s), D, **kw) / t
        terms[site] = float(Bs.reshape(-1)[worst]) if flat.numel() else 0.0
    dominant = max(terms, key=terms.get) if any(terms.values()) else "none"
    first = float(Bt.reshape(-1)[worst]) if flat.numel() else 0.0
    out = dict(
        bound=total,
        bound_prob=math.nan,
        terms=terms,
        dominant_site=dominant,
        bound_rows=(Bfull.amax(-1) * (1 + EVAL_SLACK)).reshape(*lead, nq),
        first_order=first,
        higher_order=(total - first) if math.isfinite(total) else math.inf,
        n_rescales=r.reshape(*lead, nq),
        sigma=sigma,
        **{"lambda": math.nan, "delta": delta},
    )
    if prob:
        K = int(D["vis_rows"].sum()) * dv
        lam = math.sqrt(2 * math.log(2 * max(K, 1) / delta))
        G = _prob_std(params, D, structure=structure, variant=rec, r=r, l_from=pol.l_from)
        B1r = _evaluate(_scaled(params, t, lambda name, p: p.kind == "rand"), D, **kw) / t
        B1d = _evaluate(_scaled(params, t, lambda name, p: p.kind == "det"), D, **kw) / t
        rem = torch.clamp((1 + t) * Bfull - Bt, min=0)  # >= |R|: see the module docstring
        bp = torch.minimum(Bfull, torch.minimum(lam * G, B1r) + B1d + rem)
        bp = torch.where(D["vis_rows"][..., None], bp, torch.zeros_like(bp))
        out["bound_prob"] = float(bp.max()) * (1 + EVAL_SLACK) if bp.numel() else 0.0
        out["lambda"] = lam
        out["bound_prob_rows"] = (bp.amax(-1) * (1 + EVAL_SLACK)).reshape(*lead, nq)
    return out


def _prob_std(params, D, *, structure, variant: Variant, r, l_from):
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


# ---------------------------------------------------------------------------
# tightness: the bound against the measured error, over the catalogue


def tightness_summary(table):
    """Per (policy, precision): cases, finite and held, vacuous (infinite bound), median /
    min / max of bound/measured over the finite bounds (min is the tightest case, max the
    loosest), the same for the probabilistic bound, and how many probabilistic bounds held."""
    import numpy as np

    fin = table[np.isfinite(table.bound)]
    g = fin.groupby(["policy", "precision"])
    out = g.tightness.agg(["median", "min", "max"]).add_prefix("det_")
    out = out.join(g.tightness_prob.agg(["median", "min", "max"]).add_prefix("prob_"))
    allg = table.groupby(["policy", "precision"])
    out.insert(0, "vacuous", allg.bound.agg(lambda b: int(np.isinf(b).sum())))
    out.insert(0, "held", allg.holds.agg(lambda h: int((h == True).sum())))  # noqa: E712
    out.insert(0, "cases", allg.size())
    out["held_prob"] = allg.holds_prob.agg(lambda h: int((h == True).sum()))  # noqa: E712
    return out.reset_index()


# ---------------------------------------------------------------------------
# accounting: an infinite bound is vacuous, it did not "hold"


def verdict(bound_value, error) -> tuple[bool | None, bool | None]:
    """(bound_finite, bound_holds) of one case: holds only for a finite bound that covers
    the error; an infinite bound says nothing (holds None), a missing one (NaN) neither."""
    if bound_value is None or bound_value != bound_value:
        return None, None
    if not math.isfinite(bound_value):
        return False, None
    return True, bool(error <= bound_value)


def accounting(bound_values, holds) -> dict:
    """Counts over cases: total, finite, held (finite and covering), vacuous (infinite),
    undefined (no bound). bound_values, holds: sequences (holds of the finite ones)."""
    import numpy as np

    b = np.asarray(bound_values, dtype=float)
    h = np.asarray([x is True or x == 1 for x in holds], dtype=bool)
    fin = np.isfinite(b)
    return dict(cases=len(b), finite=int(fin.sum()), held=int((fin & h).sum()),
                vacuous=int(np.isinf(b).sum()), undefined=int(np.isnan(b).sum()))


def accounting_phrase(counts: dict) -> str:
    """'finite and held in X of Y, vacuous (infinite) in Z[, undefined in W]'."""
    text = (f"finite and held in {counts['held']} of {counts['cases']}, "
            f"vacuous (infinite) in {counts['vacuous']}")
    if counts.get("undefined"):
        text += f", undefined in {counts['undefined']}"
    return text


__all__ = ["bound", "VARIANTS", "tightness_summary", "verdict",
           "accounting", "accounting_phrase"]
