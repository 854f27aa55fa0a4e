"""Standard attention in the inputs' dtype, the audit's yardstick, and what a kernel's
output must look like: flash-attn's attention_ref (upcast=False) and its logsumexp.

    from flashnum.audit.standard import standard_attention, standard_lse, check_output

The forward rules (flashnum.audit.rules) and the gradient rules (flashnum.audit.gradients)
both measure against these.
"""

from __future__ import annotations

import math

import torch

from flashnum.numerics.tiling import causal_visible, check_causal


def visible(nq: int, nk: int, alignment: str) -> torch.Tensor:
    """(Nq, Nk) bool: query i sees key j. top_left (torch's is_causal): j <= i;
    bottom_right (flash-attn >= 2.1, flashnum): j <= i + Nk - Nq (flashnum.numerics.tiling)."""
    return causal_visible(nq, nk, causal=check_causal(alignment))


def standard_attention(q, k, v, *, causal=False, alignment="top_left", scale=None,
                       softmax_in_dtype=False):
    """Standard attention in the inputs' dtype, plain torch (flash-attn's attention_ref
    with upcast=False): S rounded to the dtype, softmax in fp32 then rounded, P V in the
    dtype. Rows that see no key give 0, and differentiate to 0 (no NaN).
    softmax_in_dtype: torch.softmax on the dtype's S itself, as attention_ref writes it
    (fp32 inside; its backward then reads the rounded P, as flash-attn's dq_pt does; the
    forward values differ from the fp32 softmax rounded afterwards in the last bit of a
    few outputs): the gradients' standard (flashnum.audit.gradients)."""
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if causal:
        vis = visible(q.shape[-2], k.shape[-2], alignment)
        dead = ~vis.any(-1, keepdim=True)  # rows that see no key: logits 0, then P 0 (no
        s = s.masked_fill(~vis, -math.inf).masked_fill(dead, 0.0)  # NaN to differentiate)
    p = torch.softmax(s if softmax_in_dtype else s.float(), dim=-1)
    if causal:
        p = p.masked_fill(dead, 0.0)
    return torch.matmul(p.to(q.dtype), v)


def standard_lse(q, k, *, causal=False, alignment="top_left", scale=None):
    """fp32 logsumexp of the dtype-rounded logits (-inf for rows that see no key)."""
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    s = (torch.matmul(q, k.transpose(-1, -2)) * scale).float()
    if causal:
        s = s.masked_fill(~visible(q.shape[-2], k.shape[-2], alignment), -math.inf)
    return torch.logsumexp(s, dim=-1)


def check_output(got, q, want):
    """(out, lse or None, error message or None) of what a target returned."""
    lse = None
    if isinstance(got, (tuple, list)):
        got, lse = (got[0], got[1]) if len(got) > 1 else (got[0], None)
    if not isinstance(got, torch.Tensor):
        return None, None, f"returned {type(got).__name__}, not a tensor"
    if tuple(got.shape) != want:
        return None, None, f"returned shape {tuple(got.shape)}, expected {want}"
    if got.dtype != q.dtype:
        return None, None, f"returned dtype {got.dtype}, expected {q.dtype}"
    if lse is not None and (not isinstance(lse, torch.Tensor)
                            or tuple(lse.shape) != tuple(q.shape[:-1])):
        lse = None  # not the (..., Nq) log-sum-exp: not checked
    return got, lse, None
