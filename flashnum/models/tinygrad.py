"""A model of tinygrad's scaled_dot_product_attention on its CPU device (tinygrad 0.14).

    import flashnum
    res = flashnum.attention(q, k, v, precision="bf16", model="tinygrad", causal=True)
    from flashnum.models.tinygrad import exp2
    y = exp2(x)                          # tinygrad's fp32 exp2 polynomial, in numpy float32

tinygrad (mixin/rand.py) writes SDPA as `q.matmul(k^T, dtype=fp32) / sqrt(d)`, the causal
mask added as -inf (tril: top-left), `.cast(dtype).softmax(-1) @ v`; softmax is
`e = exp(s - max(s))`, `e * sum(e).reciprocal()`, exp is `exp2(x * (1 / ln 2))` with x in
fp32. Its scheduler fuses these into four kernels (row max, S, row sum, P V; DEBUG=4
prints their C), compiled by clang -O2 with -march=native: within one C expression clang
contracts a * b + c into one FMA. Every value as the kernels compute it:

  S     fp32: s_ij = fl32(fma chain of q_it k_jt over t from +0) * c, c = fl32(1/sqrt d)
        (the division by a constant is a product by its fp32 reciprocal; the mask add is
        the FMA's addend: fma(acc, c, 0) = fl32(acc c)). bf16: each product q_it k_jt
        rounded to bf16, summed in fp32 in order from +0 (the site qk_product), then
        fl32(acc c) rounded to bf16.
  m     the row max of s (exact).
  x     fl32(fl32(s - m) * L), L = fl32(1 / ln 2); in bf16 s - m is rounded to bf16 first.
  e     tinygrad's exp2 (codegen/decomp/transcendental.py, xexp2; `exp2` below), in bf16
        rounded to bf16.
  l     the row sum of e in fp32, in order from +0 (bf16: rounded to bf16).
  out   fp32: the division follows the P V reduction: out = fl32(fma chain of e_ij v_jc
        over j from +0) / l. bf16: P = bf16(e / l) (the reciprocal folded into one
        division), each product P_ij v_jc rounded to bf16 (pv_product), summed in fp32 in
        order, the sum rounded to bf16.

Reductions run in index order: tinygrad's UNROLL and UPCAST opts give each output its
own accumulator and add an unrolled group left to right ((acc + x0) + x1 ...), so every
sum is sequential. Under its own top-left mask every row sees key 0; a row that sees no
key (bottom-right, Nq > Nk) comes out NaN, as softmax over -inf alone does. tinygrad's
SDPA takes no scale: the model computes with 1/sqrt(d) and refuses another.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from flashnum.engine.result import Result
from flashnum.numerics import accumulate
from flashnum.numerics.tiling import causal_visible, check_causal

F32 = np.float32
INV_LN2 = F32(1 / math.log(2))  # 1.4426950216293335f: exp's `mul(1/math.log(2))` in fp32
# xexp2's fp32 polynomial, highest degree first (transcendental.py), each literal in fp32
EXP2_POLY = tuple(F32(c) for c in (0.1535920892e-3, 0.1339262701e-2, 0.9618384764e-2,
                                   0.5550347269e-1, 0.2402264476e+0, 0.6931471825e+0, 1.0))


def fma32(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """fl32(x y + z) rounded once, for float32 arrays: x y is exact in float64; the sum
    rounded to odd there (two_sum's error picks the odd neighbour) and then to fp32 is
    the one correct rounding (53 >= 24 + 2 bits; Boldo and Melquiond)."""
    p = x.astype(np.float64) * y.astype(np.float64)
    z64 = z.astype(np.float64)
    s = p + z64
    bb = s - p
    err = (p - (s - bb)) + (z64 - bb)
    even = (s.view(np.int64) & 1) == 0
    odd = np.nextafter(s, np.where(err > 0, np.inf, -np.inf))
    return np.where((err != 0) & even, odd, s).astype(F32)


def exp2(d: np.ndarray) -> np.ndarray:
    """tinygrad's xexp2 on fp32, as its kernels compute it (numpy float32, step by step)."""
    d = np.asarray(d, dtype=F32)
    with np.errstate(invalid="ignore", over="ignore"):
        # +-inf and NaN mapped to 0 (_lazy_map_numbers), the result fixed at the end
        x = np.where(np.isfinite(d), d, F32(0))
        # rintk: (x + (x < 0 ? -0.5 : 0.5)) in fp32, truncated to int32
        q = (x + np.where(x < 0, F32(-0.5), F32(0.5))).astype(np.int32)
        s = x - q.astype(F32)
        # polyN: ((c0 s + c1) s + c2) ...: one C expression, each step one FMA (clang)
        u = np.full_like(s, EXP2_POLY[0])
        for c in EXP2_POLY[1:]:
            u = fma32(u, s, np.full_like(s, c))
        # ldexp2k: u * 2^(q >> 1) * 2^(q - (q >> 1)), two fp32 products, left to right
        h = q >> 1
        u = (u * _pow2(h)) * _pow2(q - h)
        u = np.where(d >= F32(128), F32(np.inf), u)  # !(d < 128) -> inf
        u = np.where(d < F32(-150), F32(0), u)
    return np.where(np.isnan(d), F32(np.nan), u).astype(F32)


def _pow2(e: np.ndarray) -> np.ndarray:
    """pow2if: 2^e as the bits (e + 127) << 23 of an fp32 (e in [-126, 127])."""
    return ((e.astype(np.int64) + 127) << 23).astype(np.uint32).view(F32)


def _exp2_torch(x: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(exp2(x.numpy()))


def _bf16(x: torch.Tensor) -> torch.Tensor:
    """One round to nearest even into bf16, back on fp32."""
    return x.to(torch.bfloat16).float()


def _round_bf16(x64: torch.Tensor) -> torch.Tensor:
    # an exact product of two bf16 numbers (16 bits): float64 -> fp32 is exact, then one
    # rounding into bf16
    return _bf16(x64.float())


def _logits(q, k, d: int, vis, bf16: bool) -> torch.Tensor:
    """S in fp32 as the S kernel stores it (bf16: before its cast), masked -inf."""
    if bf16:
        acc = accumulate.product_dot(q, k.transpose(-1, -2), _round_bf16, "fp32")
    else:
        acc = accumulate.dot(q, k.transpose(-1, -2), "fp32")
    s = acc * torch.tensor(1.0 / math.sqrt(d), dtype=torch.float32)
    return s if vis is None else s.masked_fill(~vis, -math.inf)


def _attention(q, k, v, vis, bf16: bool):
    """(out in fp32 before the output cast, m, l) of fp32 q, k, v (bf16: their values)."""
    s = _logits(q, k, q.shape[-1], vis, bf16)
    if bf16:
        s = _bf16(s)
    m = s.amax(-1, keepdim=True)
    diff = s - m
    x = (_bf16(diff) if bf16 else diff) * torch.tensor(float(INV_LN2), dtype=torch.float32)
    e = _exp2_torch(x)
    if bf16:
        e = _bf16(e)
    l = accumulate.dot(e, torch.ones(e.shape[-1], 1, dtype=torch.float32), "fp32")
    if bf16:
        l = _bf16(l)
        p = _bf16(e / l)
        out = _bf16(accumulate.product_dot(p, v, _round_bf16, "fp32"))
    else:
        out = accumulate.dot(e, v, "fp32") / l
    return out, m, l


def forward(q, k, v, *, precision: str = "bf16", causal=False, scale=None) -> Result:
    """What tinygrad's SDPA computes for q, k, v (..., N, d) stored in `precision`
    (fp32 or bf16); causal True or "top_left" (its own alignment), "bottom_right"."""
    if precision not in ("fp32", "bf16"):
        raise ValueError(f"model tinygrad models precision fp32 or bf16, not {precision!r}")
    d = q.shape[-1]
    if scale is not None and not math.isclose(float(scale), 1 / math.sqrt(d), rel_tol=1e-12):
        raise ValueError(f"tinygrad's SDPA takes no scale: scale={scale!r}; valid: None or "
                         f"1/sqrt(d) = {1 / math.sqrt(d)!r}")
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    qs, ks, vs = (_stored(x, dtype) for x in (q, k, v))
    nq, nk = q.shape[-2], k.shape[-2]
    vis = causal_visible(nq, nk, causal=check_causal(causal)) if causal else None
    out, m, l = _attention(qs, ks, vs, vis, precision == "bf16")
    m, l = m.squeeze(-1).double(), l.squeeze(-1).double()
    masked = (~vis.any(-1)).expand_as(m) if vis is not None else torch.zeros_like(m, dtype=bool)
    return Result(out=out.double(), m=m, l=l, lse=m + torch.log(l), masked=masked,
                  n_rescales=torch.zeros_like(m, dtype=torch.int64))


def _stored(x: torch.Tensor, dtype) -> torch.Tensor:
    """The inputs as the kernel reads them: rounded once into the dtype, widened exactly."""
    x = x.detach().to("cpu")
    if x.dtype is torch.float64 and dtype is torch.bfloat16:
        from flashnum.numerics.formats import get_format

        x = get_format("bf16").round(x)
    return x.to(dtype).float()
