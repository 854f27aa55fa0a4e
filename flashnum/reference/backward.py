"""Exact gradients of attention: the reference every backward error is measured against.

    from flashnum.reference import reference_backward      (or flashnum.reference_backward)
    g = reference_backward(q, k, v, do)                  # certified, correctly rounded fp64
    g = reference_backward(q, k, v, do, method="fp64")   # plain float64, max-shifted
    g.dq, g.dk, g.dv, g.delta, g.method, g.info

The gradients of sum(dO * O), O = softmax(scale Q K^T) V, of the exact inputs:

    P = softmax(scale Q K^T);  O = P V;  D = rowsum(dO * O)
    dV = P^T dO;  dP = dO V^T;  dS = P * (dP - D);  dQ = scale dS K;  dK = scale dS^T Q

Options: causal (True or "bottom_right": j <= i + Nk - Nq; "top_left": j <= i, torch's
is_causal; flashnum.numerics.tiling.visible; a row that sees no key has dQ = 0 and adds
nothing), scale (None is exactly 1/sqrt(d)),
method, bits (the starting precision of certified, 128 by default: enough for every
case measured; it doubles where a value is not yet certain), cache (an in-memory LRU, and
<dir>/bwd-<hash>.pt when flashnum.reference.reference_cache_dir or FLASHNUM_CACHE is set).

certified: arb ball arithmetic (python-flint), one head at a time. With E = exp(scale
(Q K^T - c)) (c a float64 near each row's max: any shift gives the same P), l = E 1,
F = E * (dP - D) entrywise:

    dV = E^T (dO / l);  dQ = scale (F K) / l;  dK = scale F^T (Q / l)

(four arb_mat products and two entrywise passes). Every value is accepted only when
its ball's two ends round to the same float64 and its relative radius is below 2^-60
(flashnum.reference's rule); otherwise the head is recomputed at twice the precision,
up to 16 * bits; values still uncertain are counted in info["uncertain"]. An exact zero
(a key no query sees, a masked row) is an exact ball and certain.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch

from flashnum.numerics import elementary
from flashnum.numerics.accumulate import dot, rowsum
from flashnum.reference.balls import REL_BITS, flint_prec
from flashnum.reference.cache import BACKWARD
from flashnum.reference.inputs import as_f64, check, visible_len
from flashnum.reference.result import ReferenceGradients

METHODS = ("certified", "fp64")


def _check(q, k, v, do, causal, scale, method, bits):
    """The forward reference's checks of q, k, v and the options, then dO's shape."""
    q, k, v, causal, scale, dtypes = check(q, k, v, causal, scale, method, bits, METHODS)
    do, dd = as_f64("do", do)
    want = (*q.shape[:-1], v.shape[-1])
    if tuple(do.shape) != want:
        raise ValueError(f"do has shape {tuple(do.shape)}; valid: {want} (the output's shape)")
    return q, k, v, do, causal, scale, (*dtypes, dd)


def _hash(tensors, dtypes, causal, scale, method, bits) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(repr(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes())
    key = (dtypes, causal, None if scale is None else scale.hex(), method, bits, "bwd-v1")
    h.update(repr(key).encode())
    return h.hexdigest()


def reference_backward(q, k, v, do, *, causal=False, scale=None, method="certified", bits=128,
                       cache=True) -> ReferenceGradients:
    """Exact dQ, dK, dV of attention; see the module docstring."""
    q, k, v, do, causal, scale, dtypes = _check(q, k, v, do, causal, scale, method, bits)
    key = _hash((q, k, v, do), dtypes, causal, scale, method, bits) if cache else None
    if key is not None:
        g = BACKWARD.get(key)
        if g is not None:
            return g
    lead, nq, d, nk, dv = q.shape[:-2], q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
    B = math.prod(lead)
    q3, k3, v3, do3 = (x.reshape(B, *x.shape[-2:]) for x in (q, k, v, do))
    vis = visible_len(nq, nk, causal)
    if method == "fp64":
        dq, dk, dvv, delta = _fp64(q3, k3, v3, do3, vis, scale)
        info = {}
    else:
        dq, dk, dvv, delta, info = _certified(q3, k3, v3, do3, vis, scale, bits)
    BACKWARD.stats["computed"] += 1
    g = ReferenceGradients(
        dq=dq.reshape(*lead, nq, d), dk=dk.reshape(*lead, nk, d), dv=dvv.reshape(*lead, nk, dv),
        delta=delta.reshape(*lead, nq), method=method, bits=bits, info=info,
    )
    return BACKWARD.put(key, g) if key is not None else g


def _fp64(q, k, v, do, vis, scale):
    """The formulas of the module docstring in float64 with a max-shifted softmax."""
    d, nk = q.shape[-1], k.shape[-2]
    sc = 1.0 / math.sqrt(d) if scale is None else scale
    s = sc * dot(q, k.transpose(-1, -2), "fp64")
    seen = torch.as_tensor(np.arange(nk)[None, :] < vis[:, None])
    s = s.masked_fill(~seen, -math.inf)
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = elementary.exp(s - m)
    l = rowsum(e, "fp64")[..., None]
    p = e / torch.where(l > 0, l, torch.ones_like(l))
    o = dot(p, v, "fp64")
    delta = rowsum(do * o, "fp64")
    ds = p * (dot(do, v.transpose(-1, -2), "fp64") - delta[..., None])
    return (sc * dot(ds, k, "fp64"), sc * dot(ds.transpose(-1, -2), q, "fp64"),
            dot(p.transpose(-1, -2), do, "fp64"), delta)


def _exact_scale(d, scale):
    from flint import arb

    if scale is None:
        e4 = int(round(math.log(d, 4)))
        return arb(2) ** (-e4) if 4**e4 == d else arb(d).rsqrt()  # exact when d = 4^k
    return arb(scale)


def _certified(q, k, v, do, vis, scale, bits):
    B, nq, d = q.shape
    nk, dv = k.shape[1], v.shape[2]
    dq = torch.zeros(B, nq, d, dtype=torch.float64)
    dk = torch.zeros(B, nk, d, dtype=torch.float64)
    dvv = torch.zeros(B, nk, dv, dtype=torch.float64)
    delta = torch.zeros(B, nq, dtype=torch.float64)
    max_prec, uncertain = bits, 0
    for b in range(B):
        prec = bits
        while True:
            out, bad = _head(q[b].numpy(), k[b].numpy(), v[b].numpy(), do[b].numpy(), vis,
                             scale, prec)
            if bad == 0 or prec >= 16 * bits:
                break
            prec *= 2
        max_prec, uncertain = max(max_prec, prec), uncertain + bad
        for dst, x in zip((dq, dk, dvv, delta), out, strict=True):
            dst[b] = torch.from_numpy(x)
    return dq, dk, dvv, delta, dict(max_prec=max_prec, uncertain=uncertain)


def _rounded(entries, shape):
    """Round a list of balls to float64: (array, number of values not certain), by
    flashnum.reference's rule (both ends round alike, relative radius below 2^-60)."""
    vals = np.empty(len(entries))
    bad = 0
    for t, x in enumerate(entries):
        lo, hi = float(x.lower()), float(x.upper())
        if lo == hi and (lo == 0.0 or x.rel_accuracy_bits() >= REL_BITS):
            vals[t] = lo
        else:
            vals[t] = float(x)
            bad += 1
    return vals.reshape(shape), bad


def _head(q, k, v, do, vis, scale, prec):
    """Certified dQ, dK, dV, D of one head at `prec` bits; and how many were uncertain."""
    from flint import arb, arb_mat

    nq, d = q.shape
    nk, dv = v.shape
    with flint_prec(prec):
        sc = _exact_scale(d, scale)
        sgn = -1.0 if (scale is not None and scale < 0) else 1.0
        live = vis > 0
        with np.errstate(over="ignore", invalid="ignore"):
            dh = sgn * (q @ k.T)
        inside = np.arange(nk)[None, :] < vis[:, None]
        c = np.where(inside, dh, -np.inf).max(axis=1)
        c = np.where(np.isfinite(c), sgn * c, 0.0)  # any finite shift: P does not change
        # X = scale (Q K^T - c): the shift is an extra column of Q
        X = (arb_mat(np.hstack([q, -c[:, None]]).tolist())
             * arb_mat(np.vstack([k.T, np.ones((1, nk))]).tolist())) * sc
        xs = X.entries()
        del X
        zero, exp = arb(0), arb.exp
        E = [exp(x) if ok else zero for x, ok in zip(xs, inside.ravel().tolist(), strict=True)]
        del xs
        Em = arb_mat(nq, nk, E)
        EV = (Em * arb_mat(np.hstack([v, np.ones((nk, 1))]).tolist())).entries()
        inv_l = [1 / EV[i * (dv + 1) + dv] if live[i] else zero for i in range(nq)]
        D = []
        W, Ql = [], []  # dO / l and Q / l, row by row
        for i in range(nq):
            o_i = [EV[i * (dv + 1) + t] * inv_l[i] for t in range(dv)]
            D.append(sum((arb(float(do[i, t])) * o_i[t] for t in range(dv)), zero))
            W.extend(arb(float(x)) * inv_l[i] for x in do[i])
            Ql.extend(arb(float(x)) * inv_l[i] for x in q[i])
        dP = (arb_mat(do.tolist()) * arb_mat(v.T.tolist())).entries()
        # a row that sees one key has P = 1 and D = dO . v = dP there: dS = 0 exactly
        # (as a ball it would only shrink towards 0 with the precision)
        single = (vis == 1).tolist()
        F = [zero if single[t // nk] else E[t] * (dP[t] - D[t // nk]) for t in range(nq * nk)]
        del dP
        Fm = arb_mat(nq, nk, F)
        dV = (Em.transpose() * arb_mat(nq, dv, W)).entries()
        G = (Fm * arb_mat(k.tolist())).entries()
        dQ = [G[t] * inv_l[t // d] * sc for t in range(nq * d)]
        dK = ((Fm.transpose() * arb_mat(nq, d, Ql)) * sc).entries()
        outs, bad = [], 0
        for ents, shape in ((dQ, (nq, d)), (dK, (nk, d)), (dV, (nk, dv)), (D, (nq,))):
            x, nb = _rounded(ents, shape)
            outs.append(x)
            bad += nb if shape != (nq,) else 0  # D is reported, not required to be certain
    return outs, bad


def cache_info() -> dict:
    """How many reference gradients were computed, and served from memory or disk."""
    return BACKWARD.info()
