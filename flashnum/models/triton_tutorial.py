"""A model of the Triton tutorial's fused attention (model "triton_tutorial"), both passes.

    import flashnum
    res = flashnum.attention(q, k, v, precision="fp16", model="triton_tutorial", causal=True)
    g = flashnum.attention_backward(q, k, v, do, precision="fp16", model="triton_tutorial",
                                    causal=True)
    # or directly: forward(q, k, v, ...) -> (Result, M); backward(q, k, v, do, o, M, ...)

triton-lang/triton's python/tutorials/06-fused-attention.py (its 2025-2026 form, tensor
descriptors in the forward, pointers in the backward) in fp16, step for step. "tutorial
L123" below names the line of that file at upstream's #8853 (facebookexperimental/triton
f0504daf), where each modelled step is written.

Forward (`_attn_fwd`, `_attn_fwd_inner`; the tile its test pins, BLOCK_M 128, BLOCK_N 64):
flashnum's blocked recurrence with variant exp2 and exp2_scale "twice" is this kernel's
arithmetic (qk_scale = fl32(fl32(sm_scale) * fl32(1.44269504)), L220-221; the max taken
before scaling, L80; P = exp2(qk * qk_scale - m) summed into l in fp32, L82-85; P cast to
fp16 for P @ V, L101-103; acc / l, L244). Its causal stages (L227-241: the key blocks left
of the diagonal unmasked, then the two 64-key blocks of the diagonal with -1.0e6 added
where a key is not seen, L74-78) give the same values as the masked loop: a positive scale
keeps the row max, and exp2 of -1.0e6 - m is 0 as exp2(-inf) is. The epilogue stores
M = m + log2(l) in fp32, log2 units (L243): what the backward reads.

Backward (`_attention.backward`, L589-630; `_attn_bwd` L368-514):
  host      arg_k = k * (sm_scale * RCP_LN2), an fp16 tensor (L602-604): torch multiplies
            in fp32 and rounds to fp16, so K carries sm_scale log2(e) and its rounding
  delta     D = rowsum(o * do): fp16 o times fp32 do, summed in fp32 (L250-264)
  dK, dV    per key block of BLOCK_N1 = 128 (L416-465): when causal, first the diagonal
            in query steps of BLOCK_M1 / BLK_SLICE_FACTOR = 16 rows under the mask
            (L429-443), then the query rows below in steps of BLOCK_M1 = 32 (L446-457);
            one step (`_attn_bwd_dkdv`, L290-316): S^T = arg_k q^T in fp32,
            P^T = exp2(S^T - M), masked to 0; dV += fp16(P^T) dO; dP^T = V dO^T;
            dS^T = P^T (dP^T - D), cast to fp16; dK += dS^T Q
  dQ        per query block of BLOCK_M2 = 128 (L468-514): when causal, first the diagonal
            in key steps of BLOCK_N2 / BLK_SLICE_FACTOR = 16 under the mask (L482-498),
            then the keys left of it from left to right in steps of BLOCK_N2 = 32
            (L500-510); one step (`_attn_bwd_dq`, L344-364): S = Q arg_k^T, P = exp2(S - M),
            dP = dO V^T, dS = fp16(P (dP - D)), dQ += dS arg_k
  stores    dK *= fl32(sm_scale) (L463), dQ *= fl32(ln 2) (L513), in fp32; dQ, dK, dV
            stored as fp16 (round to nearest even)

Arithmetic as flashnum's engine has it (flashnum.engine.arith): fp32 operations on fp32
tensors, each rounded once; exp2 and log2 correctly rounded; a dot of fp16 operands
accumulated in fp32 by torch's matmul and its product rounded to fp32 before it is added
to the accumulator (`tl.dot(a, b, acc)` as the interpreter runs it: matmul, then add);
row sums by torch's fp32 sum. A GPU's ex2.approx, its MMA's accumulation order and the
interpreter's numpy exp2 and np.sum are other arithmetic: docs/audit.md measures them.

Where the tutorial stops, the model goes on by masking (no kernel to compare with there):
its backward asserts N % 128 == 0 (its forward would write M past the end), here a ragged
N is padded and the padding masked (P = 0), as a bounds-checked kernel would; it takes one
sequence length, here Nq != Nk runs with flashnum's bottom-right causal mask, every block
visited in the plain steps (no diagonal stage), rows that see no key giving zero
gradients. fp16 only and scale > 0 (ValueError otherwise). block_m, block_n, order and
variant of the public calls do not apply (the kernel's own blocks).
"""

from __future__ import annotations

import math

import torch

from flashnum.engine.arith import Arith
from flashnum.engine.call import Call
from flashnum.engine.flash import flash
from flashnum.engine.result import Gradients, Result
from flashnum.engine.variants import Exp2
from flashnum.numerics.formats import FORMATS
from flashnum.numerics.policy import make_policy
from flashnum.numerics.tiling import visible

BLOCK_M, BLOCK_N = 128, 64  # the forward's tile (the configuration its pytest run pins)
BLOCK_M1, BLOCK_N1 = 32, 128  # dK, dV: query steps of 32 rows for a key block of 128
BLOCK_M2, BLOCK_N2 = 128, 32  # dQ: key steps of 32 for a query block of 128
BLK_SLICE_FACTOR = 2  # the diagonal's steps are 32 / 2 = 16 wide
RCP_LN2 = 1.4426950408889634  # host constant, float64 (L602)
LN2 = 0.6931471824645996  # the kernel's constexpr: fl32(ln 2) exactly (L395)
PRECISIONS = ("fp16",)
FP16, FP32 = FORMATS["fp16"], FORMATS["fp32"]


def check(q, k, precision: str, scale: float, causal) -> bool:
    """What the tutorial's kernels take: fp16 and a positive scale; the mask as a bool.
    causal: True or "bottom_right" (flashnum's alignment), False, or "top_left" where
    Nq == Nk (the same mask then; the tutorial has one sequence length)."""
    if precision not in PRECISIONS:
        raise ValueError(f"model 'triton_tutorial' models the fp16 kernels; precision "
                         f"{precision!r} is not valid; valid: {', '.join(PRECISIONS)}")
    if not scale > 0:
        raise ValueError(f"model 'triton_tutorial' needs scale > 0 (the kernel takes the "
                         f"row max before scaling), got {scale!r}")
    if isinstance(causal, str):
        if causal == "bottom_right" or (causal == "top_left" and q.shape[-2] == k.shape[-2]):
            return True
        raise ValueError(f"model 'triton_tutorial' takes causal {causal!r} only where Nq "
                         f"== Nk (here {q.shape[-2]}, {k.shape[-2]}); valid: False, True, "
                         "'bottom_right'")
    return bool(causal)


def _fp16(x: torch.Tensor) -> torch.Tensor:
    """x as an fp16 tensor holds it, on an fp32 carrier (B, N, d): rounded once to nearest."""
    x = x.detach().to("cpu")
    if x.dtype is not torch.float16:
        x = FP16.round(x.to(torch.float64))
    return x.to(torch.float32).reshape(-1, *x.shape[-2:])


def forward(q, k, v, *, causal: bool = False, scale: float | None = None,
            precision: str = "fp16") -> tuple[Result, torch.Tensor]:
    """The tutorial's forward: (Result, M) with M = m + log2(l), (..., N) fp32 values."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    causal = check(q, k, precision, scale, causal)
    pol = make_policy("fa2", "fp16")
    res = flash(Call(q, k, v, precision="fp16", policy=pol, block_m=BLOCK_M, block_n=BLOCK_N,
                     variant=Exp2(exp2_scale="twice"), causal=causal, scale=scale), pol)
    # epilogue, L243: m_i += log2(l_i) in fp32 (m, l in log2 units, fp32 values)
    m32, l32 = res.m.to(torch.float32), res.l.to(torch.float32)
    M = m32 + torch.log2(l32.double()).float()
    res.info = dict(precision=precision, model="triton_tutorial", block_m=BLOCK_M,
                    block_n=BLOCK_N, order="forward", variant="exp2", causal=causal,
                    scale=scale, rounding="nearest", seed=0)
    return res, M.double()


def _f32(x: float) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64).float()  # a float64 number rounded once


def _exp2(ar: Arith, x: torch.Tensor) -> torch.Tensor:
    return ar.exp(x, FP32, base2=True)  # correctly rounded exp2 into fp32


def _steps(x: torch.Tensor, step: int, dim: int) -> torch.Tensor:
    """Split `dim` (a multiple of step) into steps, the step index moved to dim 1."""
    shape = list(x.shape)
    shape[dim:dim + 1] = [shape[dim] // step, step]
    return x.reshape(shape).movedim(dim, 1)


def _accumulate(acc: torch.Tensor, products: torch.Tensor) -> torch.Tensor:
    """acc += products[:, 0]; acc += products[:, 1]; ... in fp32, in step order (each
    product already an fp32 matmul: `acc += tl.dot(a, b)`, two roundings per step)."""
    for t in range(products.shape[1]):
        acc = acc + products[:, t]
    return acc


def _dkdv_rows(ar, k_blk, v_blk, q16, do16, M, D, rows: slice, step: int, seenT):
    """`_attn_bwd_dkdv` (L281-317) over query rows `rows` in steps of `step`: the fp32
    products dS^T Q and fp16(P^T) dO of each step, (B, steps, BLOCK_N1, d)."""
    q_r, do_r = q16[:, rows], do16[:, rows]
    qkT = k_blk @ q_r.transpose(-1, -2)  # L295: fp32 accumulation of fp16 values
    pT = _exp2(ar, qkT - M[:, None, rows])  # L296
    pT = torch.where(seenT, pT, 0.0)  # L298-300 (no-op off the diagonal)
    ppT = pT.half().float()  # L303-304
    dv = _steps(ppT, step, 2) @ _steps(do_r, step, 1)  # L305, per step
    dpT = v_blk @ do_r.transpose(-1, -2)  # L309
    dsT = (pT * (dpT - D[:, None, rows])).half().float()  # L310-311
    dk = _steps(dsT, step, 2) @ _steps(q_r, step, 1)  # L312
    return dk, dv


def _dq_cols(ar, q_blk, do_blk, m_blk, d_blk, k16, v16, cols: slice, step: int, seen):
    """`_attn_bwd_dq` (L333-365) over keys `cols` in steps of `step`: the fp32 products
    dS K of each step, (B, steps, BLOCK_M2, d)."""
    k_c, v_c = k16[:, cols], v16[:, cols]
    qk = q_blk @ k_c.transpose(-1, -2)  # L347
    p = _exp2(ar, qk - m_blk[..., None])  # L348
    p = torch.where(seen, p, 0.0)  # L350-353
    dp = do_blk @ v_c.transpose(-1, -2)  # L355
    ds = (p * (dp - d_blk[..., None])).half().float()  # L356-357
    return _steps(ds, step, 2) @ _steps(k_c, step, 1)  # L360


def backward(q, k, v, do, o, M, *, causal: bool = False, scale: float | None = None,
             precision: str = "fp16"):
    """The tutorial's backward from a forward's o (fp16 values) and M (log2 units, fp32
    values): (dq, dk, dv, delta), float64 tensors holding fp16 (fp32 for delta) values."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    causal = check(q, k, precision, scale, causal)
    lead, nq, nk, d, dv_ = q.shape[:-2], q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    ar = Arith(make_policy("fa2", "fp16"), "nearest", 0, torch.float32)
    q16, k16, v16, do16, o16 = (_fp16(x) for x in (q, k, v, do, o))
    # host, L602-604: fp16 k times the float64 constant, as torch does (fp32, then fp16)
    k16 = (k16 * _f32(scale * RCP_LN2)).half().float()
    M = M.detach().to("cpu", torch.float64).reshape(-1, nq).float()
    # preprocess, L260-262: fp16 o widened to fp32 times fp32 do, summed in fp32
    D = (o16 * do16).sum(-1)
    nq_pad, nk_pad = (-(-x // BLOCK_N1) * BLOCK_N1 for x in (nq, nk))
    q16, do16, M, D = (_pad(x, nq_pad) for x in (q16, do16, M, D))
    k16, v16 = _pad(k16, nk_pad), _pad(v16, nk_pad)
    B = q16.shape[0]
    # the kernel's causal stages need its one N_CTX; for Nq != Nk every block is visited
    # in the plain steps under the mask (an extension: no kernel to compare with)
    stages = causal and nq == nk

    def seen(queries: slice, keys: slice) -> torch.Tensor:
        """(queries, keys): the key exists, the query exists, and (causal) sees it; the
        tutorial's mask `offs_m >= offs_n` (L299, L352) where N is a multiple of 128."""
        i = torch.arange(queries.start, queries.stop)[:, None]
        j = torch.arange(keys.start, keys.stop)[None, :]
        ok = (i < nq) & (j < nk)
        return ok & visible(i, j, nq, nk) if causal else ok

    dk, dv = torch.zeros(B, nk_pad, d), torch.zeros(B, nk_pad, dv_)
    diag = BLOCK_M1 // BLK_SLICE_FACTOR  # MASK_BLOCK_M1 (L419)
    for start_n in range(0, nk_pad, BLOCK_N1):  # one program per key block (L416)
        keys = slice(start_n, start_n + BLOCK_N1)
        k_blk, v_blk = k16[:, keys], v16[:, keys]
        acc_k, acc_v = torch.zeros(B, BLOCK_N1, d), torch.zeros(B, BLOCK_N1, dv_)
        start_m = 0
        if stages:  # L429-443: the diagonal in steps of 16 rows, masked
            rows = slice(start_n, start_n + BLOCK_N1)
            tk, tv = _dkdv_rows(ar, k_blk, v_blk, q16, do16, M, D, rows, diag,
                                seen(rows, keys).T)
            acc_k, acc_v = _accumulate(acc_k, tk), _accumulate(acc_v, tv)
            start_m = start_n + BLOCK_N1
        if start_m < nq_pad:  # L446-457: the rest in steps of 32
            rows = slice(start_m, nq_pad)
            tk, tv = _dkdv_rows(ar, k_blk, v_blk, q16, do16, M, D, rows, BLOCK_M1,
                                seen(rows, keys).T)
            acc_k, acc_v = _accumulate(acc_k, tk), _accumulate(acc_v, tv)
        dv[:, keys] = acc_v  # L459-460
        dk[:, keys] = acc_k * _f32(scale)  # L463: sm_scale, an fp32 kernel argument
    dq = torch.zeros(B, nq_pad, d)
    diag = BLOCK_N2 // BLK_SLICE_FACTOR  # MASK_BLOCK_N2 (L472)
    for start_m in range(0, nq_pad, BLOCK_M2):  # the same program's second part (L468)
        qs = slice(start_m, start_m + BLOCK_M2)
        blk = (q16[:, qs], do16[:, qs], M[:, qs], D[:, qs], k16, v16)
        acc = torch.zeros(B, BLOCK_M2, d)
        cols = slice(0, nk_pad)
        if stages:  # L482-498: the diagonal's keys in steps of 16, masked, then the keys
            cols = slice(start_m, start_m + BLOCK_M2)  # to its left from the left (L500-510)
            acc = _accumulate(acc, _dq_cols(ar, *blk, cols, diag, seen(qs, cols)))
            cols = slice(0, start_m)
        if cols.stop > 0:
            acc = _accumulate(acc, _dq_cols(ar, *blk, cols, BLOCK_N2, seen(qs, cols)))
        dq[:, qs] = acc * _f32(LN2)  # L513: the fp32 constexpr ln 2
    # stores: fp32 accumulators into fp16 tensors, round to nearest even
    dq, dk, dv = (x.half().double() for x in (dq[:, :nq], dk[:, :nk], dv[:, :nk]))
    return (dq.reshape(*lead, nq, d), dk.reshape(*lead, nk, d), dv.reshape(*lead, nk, dv_),
            D[:, :nq].double().reshape(*lead, nq))


def _pad(x: torch.Tensor, n: int) -> torch.Tensor:
    if x.shape[1] == n:
        return x
    return torch.cat([x, x.new_zeros(x.shape[0], n - x.shape[1], *x.shape[2:])], dim=1)


__all__ = ["forward", "backward", "check", "BLOCK_M", "BLOCK_N", "BLOCK_M1", "BLOCK_N1",
           "BLOCK_M2", "BLOCK_N2", "BLK_SLICE_FACTOR"]


def gradients(call) -> Gradients:
    """The tutorial's fp16 kernels on a checked backward call (flashnum.models.MODELS
    ["triton_tutorial"]): its own forward, whose M = m + log2(l) (log2 units) is g.lse;
    its own blocks and orders."""
    if call.out is not None:
        raise ValueError("model 'triton_tutorial' runs its own forward (its backward reads "
                         "M = m + log2 l); out= and lse= are not taken with it")
    q, k, v, do = call.q, call.k, call.v, call.do
    res, m2 = forward(q, k, v, causal=call.causal, scale=call.softmax_scale,
                      precision=call.precision)
    dq, dk, dv, delta = backward(q, k, v, do, res.out, m2, causal=call.causal,
                                 scale=call.softmax_scale, precision=call.precision)
    return Gradients(dq=dq, dk=dk, dv=dv, lse=m2, delta=delta, out=res.out,
                     masked=res.masked, ds_rowsum=None,
                     info=dict(res.info, structure="triton_tutorial", lse="log2"))
