"""The small parameters of the a-priori bound (flashnum.analysis.bounds): one unit roundoff
(its random or deterministic part) or eta per rounding kind, each charged to the site whose
format it uses.

    from flashnum.analysis.bound_params import Param, params_of
    P = params_of(policy, "nearest", on_grid=(True, True, True))   # {name: Param}
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import mpmath
import torch

from flashnum.engine.arith import carrier, wider
from flashnum.numerics.constants import LOG2E
from flashnum.numerics.formats import EXACT, FORMATS, Exact, Format
from flashnum.numerics.policy import Policy

U64 = 2.0**-53  # unit roundoff of the float64 carrier
ETA64 = 2.0**-1075  # half of float64's smallest subnormal
EXP64 = 2.0**-52  # the float64 exp / exp2 (flashnum.numerics.elementary: half an ulp; 1 charged)


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


def params_of(pol: Policy, rounding: str, on_grid=(False, False, False)) -> dict[str, Param]:
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

    def put_product(name, site, operands):
        # each exact product is formed in float64, rounded once into the site's format
        # (flashnum.numerics.accumulate.product_dot); float64 forms it exactly for operands
        # of <= 26 bits, else it is rounded there first (one more u of float64). Exact: none
        f = F(site)
        if f is EXACT or isinstance(f, Exact):
            ur = ud = eta = 0.0
        elif f.p >= 53:  # the float64 product is the rounding (Arith.rnd keeps it)
            ur, ud, eta = U64, 0.0, ETA64
        else:
            ur, eta = (2 * f.u, f.min_subnormal) if sr else (f.u, f.min_subnormal / 2)
            wide = [g for g in operands if g is EXACT or isinstance(g, Exact) or g.p > 26]
            ud = U64 if wide else 0.0
        out["u_" + name] = Param(ur, site, "rand")
        out["ud_" + name] = Param(ud, site, "det")
        out["eta_" + name] = Param(eta, site, "det")

    put_product("qkp", "qk_product", (F("inputs"),))
    put_product("pvp", "pv_product", (F("inputs"), F("p_cast")))
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
    out["sigma"] = Param(0.0, "s", "det")  # set by scale_error
    return out


@functools.lru_cache(maxsize=256)  # mpmath at 200 bits: a sweep asks for few distinct ones
def scale_error(pol: Policy, d: int, scale, base2: bool, rounding: str) -> tuple[float, float]:
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

