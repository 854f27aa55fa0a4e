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

import math

import torch

from flashnum.analysis.bound_data import block_data, row_data
from flashnum.analysis.bound_params import Param, params_of, scale_error
from flashnum.analysis.bound_terms import evaluate, overflow_check, prob_std
from flashnum.analysis.memo import kept
from flashnum.engine.variants import FA2, Variant, variant_of
from flashnum.engine.variants import VARIANTS as VARIANT_CLASSES
from flashnum.numerics.formats import Format
from flashnum.numerics.policy import PRODUCT_SITES, SITES, make_policy
from flashnum.numerics.tiling import check_causal

_PRODUCT = {"qk_product": "qkp", "pv_product": "pvp"}  # a product site's parameters (bound_params)
T_SCALE = 2.0**-12  # the small t of B(t u) / t (first-order parts of the majorant)
EVAL_SLACK = 2.0**-30  # relative slack for the float64 evaluation of the bound itself
VARIANTS = tuple(n for n, cls in VARIANT_CLASSES.items() if cls.bounded)


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


def _bounded_variant(variant, scale) -> Variant:
    """The variant bound() takes (a name, at its default parameters, or an object), checked
    against what the derivation assumes."""
    if isinstance(variant, str) and variant not in VARIANT_CLASSES:
        raise ValueError(f"unknown variant {variant!r}; valid: {', '.join(VARIANTS)}")
    var = variant_of(variant)
    if not var.bounded:
        raise ValueError(f"no bound for variant {var.name!r}; valid: {', '.join(VARIANTS)}")
    _check_reals(scale, getattr(var, "tau", None), getattr(var, "beta", None), var)
    return var


def _check_args(q, k, v, rounding, block_n, delta) -> None:
    if rounding not in ("nearest", "stochastic"):
        raise ValueError(f"unknown rounding {rounding!r}; valid: nearest, stochastic")
    if isinstance(block_n, bool) or not isinstance(block_n, int) or block_n <= 0:
        raise ValueError(f"block_n must be a positive integer, got {block_n!r}")
    if not (0 < delta < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.ndim < 2:
            raise ValueError(f"{name} must be a tensor of shape (..., N, d)")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"shapes q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} "
                         "do not fit (..., Nq, d), (..., Nk, d), (..., Nk, dv)")


def bound(q, k, v, *, policy, block_n: int, n_rescales=None, causal: bool = False,
          scale=None, variant: str | Variant = "fa2", prob: bool = False,
          delta: float = 1e-3, precision: str = "bf16", rounding: str = "nearest",
          rows: dict | None = None) -> dict:
    """Deterministic (and probabilistic) bound on max_ij |out_ij - exact_ij|; see the module
    docstring. `variant` a Variant with its parameters (Lazy(tau=2.0)), or a name at the
    variant's defaults. Returns a dict: bound, bound_prob (nan unless prob), terms,
    dominant_site, bound_rows ((..., Nq) per-row bound), first_order, higher_order, lambda,
    delta."""
    var = _bounded_variant(variant, scale)
    _check_args(q, k, v, rounding, block_n, delta)
    causal = check_causal(causal)  # either alignment: rows see a prefix of the keys
    pol = make_policy(policy, precision)
    structure = pol.structure
    # the standard structure forms S: the variant's running max does not enter it
    rec = var if structure != "standard" else FA2()
    base2 = rec.base2
    fin = pol.fmt("inputs")
    on_grid = kept(rows, (q, k, v), ("on_grid", fin), lambda: tuple(
        isinstance(fin, Format) and fin.p < 53 and fin.representable(x.detach().cpu())
        for x in (q, k, v)))
    params = params_of(pol, rounding, on_grid)
    scale_exact, sigma = scale_error(pol, q.shape[-1], None if scale is None else float(scale),
                                     base2, rounding)
    params["sigma"] = Param(sigma, "s", "det")
    scale_nat = scale_exact / (1 / math.log(2) if base2 else 1.0)  # natural-unit scale

    def shift0(M):
        return rec.bound_shift(M), rec.bound_tau()

    # what depends on the inputs alone, then on the key blocks (rows= keeps both)
    D = {**kept(rows, (q, k, v), ("bound", causal, scale_nat, prob, rec),
                lambda: row_data(q, k, v, causal=causal, scale=scale_nat, prob=prob,
                                  shift0=shift0)),
         **kept(rows, (q, k, v), ("bound_blocks", causal, scale_nat, block_n),
                lambda: block_data(q, k, causal=causal, scale=scale_nat, block_n=block_n))}
    r = _rescales(n_rescales, D["T"], D["B"], D["nq"])
    if rec.normalised:
        r = torch.clamp(r, max=float(D["n_kb"]))
    kw = dict(structure=structure, variant=rec, scale=scale_nat, l_from=pol.l_from, r=r,
              base2=base2)
    out, Bfull, Bt = _deterministic(params, D, kw, overflow_check(pol, structure, rec, base2,
                                                                  scale_nat), q.shape[:-2])
    out.update(n_rescales=r.reshape(*q.shape[:-2], D["nq"]), sigma=sigma, delta=delta)
    if prob:
        out.update(_probabilistic(params, D, kw, Bfull, Bt, delta, q.shape[:-2]))
    return out


def _deterministic(params, D, kw, check, lead) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """The deterministic bound, its per-site terms at the worst entry and its first-order
    part: (the result's fields, B per entry, B(t u) / t per entry)."""
    Bfull = evaluate({name: p.value for name, p in params.items()}, D, check=check, **kw)
    t = T_SCALE
    Bt = evaluate(_scaled(params, t), D, **kw) / t  # >= the first-order part B1
    finite = torch.isfinite(Bfull)
    flat = torch.where(finite, Bfull, torch.full_like(Bfull, math.inf)).reshape(-1)
    worst = int(torch.argmax(flat)) if flat.numel() else 0
    total = float(flat.max()) * (1 + EVAL_SLACK) if flat.numel() else 0.0
    terms = {}
    for site in SITES:
        if site in PRODUCT_SITES and not any(params[x + _PRODUCT[site]].value
                                             for x in ("u_", "ud_", "eta_")):
            continue  # not rounded: no term (and the stored terms keep their keys)
        Bs = evaluate(_scaled(params, t, lambda name, p, s=site: p.site == s), D, **kw) / t
        terms[site] = float(Bs.reshape(-1)[worst]) if flat.numel() else 0.0
    dominant = max(terms, key=terms.get) if any(terms.values()) else "none"
    first = float(Bt.reshape(-1)[worst]) if flat.numel() else 0.0
    out = dict(bound=total, bound_prob=math.nan, terms=terms, dominant_site=dominant,
               bound_rows=(Bfull.amax(-1) * (1 + EVAL_SLACK)).reshape(*lead, D["nq"]),
               first_order=first,
               higher_order=(total - first) if math.isfinite(total) else math.inf,
               **{"lambda": math.nan})
    return out, Bfull, Bt


def _probabilistic(params, D, kw, Bfull, Bt, delta, lead) -> dict:
    """The probabilistic bound's fields (see the module docstring)."""
    t = T_SCALE
    K = int(D["vis_rows"].sum()) * D["dv"]
    lam = math.sqrt(2 * math.log(2 * max(K, 1) / delta))
    G = prob_std(params, D, structure=kw["structure"], variant=kw["variant"], r=kw["r"],
                 l_from=kw["l_from"])
    B1r = evaluate(_scaled(params, t, lambda name, p: p.kind == "rand"), D, **kw) / t
    B1d = evaluate(_scaled(params, t, lambda name, p: p.kind == "det"), D, **kw) / t
    rem = torch.clamp((1 + t) * Bfull - Bt, min=0)  # >= |R|: see the module docstring
    bp = torch.minimum(Bfull, torch.minimum(lam * G, B1r) + B1d + rem)
    bp = torch.where(D["vis_rows"][..., None], bp, torch.zeros_like(bp))
    return dict(bound_prob=float(bp.max()) * (1 + EVAL_SLACK) if bp.numel() else 0.0,
                **{"lambda": lam},
                bound_prob_rows=(bp.amax(-1) * (1 + EVAL_SLACK)).reshape(*lead, D["nq"]))


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
