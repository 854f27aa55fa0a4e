"""A model of PyTorch's CPU flash attention (model "torch_cpu"), operation for operation.

    import flashnum
    res = flashnum.attention(q, k, v, precision="bf16", model="torch_cpu", causal=True)
    # or directly: flashnum.models.torch_cpu.attention_torch_cpu(q, k, v, precision="bf16")

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
            torch.exp's SLEEF function. On the kvB mod 16 tail columns the correctly
            rounded exp (measured: glibc's expf differs from the kernel there, the C
            library's double exp rounded to fp32 agrees on every case tried)
  row sum   lane accumulators over the vectors (fp32: one of 16 lanes; bf16/fp16: two,
            over 32-column steps, and one for a last 16-column step), the AVX-512 shuffle
            tree (lanes i + 8, + 4, + 2, + 1), then the tail columns one by one
  state     alpha = expf(m_old - m_new) (std::exp of a float: glibc's expf, not rounded
            correctly on about one argument in 2000); l = fma(alpha, l_old, rowsum) (GCC contracts
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
only nearly bit-exact). Where cpublas::could_pack(dtype) holds (bf16 with AMX; fp16 with
AMX-FP16) and need_pack() does, the kernel's with_pack variant multiplies S = Q K^T and
P V by cpublas::brgemm on K^T and V reordered by pack_vnni2 (_Packed), P in rows of even
length; the model calls the same exported brgemm, from its Python loop (the kernel's
cpu_flash_attention<..., with_pack=true>). Everything else is torch elementwise arithmetic
on fp32 tensors, each operation the one IEEE operation the kernel performs; FMAs are
evaluated exactly (fp64 product and sum, rounded to odd, then to fp32).

The exponentials are in flashnum.models.torch_cpu_exp, the GEMM calls (MKL, brgemm and
the packing) in flashnum.models.torch_cpu_gemm; here: the splits, the row softmax
(torch_cpu.c or torch) and the kernel's loop.
"""

from __future__ import annotations

import ctypes
import functools
import math
from pathlib import Path

import torch

from flashnum.engine.result import Result
from flashnum.models.torch_cpu_exp import _fma, _logf, exp64, exp_u20, expf, fexp_u20
from flashnum.models.torch_cpu_gemm import (
    _brgemm,
    _brgemm_call,
    _mkl,
    _omp_set_num_threads,
    _one_thread,
    _Packed,
    _pv,
    _qk,
    need_pack,
)
from flashnum.numerics import build

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
LANES = 16  # AVX-512 float vector width (Vectorized<float>::size())
KV_SPLIT = 512


def split_sizes(nq: int, nk: int) -> tuple[int, int]:
    """(q_split, kv_split) the kernel uses for these lengths (flash_attention_kernel_impl)."""
    q_split = 256 if nq >= 768 else 64 if nq >= 192 else 32
    return min(q_split, nq), min(KV_SPLIT, nk)


# ---------------------------------------------------------------------------
# the row softmax of one block: torch_cpu.c when a C compiler is at hand (fast), else the
# same operations in torch (tests check that both give the same bits)


_WHY = None  # why torch_cpu.c is not in use (None: not asked yet, or in use)


def why() -> str | None:
    """Why the C loop is not in use (the compiler's message, say), or None when it is."""
    _clib()
    return _WHY


@functools.cache
def _clib():
    """torch_cpu.c compiled once by flashnum.numerics.build (its cache key holds the CPU:
    -march=native code is never loaded on another CPU), or None: why() says why (the
    compiler's message), and the loop runs in Python with the same values."""
    global _WHY
    # -march=native only turns the written fmaf/floorf into instructions (the same values:
    # both are exact); -ffp-contract=off keeps every other operation as written;
    # -fno-math-errno and -fno-trapping-math let the exp loops vectorise (errno and the
    # floating-point exception flags are never read; no value changes)
    flags = ["-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno",
             "-fno-trapping-math", "-fPIC", "-shared", "-pthread"]
    try:
        so = build.shared_library("torch_cpu", Path(__file__).with_suffix(".c").read_text(),
                                  [flags], libs=["-lm"])
    except build.BuildError as e:
        _WHY = str(e)
        return None
    lib = ctypes.CDLL(str(so))
    f = lib.tc_softmax_block
    f.restype = None
    f.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64] + [ctypes.c_void_p] * 5 + [
        ctypes.c_int]
    i64, vp = ctypes.c_int64, ctypes.c_void_p
    lib.tc_finish.restype = None
    lib.tc_finish.argtypes = [vp, vp, vp, i64, i64, ctypes.c_int] + [vp] * 5
    lib.tc_lse.restype = None
    lib.tc_lse.argtypes = [vp, vp, vp, i64]
    lib.tc_attention.restype = None
    lib.tc_attention.argtypes = ([vp] * 5 + [i64] * 6 + [ctypes.c_int, ctypes.c_int,
                                 ctypes.c_float, vp, vp, i64, i64, vp, vp, vp])
    return lib


def softmax_block(s, m, l, prec, use_c=True):
    """One key block's softmax step on scaled logits s (R, n): returns (p, alpha, live) and
    updates m, l (R,) in place."""
    lib = _clib() if use_c else None
    if lib is not None:
        s = s.contiguous()
        p = torch.empty_like(s)
        alpha = torch.empty_like(m)
        live = torch.empty(m.shape, dtype=torch.int32)
        lib.tc_softmax_block(s.data_ptr(), s.shape[0], s.shape[1], m.data_ptr(), l.data_ptr(),
                             p.data_ptr(), alpha.data_ptr(), live.data_ptr(), int(prec != "fp32"))
        return p, alpha, live.bool()
    m_new = torch.maximum(m, s.amax(dim=-1))
    live = m_new != -math.inf  # a row with no visible key yet: P = 0, state kept
    m_safe = torch.where(live, m_new, torch.zeros_like(m_new))
    p = _block_exp(s, m_safe, prec)
    p = torch.where(live[..., None], p, torch.zeros_like(p))
    row_sum = _row_sum(p, prec)
    alpha = expf(torch.where(live, m - m_safe, torch.zeros_like(m)))
    l.copy_(torch.where(live, _fma(alpha, l, row_sum), l))
    m.copy_(torch.where(live, m_new, m))
    return p, torch.where(live, alpha, torch.ones_like(alpha)), live



def _row_sum(p: torch.Tensor, prec: str) -> torch.Tensor:
    """sum over the last dim as _exp_reduce_sum_fusion_kernel adds: lane accumulators (for a
    bf16/fp16 P two of them, over 32-column steps, plus one for a last 16-column step), the
    AVX-512 shuffle tree (lane i + 8, + 4, + 2, + 1), then the tail columns in order."""
    n = p.shape[-1]
    main = LANES * (n // LANES)
    step = LANES if prec == "fp32" else 2 * LANES
    end_n = step * (n // step)
    zeros = torch.zeros(*p.shape[:-1], LANES, dtype=torch.float32)
    acc = [zeros, zeros.clone()]
    tail = zeros.clone()
    for c0 in range(0, end_n, step):
        for i in range(step // LANES):
            acc[i] = acc[i] + p[..., c0 + i * LANES : c0 + (i + 1) * LANES]
    for c0 in range(end_n, main, LANES):
        tail = tail + p[..., c0 : c0 + LANES]
    total = acc[0] + tail
    if step > LANES:
        total = total + acc[1]
    for half in (8, 4, 2, 1):
        total = total[..., :half] + total[..., half : 2 * half]
    total = total[..., 0]
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
        p[..., main:] = exp64(x[..., main:]).float()
    return p


# ---------------------------------------------------------------------------
# the kernel


def check_alignment(call) -> None:
    """The kernel's causal mask is torch's is_causal, top-left: causal=True (bottom-right, as
    for every policy) with Nq != Nk is not what it computes, and refused."""
    nq, nk = call.q.shape[-2], call.k.shape[-2]
    if call.causal is True and nq != nk:
        raise ValueError(f"model 'torch_cpu' models torch's top-left causal mask; with Nq={nq}"
                         f" != Nk={nk} causal=True (bottom-right) is not what it computes; "
                         "valid: causal='top_left' or False")


def forward(call) -> Result:
    """The model on a checked call (flashnum.models.MODELS["torch_cpu"]); top-left causal."""
    check_alignment(call)
    return attention_torch_cpu(call.q, call.k, call.v, precision=call.precision,
                               causal=bool(call.causal), scale=call.scale)


def attention_torch_cpu(q, k, v, *, precision="bf16", causal=False, scale=None,
                        q_split=None, kv_split=None, use_c=True) -> Result:
    """What torch's CPU SDPA computes for q, k, v stored in `precision` (fp32, bf16, fp16).

    q_split/kv_split default to the kernel's own choice for the shape (split_sizes);
    use_c=False takes the torch path of the row softmax (the same values, slower)."""
    if precision not in DTYPES:
        raise ValueError(f"model torch_cpu models precision fp32, bf16 or fp16, not {precision!r}")
    dtype = DTYPES[precision]
    lead, nq, nk, d = q.shape[:-2], q.shape[-2], k.shape[-2], q.shape[-1]
    dv = v.shape[-1]
    if dv != d:
        raise ValueError(f"model torch_cpu needs equal head dims (the kernel's), got {d} and {dv}")
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
    out = torch.empty(bh, nq, d, dtype=torch.float32)
    m_all = torch.empty(bh, nq, dtype=torch.float32)
    l_all = torch.empty(bh, nq, dtype=torch.float32)
    bufs = _ThreadBuffers(dtype, qs, ks, d, bh * -(-nq // qs))
    packed = None
    if need_pack(precision, bh, nq, nk, d, qs, causal, torch.get_num_threads()):
        packed = _Packed(k3, v3, ks)
        bufs = _ThreadBuffers(dtype, qs, ks, d, bh * -(-nq // qs), packed=packed)
    lib = _clib() if use_c else None
    if packed is not None:  # the packed loop runs from Python (its GEMMs are oneDNN's)
        with _one_thread(bufs.threads > 1):
            _run_python(precision, q3, k3, v3, qs, ks, causal, scale32, bufs, out, m_all,
                        l_all, use_c, packed)
            _brgemm()[2](True)
        res = _finish_python(lib, dtype, out, m_all, l_all)
    elif lib is not None and _mkl() is not None and _omp_set_num_threads() is not None:
        _run_c(lib, precision, q3, k3, v3, qs, ks, causal, scale32, bufs, out, m_all,
               l_all)  # o before the division, m, l as the state leaves them
        res = _finish_c(lib, precision, out, m_all, l_all)
    else:
        with _one_thread():  # the GEMMs run on one thread, as in the kernel's parallel loop
            _run_python(precision, q3, k3, v3, qs, ks, causal, scale32, bufs, out, m_all,
                        l_all, use_c)
        res = _finish_python(lib, dtype, out, m_all, l_all)
    out64, m64, l64, lse, nonfinite = res
    return Result(
        out=out64.reshape(*lead, nq, d), m=m64.reshape(*lead, nq), l=l64.reshape(*lead, nq),
        lse=lse.reshape(*lead, nq), masked=torch.zeros(*lead, nq, dtype=torch.bool),
        n_rescales=torch.zeros(*lead, nq, dtype=torch.int64), backend="emulate",
        nonfinite=None if nonfinite is None else nonfinite.reshape(*lead, nq),
        info=dict(precision=precision, model="torch_cpu", block_m=qs, block_n=ks,
                  causal=causal, scale=scale, order="forward", variant="fa2"),
    )


def _finish_c(lib, prec, o, m, l):
    """The kernel's epilogue in torch_cpu.c (tc_finish): (out, m, l, lse) as float64 and
    the rows with inf or NaN. On small shapes torch's elementwise calls would cost more
    than the kernel loop itself."""
    bh, nq, d = o.shape
    res = [torch.empty(bh, nq, d, dtype=torch.float64)] + [
        torch.empty(bh, nq, dtype=torch.float64) for _ in range(3)]
    nonfinite = torch.empty(bh, nq, dtype=torch.bool)
    lib.tc_finish(o.data_ptr(), m.data_ptr(), l.data_ptr(), bh * nq, d,
                  ("fp32", "bf16", "fp16").index(prec), *(x.data_ptr() for x in res),
                  nonfinite.data_ptr())
    return (*res, nonfinite)


def _finish_python(lib, dtype, o, m, l):
    """_finish_c's epilogue in torch: out = o * fl32(1 / l) in the dtype (l = 0: 1), m
    (-inf: 0), l, lse = m + logf(l); nonfinite left to Result."""
    l_safe = torch.where(l == 0, torch.ones_like(l), l)
    recip = 1.0 / l_safe  # the kernel multiplies by the fp32 reciprocal
    out = (o * recip[..., None]).to(dtype).float()
    m0 = torch.where(m == -math.inf, torch.zeros_like(m), m)
    if lib is not None:  # fp32 m + std::log(l), as the kernel stores it
        lse32 = torch.empty_like(m0)
        lib.tc_lse(m0.data_ptr(), l_safe.data_ptr(), lse32.data_ptr(), m0.numel())
    else:
        lse32 = m0 + expf(l_safe, _logf())
    return out.double(), m0.double(), l_safe.double(), lse32.double(), None


def _run_c(lib, prec, q3, k3, v3, qs, ks, causal, scale32, bufs, o_all, m_all, l_all) -> None:
    """Every task in torch_cpu.c (tc_attention) on as many threads as the kernel's parallel
    loop: o_all (before the division by l), m_all and l_all filled in place. The GEMMs are
    MKL's, called from C through their addresses, each on one OpenMP thread as inside the
    kernel's loop (each of the C threads sets its own team size to 1)."""
    bh, nq, d = q3.shape
    gemm = ctypes.cast(_mkl()[prec], ctypes.c_void_p).value
    low = bufs.low.data_ptr() if bufs.low is not None else None
    lib.tc_attention(gemm, _omp_set_num_threads(), q3.data_ptr(), k3.data_ptr(),
                     v3.data_ptr(), bh, nq, k3.shape[1], d, qs, ks,
                     ("fp32", "bf16", "fp16").index(prec), int(causal), float(scale32),
                     bufs.f32.data_ptr(), low, bufs.threads, bufs.per_thread, o_all.data_ptr(),
                     m_all.data_ptr(), l_all.data_ptr())


def _run_python(prec, q3, k3, v3, qs, ks, causal, scale32, bufs, o_all, m_all, l_all,
                use_c, packed=None) -> None:
    """The same loop task by task from Python (no C compiler, no MKL symbols, or use_c
    False), filling o_all, m_all, l_all as _run_c does."""
    bh, nq = q3.shape[:2]
    for h in range(bh):
        for r0 in range(0, nq, qs):
            qb = min(qs, nq - r0)
            buf = bufs.for_task(h * -(-nq // qs) + r0 // qs)
            m, l, o = _query_block(prec, q3[h, r0 : r0 + qb], k3[h], v3[h], r0, ks, causal,
                                   scale32, buf, use_c, packed, h)
            o_all[h, r0 : r0 + qb], m_all[h, r0 : r0 + qb], l_all[h, r0 : r0 + qb] = o, m, l


class _ThreadBuffers:
    """The kernel's per-thread scratch: one fp32 buffer per thread holding qk (qS x kvS), the
    row max and sum (qS each) and dst (qS x d) one after another, and for bf16/fp16 one
    buffer of the stored P. MKL may sum differently for operands aligned differently, so the
    model uses the same offsets, on the thread at::parallel_for gives the task (contiguous
    chunks of ceil(tasks / threads) tasks, threads = min(torch threads, tasks))."""

    def __init__(self, dtype, qs, ks, d, tasks, packed=None):
        self.threads = max(1, min(torch.get_num_threads(), tasks))
        self.chunk = -(-tasks // self.threads)
        self.qs, self.ks, self.d = qs, ks, d
        self.per_thread = qs * ks + 2 * qs + qs * d
        self.f32 = torch.empty(self.threads, self.per_thread, dtype=torch.float32)
        eks = ks if packed is None else packed.eks  # buf_reduced: qS x ekvS per thread
        self.low = (None if dtype is torch.float32
                    else torch.empty(self.threads, qs * eks, dtype=dtype))
        self.q_pad = (None if packed is None or d % 2 == 0
                      else torch.empty(self.threads, qs * packed.ehead, dtype=dtype))

    def for_task(self, task):
        t = task // self.chunk
        base = self.f32[t]
        return dict(qk=base[: self.qs * self.ks],
                    dst=base[self.qs * self.ks + 2 * self.qs :][: self.qs * self.d],
                    low=None if self.low is None else self.low[t],
                    q_pad=None if self.q_pad is None else self.q_pad[t])


def _query_block(prec, q, k, v, r0, ks, causal, scale32, buf, use_c=True, packed=None,
                 h=0):
    """(m, l, o) of one query block (q: qB x d) of one head after every key block it visits.
    packed: the reordered K, V of need_pack (head h): S and P V by brgemm instead."""
    qb, d = q.shape
    nk = k.shape[0]
    m = torch.full((qb,), -math.inf, dtype=torch.float32)
    l = torch.zeros(qb, dtype=torch.float32)
    o = buf["dst"][: qb * d].view(qb, d)
    num_keys = min(r0 + qb, nk) if causal else nk
    rows = torch.arange(qb)
    q_op, ld_q = q, d
    if packed is not None and d % 2:  # copy_value_with_pad: q with a zero column
        q_op = buf["q_pad"][: qb * packed.ehead].view(qb, packed.ehead)
        q_op.zero_()
        q_op[:, :d] = q
        ld_q = packed.ehead
    for n in range(0, num_keys, ks):
        kvb = min(ks, nk - n)
        s = buf["qk"][: qb * kvb].view(qb, kvb)
        if packed is None:
            _qk(prec, q, k[n : n + kvb], s)
        else:
            kp = packed.key[h, n * packed.ehead :]
            _brgemm_call(prec, qb, kvb, packed.ehead, ld_q, kvb, kvb, False, q_op, kp, s)
        if causal and num_keys - n <= ks:
            s.masked_fill_(torch.arange(kvb)[None, :] > (r0 + rows - n)[:, None], -math.inf)
        s.mul_(scale32)
        p, alpha, live = softmax_block(s, m, l, prec, use_c)
        if n > 0:
            o.mul_(alpha[:, None])  # alpha is 1 on skipped rows: o kept
        if buf["low"] is None:
            s.copy_(p)  # fp32: P overwrites the logits in the same buffer
            pc = s
        elif packed is None:
            pc = buf["low"][: qb * kvb].view(qb, kvb)
            pc.copy_(p)  # the stored P: one round to nearest even
        else:  # rows of ekvB (an odd block gets a zero column)
            ekvb = kvb + kvb % 2
            pc = buf["low"][: qb * ekvb].view(qb, ekvb)
            pc[:, :kvb] = p
            if ekvb > kvb:
                pc[:, kvb:] = 0
        if packed is None:
            _pv(prec, pc, v[n : n + kvb], o, first=n == 0)
        else:
            ekvb = kvb + kvb % 2
            vp = packed.value[h, n // ks * packed.eks * d :]
            _brgemm_call(prec, qb, d, ekvb, ekvb, d, d, n > 0, pc, vp, o)
    return m, l, o.clone()
