"""Models of library kernels that materialise S: jax_xla, torch_math, ort_cpu, torch_flex_eager.

    import flashnum
    res = flashnum.attention(q, k, v, precision="bf16", model="jax_xla", causal=True)

Each follows its kernel's source, operation for operation, in fp32 torch arithmetic
(the sites of flashnum.numerics.policy cannot say "the scale applied as a GEMM's
alpha" or "P times the reciprocal of its row sum"):

  jax_xla     jax.nn.dot_product_attention(implementation="xla") (jax/_src/nn/functions.py,
              _dot_product_attention_core): S = einsum(Q, K) with fp32 accumulation and
              fp32 result (preferred_element_type), S *= fl32(scale) in fp32, masked
              logits set to a large negative, softmax in fp32 (jax.nn.softmax:
              exp(s - max) / sum), P cast to the input dtype, P V in the input dtype
              (XLA's CPU dot widens bf16 to fp32 and rounds the result once).
  torch_math  ATen's _scaled_dot_product_attention_math (torch 2.13,
              aten/src/ATen/native/transformers/attention.cpp): bf16 and fp16 inputs
              widened to fp32 first; Q and K each multiplied by fl32(sqrt(scale)); S =
              Q K^T in fp32; masked logits -inf; softmax in fp32; P V in fp32; the output
              cast to the dtype once.
  ort_cpu     ONNX Runtime's CPU Attention (onnxruntime/core/providers/cpu/llm/
              attention.cc, attention_softmax.h): S = fl(alpha * fl32(Q K^T)) with
              alpha = scale applied by the GEMM (fp16: operands widened, SGEMM, the
              result rounded to fp16), the causal mask added as the GEMM's C (beta = 1;
              masked entries the dtype's lowest value), MlasComputeSoftmax on fp32
              (max, exp(s - max), their sum, then P = e * fl32(1 / sum)), P rounded to
              the dtype, P V by the same GEMM path, the output in the dtype.
  torch_flex_eager  flex_attention called uncompiled (torch 2.13,
              torch/_higher_order_ops/flex_attention.py, math_attention): S = Q K^T in
              fp32 (inputs widened), S * scale in fp32, masked logits -inf, ATen's
              _safe_softmax in fp32 (a row that sees no key gives 0), P cast to the dtype,
              P V in the dtype (torch.matmul), the output in the dtype.

What is not modelled (docs/audit.md gives the measured agreement): the summation order
of each library's GEMMs (Eigen's in XLA, MLAS's in ONNX Runtime; torch.matmul's is
MKL's) and of the row sums, and the elementary functions: exp here is torch's fp32 exp,
XLA's CPU exp and MLAS's are their own polynomials. In bf16 and fp16 these move an
output only where an fp32 ulp crosses a rounding boundary of the dtype; in fp32 they
show in most outputs.

causal: True or "bottom_right" (flashnum's alignment), "top_left" (the three kernels'
own: query i sees keys 0..i).
"""

from __future__ import annotations

import math

import torch

from flashnum.engine.result import Result
from flashnum.numerics.tiling import causal_visible, check_causal

KERNEL_MODELS = ("jax_xla", "torch_math", "ort_cpu", "torch_flex_eager")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# jax.nn's _get_large_negative for fp32 logits: -0.7 * the largest fp32
JAX_LARGE_NEGATIVE = -0.7 * float(torch.finfo(torch.float32).max)


def _visible(nq: int, nk: int, causal) -> torch.Tensor | None:
    return causal_visible(nq, nk, causal=check_causal(causal)) if causal else None


def _stored(x: torch.Tensor, dtype) -> torch.Tensor:
    """The inputs as the kernel reads them: one rounding to the dtype (from float64 via
    flashnum's format, never fp64 -> fp32 -> dtype), then widened to fp32 exactly."""
    x = x.detach().to("cpu")
    if x.dtype is torch.float64 and dtype is not torch.float32:
        from flashnum.numerics.formats import get_format

        x = get_format({torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]).round(x)
    return x.to(dtype).float()


def _jax_xla(q, k, v, dtype, vis, scale):
    s = q @ k.transpose(-1, -2)
    s = s * torch.tensor(scale, dtype=torch.float32)
    if vis is not None:
        s = s.masked_fill(~vis, JAX_LARGE_NEGATIVE)
    m = s.amax(-1, keepdim=True)
    e = torch.exp(s - m)
    p = (e / e.sum(-1, keepdim=True)).to(dtype).float()
    return (p @ v).to(dtype), m, e.sum(-1, keepdim=True)


def _torch_math(q, k, v, dtype, vis, scale):
    root = torch.tensor(math.sqrt(scale), dtype=torch.float32)
    s = (q * root) @ (k * root).transpose(-1, -2)
    if vis is not None:
        s = s.masked_fill(~vis, -math.inf)
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    l = e.sum(-1, keepdim=True)
    p = torch.softmax(s, dim=-1)  # ATen's own fp32 softmax (the same op the kernel calls)
    return torch.nan_to_num(p @ v, nan=0.0).to(dtype), m, l


def _ort_cpu(q, k, v, dtype, vis, scale):
    alpha = torch.tensor(scale, dtype=torch.float32)
    s = ((q @ k.transpose(-1, -2)) * alpha).to(dtype).float()
    if vis is not None:  # the mask is the GEMM's C: 0 + x is x, lowest + x is lowest-ish
        lowest = torch.finfo(dtype).min
        s = torch.where(vis, s, (s + lowest).to(dtype).float())
    m = s.amax(-1, keepdim=True)
    e = torch.exp(s - m)
    l = e.sum(-1, keepdim=True)
    p = (e * (1.0 / l)).to(dtype).float()
    return (p @ v).to(dtype), m, l


def _flex_eager(q, k, v, dtype, vis, scale):
    s = (q @ k.transpose(-1, -2)) * scale  # a Python float: the multiply in fp32
    if vis is not None:
        s = s.masked_fill(~vis, -math.inf)
    m = s.amax(-1, keepdim=True)
    l = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m))).sum(-1, True)
    p = torch._safe_softmax(s, dim=-1)  # ATen's op, the one the kernel calls
    return p.to(dtype) @ v.to(dtype), m, l


_MODELS = {"jax_xla": _jax_xla, "torch_math": _torch_math, "ort_cpu": _ort_cpu,
           "torch_flex_eager": _flex_eager}


def attention_kernel_model(q, k, v, policy: str, *, precision="bf16", causal=False,
                           scale=None) -> Result:
    """What the kernel `policy` (KERNEL_MODELS) computes for q, k, v stored in `precision`."""
    if policy not in _MODELS:
        raise ValueError(f"unknown kernel model {policy!r}; valid: {', '.join(KERNEL_MODELS)}")
    if precision not in DTYPES:
        raise ValueError(f"model {policy} models precision fp32, bf16 or fp16, "
                         f"not {precision!r}")
    dtype = DTYPES[precision]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    vis = _visible(q.shape[-2], k.shape[-2], causal)
    qs, ks, vs = (_stored(x, dtype) for x in (q, k, v))
    out, m, l = _MODELS[policy](qs, ks, vs, dtype, vis, scale)
    m, l = m.squeeze(-1).double(), l.squeeze(-1).double()
    masked = (~vis.any(-1)).expand_as(m) if vis is not None else torch.zeros_like(m, dtype=bool)
    return Result(out=out.double(), m=m, l=l, lse=m + torch.log(l), masked=masked,
                  n_rescales=torch.zeros_like(m, dtype=torch.int64))
