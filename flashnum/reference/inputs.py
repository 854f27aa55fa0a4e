"""The inputs of a reference: taken as the exact values they hold (float64 holds every float
format exactly), checked once with one-line errors, and hashed for the cache."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch

from flashnum.numerics.tiling import causal_visible, check_causal

METHODS = ("certified", "fp64", "mpmath")  # the forward's; the backward's are its first two


def as_f64(name: str, x) -> tuple[torch.Tensor, str]:
    t = torch.as_tensor(x) if not isinstance(x, torch.Tensor) else x
    if t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"{name} has dtype {t.dtype}; valid: a real float or integer tensor")
    t64 = t.detach().to("cpu", torch.float64)
    if not t.is_floating_point() and not torch.equal(t64.to(t.dtype), t.detach().cpu()):
        raise ValueError(f"{name} holds integers beyond 2^53, not exact in float64")
    if not bool(torch.isfinite(t64).all()):
        bad = t64[~torch.isfinite(t64)].flatten()[0].item()
        raise ValueError(f"{name} contains {bad} (NaN/inf); valid: finite values only")
    return t64.contiguous(), str(t.dtype)


def check(q, k, v, causal, scale, method, bits, methods=METHODS):
    """q, k, v as exact float64 with their dtypes, the causal flag, the scale; one-line
    ValueErrors naming the bad argument (the backward passes its own `methods`)."""
    if method not in methods:
        raise ValueError(f"unknown method {method!r}; valid: {', '.join(methods)}")
    if isinstance(bits, bool) or not isinstance(bits, int) or bits < 64:
        raise ValueError(f"bits must be an integer >= 64, got {bits!r}")
    try:
        causal = check_causal(causal)
    except TypeError as e:
        raise ValueError(str(e)) from None
    (q, qd), (k, kd), (v, vd) = as_f64("q", q), as_f64("k", k), as_f64("v", v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim < 2:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; valid: (..., N, d), ndim >= 2")
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(
            f"leading dims differ: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}; "
            "valid: q (..., Nq, d), k (..., Nk, d), v (..., Nk, dv) with the same ..."
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q has d={q.shape[-1]} but k has d={k.shape[-1]}; they must agree")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k has Nk={k.shape[-2]} but v has Nk={v.shape[-2]}; they must agree")
    if q.shape[-1] == 0:
        raise ValueError("q and k have d=0; valid: a head dim d >= 1")
    scale = check_scale(scale)
    return q, k, v, causal, scale, (qd, kd, vd)


def check_scale(scale) -> float | None:
    """The softmax scale as a float (None stays None: exactly 1/sqrt(d)); one-line error else."""
    if scale is None:
        return None
    try:
        scale = float(scale)
    except (TypeError, ValueError):
        raise ValueError(f"scale must be None or a finite real, got {scale!r}") from None
    if not math.isfinite(scale):
        raise ValueError(f"scale must be None or a finite real, got {scale!r}")
    return scale


def visible_len(nq: int, nk: int, causal) -> np.ndarray:
    """Keys each query row sees: a prefix of length vis[i] (tiling.causal_visible)."""
    if not causal:
        return np.full(nq, nk, dtype=np.int64)
    vis = causal_visible(nq, nk, causal=causal).sum(-1).numpy().astype(np.int64)
    return vis


def input_hash(q, k, v, *, causal=False, scale=None, method="certified", bits=256) -> str:
    """sha256 of everything the reference depends on: values, shapes, dtypes, options."""
    q, k, v, causal, scale, dtypes = check(q, k, v, causal, scale, method, bits)
    return hash_of(q, k, v, dtypes, causal, scale, method, bits)


def hash_of(q, k, v, dtypes, causal, scale, method, bits) -> str:
    h = hashlib.sha256()
    for t in (q, k, v):
        h.update(repr(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes())
    key = (dtypes, causal, None if scale is None else scale.hex(), method, bits, "v1")
    h.update(repr(key).encode())
    return h.hexdigest()
