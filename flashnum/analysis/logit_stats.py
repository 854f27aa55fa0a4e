"""Statistics of one head's attention logits: what makes its softmax easy or hard to round.

    from flashnum.analysis.logit_stats import head_stats
    rows = head_stats(q, k, scale=0.125, causal=True)   # one dict per (batch, head)
    rows[0]["sink_mass"], rows[0]["max_logit"], rows[0]["ties_bf16"], ...

They describe a trained model's heads beside the catalogue's distributions on one scale
(the trained_model experiment, docs/trained_model.md). The scaled logits
s_ij = scale * q_i . k_j are computed in fp64 from the stored tensors, summed over the head
dimension in a fixed order (so equal keys give bitwise equal logits), with the causal mask
bottom-right aligned (flashnum.numerics.tiling); P_ij = exp(s_ij - m_i) / l_i is exact to
fp64. Per row i over its visible keys, then summarised over the rows:

    max_logit       max_i m_i: how far from 0 the largest logit sits (fp16's exp overflows
                    past ln 65504 = 11.1 when the max is not subtracted)
    min_row_max     min_i m_i
    spread          median_i of the standard deviation of row i's logits (the catalogue's
                    logit_std / temperature)
    range           max_i (m_i - min_j s_ij): how many binades P spans (underflow)
    sink_mass       mean_i P_i0: probability on key 0 (an attention sink: Xiao et al. 2024)
    sink_max        max_i P_i0
    sink_argmax     fraction of rows whose row max is at key 0
    max_prob        mean_i max_j P_ij: how peaked the rows are (1: one key takes all)
    entropy         mean_i of the row entropy over log(visible keys): 1 is uniform, 0 one-hot
    ties_exact      fraction of rows whose max is attained by >= 2 keys exactly (in fp64)
    ties_bf16       mean_i of the number of keys whose exact exp(s_ij - m_i) rounds to 1 in
                    bf16 (s_ij - m_i >= log1p(-2^-9), about -2^-9): the repeated maxima of
                    Qiu & Yao 2025, where bf16 P holds several exact 1s (>= 1: the max
                    itself counts)
    ties_fp16       the same in fp16 (s_ij - m_i >= log1p(-2^-12))
    q_outlier_ratio max over head dims of the rms of q's column / their median: massive
                    channels (Dettmers et al. 2022, Sun et al. 2024)
    k_outlier_ratio the same for k
    q_outliers      how many head dims have an rms above OUTLIER x the median (k_outliers)
    q_absmax        max |q| (k_absmax, v_absmax): magnitudes against fp8's range
"""

from __future__ import annotations

import math

import torch

from flashnum.numerics import elementary
from flashnum.numerics.accumulate import rowsum
from flashnum.numerics.tiling import causal_visible

OUTLIER = 4.0  # a channel whose rms is this many times the median's is an outlier channel
STATS = ("max_logit", "min_row_max", "spread", "range", "sink_mass", "sink_max",
         "sink_argmax", "max_prob", "entropy", "ties_exact", "ties_bf16", "ties_fp16",
         "q_outlier_ratio", "k_outlier_ratio", "q_outliers", "k_outliers", "q_absmax",
         "k_absmax", "v_absmax")


def scaled_logits(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """scale * q k^T in fp64, each logit summed t = 0, 1, ..., d-1 from zero."""
    q, k = q.to(torch.float64), k.to(torch.float64)
    s = torch.zeros(*q.shape[:-1], k.shape[-2], dtype=torch.float64)
    for t in range(q.shape[-1]):
        s += q[..., :, t, None] * k[..., None, :, t]
    return s * scale


def _mean(x: torch.Tensor) -> float:
    """The mean of every entry, summed in flashnum's order (flashnum.numerics.accumulate)."""
    return float(rowsum(x.reshape(-1).to(torch.float64), "fp64") / x.numel())


def _channel_outliers(x: torch.Tensor) -> tuple[float, int]:
    x = x.to(torch.float64)
    rms = (rowsum(x.square().transpose(-1, -2), "fp64") / x.shape[-2]).sqrt()  # (d,) per dim
    med = float(rms.median())
    if med == 0.0:
        return (math.inf if float(rms.max()) > 0 else 1.0), int((rms > 0).sum())
    return float(rms.max()) / med, int((rms > OUTLIER * med).sum())


def head_stats(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None = None, *,
               scale: float | None = None, causal: bool = False) -> list[dict]:
    """The statistics (module docstring) of every (batch, head) of q, k (and v's max).

    q: (batch, heads, Nq, d), k: (batch, heads, Nk, d); scale None means 1/sqrt(d);
    causal: bottom-right aligned. Rows that see no key are left out. Returns one dict per
    (batch, head), batch-major, with "batch" and "head" besides STATS.
    """
    if q.ndim != 4 or k.ndim != 4 or q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q, k must be (batch, heads, N, d) with equal batch, heads and d; "
                         f"got {tuple(q.shape)} and {tuple(k.shape)}")
    if causal not in (True, False):
        raise ValueError(f"causal must be True or False (bottom-right), got {causal!r}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    nq, nk = q.shape[-2], k.shape[-2]
    vis = causal_visible(nq, nk) if causal else torch.ones(nq, nk, dtype=torch.bool)
    seen = vis.any(dim=-1)
    n_vis = vis.sum(dim=-1).to(torch.float64)[seen]
    s_all = scaled_logits(q, k, scale)
    out = []
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            s = s_all[b, h].masked_fill(~vis, -math.inf)[seen]
            m = s.max(dim=-1).values
            d = s - m[:, None]  # <= 0, -inf where masked
            e = elementary.exp(d)
            p = e / rowsum(e, "fp64")[:, None]
            fin = torch.isfinite(s)
            mean = rowsum(torch.where(fin, s, 0.0), "fp64") / n_vis
            var = rowsum(torch.where(fin, (s - mean[:, None]).square(), 0.0), "fp64") / n_vis
            smin = torch.where(fin, s, math.inf).min(dim=-1).values
            plogp = rowsum(torch.where(p > 0, p * elementary.log(p), 0.0), "fp64")
            ent = torch.where(n_vis > 1, -plogp / elementary.log(n_vis).clamp_min(1e-300), 0.0)
            qr, qn = _channel_outliers(q[b, h])
            kr, kn = _channel_outliers(k[b, h])
            out.append(dict(
                batch=b, head=h,
                max_logit=float(m.max()), min_row_max=float(m.min()),
                spread=float(var.sqrt().median()), range=float((m - smin).max()),
                sink_mass=_mean(p[:, 0]), sink_max=float(p[:, 0].max()),
                sink_argmax=float((s[:, 0] == m).to(torch.float64).mean()),
                max_prob=_mean(p.max(dim=-1).values), entropy=_mean(ent),
                ties_exact=float(((s == m[:, None]).sum(-1) >= 2).to(torch.float64).mean()),
                # exp(x), x <= 0, rounds to 1 in a format of p significant bits when
                # exp(x) >= 1 - 2^-(p+1), the midpoint below 1 (a tie goes to 1, the even
                # one): x >= log1p(-2^-(p+1)); bf16 p = 8, fp16 p = 11
                ties_bf16=float((d >= math.log1p(-2.0 ** -9)).sum(-1).double().mean()),
                ties_fp16=float((d >= math.log1p(-2.0 ** -12)).sum(-1).double().mean()),
                q_outlier_ratio=qr, k_outlier_ratio=kr, q_outliers=qn, k_outliers=kn,
                q_absmax=float(q[b, h].abs().max()), k_absmax=float(k[b, h].abs().max()),
                v_absmax=float(v[b, h].abs().max()) if v is not None else math.nan))
    return out
