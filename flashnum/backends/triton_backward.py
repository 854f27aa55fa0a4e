"""The real backward kernel: FlashAttention-2's backward in Triton, with flashnum's knobs.

    from flashnum.backends.triton_backward import attention_backward_triton, compare_backward
    g = attention_backward_triton(q, k, v, do, precision="bf16", block_m=32, block_n=32,
                                  causal=False, dq_order="forward", out=None, lse=None)
    g.dq, g.dk, g.dv, g.delta        # float64, as flashnum.attention_backward returns them
    table = compare_backward(q, k, v, do, block_m=32, block_n=32)   # kernel vs emulator

The structure of Triton's fused-attention tutorial (python/tutorials/06-fused-attention.py,
`_attn_bwd_preprocess`, `_attn_bwd_dkdv`, `_attn_bwd_dq`):

    _bwd_preprocess   D = rowsum(O * dO) in fp32, one program per query block
    _bwd_dkdv         one program per key block: for every query block, P = exp(s - L)
                      (s = scale * Q K^T in fp32, L the stored fp32 LSE), dV += cast(P)^T dO,
                      dP = dO V^T, dS = P (dP - D), dK += cast(dS)^T Q; dK *= scale
    _bwd_dq           one program per query block: for every key block in `dq_order` (on a
                      GPU, the order flash-attn's atomic adds happen to take), dQ += cast(dS) K;
                      dQ *= scale

Knobs, as the forward kernel's (flashnum.backends.triton): block_m, block_n, the P and dS
cast formats (`p_cast`, `ds_cast`: bf16, fp16 or fp32 for fp32 inputs), the output
format, the dQ accumulation order, causal (bottom-right aligned), and exp2 (P = exp2(S2 -
L2): log2 e folded into the fp32 scale and the LSE, as flashnum.attention_backward's
exp2=True; the tutorial folds it into K instead, not done here). The forward is
flashnum's Triton forward kernel unless `out` and `lse` are given.

Devices: without a CUDA GPU the kernels run on Triton's CPU interpreter (importing this
module sets TRITON_INTERPRET=1 there, through flashnum.backends.triton); with one they
run on it (inputs of any device are rounded on the host, moved to cuda, stored in the
input dtype; the gradients come back as float64 on the inputs' device). The GPU path is
written, not yet measured (no GPU here): bench/backward_gpu.py is its check.

On the CPU interpreter the forward kernel's fixes apply (the same helpers): bf16 tensors
travel as fp32 (exact) so that tl.dot multiplies values, not bit patterns, and bf16 casts
round to nearest even on the fp32 bits (`_round_rne`). What still differs from the
emulator by construction: numpy's float32 exp (not correctly rounded; <= 2 ulps of fp32)
and numpy's summation order inside each dot. `acc = tl.dot(a, b, acc)` is a matmul then
an add here, the same two fp32 roundings as the emulator's tile product stored in the
accumulator's format and then added.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# first: without a CUDA GPU it sets TRITON_INTERPRET=1 before triton is imported
from flashnum.backends.triton_kernel import _TORCH, INTERPRET, _cast, _dot, _round_rne  # isort: skip
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from flashnum.engine.backward import check_backward
from flashnum.engine.call import backward_call_of
from flashnum.engine.result import Gradients
from flashnum.numerics.constants import LOG2E
from flashnum.numerics.formats import get_format
from flashnum.numerics.policy import make_backward_policy
from flashnum.numerics.tiling import key_block_order, n_blocks

PRECISIONS = ("bf16", "fp16", "fp32")


@triton.jit
def _bwd_preprocess(O, DO, DELTA, Nq, stride_z, stride_m, DV: tl.constexpr,
                    HEAD_DIM_V: tl.constexpr, BLOCK_M: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    z = tl.program_id(1).to(tl.int64)
    offs_dv = tl.arange(0, HEAD_DIM_V)
    mask = (offs_m[:, None] < Nq) & (offs_dv[None, :] < DV)
    ptr = z * stride_z + offs_m[:, None] * stride_m + offs_dv[None, :]
    o = tl.load(O + ptr, mask=mask, other=0.0).to(tl.float32)
    do = tl.load(DO + ptr, mask=mask, other=0.0).to(tl.float32)
    tl.store(DELTA + z * Nq + offs_m, tl.sum(o * do, 1), mask=offs_m < Nq)


@triton.jit
def _keep(offs_m, cols, Nq, Nk, CAUSAL: tl.constexpr):
    """The (query, key) entries of a tile that are inside the matrices and, when causal,
    on or below the bottom-right diagonal: the logits kept, every other one -inf."""
    keep = (cols[None, :] < Nk) & (offs_m[:, None] < Nq)
    if CAUSAL:
        keep = keep & (cols[None, :] <= offs_m[:, None] + (Nk - Nq))
    return keep


@triton.jit
def _p_and_ds(q, k_t, v_t, do, lse, delta, keep, s_scale, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, USE_EXP2: tl.constexpr, EMULATE: tl.constexpr):
    """P (fp32) and dS (fp32) of one (query block, key block) tile, -inf logits outside
    `keep` (_keep); with USE_EXP2 the logits, s_scale and the LSE are in log2 units."""
    s = _dot(q, k_t, tl.zeros([BLOCK_M, BLOCK_N], tl.float32), "ieee", EMULATE, None)
    s = s * s_scale
    s = tl.where(keep, s, float("-inf"))
    if USE_EXP2:
        p = tl.exp2(s - lse[:, None])
    else:
        p = tl.exp(s - lse[:, None])
    dp = _dot(do, v_t, tl.zeros([BLOCK_M, BLOCK_N], tl.float32), "ieee", EMULATE, None)
    ds = p * (dp - delta[:, None])
    return p, ds


@triton.jit
def _bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV_OUT, qk_scale, s_scale, Nq, Nk, n_qb,
              stride_qz, stride_qm, stride_kz, stride_kn, stride_vz, stride_vn,
              D: tl.constexpr, DV: tl.constexpr, HEAD_DIM: tl.constexpr,
              HEAD_DIM_V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              CAUSAL: tl.constexpr, P_FORMAT: tl.constexpr, DS_FORMAT: tl.constexpr,
              OUT_FORMAT: tl.constexpr, USE_EXP2: tl.constexpr, EMULATE: tl.constexpr):
    start_n = tl.program_id(0) * BLOCK_N
    z = tl.program_id(1).to(tl.int64)
    cols = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_dv = tl.arange(0, HEAD_DIM_V)
    k_t = tl.load(K + z * stride_kz + cols[None, :] * stride_kn + offs_d[:, None],
                  mask=(cols[None, :] < Nk) & (offs_d[:, None] < D), other=0.0)
    v_t = tl.load(V + z * stride_vz + cols[None, :] * stride_vn + offs_dv[:, None],
                  mask=(cols[None, :] < Nk) & (offs_dv[:, None] < DV), other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM_V], tl.float32)
    for qb in range(0, n_qb):
        offs_m = qb * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = offs_m < Nq
        q = tl.load(Q + z * stride_qz + offs_m[:, None] * stride_qm + offs_d[None, :],
                    mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0)
        do = tl.load(DO + z * Nq * DV + offs_m[:, None] * DV + offs_dv[None, :],
                     mask=row_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
        lse = tl.load(LSE + z * Nq + offs_m, mask=row_ok, other=0.0)
        delta = tl.load(DELTA + z * Nq + offs_m, mask=row_ok, other=0.0)
        keep = _keep(offs_m, cols, Nq, Nk, CAUSAL)
        p, ds = _p_and_ds(q, k_t, v_t, do, lse, delta, keep, s_scale, BLOCK_M, BLOCK_N,
                          USE_EXP2, EMULATE)
        p_c = _cast(p, P_FORMAT, DO.dtype.element_ty, EMULATE)
        dv = _dot(tl.trans(p_c), do, dv, "ieee", EMULATE, None)
        ds_c = _cast(ds, DS_FORMAT, Q.dtype.element_ty, EMULATE)
        dk = _dot(tl.trans(ds_c), q, dk, "ieee", EMULATE, None)
    dk = dk * qk_scale
    if OUT_FORMAT == "bf16" and EMULATE:
        dk = _round_rne(dk, 16)
        dv = _round_rne(dv, 16)
    tl.store(DK + z * Nk * D + cols[:, None] * D + offs_d[None, :],
             dk.to(DK.dtype.element_ty), mask=(cols[:, None] < Nk) & (offs_d[None, :] < D))
    tl.store(DV_OUT + z * Nk * DV + cols[:, None] * DV + offs_dv[None, :],
             dv.to(DV_OUT.dtype.element_ty),
             mask=(cols[:, None] < Nk) & (offs_dv[None, :] < DV))


@triton.jit
def _bwd_dq(Q, K, V, DO, LSE, DELTA, DQ, ORDER, qk_scale, s_scale, Nq, Nk, n_kb,
            stride_qz, stride_qm, stride_kz, stride_kn, stride_vz, stride_vn,
            D: tl.constexpr, DV: tl.constexpr, HEAD_DIM: tl.constexpr,
            HEAD_DIM_V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            CAUSAL: tl.constexpr, DS_FORMAT: tl.constexpr, OUT_FORMAT: tl.constexpr,
            USE_EXP2: tl.constexpr, EMULATE: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    z = tl.program_id(1).to(tl.int64)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_dv = tl.arange(0, HEAD_DIM_V)
    row_ok = offs_m < Nq
    q = tl.load(Q + z * stride_qz + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0)
    do = tl.load(DO + z * Nq * DV + offs_m[:, None] * DV + offs_dv[None, :],
                 mask=row_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
    lse = tl.load(LSE + z * Nq + offs_m, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + z * Nq + offs_m, mask=row_ok, other=0.0)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for step in range(0, n_kb):
        kb = tl.load(ORDER + step)
        cols = kb * BLOCK_N + tl.arange(0, BLOCK_N)
        k_t = tl.load(K + z * stride_kz + cols[None, :] * stride_kn + offs_d[:, None],
                      mask=(cols[None, :] < Nk) & (offs_d[:, None] < D), other=0.0)
        v_t = tl.load(V + z * stride_vz + cols[None, :] * stride_vn + offs_dv[:, None],
                      mask=(cols[None, :] < Nk) & (offs_dv[:, None] < DV), other=0.0)
        keep = _keep(offs_m, cols, Nq, Nk, CAUSAL)
        p, ds = _p_and_ds(q, k_t, v_t, do, lse, delta, keep, s_scale, BLOCK_M, BLOCK_N,
                          USE_EXP2, EMULATE)
        ds_c = _cast(ds, DS_FORMAT, Q.dtype.element_ty, EMULATE)
        dq = _dot(ds_c, tl.trans(k_t), dq, "ieee", EMULATE, None)
    dq = dq * qk_scale
    if OUT_FORMAT == "bf16" and EMULATE:
        dq = _round_rne(dq, 16)
    tl.store(DQ + z * Nq * D + offs_m[:, None] * D + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=row_ok[:, None] & (offs_d[None, :] < D))


DEVICE = torch.device("cpu") if INTERPRET else torch.device("cuda")


def _storage(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """x (float64, values of fmt) in the kernel's storage dtype (bf16 as fp32 on the
    interpreter, whose bf16 dot multiplies bit patterns), on the kernel's device."""
    if INTERPRET and fmt == "bf16":
        return x.to(torch.float32).to(DEVICE).contiguous()
    return x.to(_TORCH[fmt]).to(DEVICE).contiguous()


@dataclass(frozen=True)
class BackwardKernel:
    """The constexprs of the three launches, as the policy sets them: the tiles, the mask,
    the formats P and dS are cast to before their dots, the gradients' stored format, and
    exp2 (the logits and the LSE in log2 units)."""

    block_m: int
    block_n: int
    causal: bool
    p_format: str
    ds_format: str
    out_format: str
    exp2: bool = False


def backward_kernels(q3, k3, v3, do3, o3, lse32, order, qk_scale, s_scale,
                     kernel: BackwardKernel):
    """The three launches on prepared (Z, N, .) tensors of the kernel's device: q3, k3,
    v3, do3, o3 stored (_storage), lse32 the fp32 LSE (log2 units with exp2, 0 on masked
    rows), order int32 key blocks in dQ's order, qk_scale the fp32 scale of dK and dQ,
    s_scale that of the logits (times log2 e with exp2). Returns delta, dq, dk, dv in the
    output's storage dtype (what bench/backward_gpu.py times)."""
    block_m, block_n, out_format = kernel.block_m, kernel.block_n, kernel.out_format
    Z, nq, d = q3.shape
    nk, dv = k3.shape[1], v3.shape[-1]
    n_qb, n_kb = n_blocks(nq, block_m), n_blocks(nk, block_n)
    hd, hdv = triton.next_power_of_2(d), triton.next_power_of_2(dv)
    dev = q3.device
    delta = torch.empty(Z, nq, dtype=torch.float32, device=dev)
    _bwd_preprocess[(n_qb, Z)](o3, do3, delta, nq, o3.stride(0), o3.stride(1), DV=dv,
                               HEAD_DIM_V=hdv, BLOCK_M=block_m)
    out_dtype = torch.float32 if (INTERPRET and out_format == "bf16") else _TORCH[out_format]
    dq = torch.empty(Z, nq, d, dtype=out_dtype, device=dev)
    dk = torch.empty(Z, nk, d, dtype=out_dtype, device=dev)
    dvv = torch.empty(Z, nk, dv, dtype=out_dtype, device=dev)
    strides = (q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), v3.stride(0),
               v3.stride(1))
    common = dict(D=d, DV=dv, HEAD_DIM=hd, HEAD_DIM_V=hdv, BLOCK_M=block_m, BLOCK_N=block_n,
                  CAUSAL=bool(kernel.causal), DS_FORMAT=kernel.ds_format,
                  OUT_FORMAT=out_format, USE_EXP2=bool(kernel.exp2), EMULATE=INTERPRET)
    _bwd_dkdv[(n_kb, Z)](q3, k3, v3, do3, lse32, delta, dk, dvv, qk_scale, s_scale, nq, nk,
                         n_qb, *strides, P_FORMAT=kernel.p_format, **common)
    _bwd_dq[(n_qb, Z)](q3, k3, v3, do3, lse32, delta, dq, order, qk_scale, s_scale, nq, nk,
                       n_kb, *strides, **common)
    return delta, dq, dk, dvv


# what the kernels take beside precision, policy and the blocks, with flashnum's defaults
# (flashnum.engine.call.BackwardCall): causal, scale, dq_order, seed, out, lse, exp2
OPTIONS = ("causal", "scale", "dq_order", "seed", "out", "lse", "exp2")


def attention_backward_triton(q, k, v, do, *, precision="bf16", policy="fa2", block_m=32,
                              block_n=32, **options) -> Gradients:
    """dQ, dK, dV by the Triton kernels (see the module docstring). options: OPTIONS, as
    flashnum.attention_backward takes them (out, lse: the forward's, else recomputed by
    flashnum.backends.triton.attention_triton)."""
    bad = sorted(set(options) - set(OPTIONS))
    if bad:  # what a signature listing them would refuse
        raise TypeError(f"attention_backward_triton() got an unexpected keyword argument "
                        f"{bad[0]!r}")
    call = backward_call_of(q, k, v, do, precision=precision, policy=policy, block_m=block_m,
                            block_n=block_n, **options)
    check_backward(call)
    if call.causal == "top_left":  # the kernels write the bottom-right rule out themselves
        raise ValueError("causal='top_left' is not supported by backend 'triton' (its "
                         "kernels are bottom-right aligned); valid there: False, True, "
                         "'bottom_right'")
    causal, scale, seed = call.causal, call.scale, call.seed
    dq_order, out, lse = call.dq_order, call.out, call.lse
    exp2 = options.get("exp2", False)  # as given (a numpy bool stays one in info)
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r} not in the kernel; valid: "
                         f"{', '.join(PRECISIONS)}")
    pol = make_backward_policy(policy, precision)
    if pol.structure != "flash" or pol.name not in ("fa2", "custom"):
        raise ValueError(f"policy {pol.name!r} is not the kernel's; valid: fa2 (or a flash "
                         "BackwardPolicy with fp32 accumulators)")
    for b in (block_m, block_n):
        if b < 16 or b & (b - 1):
            raise ValueError(f"block size {b} not in the kernel; valid: powers of 2 >= 16")
    d, nq, nk, dv = q.shape[-1], q.shape[-2], k.shape[-2], v.shape[-1]
    sc = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if out is None:
        from flashnum.backends.triton import attention_triton

        res = attention_triton(q, k, v, precision=precision, policy=pol.forward,
                               block_m=block_m, block_n=block_n, causal=causal, scale=sc)
        out, lse = res.out, res.lse
    fin, fout = pol.forward.inputs, pol.out
    lead = q.shape[:-2]
    q3, k3, v3 = (_storage(get_format(fin).round(x.detach().cpu().double()).reshape(
        -1, *x.shape[-2:]), fin) for x in (q, k, v))
    do3 = _storage(get_format(pol.do).round(do.detach().cpu().double()).reshape(-1, nq, dv),
                   pol.do)
    o3 = _storage(out.detach().cpu().double().reshape(-1, nq, dv), fout)
    # exp2: the LSE in log2 units, rounded once to fp32 (the emulator's lse site)
    lse32 = (lse.detach().cpu().double() * (LOG2E if exp2 else 1.0)).reshape(-1, nq).to(
        torch.float32)
    lse32 = torch.where(torch.isfinite(lse32), lse32, torch.zeros_like(lse32)).to(
        DEVICE).contiguous()
    qk_scale = float(torch.tensor(sc, dtype=torch.float32))
    s_scale = float(torch.tensor(sc * LOG2E, dtype=torch.float32)) if exp2 else qk_scale
    order = key_block_order(dq_order, 1, n_blocks(nk, block_n), seed)[0]
    delta, dq, dk, dvv = backward_kernels(
        q3, k3, v3, do3, o3, lse32, order.to(torch.int32).to(DEVICE).contiguous(), qk_scale,
        s_scale, BackwardKernel(block_m, block_n, causal, pol.p_cast, pol.ds_cast, fout, exp2))
    home = q.device

    def back(x, *tail):
        return x.to(home, torch.float64).reshape(*lead, *tail)

    masked = torch.isneginf(lse.detach().double()).reshape(*lead, nq).to(home)
    return Gradients(
        dq=back(dq, nq, d), dk=back(dk, nk, d), dv=back(dvv, nk, dv), lse=back(lse32, nq),
        delta=back(delta, nq), out=back(o3, nq, dv), masked=masked,
        ds_rowsum=torch.full((*lead, nq), math.nan, device=home),
        info=dict(backend="triton", precision=precision, block_m=block_m, block_n=block_n,
                  causal=causal, scale=sc, exp2=exp2,
                  dq_order=dq_order if isinstance(dq_order, str) else "permutation"),
    )


def compare_backward(q, k, v, do, **kw) -> dict:
    """Kernel against the emulated backward (the same forward O and LSE given to both), per
    gradient: {"elem": fractions of entries within 0, 1, 2 ulps of the output format at the
    emulator's value and the largest (flashnum.backends.triton.ulp_distribution), "scaled":
    the same in ulps at the gradient's largest entry (entries that cancel to far below
    it move by many of their own ulps for one ulp of an fp32 intermediate)}."""
    from flashnum.backends.triton import ulp_distribution
    from flashnum.engine.backward import backward
    from flashnum.engine.call import backward_call_of, call_of
    from flashnum.engine.emulate import emulate

    precision = kw.get("precision", "bf16")
    fwd = emulate(call_of(q, k, v, precision=precision, block_m=kw.get("block_m", 32),
                          block_n=kw.get("block_n", 32), causal=kw.get("causal", False),
                          scale=kw.get("scale")))
    gk = attention_backward_triton(q, k, v, do, out=fwd.out, lse=fwd.lse, **kw)
    ge = backward(backward_call_of(q, k, v, do, out=fwd.out, lse=fwd.lse, **kw))
    fout = get_format(make_backward_policy(kw.get("policy", "fa2"), precision).out)
    out = {}
    for name in ("dq", "dk", "dv"):
        a, b = getattr(gk, name), getattr(ge, name)
        top = b.abs().max().expand_as(b)
        out[name] = {"elem": ulp_distribution(a - b, fout.ulp(b)),
                     "scaled": ulp_distribution(a - b, fout.ulp(top))}
    return out


__all__ = ["attention_backward_triton", "backward_kernels", "BackwardKernel", "compare_backward",
           "OPTIONS", "PRECISIONS"]
