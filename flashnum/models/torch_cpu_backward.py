"""A model of PyTorch's CPU flash-attention backward (model "torch_cpu"), step for step.

    import flashnum
    g = flashnum.attention_backward(q, k, v, do, precision="bf16", model="torch_cpu",
                                    causal="top_left")  # torch's is_causal
    # or directly: flashnum.models.torch_cpu_backward.attention_backward_torch_cpu(...)

On CPU, autograd through torch.nn.functional.scaled_dot_product_attention runs ATen's
`cpu_flash_attention_backward` (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp, torch
2.13) for fp32, bf16 and fp16. This module repeats it; the forward it reads (O, LSE) is
flashnum.models.torch_cpu's model of `cpu_flash_attention`, bit-exact to the kernel.
Each step names its lines of `cpu_flash_attention_backward` in FlashAttentionKernel.cpp as
of pytorch commit 27a4844d7fb (a listing of a source whose backward is this one; 2.13's
line numbers may be shifted), top to bottom:

  splits    (flash_attention_backward_kernel_impl) query blocks of 256 rows when Nq >= 768,
            64 when Nq >= 192, else 32; key blocks of 512 (or Nk when smaller)
  layout    (the op's wrapper) q, k, v read as (B, H, N, d) tensors, dO made contiguous in
            (B, N, H, d), dQ, dK, dV zero tensors in (B, N, H, d) in the dtype: their
            leading dimensions (d, H d) are the GEMMs' lda/ldb/ldc
  buffers   (889-901, 922-927) per thread: fp32 attn | grad_attn, dtype copies of both
  loop      (918-936, at::parallel_for over B * H) per head, per query block:
  D         (938-945) dsum = vec::map2_reduce_all(x * y, x + y, dO, O): fp32 products rounded, then
            added (not fused) into 16-lane accumulators (bf16/fp16: two, over 32-column
            steps, and the first for a last 16 columns), the lanes folded by the AVX-512
            shuffle tree (i + 8, + 4, + 2, + 1); under 16 (32) columns, in order
  per key block (946-948; up to min(m + qB, Nk) when causal, top-left):
  S         (950-965) attn = gemm(T, N, kvB, qB, d, scale, K, Q): fp32 out, alpha = fl32(scale)
            (MKL's sgemm / gemm_bf16bf16f32 / gemm_f16f16f32, as the forward model calls)
  P         (1002-1009) attn = exp(attn - lse) by vec::map: SLEEF's expf_u10 on every column
            (torch_cpu.c tc_exp_rows; neither torch.exp nor the forward's exp_u20)
  causal    (1011-1017) the diagonal block's columns past row i (i = m + row - n) set to 0 after exp
  P cast    (1021-1029) attn_reduced = P in the dtype (round to nearest even); fp32 keeps P
  dV        (1031-1046) grad_v += gemm(N, T, d, kvB, qB, 1, dO, P_cast): into the dtype tensor
  dP        (1048-1063) grad_attn = gemm(T, N, kvB, qB, d, 1, V, dO): fp32 out (the library call)
  dS        (1065-1073) grad_attn = P * (grad_attn - D): two fp32 roundings (vec::map2)
  dS cast   (1077-1085) grad_attn_reduced = dS in the dtype
  dQ        (1087-1102) grad_q += gemm(N, N, d, qB, kvB, scale, K, dS_cast): into the dtype tensor
  dK        (1104-1119) grad_k += gemm(N, T, d, kvB, qB, scale, Q, dS_cast): into the dtype tensor

dQ, dK, dV accumulate in their own dtype: for bf16 and fp16 each GEMM's
alpha * A B + C is rounded to the dtype after every block (the library's fused sum), a
rounding that fp32-accumulator models (flashnum's fa2) do not make. Those three GEMMs are
at::native::cpublas::gemm itself, reached through torch's addmm_ with operand views whose
strides are the kernel's (addmm_impl_cpu_ passes the same transposes, sizes and leading
dimensions): oneDNN's matmul with a sum post-op for bf16/fp16, MKL's sgemm for fp32. The
two fp32-output GEMMs are MKL's, called through ctypes as the forward model calls them.

Threads: inside the kernel's parallel loop (B * H > 1, more than one thread) every GEMM
runs on one thread; the model runs its GEMMs with OpenMP and MKL set to one thread for
the calling thread (restored after; torch.set_num_threads is never called). With
B * H = 1 the kernel's loop runs on the caller's thread and its GEMMs may use all threads;
so do the model's. Scratch buffers sit at the kernel's offsets (one fp32 and one dtype
buffer per thread), as MKL's result can depend on the operands' alignment.

A caveat of the kernel, not of the model: torch.set_num_threads(n) switches MKL's dynamic
thread adjustment off, and from then on torch's fp32 GEMMs inside the parallel loop split
their work differently: torch's own fp32 dQ, dK, dV change in the last bits. The model
follows torch in its default state (a process that never called torch.set_num_threads, or
one that set 1 thread).
"""

from __future__ import annotations

import ctypes
import math

import numpy as np
import torch

from flashnum.engine.result import Gradients
from flashnum.models.torch_cpu import (
    DTYPES,
    LANES,
    _clib,
    attention_torch_cpu,
    check_alignment,
    split_sizes,
)
from flashnum.models.torch_cpu_exp import _fma
from flashnum.models.torch_cpu_gemm import _mkl, _one_thread

_F32 = torch.float32


# ---------------------------------------------------------------------------
# the steps that are not GEMMs


def normalize_last_dims(trans_a, trans_b, m, n, k, lda, ldb, ldc):
    """cpublas::internal::normalize_last_dims: leading dimensions of size-1 operands."""
    if n == 1:
        ldc = m
    if trans_a != b"N":
        if m == 1:
            lda = k
    elif k == 1:
        lda = m
    if trans_b != b"N":
        if k == 1:
            ldb = n
    elif n == 1:
        ldb = k
    return lda, ldb, ldc


def x_yt(prec, alpha, x, ld_x, y, ld_y, out) -> None:
    """out (R, C) fp32 = alpha x (R, d) @ y (C, d)^T, as the kernel calls it:
    gemm(T, N, C, R, d, alpha, y, ld_y, x, ld_x, 0, out, C), cpublas::gemm with an fp32
    output, i.e. MKL's own entry point for the dtype (sgemm, gemm_bf16bf16f32,
    gemm_f16f16f32). x, y are views into the stored tensors: MKL's sum can depend on
    where they lie."""
    r, d = x.shape
    c = y.shape[0]
    fns = _mkl()
    if fns is None:  # no MKL symbols: torch sums (nearly, not always bit for bit, the same)
        out.copy_(torch.matmul(x.float(), y.float().T) * alpha)
        return
    lda, ldb, ldc = normalize_last_dims(b"T", b"N", c, r, d, ld_y, ld_x, c)
    ci = ctypes.c_int
    fns[prec](ctypes.c_char_p(b"T"), ctypes.c_char_p(b"N"), ctypes.byref(ci(c)),
              ctypes.byref(ci(r)), ctypes.byref(ci(d)), ctypes.byref(ctypes.c_float(alpha)),
              ctypes.c_void_p(y.data_ptr()), ctypes.byref(ci(lda)),
              ctypes.c_void_p(x.data_ptr()), ctypes.byref(ci(ldb)),
              ctypes.byref(ctypes.c_float(0.0)), ctypes.c_void_p(out.data_ptr()),
              ctypes.byref(ci(ldc)))


def rowsum_products(x: torch.Tensor, y: torch.Tensor, prec: str) -> torch.Tensor:
    """vec::map2_reduce_all(x * y, x + y) over the last dim of fp32 (R, d) tensors (the
    values of the dtype), as functional_base.h (fp32) and functional_bfloat16.h (bf16, fp16:
    a 32-column vector converted to two 16-lane halves) add them."""
    d = x.shape[-1]
    width = LANES if prec == "fp32" else 2 * LANES
    prod = x * y  # every product rounded to fp32 (exact for bf16/fp16 values)
    if d < width:  # one partial vector, then lane 0 plus lanes 1.. in order
        acc = prod[:, :LANES].clone() if d > LANES else prod
        if d > LANES:
            acc[:, : d - LANES] = acc[:, : d - LANES] + prod[:, LANES:d]
        total = acc[:, 0].clone()
        for i in range(1, min(d, LANES)):
            total = total + acc[:, i]
        return total
    n_acc = width // LANES
    acc = [prod[:, i * LANES : (i + 1) * LANES].clone() for i in range(n_acc)]
    full = width * (d // width)
    for c0 in range(width, full, width):
        for i in range(n_acc):
            acc[i] = acc[i] + prod[:, c0 + i * LANES : c0 + (i + 1) * LANES]
    for i, c0 in enumerate(range(full, d, LANES)):  # the tail, lane-masked (Vec::set)
        w = min(LANES, d - c0)
        acc[i][:, :w] = acc[i][:, :w] + prod[:, c0 : c0 + w]
    total = acc[0] + acc[1] if n_acc == 2 else acc[0]
    for half in (8, 4, 2, 1):  # VecReduceAllSIMD<float>: the AVX-512 shuffle tree
        total = total[:, :half] + total[:, half : 2 * half]
    return total[:, 0]


_R_LN2 = 1.442695040888963407359924681001892137426645954152985934135449406931
_L2U, _L2L = 0.693145751953125, 1.428606765330187045e-06
_SLEEF_C = (0.000198527617612853646278381, 0.00139304355252534151077271,
            0.00833336077630519866943359, 0.0416664853692054748535156,
            0.166666671633720397949219, 0.5)


def sleef_expf_u10(d: torch.Tensor) -> torch.Tensor:
    """SLEEF's expf_u10 (Vectorized<float>::exp() on AVX-512) on fp32 d, elementwise: the
    torch twin of torch_cpu.c's sleef_expf_u10 (FMAs evaluated exactly by _fma)."""
    def f32(x):
        return torch.tensor(x, dtype=_F32)
    dc = torch.nan_to_num(d.clamp(-110.0, 110.0), nan=0.0)  # keeps the int conversion defined
    q = torch.round(dc * f32(_R_LN2))  # rint: nearest, ties to even
    s = _fma(q, f32(-_L2U), dc)
    s = _fma(q, f32(-_L2L), s)
    u = torch.full_like(d, float(f32(_SLEEF_C[0])))
    for c in _SLEEF_C[1:]:
        u = _fma(u, s, float(f32(c)))
    u = 1.0 + _fma(s * s, u, s)
    qi = q.to(torch.int32)
    h = qi >> 1
    u = (u * ((h + 127) << 23).view(_F32)) * ((qi - h + 127) << 23).view(_F32)
    u = torch.where(d < -104.0, torch.zeros_like(u), u)
    u = torch.where(d > 100.0, torch.full_like(u, math.inf), u)
    return torch.where(torch.isnan(d), d, u)


def exp_rows(a: torch.Tensor, lse: torch.Tensor, use_c: bool = True) -> None:
    """a (R, n) fp32 <- exp(a - lse[row]) in place, as the kernel's vec::map."""
    lib = _clib() if use_c else None
    if lib is not None:
        f = lib.tc_exp_rows
        f.restype, f.argtypes = None, [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                       ctypes.c_void_p]
        lse = lse.contiguous()
        f(a.data_ptr(), a.shape[0], a.shape[1], lse.data_ptr())
        return
    a.copy_(sleef_expf_u10(a - lse[:, None]))


# ---------------------------------------------------------------------------
# the kernel


def kernel_causal(causal, nq: int, nk: int) -> bool:
    """Whether the kernel's causal mask applies. Its mask is top-left (torch's is_causal:
    query i sees keys 0..i). "top_left" names it; flashnum.attention_backward refuses True
    (bottom-right there, as for every policy) where Nq != Nk, so True reaches this
    function from it only where the masks coincide. "bottom_right"
    (flashnum's alignment for the other policies: query i sees keys 0..i + Nk - Nq) is the
    same mask only when Nq = Nk, and otherwise one the kernel cannot compute."""
    if isinstance(causal, (bool, np.bool_)):
        return bool(causal)
    if causal == "top_left":
        return True
    if causal == "bottom_right":
        if nq == nk:
            return True
        raise ValueError(
            f"model torch_cpu models torch's is_causal, whose mask is top-left; with Nq = "
            f"{nq} != Nk = {nk} causal='bottom_right' is another mask: pass causal=True or "
            "'top_left' for torch's, or False")
    raise ValueError(f"unknown causal {causal!r}; valid: False, True (the kernel's top-left "
                     "mask), 'top_left', 'bottom_right' (Nq = Nk only)")


def backward(call) -> Gradients:
    """The model on a checked backward call (flashnum.models.MODELS["torch_cpu"]): one
    kernel, so exp2=False and rounding='nearest' only; top-left as torch's is_causal."""
    check_alignment(call)
    if call.exp2 or call.rounding != "nearest":
        raise ValueError("model torch_cpu models one kernel: exp2=False and "
                         f"rounding='nearest' only, got exp2={call.exp2!r}, "
                         f"rounding={call.rounding!r}")
    return attention_backward_torch_cpu(call.q, call.k, call.v, call.do, precision=call.precision,
                                        causal=call.causal, scale=call.scale, out=call.out,
                                        lse=call.lse, measure_ds=call.measure_ds)


def attention_backward_torch_cpu(q, k, v, do, *, precision="bf16", causal=False, scale=None,
                                 out=None, lse=None, measure_ds=False, threads=None,
                                 use_c=True) -> Gradients:
    """dQ, dK, dV as autograd through torch's CPU SDPA computes them, for q, k, v, do
    (..., H, N, d) stored in `precision` (fp32, bf16, fp16; one rounding to nearest).

    out, lse: the forward's O (..., Nq, d) and fp32 LSE (..., Nq); by default flashnum's
    torch_cpu forward, which equals torch's bit for bit. causal: False, True or "top_left"
    (torch's is_causal, as the torch_cpu forward takes True), "bottom_right" when Nq = Nk
    (kernel_causal).
    threads: the kernel's at::get_num_threads() (which scratch buffer each head uses);
    by default torch.get_num_threads() of this process. use_c=False takes the torch twin
    of the exp (the same values, slower)."""
    if precision not in DTYPES:
        raise ValueError(f"model torch_cpu models precision fp32, bf16 or fp16, not "
                         f"{precision!r}")
    dtype = DTYPES[precision]
    lead, nq, nk, d = q.shape[:-2], q.shape[-2], k.shape[-2], q.shape[-1]
    if v.shape[-1] != d:
        raise ValueError(f"model torch_cpu needs equal head dims (the kernel's), got {d} "
                         f"and {v.shape[-1]}")
    top_left = kernel_causal(causal, nq, nk)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    alpha = float(torch.tensor(scale, dtype=_F32))  # accum_t scaling_factor
    h_count = lead[-1] if len(lead) else 1
    b_count = math.prod(lead[:-1]) if len(lead) > 1 else 1

    def stored(x, n):  # (B, H, N, d) in the dtype, one rounding from the caller's values
        x = x.detach().to("cpu")
        if x.dtype is torch.float64 and dtype is not torch.float32:
            from flashnum.numerics.formats import get_format
            x = get_format(precision).round(x).float()
        return x.to(dtype).reshape(b_count, h_count, n, d).contiguous()

    q4, k4, v4, do4 = stored(q, nq), stored(k, nk), stored(v, nk), stored(do, nq)
    variant = "fa2" if out is None else "given"
    if out is None:
        res = attention_torch_cpu(q4, k4, v4, precision=precision, causal=top_left,
                                  scale=scale)
        out, lse = res.out, res.lse
    o4 = out.detach().to("cpu", torch.float64).to(dtype).reshape(b_count, h_count, nq, d)
    lse3 = lse.detach().to("cpu", torch.float64).to(_F32).reshape(b_count, h_count, nq)
    threads = torch.get_num_threads() if threads is None else int(threads)
    grads = _run(precision, q4, k4, v4, do4, o4, lse3, top_left, alpha, measure_ds, threads,
                 use_c)
    dq, dk, dv, delta, ds_rowsum = grads
    qs, ks = split_sizes(nq, nk)

    def shaped(x, n):
        return x.transpose(1, 2).to(torch.float64).reshape(*lead, n, d)

    return Gradients(
        dq=shaped(dq, nq), dk=shaped(dk, nk), dv=shaped(dv, nk),
        lse=lse3.to(torch.float64).reshape(*lead, nq),
        delta=delta.to(torch.float64).reshape(*lead, nq),
        out=o4.to(torch.float64).reshape(*lead, nq, d),
        masked=torch.zeros(*lead, nq, dtype=torch.bool),  # top-left: row i sees key 0
        ds_rowsum=None if ds_rowsum is None else ds_rowsum.to(torch.float64).reshape(
            *lead, nq),
        info=dict(precision=precision, model="torch_cpu", structure="flash", block_m=qs,
                  block_n=ks, order="forward", dq_order="forward",
                  causal="top_left" if top_left else False, scale=scale, rounding="nearest",
                  seed=0, exp2=False, variant=variant),
    )


def _run(prec, q4, k4, v4, do4, o4, lse3, causal, alpha, measure_ds, threads, use_c):
    """The kernel's loop on (B, H, N, d) dtype tensors; returns dq, dk, dv as (B, N, H, d)
    dtype tensors, D (B, H, Nq) and the rowsum of dS as cast (or None)."""
    dtype = DTYPES[prec]
    b_count, h_count, nq, d = q4.shape
    nk = k4.shape[2]
    qs, ks = split_sizes(nq, nk)
    go = do4.transpose(1, 2).contiguous()  # grad_out.contiguous() of the (B, N, H, d) view
    o_t = o4.transpose(1, 2)  # the forward's output, (B, N, H, d) in memory; D reads rows
    gq = torch.zeros(b_count, nq, h_count, d, dtype=dtype)
    gk = torch.zeros(b_count, nk, h_count, d, dtype=dtype)
    gv = torch.zeros(b_count, nk, h_count, d, dtype=dtype)
    delta = torch.empty(b_count, h_count, nq, dtype=_F32)
    ds_rowsum = torch.zeros(b_count, h_count, nq, dtype=_F32) if measure_ds else None
    tasks = b_count * h_count
    # at::parallel_for runs one head on the caller's thread, GEMMs on all its threads
    inline_threaded = tasks == 1 and threads > 1
    threads = max(1, min(threads, tasks))
    chunk = -(-tasks // threads)
    buf = torch.empty(threads, 2 * qs * ks, dtype=_F32)  # attn | grad_attn, per thread
    buf_low = None if prec == "fp32" else torch.empty(threads, 2 * qs * ks, dtype=dtype)
    ld_go = h_count * d
    with _one_thread(not inline_threaded):
        for task in range(tasks):
            b, h = divmod(task, h_count)
            t = task // chunk  # the thread at::parallel_for gives this head
            for m in range(0, nq, qs):
                qb = min(qs, nq - m)
                qm, gom = q4[b, h, m : m + qb], go[b, m : m + qb, h]
                dsum = rowsum_products(gom.float(), o_t[b, m : m + qb, h].float(), prec)
                delta[b, h, m : m + qb] = dsum
                num_keys = min(m + qb, nk) if causal else nk
                for n in range(0, num_keys, ks):
                    kvb = min(ks, nk - n)
                    kn, vn = k4[b, h, n : n + kvb], v4[b, h, n : n + kvb]
                    attn = buf[t, : qb * kvb].view(qb, kvb)
                    grad_attn = buf[t, qs * ks : qs * ks + qb * kvb].view(qb, kvb)
                    # -- attn <- scale * q @ k.T, then exp(attn - lse) --
                    x_yt(prec, alpha, qm, d, kn, d, attn)
                    exp_rows(attn, lse3[b, h, m : m + qb], use_c)
                    if causal and num_keys - n <= ks:  # zero past the diagonal
                        last = m + torch.arange(qb)[:, None] - n
                        attn.masked_fill_(torch.arange(kvb)[None, :] > last, 0.0)
                    p_c = attn
                    if buf_low is not None:
                        p_c = buf_low[t, : qb * kvb].view(qb, kvb)
                        p_c.copy_(attn)  # round to nearest even
                    # -- grad_v += attn.T @ grad_out --
                    gv[b, n : n + kvb, h].addmm_(p_c.T, gom)
                    # -- grad_attn <- grad_out @ v.T, then attn * (grad_attn - dsum) --
                    x_yt(prec, 1.0, gom, ld_go, vn, d, grad_attn)
                    grad_attn.sub_(dsum[:, None]).mul_(attn)
                    ds_c = grad_attn
                    if buf_low is not None:
                        ds_c = buf_low[t, qs * ks : qs * ks + qb * kvb].view(qb, kvb)
                        ds_c.copy_(grad_attn)
                    if ds_rowsum is not None:
                        ds_rowsum[b, h, m : m + qb] += ds_c.float().sum(-1)
                    # -- grad_q += scale * grad_attn @ k; grad_k += scale * grad_attn.T @ q --
                    gq[b, m : m + qb, h].addmm_(ds_c, kn, alpha=alpha)
                    gk[b, n : n + kvb, h].addmm_(ds_c.T, qm, alpha=alpha)
    return gq, gk, gv, delta, ds_rowsum
