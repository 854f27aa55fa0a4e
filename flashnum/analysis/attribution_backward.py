"""Per-site attribution of the backward's error: each site's share of dQ's, dK's, dV's error.

    from flashnum.analysis.attribution_backward import attribute_backward
    t = attribute_backward(q, k, v, do, precision="bf16", policy="fa2", block_m=32, block_n=32)
    t[t.grad == "dq"].sort_values("err_only")      # which site makes dQ's error

The backward's twin of flashnum.analysis.attribution. For every site the backward policy
rounds (BackwardPolicy: format not exact) and for the group `forward` (the forward that
makes O and the LSE, with the policy's forward formats) the emulated backward runs twice
more: with *only* that site rounded (every other site, the forward's included, exact) and
with every site *but* that one rounded. Against the same reference (by default the
certified flashnum.reference_backward) each run gives, per gradient g, an error per
metric (max_abs: max |g - ref|; rmse: sqrt(mean (g - ref)^2), which adds across sites
better than the maximum, taken at one entry):

    err_only      the error with only this site rounded
    err_without   the error with this site exact, every other rounded
    total         the error of the whole policy
    share         err_only / (sum of err_only over the sites): the site's share, to first
                  order (errors of different sites add to first order in the roundoffs)
    saved         (total - err_without) / total: what making this site exact saves
    bound_term    the a-priori bound's term of this site at its worst entry
                  (flashnum.analysis.bounds_backward, terms=True), and bound_share, its
                  share of the sum of the terms

One tidy row per (site, gradient, metric). Where share and saved disagree the sites interact (a
cast that rounds a value an earlier site already rounded, a cancellation in dP - D).
Inputs should lie on the precision's grid (the runner's do): their rounding is not a site.
"""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd

from flashnum.api import attention_backward
from flashnum.numerics.accumulate import rowsum
from flashnum.numerics.policy import BWD_SITES, SITES, Policy, make_backward_policy

GRADS = ("dq", "dk", "dv")
METRICS = ("max_abs", "rmse")


def rounded_backward_sites(pol) -> list[str]:
    """The backward sites a policy rounds, in data-flow order, then `forward` if its forward
    rounds anywhere."""
    sites = [s for s in BWD_SITES if getattr(pol, s) != "exact"]
    if any(getattr(pol.forward, s) != "exact" for s in SITES):
        sites.append("forward")
    return sites


def only(pol, site: str):
    """The policy with only `site` rounding (`forward`: only the forward's sites)."""
    if site == "forward":
        return replace(pol, name=f"{pol.name}[only forward]",
                       **{s: "exact" for s in BWD_SITES})
    return pol.only(site)


def without(pol, site: str):
    """The policy with `site` exact (`forward`: the forward exact) and every other rounding."""
    if site == "forward":
        return replace(pol, name=f"{pol.name}[without forward]", forward=Policy(name="exact"))
    return replace(pol, name=f"{pol.name}[without {site}]", **{site: "exact"})


def attribute_backward(q, k, v, do, *, precision: str = "bf16", policy="fa2", ref=None,
                       sites=None, bound_terms: bool = True, **kw) -> pd.DataFrame:
    """The per-site table (see the module docstring).

    ref: reference gradients with .dq, .dk, .dv (default: the certified
    flashnum.reference_backward); sites: which sites (default: every rounded one);
    kw: passed to flashnum.attention_backward (block_m, block_n, causal, scale, dq_order).
    """
    pol = make_backward_policy(policy, precision)
    todo = rounded_backward_sites(pol) if sites is None else list(sites)
    valid = (*BWD_SITES, "forward")
    for s in todo:
        if s not in valid:
            raise ValueError(f"unknown backward site {s!r}; valid: {', '.join(valid)}")
    if ref is None:
        from flashnum.reference import reference_backward

        ref = reference_backward(q, k, v, do, causal=kw.get("causal", False),
                                 scale=kw.get("scale"))

    def errors(p) -> dict:
        g = attention_backward(q, k, v, do, precision=precision, policy=p, **kw)
        out = {}
        for n in GRADS:
            e = getattr(g, n) - getattr(ref, n)
            out[n, "max_abs"] = float(e.abs().max()) if e.numel() else 0.0
            out[n, "rmse"] = (float((rowsum(e.square().reshape(-1), "fp64") / e.numel())
                                    .sqrt()) if e.numel() else 0.0)
        return out

    total = errors(pol)
    runs = {s: (errors(only(pol, s)), errors(without(pol, s))) for s in todo}
    terms = _bound_terms(q, k, v, do, pol, precision, kw) if bound_terms else {}
    rows = []
    for g, m in ((g, m) for g in GRADS for m in METRICS):
        sum_only = sum(runs[s][0][g, m] for s in todo)
        sum_terms = sum(terms.get(g, {}).get(s, 0.0) for s in todo)
        t = total[g, m]
        for s in todo:
            e_only, e_without = runs[s][0][g, m], runs[s][1][g, m]
            term = terms.get(g, {}).get(s, math.nan)
            rows.append(dict(
                site=s, format=_format(pol, s), grad=g, metric=m, err_only=e_only,
                err_without=e_without, total=t,
                share=e_only / sum_only if sum_only > 0 else math.nan,
                saved=(t - e_without) / t if t > 0 else math.nan, bound_term=term,
                bound_share=term / sum_terms if sum_terms > 0 else math.nan))
    return pd.DataFrame(rows)


def _format(pol, site: str) -> str:
    return pol.forward.name if site == "forward" else getattr(pol, site)


def _bound_terms(q, k, v, do, pol, precision, kw) -> dict:
    from flashnum.analysis.bounds_backward import bound_backward

    keys = ("block_m", "block_n", "causal", "scale")
    b = bound_backward(q, k, v, do, policy=pol, precision=precision, terms=True,
                       **{key: kw[key] for key in keys if key in kw})
    return b["terms"]
