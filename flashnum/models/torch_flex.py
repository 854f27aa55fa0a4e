"""A model of compiled flex attention on CPU (model "torch_flex"), operation for operation.

    import flashnum
    res = flashnum.attention(q, k, v, precision="bf16", model="torch_flex", causal="top_left")
    # or directly: flashnum.models.torch_flex.attention_torch_flex(q, k, v, precision="fp32")

torch.compile(torch.nn.attention.flex_attention.flex_attention) on CPU runs inductor's C++
flex template (torch/_inductor/kernel/flex/flex_cpu.py, torch 2.13). Its generated code
(TORCH_LOGS=output_code) does, per (batch, head, query block):

  splits    the block mask's BLOCK_SIZE (128) for both queries and keys; with no mask the
            empty block mask's block is 2^30, so one query block and one key block hold
            the whole sequence (no online rescaling at all)
  order     the partial key blocks of the query block (the mask applied as -inf), then
            its full ones, each list ascending: causal (q >= kv) visits the diagonal block
            first, then 0 .. qb-1; a ragged last tile is partial, so the last query block
            of a ragged N lists every block as partial, in forward order (block_lists)
  S         inductor's micro-GEMM, one logit at a time: 16 fp32 lanes, lane l an FMA
            chain from +0 over elements l, l+16, ... of q and k (bf16 widened exactly),
            then vec_reduce_all's shuffle tree (lanes + 8, + 4, + 2, + 1). Where the
            kernel packs K and V (bf16 where cpublas::could_pack: oneDNN's AMX brgemm),
            S is cpublas::brgemm on the packed K instead
  scale     fl32(S * fl32(scale)), a separate multiply; then the mask, then the row max
  exp       ATen's Vectorized<float>::exp_u20 on whole 16-lane vectors (lanes summed,
            the shuffle tree); on the cols mod 16 tail, `exp` of a float resolves to the
            C library's double exp: P = fl32 of it (bf16: fl32 then bf16), and the row sum
            takes the double value, fl32(sum + exp) per column
  state     m, l, o in fp32; alpha = expf(m_old - m_new) (glibc); l = rowsum +
            fl32(alpha l), no FMA (-ffp-contract=off); o = o * alpha from the second block
  P V       P stored in the dtype (round to nearest even; the row sum read the fp32 P),
            then cpublas::brgemm (fp32: its float overload; bf16: on the packed V where
            the kernel packs) accumulating into o from the second block on; fp16 unpacked
            takes the template's micro-GEMM instead ("Fallback Half brgemm is slower"):
            per output one FMA chain over the block's keys, from o
  output    o * fl32(1 / l), cast to the dtype; l = 0 (a row that sees no key) takes 1

The brgemm calls are the kernel's own (at::native::cpublas::brgemm in the libtorch_cpu
torch loaded, through ctypes, with the kernel's sizes and leading dimensions), so their
summation order is oneDNN's on this machine by construction and moves with it, as the
kernel's does; on a machine with AMX the bf16 S is the packed brgemm's, without AMX the
micro-GEMM's. The FMA chains are accumulate.dot's (one fp32 FMA chain from +0, exact),
fp16's P V chains (they start from o) torch_cpu_exp's exact fma step by step; the
exponentials are torch_cpu_exp's.
"""

from __future__ import annotations

import ctypes
import functools
import math
from pathlib import Path

import torch

from flashnum.engine.result import Result
from flashnum.models.torch_cpu_exp import _expf, _fma, exp64, exp_u20
from flashnum.models.torch_cpu_gemm import _brgemm, _brgemm_call, _Packed
from flashnum.numerics.accumulate import dot

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_SCALAR_TYPE = {"bf16": 15, "fp16": 5}  # c10::ScalarType of BFloat16, Half
BLOCK = 128  # create_block_mask's default BLOCK_SIZE
WHOLE = 1 << 30  # the block size of flex's empty block mask (no mask given)
LANES = 16  # AVX-512 float vector width
_BRGEMM_F32 = "_ZN2at6native7cpublas6brgemmEllllllbPKfS3_Pfb"


def block_lists(nq: int, nk: int, causal: bool, block: int = BLOCK):
    """Per query block, the key blocks the kernel visits in order, as (block, partial):
    the partial ones ascending, then the full ones ascending (the block mask's kv_indices,
    then its full_kv_indices), for the top-left causal mask q >= kv on tiles padded to
    `block` (the padding masked). Without a mask: one query block, one key block."""
    if not causal:
        return [[(0, True)]]
    lists = []
    for qb in range(-(-nq // block)):
        rows = torch.arange(qb * block, (qb + 1) * block)[:, None]
        partial, full = [], []
        for kb in range(-(-nk // block)):
            cols = torch.arange(kb * block, (kb + 1) * block)[None, :]
            seen = (rows >= cols) & (rows < nq) & (cols < nk)
            if bool(seen.all()):
                full.append((kb, False))
            elif bool(seen.any()):
                partial.append((kb, True))
        lists.append(partial + full)
    return lists


def need_pack(prec: str, bh: int, nq: int, nk: int, d: int, q_split: int, threads: int) -> bool:
    """The template's need_pack: bf16/fp16 where cpublas::could_pack of the dtype holds
    (oneDNN's AMX brgemm), both lengths at least 64, and the GEMM work per thread at least
    4x the packing work."""
    lib = _brgemm()
    if prec not in _SCALAR_TYPE or lib is None or not lib[0](_SCALAR_TYPE[prec]):
        return False
    if nk < 64 or nq < 64:
        return False
    q_slice = -(-nq // q_split)
    qs_per_thread = float((bh * q_slice + threads - 1) // threads)
    return qs_per_thread * q_split * nk * d / float(bh * nk * d) >= 4


@functools.cache
def _brgemm_f32():
    """cpublas::brgemm's float overload (the kernel's P V in fp32)."""
    lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
    f = getattr(lib, _BRGEMM_F32)
    i64, vp = ctypes.c_int64, ctypes.c_void_p
    f.argtypes = [i64] * 6 + [ctypes.c_bool, vp, vp, vp, ctypes.c_bool]
    f.restype = None
    return f


def _tree(v: torch.Tensor) -> torch.Tensor:
    """vec_reduce_all on AVX-512: lanes i and i + 8 added, then + 4, + 2, + 1."""
    for half in (8, 4, 2):
        v = v[..., :half] + v[..., half:2 * half]
    return v[..., 0] + v[..., 1]


def micro_gemm_qk(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """(BH, rows, d) x (BH, cols, d) -> (BH, rows, cols) fp32 as the template's
    micro_gemm_transpose_b: 16 lane chains over d (zero-padded to a multiple of 16), the
    tree. Its other branch (d a multiple of 16 below 24: d = 16) is one chain over d."""
    d, cols = q.shape[-1], k.shape[-2]
    if d % LANES == 0 and 24 > d and cols >= LANES:  # whole 16-column groups: one chain
        main = LANES * (cols // LANES)
        s = dot(q.float(), k[..., :main, :].float().transpose(-1, -2), "fp32")
        return torch.cat([s, micro_gemm_qk_lanes(q, k[..., main:, :])], dim=-1)
    return micro_gemm_qk_lanes(q, k)


def micro_gemm_qk_lanes(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The micro-GEMM's inner-product branch: 16 lane chains, then the tree."""
    d = q.shape[-1]
    pad = -d % LANES
    qp = torch.nn.functional.pad(q.float(), (0, pad))
    kp = torch.nn.functional.pad(k.float(), (0, pad))
    steps = qp.shape[-1] // LANES
    # lane l's chain reads elements l, l + 16, ...: the lanes as a batch dim, one dot call
    a = qp.unflatten(-1, (steps, LANES)).movedim(-1, -3)  # (BH, 16, rows, steps)
    b = kp.unflatten(-1, (steps, LANES)).movedim(-1, -3).transpose(-1, -2)  # (BH, 16, steps, cols)
    return _tree(dot(a, b, "fp32").movedim(-3, -1))


def micro_gemm_pv(p: torch.Tensor, v: torch.Tensor, c: torch.Tensor | None) -> torch.Tensor:
    """(BH, rows, cols) x (BH, cols, dv) fp32, as the template's micro_gemm (fp16's P V):
    per output one FMA chain over k = 0, 1, ..., from c (accumulating) or +0."""
    acc = torch.zeros(*p.shape[:-1], v.shape[-1]) if c is None else c
    pf, vf = p.float(), v.float()
    for j in range(p.shape[-1]):
        acc = _fma(pf[..., j:j + 1], vf[..., j:j + 1, :], acc)
    return acc


def _exp_rowsum(x: torch.Tensor):
    """kernel_exp_reduce_sum_fusion_kernel on x = s - m (fp32): P (fp32, and its tail's
    double exp) and the row sum."""
    cols = x.shape[-1]
    main = LANES * (cols // LANES)
    p = torch.empty_like(x)
    p[..., :main] = exp_u20(x[..., :main])
    acc = torch.zeros(*x.shape[:-1], LANES, dtype=torch.float32)
    for c in range(0, main, LANES):
        acc = acc + p[..., c:c + LANES]
    total = _tree(acc)
    if main < cols:
        e = exp64(x[..., main:])  # float64: the double exp of each tail value
        p[..., main:] = e.float()
        for j in range(cols - main):  # float += double: the sum in double, then fl32
            total = (total.double() + e[..., j]).float()
    return p, total


def check_alignment(call) -> None:
    """The kernel's causal mask is q >= kv, top-left; causal=True (bottom-right) with
    Nq != Nk is refused."""
    nq, nk = call.q.shape[-2], call.k.shape[-2]
    if call.causal is True and nq != nk:
        raise ValueError(f"model 'torch_flex' models the top-left mask q >= kv; with Nq={nq}"
                         f" != Nk={nk} causal=True (bottom-right) is not what it computes; "
                         "valid: causal='top_left' or False")


def forward(call) -> Result:
    """The model on a checked call (flashnum.models.MODELS["torch_flex"]); top-left causal."""
    check_alignment(call)
    return attention_torch_flex(call.q, call.k, call.v, precision=call.precision,
                                causal=bool(call.causal), scale=call.scale)


def attention_torch_flex(q, k, v, *, precision="bf16", causal=False, scale=None) -> Result:
    """What compiled flex_attention computes on CPU for q, k, v (B, H, N, d) stored in
    `precision` (fp32, bf16, fp16); causal: the block mask of q >= kv (top-left)."""
    if precision not in DTYPES:
        raise ValueError(f"model torch_flex models precision fp32, bf16 or fp16, not "
                         f"{precision!r}")
    dtype = DTYPES[precision]
    lead, nq, nk, d, dv = q.shape[:-2], q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    scale32 = torch.tensor(scale, dtype=torch.float32)

    def stored(x):
        x = x.detach().to("cpu")
        if x.dtype is torch.float64 and dtype is not torch.float32:
            from flashnum.numerics.formats import get_format
            x = get_format(precision).round(x).float()  # one rounding, not fp64->fp32->dtype
        return x.to(dtype).reshape(-1, x.shape[-2], x.shape[-1]).contiguous()

    q3, k3, v3 = stored(q), stored(k), stored(v)
    bh = q3.shape[0]
    qs, ks = (min(BLOCK, nq), min(BLOCK, nk)) if causal else (nq, nk)
    packed = None
    if need_pack(precision, bh, nq, nk, d, qs, torch.get_num_threads()):
        packed = _Packed(k3, v3, ks)
    o = torch.empty(bh, nq, dv, dtype=torch.float32)
    m = torch.empty(bh, nq, dtype=torch.float32)
    l = torch.empty(bh, nq, dtype=torch.float32)
    for qb, blocks in enumerate(block_lists(nq, nk, causal, BLOCK if causal else WHOLE)):
        r0, r1 = qb * qs, min(nq, (qb + 1) * qs)
        rows = _query_block(precision, q3, k3, v3, (r0, r1), ks, blocks, causal, scale32,
                            packed)
        o[:, r0:r1], m[:, r0:r1], l[:, r0:r1] = rows
    if packed is not None:
        _brgemm()[2](True)
    l1 = torch.where(l == 0, torch.ones_like(l), l)
    out = (o * (1.0 / l1)[..., None]).to(dtype)
    m0 = torch.where(m == -math.inf, torch.zeros_like(m), m)
    lse = m0.double() + l1.double().log()
    n = (*lead, nq)
    return Result(
        out=out.double().reshape(*n, dv), m=m0.double().reshape(n), l=l1.double().reshape(n),
        lse=lse.reshape(n), masked=(m == -math.inf).reshape(n),
        n_rescales=torch.zeros(n, dtype=torch.int64), backend="emulate",
        info=dict(precision=precision, model="torch_flex", block_m=qs, block_n=ks,
                  causal=causal, scale=scale, order="partial, then full", variant="fa2"),
    )


def _query_block(prec, q3, k3, v3, span, ks, blocks, causal, scale32, packed):
    """One query block [r0, r1) of every (batch, head): its key blocks in the kernel's
    order; returns o (before the division), m, l."""
    bh, nk, d = k3.shape
    dv = v3.shape[-1]
    r0, r1 = span
    rows = r1 - r0
    m = torch.full((bh, rows), -math.inf)
    l = torch.zeros(bh, rows)
    o = torch.zeros(bh, rows, dv)
    expf = _expf()
    for n_idx, (kb, partial) in enumerate(blocks):
        c0 = kb * ks
        c1 = min(nk, c0 + ks)
        s = _scores(prec, q3, k3, r0, r1, c0, c1, packed) * scale32
        if causal and partial:  # the mask_mod q >= kv on a partial tile
            seen = torch.arange(r0, r1)[:, None] >= torch.arange(c0, c1)[None, :]
            s = torch.where(seen, s, torch.tensor(-math.inf))
        m_new = torch.maximum(m, s.amax(-1))
        dead = m_new == -math.inf  # every key so far masked: the kernel leaves the row
        p, rowsum = _exp_rowsum(s - torch.where(dead, 0.0, m_new)[..., None])
        alpha = torch.tensor([expf(float(x)) for x in (m - m_new).reshape(-1).tolist()],
                             dtype=torch.float32).reshape(m.shape)
        l = torch.where(dead, l, rowsum + alpha * l)
        if n_idx > 0:
            o = torch.where(dead[..., None], o, o * alpha[..., None])
        m = torch.where(dead, m, m_new)
        p = torch.where(dead[..., None], 0.0, p)
        _pv(prec, p, v3, c0, o, n_idx > 0, packed, ks)
    return o, m, l


def _scores(prec, q3, k3, r0, r1, c0, c1, packed):
    """S = Q K^T of one tile, fp32: the micro-GEMM, or brgemm on the packed K."""
    if packed is None:
        return micro_gemm_qk(q3[:, r0:r1], k3[:, c0:c1])
    bh, _, d = q3.shape
    rows, cols = r1 - r0, c1 - c0
    s = torch.empty(bh, rows, cols)
    qpad = q3 if d == packed.ehead else torch.nn.functional.pad(q3, (0, 1))
    lda = d if d == packed.ehead else packed.ehead
    for h in range(bh):
        a = qpad[h, r0:r1].contiguous()
        b = packed.key[h, c0 * packed.ehead:]
        _brgemm_call(prec, rows, cols, packed.ehead, lda, cols, cols, False, a, b, s[h])
    return s


def _pv(prec, p, v3, c0, o, add, packed, ks):
    """o (+)= P V by cpublas::brgemm as the kernel calls it: P in the dtype with rows of
    cols (even where packed: a zero column pads an odd one)."""
    bh, rows, cols = p.shape
    dv = v3.shape[-1]
    ecols = cols + cols % 2 if packed is not None else cols
    pbuf = torch.zeros(bh, rows, ecols, dtype=v3.dtype)
    pbuf[..., :cols] = p.to(v3.dtype)
    if packed is None and prec == "fp16":  # the template's micro-GEMM, not Half's brgemm
        o.copy_(micro_gemm_pv(pbuf, v3[:, c0:c0 + cols], o if add else None))
        return
    f32 = _brgemm_f32() if prec == "fp32" else None
    for h in range(bh):
        if packed is not None:
            b = packed.value[h, c0 // ks * packed.eks * dv:]
            _brgemm_call(prec, rows, dv, ecols, ecols, dv, dv, add, pbuf[h], b, o[h])
        elif f32 is not None:
            f32(rows, dv, cols, cols, dv, dv, add, pbuf[h].data_ptr(),
                v3[h, c0:].data_ptr(), o[h].data_ptr(), False)
        else:
            _brgemm()[1][prec](rows, dv, cols, cols, dv, dv, add, pbuf[h].data_ptr(),
                               v3[h, c0:].data_ptr(), o[h].data_ptr(), False)
