"""reference(q, k, v, ...): exact attention, by one of three methods, through the cache
(flashnum.reference's docstring lists every option)."""

from __future__ import annotations

import math

from flashnum.reference.cache import FORWARD
from flashnum.reference.certified import certified
from flashnum.reference.fp64 import fp64
from flashnum.reference.inputs import check, hash_of, visible_len
from flashnum.reference.mp import mpmath_rows
from flashnum.reference.result import Reference


def reference(
    q, k, v, *, causal=False, scale=None, method="certified", bits=256, cache=True, workers=None
) -> Reference:
    """Attention of the exact inputs; flashnum.reference's docstring lists every option."""
    q, k, v, causal, scale, dtypes = check(q, k, v, causal, scale, method, bits)
    key = hash_of(q, k, v, dtypes, causal, scale, method, bits) if cache else None
    if key is not None:
        ref = FORWARD.get(key)
        if ref is not None:
            return ref
    lead = q.shape[:-2]
    nq, d, nk, dv = q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
    B = math.prod(lead)
    q3, k3, v3 = q.reshape(B, nq, d), k.reshape(B, nk, d), v.reshape(B, nk, dv)
    vis = visible_len(nq, nk, causal)
    if method == "certified":
        out, lse, mx, err, info = certified(q3, k3, v3, vis, scale, bits, workers)
    elif method == "fp64":
        out, lse, mx, err, info = fp64(q3, k3, v3, vis, scale)
    else:
        out, lse, mx, err, info = mpmath_rows(q3, k3, v3, vis, scale, bits)
    FORWARD.stats["computed"] += 1
    ref = Reference(
        out=out.reshape(*lead, nq, dv),
        lse=lse.reshape(*lead, nq),
        row_max=mx.reshape(*lead, nq),
        method=method,
        err_bound=err.reshape(*lead, nq),
        bits=bits,
        info=info,
    )
    return FORWARD.put(key, ref) if key is not None else ref
