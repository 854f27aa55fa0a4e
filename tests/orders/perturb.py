"""Libraries that sum in another valid order: what another CPU's BLAS and libm may do.

    from perturb import install
    install()      # from now on torch's GEMMs, reductions and float64 exp/log give other bits

A BLAS, oneDNN or ATen may sum a dot product or a reduction in any order, and a vector
libm may return either neighbour of a transcendental value; which one depends on the
CPU. Switches alone do not reveal that (on one machine ATEN_CPU_CAPABILITY and
MKL_ENABLE_INSTRUCTIONS leave most orders as they are), so this module replaces them with
versions that are as valid and certainly different:

  - matmul, @, mm, bmm, einsum sum their products in reversed order (the contracted
    dimensions flipped);
  - sum, mean, std, var, nansum, vector_norm / norm reduce their dimensions flipped;
  - exp, exp2, expm1, log, log1p (functions, methods, in place) return the neighbour
    away from zero of torch's value wherever the argument's last significand bit is 1
    (still within about an ulp);
  - numpy's matmul and dot (the functions; the @ operator of arrays cannot be replaced)
    sum in reversed order.

Integer and boolean tensors are left alone (their sums are exact in any order). Loaded in
every process of a run through sitecustomize.py beside it when FLASHNUM_TEST_ORDERS=1
(tests/test_same_bits.py), so the runner's spawned workers are perturbed too.
"""

from __future__ import annotations

import functools
import re

import numpy as np
import torch

_DONE = []


def _float(x) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point()


def _matmul(orig):
    @functools.wraps(orig)
    def f(a, b, *args, **kw):
        if not (_float(a) and _float(b)) or a.dim() == 0 or b.dim() == 0:
            return orig(a, b, *args, **kw)
        return orig(a.flip(-1), b.flip(0 if b.dim() == 1 else -2), *args, **kw)
    return f


def _rmatmul(orig):
    @functools.wraps(orig)
    def f(b, a):  # a @ b where a is not a tensor
        return _PATCHED["matmul"](a, b) if _float(b) else orig(b, a)
    return f


def _dims(x, dim):
    if dim is None:
        return list(range(x.dim()))
    return [d % max(1, x.dim()) for d in ((dim,) if isinstance(dim, int) else dim)]


def _reduction(orig, dim_pos=1):
    @functools.wraps(orig)
    def f(x, *args, **kw):
        if not _float(x) or x.dim() == 0:
            return orig(x, *args, **kw)
        dim = kw.get("dim", args[0] if len(args) >= dim_pos and args else None)
        if isinstance(dim, torch.dtype):  # sum(dtype=...) passed positionally
            dim = None
        dims = [d for d in _dims(x, dim) if x.shape[d] > 1]
        return orig(x.flip(dims) if dims else x, *args, **kw)
    return f


def _norm(orig):
    @functools.wraps(orig)
    def f(x, *args, **kw):
        if not _float(x) or x.dim() == 0:
            return orig(x, *args, **kw)
        dim = kw.get("dim", args[1] if len(args) >= 2 else None)
        dims = [d for d in _dims(x, dim) if x.shape[d] > 1]
        return orig(x.flip(dims) if dims else x, *args, **kw)
    return f


def _einsum(orig):
    @functools.wraps(orig)
    def f(eq, *ops):
        if len(ops) == 1 and isinstance(ops[0], (list, tuple)):
            ops = tuple(ops[0])
        if "..." in eq or "->" not in eq or not all(_float(o) for o in ops):
            return orig(eq, *ops)
        ins, out = eq.replace(" ", "").split("->")
        terms = ins.split(",")
        contracted = set(re.sub("[^a-zA-Z]", "", ins)) - set(out)
        flipped = [o.flip([i for i, c in enumerate(t) if c in contracted]) if contracted
                   else o for o, t in zip(ops, terms, strict=True)]
        return orig(eq, *flipped)
    return f


def _neighbour(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """y, moved one ulp away from zero where x's last significand bit is 1."""
    if not (_float(y) and _float(x)) or y.shape != x.shape or y.dtype not in (
            torch.float32, torch.float64):
        return y
    ib = torch.int64 if x.dtype is torch.float64 else torch.int32
    xb = x.detach().contiguous().view(ib) if x.dtype in (torch.float32, torch.float64) else None
    if xb is None:
        return y
    odd = (xb & 1) == 1
    far = torch.nextafter(y, torch.where(y < 0, -torch.inf, torch.inf).to(y.dtype))
    ok = odd & torch.isfinite(y) & (y != 0)
    return torch.where(ok, far, y)


def _elementwise(orig):
    @functools.wraps(orig)
    def f(x, *args, **kw):
        y = orig(x, *args, **kw)
        return _neighbour(y, x) if _float(x) and "out" not in kw else y
    return f


def _elementwise_(orig, plain):
    @functools.wraps(orig)
    def f(x, *args, **kw):
        x.copy_(plain(x.clone()))
        return x
    return f


def _np_matmul(orig):
    @functools.wraps(orig)
    def f(a, b, *args, **kw):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype.kind != "f" or b.dtype.kind != "f" or a.ndim == 0 or b.ndim == 0:
            return orig(a, b, *args, **kw)
        return orig(np.flip(a, -1), np.flip(b, 0 if b.ndim == 1 else -2), *args, **kw)
    return f


_PATCHED: dict = {}


def install() -> None:
    """Replace the libraries' orders in this process (once)."""
    if _DONE:
        return
    _DONE.append(True)
    T = torch.Tensor
    mm = _matmul(torch.matmul)
    _PATCHED["matmul"] = mm
    torch.matmul = mm
    torch.mm = _matmul(torch.mm)
    torch.bmm = _matmul(torch.bmm)
    T.__matmul__ = _matmul(T.__matmul__)
    T.__rmatmul__ = _rmatmul(T.__rmatmul__)
    T.matmul = _matmul(T.matmul)
    T.mm = _matmul(T.mm)
    T.bmm = _matmul(T.bmm)
    torch.einsum = _einsum(torch.einsum)
    for name in ("sum", "mean", "nansum", "std", "var"):
        setattr(torch, name, _reduction(getattr(torch, name)))
        setattr(T, name, _reduction(getattr(T, name)))
    torch.linalg.vector_norm = _norm(torch.linalg.vector_norm)
    torch.norm = _norm(torch.norm)
    T.norm = _norm(T.norm)
    for name in ("exp", "exp2", "expm1", "log", "log1p"):
        fn = _elementwise(getattr(torch, name))
        setattr(torch, name, fn)
        setattr(T, name, _elementwise(getattr(T, name)))
        setattr(T, name + "_", _elementwise_(getattr(T, name + "_"), fn))
    np.matmul = _np_matmul(np.matmul)
    np.dot = _np_matmul(np.dot)
