"""reference(q, k, v, ...): exact attention, by one of three methods, through the cache
(flashnum.reference's docstring lists every option)."""

from __future__ import annotations

import math

import torch

from flashnum.engine import checks as engine_checks  # available_bytes read at each call
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
    check_memory(q, k, v)  # before the float64 copies: an expanded view may be huge
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


WORK = 1 << 28  # the blocked loops' temporaries: rows in blocks of 2^20 logits or 64 MB


def peak_bytes(q, k, v) -> int:
    """An estimate, from above, of the memory reference(q, k, v) adds: 10 float64 copies of
    q, k and v (an expanded view counts whole: the copy, its bytes for the cache's hash,
    the padded and sliced copies of the GEMMs), the outputs (out, lse, row max, bound)
    twice, and WORK for the blocked loops. `OMP_NUM_THREADS=1 python
    bench/reference_memory.py` (2-core Xeon, d = 64, fp64 and certified, Nk up to 2^21,
    expanded views too): the estimate is 1.4-5.6x the growth of the peak RSS."""
    n = sum(math.prod(t.shape) for t in (q, k, v))
    rows = math.prod(q.shape[:-1]) if q.ndim >= 1 else 1
    dv = v.shape[-1] if v.ndim >= 1 else 1
    return 8 * (10 * n + 2 * rows * (dv + 3)) + WORK


def check_memory(q, k, v) -> None:
    """Refuse, naming the estimate, a reference whose peak memory exceeds what is available
    (as flashnum.attention refuses its calls); inputs other than tensors are left to check."""
    if not all(isinstance(t, torch.Tensor) for t in (q, k, v)):
        return
    need, have = peak_bytes(q, k, v), engine_checks.available_bytes()
    if have is not None and need > have:
        raise ValueError(
            f"this reference needs an estimated {engine_checks.human(need)} of memory (q "
            f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} as float64) and "
            f"{engine_checks.human(have)} is "
            "available; valid: fewer heads or a shorter sequence")
