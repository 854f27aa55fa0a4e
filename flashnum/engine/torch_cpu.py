"""A model of PyTorch's CPU flash attention (policy "torch_cpu"), operation for operation.

    import flashnum
    res = flashnum.attention(q, k, v, precision="bf16", policy="torch_cpu", causal=True)
    # or directly: flashnum.engine.torch_cpu.attention_torch_cpu(q, k, v, precision="bf16")

On CPU, torch.nn.functional.scaled_dot_product_attention runs ATen's flash kernel
(aten/src/ATen/native/cpu/FlashAttentionKernel.cpp, `cpu_flash_attention`, torch 2.13)
for fp32, bf16 and fp16. This module repeats its arithmetic in the same order:

  splits    query blocks of 256 rows when Nq >= 768, 64 when Nq >= 192, else 32; key
            blocks of 512 (or Nk when smaller); the last key block is ragged
  S         one GEMM per (batch, head, query block, key block), fp32 accumulation of
            the stored q, k: the kernel's own call (MKL sgemm, gemm_bf16bf16f32 or
            gemm_f16f16f32 with the same transposes, sizes and leading dimensions)
  scale     fl32(S * fl32(scale)), then the row max of the block, max'd with the old
  causal    top-left: query row i sees keys 0..i; key blocks past the diagonal are
            never visited, the diagonal block is filled with -inf
  exp       P = exp(s - m) on whole 16-lane vectors by ATen's Vectorized<float>::exp_u20 for
            fp32 (a degree-5 polynomial with FMA) and fexp_u20 for bf16/fp16 (a cubic for
            2^frac, assembled in the exponent bits: errors up to ~1e-4 relative); neither is
            torch.exp's SLEEF function. glibc expf on the kvB mod 16 tail columns
  row sum   16 lane accumulators over the vectors, the AVX-512 shuffle tree (lanes
            i + 8, + 4, + 2, + 1), then the tail columns one by one
  state     alpha = expf(m_old - m_new); l = fma(alpha, l_old, rowsum) (GCC contracts
            this C++ expression on the AVX-512 build); o = o * alpha before the GEMM
  P cast    P stored in bf16/fp16 (round to nearest even) as the P @ V operand;
            fp32 P stays fp32. The row sum reads the fp32 P
  P @ V     the library GEMM with beta = 1 accumulating into o (beta = 0 on the first block)
  output    o * fl32(1 / l), cast to the dtype; a row with l = 0 takes l = 1 (out = 0)
  lse       m + log(l) (m = 0 for a row that saw no key)

The GEMMs are MKL's own, called through ctypes from the libtorch_cpu that torch loaded,
so their summation order is the library's by construction (the vector-width and
threading of MKL are its own; docs/audit.md gives the measured agreement). Where MKL's
symbols are missing the operands are widened to fp32 and torch.matmul sums them (then
only nearly bit-exact). Everything else is torch elementwise arithmetic on fp32 tensors,
each operation the one IEEE operation the kernel performs; FMAs are evaluated exactly
(fp64 product and sum, rounded to odd, then to fp32).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
from pathlib import Path

import numpy as np
import torch

from flashnum.engine.result import Result

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
LANES = 16  # AVX-512 float vector width (Vectorized<float>::size())
KV_SPLIT = 512

# exp_u20's constants (ATen vec512_float.h), as fp32 values
_F32 = np.float32
_C = [_F32(0.999999701), _F32(0.499991506), _F32(0.166676521), _F32(0.0418978221),
      _F32(0.00828929059)]
_LOG2E = np.array([0x3FB8AA3B], dtype=np.uint32).view(np.float32)[0]
_LN2 = np.array([0x3F317218], dtype=np.uint32).view(np.float32)[0]
_LN_MIN = np.array([0xC2AEAC50], dtype=np.uint32).view(np.float32)[0]
_LN_MAX = np.array([0x42B17218], dtype=np.uint32).view(np.float32)[0]


def split_sizes(nq: int, nk: int) -> tuple[int, int]:
    """(q_split, kv_split) the kernel uses for these lengths (flash_attention_kernel_impl)."""
    q_split = 256 if nq >= 768 else 64 if nq >= 192 else 32
    return min(q_split, nq), min(KV_SPLIT, nk)


# ---------------------------------------------------------------------------
# the two exponentials


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


# ---------------------------------------------------------------------------
# the library's GEMMs


@functools.cache
def _mkl():
    """MKL's Fortran GEMMs inside the libtorch_cpu torch loaded, or None."""
    lib_dir = Path(torch.__file__).parent / "lib"
    try:
        lib = ctypes.CDLL(str(lib_dir / "libtorch_cpu.so"))
        fns = {"fp32": lib.sgemm_, "bf16": lib.gemm_bf16bf16f32_, "fp16": lib.gemm_f16f16f32_}
    except (OSError, AttributeError):
        return None
    for f in fns.values():
        f.restype = None
    return fns


def mkl_available() -> bool:
    return _mkl() is not None


def _gemm(prec, trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc):
    """Column-major C (m x n) = op(A) op(B) + beta C through the library, as cpublas::gemm."""
    fns = _mkl()
    ci = ctypes.c_int
    one, bet = ctypes.c_float(1.0), ctypes.c_float(beta)
    fns[prec](ctypes.c_char_p(trans_a), ctypes.c_char_p(trans_b), ctypes.byref(ci(m)),
              ctypes.byref(ci(n)), ctypes.byref(ci(k)), ctypes.byref(one),
              ctypes.c_void_p(a.data_ptr()), ctypes.byref(ci(lda)),
              ctypes.c_void_p(b.data_ptr()), ctypes.byref(ci(ldb)), ctypes.byref(bet),
              ctypes.c_void_p(c.data_ptr()), ctypes.byref(ci(ldc)))


def _qk(prec, q, k) -> torch.Tensor:
    """S (BH, qB, kvB) fp32 = q (BH, qB, d) @ k (BH, kvB, d)^T, per head as the kernel calls
    gemm(T, N, kvB, qB, d, 1, k, ldk, q, ldq, 0, S, kvB)."""
    bh, qb, d = q.shape
    kvb = k.shape[1]
    if _mkl() is None:
        return torch.matmul(q.float(), k.float().transpose(-1, -2))
    s = torch.empty(bh, qb, kvb, dtype=torch.float32)
    for h in range(bh):
        _gemm(prec, b"T", b"N", kvb, qb, d, k[h], d, q[h], d, 0.0, s[h], kvb)
    return s


def _pv(prec, p, v, o, first: bool) -> None:
    """o (BH, qB, d) fp32 <- p (BH, qB, kvB) @ v (BH, kvB, d) + (0 if first else 1) o, per
    head as gemm(N, N, d, qB, kvB, 1, v, ldv, p, kvB, beta, o, d)."""
    bh, qb, kvb = p.shape
    d = v.shape[-1]
    if _mkl() is None:
        pv = torch.matmul(p.float(), v.float())
        o.copy_(pv if first else pv + o)
        return
    for h in range(bh):
        _gemm(prec, b"N", b"N", d, qb, kvb, v[h], d, p[h], kvb, 0.0 if first else 1.0, o[h], d)


# ---------------------------------------------------------------------------
# the row softmax of one block


def _row_sum(p: torch.Tensor) -> torch.Tensor:
    """sum over the last dim as _exp_reduce_sum_fusion_kernel adds: 16 lane accumulators,
    the shuffle tree, then the tail columns in order."""
    n = p.shape[-1]
    main = LANES * (n // LANES)
    acc = torch.zeros(*p.shape[:-1], LANES, dtype=torch.float32)
    for c0 in range(0, main, LANES):
        acc = acc + p[..., c0 : c0 + LANES]
    for half in (8, 4, 2, 1):
        acc = acc[..., :half] + acc[..., half : 2 * half]
    total = acc[..., 0]
    for c in range(main, n):
        total = total + p[..., c]
    return total


def _block_exp(s: torch.Tensor, m: torch.Tensor, prec: str) -> torch.Tensor:
    """P = exp(s - m) as the kernel: on whole vectors exp_u20 (fp32) or fexp_u20 (bf16,
    fp16: torch 2.13 takes the faster one when P is stored narrow), expf on the tail."""
    x = s - m[..., None]
    n = x.shape[-1]
    main = LANES * (n // LANES)
    p = torch.empty_like(x)
    p[..., :main] = (exp_u20 if prec == "fp32" else fexp_u20)(x[..., :main])
    if main < n:
        p[..., main:] = expf(x[..., main:])
    return p


# ---------------------------------------------------------------------------
# the kernel


def attention_torch_cpu(q, k, v, *, precision="bf16", causal=False, scale=None,
                        q_split=None, kv_split=None) -> Result:
    """What torch's CPU SDPA computes for q, k, v stored in `precision` (fp32, bf16, fp16).

    q_split/kv_split default to the kernel's own choice for the shape (split_sizes)."""
    if precision not in DTYPES:
        raise ValueError(f"policy torch_cpu models precision fp32, bf16 or fp16, not {precision!r}")
    dtype = DTYPES[precision]
    lead, nq, nk, d = q.shape[:-2], q.shape[-2], k.shape[-2], q.shape[-1]
    dv = v.shape[-1]
    if dv != d:
        raise ValueError(f"policy torch_cpu needs equal head dims (the kernel's), got {d} and {dv}")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    scale32 = torch.tensor(scale, dtype=torch.float32)
    qs, ks = split_sizes(nq, nk)
    qs, ks = q_split or qs, kv_split or ks

    def stored(x):  # the inputs as the kernel reads them (one RNE cast from the caller's values)
        x = x.detach().to("cpu")
        if x.dtype is torch.float64 and dtype is not torch.float32:
            from flashnum.numerics.formats import get_format
            x = get_format(precision).round(x).float()  # one rounding, not fp64->fp32->dtype
        return x.to(dtype).reshape(-1, x.shape[-2], x.shape[-1]).contiguous()

    q3, k3, v3 = stored(q), stored(k), stored(v)
    bh = q3.shape[0]
    out = torch.zeros(bh, nq, d, dtype=torch.float32)
    m_all = torch.zeros(bh, nq, dtype=torch.float32)
    l_all = torch.zeros(bh, nq, dtype=torch.float32)
    for r0 in range(0, nq, qs):
        qb = min(qs, nq - r0)
        m, l, o = _query_block(precision, q3[:, r0 : r0 + qb], k3, v3, r0, ks, causal, scale32)
        l_safe = torch.where(l == 0, torch.ones_like(l), l)
        recip = 1.0 / l_safe  # the kernel multiplies by the fp32 reciprocal
        out[:, r0 : r0 + qb] = (o * recip[..., None]).to(dtype).float()
        m_all[:, r0 : r0 + qb] = torch.where(m == -math.inf, torch.zeros_like(m), m)
        l_all[:, r0 : r0 + qb] = l_safe
    masked = torch.zeros(bh, nq, dtype=torch.bool)
    m64, l64 = m_all.double(), l_all.double()
    lse = (m_all + expf(l_all, _logf())).double()  # fp32 m + std::log(l), as the kernel stores it
    return Result(
        out=out.double().reshape(*lead, nq, d), m=m64.reshape(*lead, nq),
        l=l64.reshape(*lead, nq), lse=lse.reshape(*lead, nq), masked=masked.reshape(*lead, nq),
        n_rescales=torch.zeros(*lead, nq, dtype=torch.int64), backend="emulate",
        info=dict(precision=precision, policy="torch_cpu", block_m=qs, block_n=ks,
                  causal=causal, scale=scale, order="forward", variant="fa2"),
    )


def _query_block(prec, qb_, k3, v3, r0, ks, causal, scale32):
    """(m, l, o) of one query block after every key block it visits."""
    bh, qb, d = qb_.shape
    nk = k3.shape[1]
    m = torch.full((bh, qb), -math.inf, dtype=torch.float32)
    l = torch.zeros(bh, qb, dtype=torch.float32)
    o = torch.zeros(bh, qb, d, dtype=torch.float32)
    num_keys = min(r0 + qb, nk) if causal else nk
    rows = torch.arange(qb)
    for n in range(0, num_keys, ks):
        kvb = min(ks, nk - n)
        s = _qk(prec, qb_, k3[:, n : n + kvb].contiguous())
        if causal and num_keys - n <= ks:
            cols = torch.arange(kvb)
            s = s.masked_fill(cols[None, :] > (r0 + rows - n)[:, None], -math.inf)
        s = s * scale32
        m_new = torch.maximum(m, s.amax(dim=-1))
        live = m_new != -math.inf  # a row with no visible key yet: P = 0, state kept
        m_safe = torch.where(live, m_new, torch.zeros_like(m_new))
        p = _block_exp(s, m_safe, prec)
        p = torch.where(live[..., None], p, torch.zeros_like(p))
        row_sum = _row_sum(p)
        alpha = expf(torch.where(live, m - m_safe, torch.zeros_like(m)))
        l = torch.where(live, _fma(alpha, l, row_sum), l)
        if n > 0:
            o = torch.where(live[..., None], o * alpha[..., None], o)
        m = torch.where(live, m_new, m)
        pc = p.to(DTYPES[prec]).contiguous()  # the stored P (fp32 stays fp32)
        o = o.contiguous()
        _pv(prec, pc, v3[:, n : n + kvb].contiguous(), o, first=n == 0)
    return m, l, o
