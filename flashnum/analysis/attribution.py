"""Per-site error attribution: how much of the error each rounding site contributes.

    from flashnum.analysis.attribution import attribute, dominant_site
    table = attribute(q, k, v, precision="bf16", policy="lowp", block_n=64)
    table[table.metric == "mean_signed"]        # which site carries the bias
    dominant_site(q, k, v, precision="bf16", policy="fa2")

For every site the policy rounds (format not `exact`) the engine runs twice more:
with *only* that site rounded (Policy.only: every other site exact, i.e. float64) and
with every site *but* that one rounded (Policy.without). Against the same reference,
each run gives one error per metric:

    max_abs       max |out - ref|
    rmse          sqrt(mean (out - ref)^2)            (FlashAttention-3's measure)
    mean_signed   mean (out - ref)                    (bias, Qiu & Yao 2025)

The table is tidy, one row per (site, metric): site, format (the site's format in the
policy), metric, err_only, err_without, total (the error of the full policy). To first
order in the unit roundoffs the errors of different sites add: err_only says what a
site does alone, total - err_without what removing it saves; where the two disagree
the sites interact (for instance the P cast rounds values that p already rounded).

From the shell (flashnum/attribute.py; the experiment form of the table):

    python -m flashnum.attribute distribution=ties precision=bf16 policy=lowp
    python -m flashnum.attribute experiment=true   # the stored grid: experiments/attribution
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from flashnum.analysis.metrics import max_abs_err, rmse, signed_err
from flashnum.api import attention
from flashnum.numerics.formats import EXACT, Exact
from flashnum.numerics.policy import SITES, make_policy

METRICS = ("max_abs", "rmse", "mean_signed")


def _errors(out: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    return dict(max_abs=max_abs_err(out, ref), rmse=rmse(out, ref),
                mean_signed=signed_err(out, ref)["mean_signed_err"])


def _reference(q, k, v, kw) -> torch.Tensor:
    from flashnum.reference import reference

    return reference(q, k, v, causal=kw.get("causal", False), scale=kw.get("scale")).out


def rounded_sites(policy) -> list[str]:
    """The sites a policy rounds (its format is not exact), in data-flow order."""
    return [s for s in SITES if not isinstance(policy.fmt(s), Exact) and policy.fmt(s) is not EXACT]


def attribute(q, k, v, *, precision: str = "bf16", policy="fa2", ref_out=None,
              sites=None, **attention_kwargs) -> pd.DataFrame:
    """The per-site attribution table (see the module docstring).

    ref_out: the exact output (default: flashnum.reference's certified one).
    sites: which sites to attribute (default: every site the policy rounds).
    attention_kwargs: passed to flashnum.attention (block_n, order, variant, causal, ...).
    """
    if "backend" in attention_kwargs and attention_kwargs["backend"] != "emulate":
        raise ValueError("attribution needs backend='emulate' (it changes the policy per site)")
    pol = make_policy(policy, precision)
    todo = rounded_sites(pol) if sites is None else list(sites)
    for s in todo:
        if s not in SITES:
            raise ValueError(f"unknown site {s!r}; valid: {', '.join(SITES)}")
    ref = _reference(q, k, v, attention_kwargs) if ref_out is None else ref_out
    ref = torch.as_tensor(ref).to(torch.float64)

    def run(p):
        return attention(q, k, v, precision=precision, policy=p, **attention_kwargs).out

    total = _errors(run(pol), ref)
    rows = []
    for site in todo:
        only = _errors(run(pol.only(site)), ref)
        without = _errors(run(pol.without(site)), ref)
        for metric in METRICS:
            rows.append(dict(site=site, format=getattr(pol, site), metric=metric,
                             err_only=only[metric], err_without=without[metric],
                             total=total[metric]))
    return pd.DataFrame(rows, columns=["site", "format", "metric", "err_only", "err_without",
                                       "total"])


def rss(table: pd.DataFrame, metric: str = "rmse") -> float:
    """Root-sum-square of the single-site errors: the total if the sites' errors were
    independent (for rmse: uncorrelated errors add in mean square)."""
    t = table[table.metric == metric]
    return math.sqrt(math.fsum(x * x for x in t.err_only))  # exact: no order


def dominant_site(q, k, v, *, precision: str = "bf16", policy="fa2", metric: str = "max_abs",
                  ref_out=None, **attention_kwargs) -> str:
    """The site whose rounding alone gives the largest error (|err_only| under `metric`)."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; valid: {', '.join(METRICS)}")
    t = attribute(q, k, v, precision=precision, policy=policy, ref_out=ref_out,
                  **attention_kwargs)
    t = t[t.metric == metric]
    if t.empty:
        return "none"
    return str(t.loc[t.err_only.abs().idxmax(), "site"])


__all__ = ["attribute", "dominant_site", "rss", "rounded_sites", "METRICS"]
