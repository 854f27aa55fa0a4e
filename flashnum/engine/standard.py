"""Standard attention (the policy structure "standard"): S formed, softmax normalised, then P V.

    from flashnum.engine.standard import standard
    res = standard(call, make_policy("naive", "fp16"))   # a checked flashnum.engine.call.Call

What FlashAttention-3 calls standard attention and torch writes
`softmax(q @ k.T * scale) @ v`; the `naive` preset is this structure in the precision.
Each value is rounded at its policy site as in the flash structure (flashnum.engine.arith).
It works through chunks of query rows so that at most ~2^24 logits exist at once; the
chunking changes no rounding (every row is independent).
"""

from __future__ import annotations

import math

import torch

from flashnum.engine.arith import Arith, carrier, wider
from flashnum.engine.call import Call
from flashnum.engine.result import Result
from flashnum.engine.tiles import scale_in_logits_format, stored_inputs
from flashnum.numerics import elementary
from flashnum.numerics.policy import Policy
from flashnum.numerics.tiling import causal_visible

MAX_LOGITS = 1 << 24  # logits formed at once (a chunk of query rows times every key)


def standard(call: Call, pol: Policy) -> Result:
    """softmax(scale Q K^T) V of a checked call, rounded where `pol` says (see the module
    docstring)."""
    q, k, v, causal = call.q, call.k, call.v, call.causal
    lead = q.shape[:-2]
    nq, nk, dv = q.shape[-2], k.shape[-2], v.shape[-1]
    ar = Arith(pol, call.rounding, call.seed, carrier(pol))
    q3, k3, v3 = stored_inputs(ar, q, k, v)
    scale_s = scale_in_logits_format(ar, call.softmax_scale, base2=False)
    rows = max(1, min(nq, MAX_LOGITS // max(1, q3.shape[0] * nk)))
    vis = causal_visible(nq, nk, causal=causal) if causal else None
    parts = [_rows(ar, q3[:, r0 : r0 + rows], k3, v3, scale_s,
                   None if vis is None else vis[r0 : r0 + rows])
             for r0 in range(0, nq, rows)]
    out, m, l = (torch.cat([x[i] for x in parts], 1) for i in range(3))
    out = out.reshape(*lead, nq, dv).to(torch.float64)
    m = m.reshape(*lead, nq).to(torch.float64)
    l = l.reshape(*lead, nq).to(torch.float64)
    return Result(
        out=out, m=m, l=l, lse=m + elementary.log(l), masked=m == -math.inf,
        n_rescales=torch.zeros_like(m, dtype=torch.int64),
    )


def _rows(ar: Arith, q, k, v, scale_s: float, vis):
    """out, m, l of a chunk of query rows: S, its row max, P = exp(S - m) / l, then P V."""
    pol = ar.policy
    s = ar.dot(q, k.transpose(-1, -2), pol.fmt("qk_acc"), pol.fmt("qk_product"))
    s = ar.site(ar.site(s, "s") * scale_s, "s")
    if vis is not None:
        s = s.masked_fill(~vis, -math.inf)
    m = ar.rnd(s.amax(dim=-1), pol.fmt("m"))
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = ar.exp(ar.rnd(s - m_safe[..., None], wider(pol.fmt("s"), pol.fmt("m"))), pol.fmt("p"))
    l = ar.site(ar.rowsum(e, pol.fmt("l_acc")), "l")
    l_safe = torch.where(l > 0, l, torch.ones_like(l))
    p = ar.site(ar.site(e / l_safe[..., None], "div"), "p_cast")
    out = ar.site(ar.dot(p, v, pol.fmt("pv_acc"), pol.fmt("pv_product")), "out")
    out = torch.where((m == -math.inf)[..., None], torch.zeros_like(out), out)
    return out, m, l
