"""The Triton FlashAttention-2 forward kernel (`_fa2_fwd`) and the jit helpers it shares with
the backward kernels (flashnum.backends.triton_backward): the rounding, the dot, the casts.

flashnum.backends.triton is the host side (a Policy into the constexprs, the launch, the
Result) and its docstring says what each argument models and what Triton's interpreter
gets wrong. This module decides whether the kernels run on that interpreter: without a
CUDA GPU it sets TRITON_INTERPRET=1 before triton is first imported (Triton reads the
variable when a function is decorated), and refuses with a RuntimeError an import that
cannot work (TRITON_INTERPRET=0 without a GPU; triton imported earlier without the
variable).
"""

from __future__ import annotations

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.language import standard as _tl_standard  # noqa: E402

# the torch dtype a format is stored in (None: this torch has no such fp8 dtype)
_TORCH = {
    "fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32,
    "fp8_e4m3": getattr(torch, "float8_e4m3fn", None),
    "fp8_e5m2": getattr(torch, "float8_e5m2", None),
}


# ---------------------------------------------------------------------------
# the kernel


@triton.jit
def _round_rne(x, DROP: tl.constexpr):
    # Round fp32 x to 24 - DROP significand bits, nearest-even, on its bits: add
    # 0111..1 (+1 when the kept lsb is odd) below the cut, then clear the cut.
    # DROP=16: bf16; DROP=13: tf32. Both keep fp32's exponent range, so the carry
    # into the exponent is the right answer (up to inf) and subnormals round too.
    b = x.to(tl.int32, bitcast=True)
    b = b + ((1 << (DROP - 1)) - 1) + ((b >> DROP) & 1)
    b = b & (-(1 << DROP))
    r = b.to(tl.float32, bitcast=True)
    return tl.where(x != x, x, r)  # NaN stays NaN


@triton.jit
def _dot(a, b, acc, PRECISION: tl.constexpr, EMULATE: tl.constexpr, IMPRECISE: tl.constexpr):
    # acc + a @ b with the dot's input precision; on the interpreter the tf32
    # roundings that a GPU's tensor cores would do are done here. IMPRECISE: fp8 dots
    # on sm_90 accumulate in the MMA's reduced precision for this many products
    # before promoting to fp32 (None: Triton's default, 2^30 on sm_90: never)
    if EMULATE and PRECISION == "tf32":
        acc = tl.dot(_round_rne(a, 13), _round_rne(b, 13), acc, input_precision="ieee")
    elif EMULATE and PRECISION == "tf32x3":
        a_big = _round_rne(a, 13)
        b_big = _round_rne(b, 13)
        a_small = _round_rne(a - a_big, 13)
        b_small = _round_rne(b - b_big, 13)
        acc = tl.dot(a_small, b_big, acc, input_precision="ieee")
        acc = tl.dot(a_big, b_small, acc, input_precision="ieee")
        acc = tl.dot(a_big, b_big, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc, input_precision=PRECISION, max_num_imprecise_acc=IMPRECISE)
    return acc


@triton.jit
def _cast(x, FMT: tl.constexpr, DOT_DTYPE: tl.constexpr, EMULATE: tl.constexpr):
    # x (fp32) rounded to FMT and handed on in the dot's dtype (an exact widening)
    if FMT == "fp32":
        y = x
    elif FMT == "tf32":
        y = _round_rne(x, 13)  # Triton has no tf32 dtype to cast to, on any device
    elif FMT == "bf16" and EMULATE:
        y = _round_rne(x, 16)  # the interpreter's own cast truncates
    elif FMT == "bf16":
        y = x.to(tl.bfloat16)
    elif FMT == "fp16":
        y = x.to(tl.float16)
    elif FMT == "fp8_e4m3":
        y = x.to(tl.float8e4nv)
    else:  # fp8_e5m2
        y = x.to(tl.float8e5)
    return y.to(DOT_DTYPE)


@triton.jit
def _softmax_update(s, m_i, USE_EXP2: tl.constexpr):
    # the running max after the tile's logits s, P = exp(s - m_new) and alpha =
    # exp(m_old - m_new); a row that has seen no key yet shifts by 0: exp(-inf - 0) = 0,
    # never NaN. Also whether the max moved (a rescale), for n_rescales
    m_new = tl.maximum(m_i, tl.max(s, 1))
    rescaled = ((m_new > m_i) & (m_i > float("-inf"))).to(tl.int32)
    m_use = tl.where(m_new > float("-inf"), m_new, 0.0)
    if USE_EXP2:
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
    else:
        alpha = tl.exp(m_i - m_use)
        p = tl.exp(s - m_use[:, None])
    return m_new, p, alpha, rescaled


@triton.jit
def _normalise(acc, l_i, OUT_FORMAT: tl.constexpr, EMULATE: tl.constexpr):
    # o / l, correctly rounded; fully masked rows (l = 0) give 0
    seen = l_i > 0.0
    o = tl.math.div_rn(acc, tl.where(seen, l_i, 1.0)[:, None])
    o = tl.where(seen[:, None], o, 0.0)
    if OUT_FORMAT == "bf16" and EMULATE:
        o = _round_rne(o, 16)
    return o


@triton.jit
def _fa2_fwd(
    Q, K, V, O, ORDER, M, L, NRESC, TRACE_M, TRACE_L,
    qk_scale, Nq, Nk, n_kb,
    stride_qz, stride_qm, stride_kz, stride_kn, stride_vz, stride_vn, stride_oz, stride_om,
    stride_order_z,
    D: tl.constexpr, DV: tl.constexpr, HEAD_DIM: tl.constexpr, HEAD_DIM_V: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, USE_EXP2: tl.constexpr, L_FROM_CAST: tl.constexpr,
    QK_PRECISION: tl.constexpr, PV_PRECISION: tl.constexpr,
    P_FORMAT: tl.constexpr, OUT_FORMAT: tl.constexpr, FP8_IMPRECISE: tl.constexpr,
    FORWARD: tl.constexpr, EMULATE: tl.constexpr, TRACE: tl.constexpr,
):
    start_m = tl.program_id(0) * BLOCK_M
    z = tl.program_id(1).to(tl.int64)
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    offs_dv = tl.arange(0, HEAD_DIM_V)
    row_ok = offs_m < Nq
    # Q stays in registers; padded head-dim columns and rows past Nq load as 0
    q = tl.load(Q + z * stride_qz + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=row_ok[:, None] & (offs_d[None, :] < D), other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM_V], tl.float32)
    n_resc = tl.zeros([BLOCK_M], tl.int32)
    # bottom-right aligned causal mask: query i sees key j iff j <= i + (Nk - Nq)
    last_key = tl.minimum(start_m + BLOCK_M, Nq) - 1 + (Nk - Nq)
    for step in range(0, n_kb):
        if FORWARD:
            kb = step  # the forward order needs no index load (same numbers, fewer loads)
        else:
            kb = tl.load(ORDER + z * stride_order_z + tl.program_id(0) * n_kb + step)
        start_n = kb * BLOCK_N
        if CAUSAL:
            visible = start_n <= last_key
        else:
            visible = True
        if visible:
            cols = start_n + offs_n
            # -- the logits (base 2 for exp2), rounded to fp32 --
            k_t = tl.load(K + z * stride_kz + cols[None, :] * stride_kn + offs_d[:, None],
                          mask=(cols[None, :] < Nk) & (offs_d[:, None] < D), other=0.0)
            qk = _dot(q, k_t, tl.zeros([BLOCK_M, BLOCK_N], tl.float32), QK_PRECISION, EMULATE,
                      FP8_IMPRECISE)
            s = qk * qk_scale
            keep = cols[None, :] < Nk
            if CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None] + (Nk - Nq))
            s = tl.where(keep, s, float("-inf"))
            # -- m, P and the rescale alpha; P cast for the P @ V dot --
            m_new, p, alpha, rescaled = _softmax_update(s, m_i, USE_EXP2)
            n_resc += rescaled
            p_c = _cast(p, P_FORMAT, V.dtype.element_ty, EMULATE)
            # -- l and o --
            if L_FROM_CAST:
                l_ij = tl.sum(p_c.to(tl.float32), 1)
            else:
                l_ij = tl.sum(p, 1)
            l_i = l_i * alpha + l_ij
            v = tl.load(V + z * stride_vz + cols[:, None] * stride_vn + offs_dv[None, :],
                        mask=(cols[:, None] < Nk) & (offs_dv[None, :] < DV), other=0.0)
            acc = acc * alpha[:, None]
            acc = _dot(p_c, v, acc, PV_PRECISION, EMULATE, FP8_IMPRECISE)
            m_i = m_new
        if TRACE:
            t_off = z * n_kb * Nq + step * Nq + offs_m
            tl.store(TRACE_M + t_off, m_i, mask=row_ok)
            tl.store(TRACE_L + t_off, l_i, mask=row_ok)
    o = _normalise(acc, l_i, OUT_FORMAT, EMULATE)
    tl.store(O + z * stride_oz + offs_m[:, None] * stride_om + offs_dv[None, :],
             o.to(O.dtype.element_ty), mask=row_ok[:, None] & (offs_dv[None, :] < DV))
    tl.store(M + z * Nq + offs_m, m_i, mask=row_ok)
    tl.store(L + z * Nq + offs_m, l_i, mask=row_ok)
    tl.store(NRESC + z * Nq + offs_m, n_resc, mask=row_ok)


def _interpreted(fn) -> bool:
    return type(fn).__name__ == "InterpretedFunction"


INTERPRET = _interpreted(_fa2_fwd)
if not INTERPRET and not torch.cuda.is_available():
    raise RuntimeError(
        "flashnum.backends.triton: no CUDA GPU and the Triton kernel was compiled for one "
        f"(TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')!r}). Set TRITON_INTERPRET=1 (or "
        "leave it unset) before this module is imported to run on Triton's CPU interpreter."
    )
if INTERPRET and not _interpreted(_tl_standard._sum_combine):
    # triton.language decorates its own library (tl.sum, tl.max) when first imported
    raise RuntimeError(
        "flashnum.backends.triton: triton.language was imported before TRITON_INTERPRET=1 "
        "was set, so tl.sum and tl.max are compiled for a GPU and fail in the interpreter. Set "
        "TRITON_INTERPRET=1 in the environment, or import flashnum.backends.triton (or "
        "call flashnum.attention(..., backend='triton')) before importing triton."
    )
