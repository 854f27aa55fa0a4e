"""The exponentials of torch's CPU flash kernel (flashnum.models.torch_cpu): ATen's
Vectorized<float>::exp_u20 and fexp_u20 (AVX-512) on whole vectors, and the C library's
expf, logf and double exp the scalar code calls.

Each is repeated operation for operation on fp32 tensors; the FMAs are evaluated
exactly (_fma: fp64 product and sum, rounded to odd, then to fp32).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import numpy as np
import torch

# exp_u20's constants (ATen vec512_float.h), as fp32 values
_F32 = np.float32
_C = [_F32(0.999999701), _F32(0.499991506), _F32(0.166676521), _F32(0.0418978221),
      _F32(0.00828929059)]
_LOG2E = np.array([0x3FB8AA3B], dtype=np.uint32).view(np.float32)[0]
_LN2 = np.array([0x3F317218], dtype=np.uint32).view(np.float32)[0]
_LN_MIN = np.array([0xC2AEAC50], dtype=np.uint32).view(np.float32)[0]
_LN_MAX = np.array([0x42B17218], dtype=np.uint32).view(np.float32)[0]


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fp32 fma(a, b, c), rounded once: the fp64 product is exact, the fp64 sum is
    rounded to odd (so that its rounding to fp32 is the correct one)."""
    p = a.double() * b.double()
    c64 = c.double() if isinstance(c, torch.Tensor) else torch.tensor(float(c), dtype=torch.float64)
    s = p + c64
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)  # s + err = p + c exactly (TwoSum)
    even = (s.view(torch.int64) & 1) == 0
    fix = (err != 0) & even & torch.isfinite(s)
    if bool(fix.any()):
        s = torch.where(fix, torch.nextafter(s, s + err), s)
    return s.float()


def exp_u20(x: torch.Tensor) -> torch.Tensor:
    """ATen's Vectorized<float>::exp_u20 (AVX-512) on fp32 x, elementwise."""
    f32 = torch.float32
    below = x < float(_LN_MIN)
    src = torch.clamp(torch.clamp(x, max=float(_LN_MAX)), min=float(_LN_MIN))
    fx = torch.floor(_fma(src, torch.tensor(float(_LOG2E), dtype=f32), 0.5))
    r = _fma(-fx, torch.tensor(float(_LN2), dtype=f32), src)
    res = _fma(r, torch.tensor(float(_C[4]), dtype=f32), float(_C[3]))
    for c in (_C[2], _C[1], _C[0], _F32(1.0)):
        res = _fma(r, res, float(c))
    # 2^(fx - 1) built from its exponent bits; fx >= -126 after the clamp
    e = (fx - 1).to(torch.int32) + 127
    two = torch.where(e > 0, e << 23, torch.zeros_like(e)).view(f32)
    two = torch.where(below, torch.zeros_like(two), two)
    return (res * two) * 2.0


# fexp_u20's constants (ATen vec512_float.h; double literals cast to float)
_D = [_F32(0.00010703434948458272), _F32(0.30354260500649682), _F32(-0.22433836478672356),
      _F32(-0.079204240219773236)]


def fexp_u20(x: torch.Tensor) -> torch.Tensor:
    """ATen's Vectorized<float>::fexp_u20 (AVX-512; Malossi et al.'s fast exp: 2^frac by a
    cubic, the result assembled in the exponent bits by one fma and a truncation)."""
    f32 = torch.float32
    lo, hi = x < float(_LN_MIN), x > float(_LN_MAX)
    src = x * torch.tensor(float(_LOG2E), dtype=f32)
    frac = src - torch.floor(src)
    res = _fma(frac, torch.tensor(float(_D[3]), dtype=f32), float(_D[2]))
    res = _fma(frac, res, float(_D[1]))
    res = _fma(frac, res, float(_D[0]))
    src = src - res
    tmp = _fma(torch.tensor(2.0**23, dtype=f32), src, 2.0**23 * 127)
    bits = torch.trunc(torch.nan_to_num(tmp, nan=0.0, posinf=0.0, neginf=0.0)).to(torch.int32)
    bits = torch.where(lo, torch.zeros_like(bits), bits)
    bits = torch.where(hi, torch.full_like(bits, 0x7F800000), bits)
    return bits.view(f32)


@functools.cache
def _expf():
    name = ctypes.util.find_library("m") or "libm.so.6"
    f = ctypes.CDLL(name).expf
    f.restype = ctypes.c_float
    f.argtypes = [ctypes.c_float]
    return f


@functools.cache
def _exp64():
    name = ctypes.util.find_library("m") or "libm.so.6"
    f = ctypes.CDLL(name).exp
    f.restype = ctypes.c_double
    f.argtypes = [ctypes.c_double]
    return f


def exp64(x: torch.Tensor) -> torch.Tensor:
    """The C library's double exp of fp32 x (float64 result); rounded to fp32 it is the
    correctly rounded exp that the kernel's tail loop delivers (measured)."""
    f = _exp64()
    flat = x.detach().contiguous().reshape(-1).double().numpy()
    out = np.fromiter((f(v) for v in flat.tolist()), dtype=np.float64, count=flat.size)
    return torch.from_numpy(out).reshape(x.shape)


@functools.cache
def _logf():
    name = ctypes.util.find_library("m") or "libm.so.6"
    f = ctypes.CDLL(name).logf
    f.restype = ctypes.c_float
    f.argtypes = [ctypes.c_float]
    return f


def expf(x: torch.Tensor, f=None) -> torch.Tensor:
    """The C library's expf (what std::exp(float) calls), elementwise, on fp32 x."""
    f = f or _expf()
    flat = x.detach().contiguous().reshape(-1).numpy()
    out = np.fromiter((f(v) for v in flat.tolist()), dtype=np.float32, count=flat.size)
    return torch.from_numpy(out).reshape(x.shape)
