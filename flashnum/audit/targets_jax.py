"""JAX's attention kernels as audit targets: XLA's dot_product_attention and Pallas's mha.

    from flashnum.audit.targets_jax import jax_xla, jax_pallas
    out = jax_xla(q, k, v, causal=True)              # torch (B, H, N, d) in, torch out

  jax_xla     jax.nn.dot_product_attention(..., implementation="xla"): logits in fp32
              (einsum with preferred_element_type fp32), the scale in fp32, masked
              entries set to a large negative, softmax in fp32 (exp(s - max) / sum),
              P cast to the input dtype, P V in the input dtype. is_causal is tril:
              top-left aligned.
  jax_pallas  jax.experimental.pallas.ops.gpu.attention.mha (the Triton-style
              FlashAttention kernel): 128 x 128 blocks, exp2 with log2(e) * sm_scale
              folded into the logits, fp32 m, l and o, P cast to the dtype before P V,
              o / l at the end. interpret=True on a CPU (the kernel's jnp operations run
              through XLA's CPU backend), compiled with Triton on a GPU. Its causal mask
              is top-left (span_q >= span_k). Its sm_scale defaults to 1.0, not
              1/sqrt(d): the target always passes the scale.

Both run under jax.jit, as models call them, with and without gradients (un-jitted,
dot_product_attention catches the CPU's refusal of fp16 x fp16 -> fp32 dots and falls
back to the default precision; under jit the refusal comes at compile time, outside its
try, and fp16 raises: the table says "unsupported"). Both take JAX's (B, N, H, d)
layout; the targets transpose inside the JAX function, so gradients come back in
torch's layout. With inputs that require grad, the call goes through torch.autograd
(one Function wrapping jax.vjp): jax_xla's backward is XLA's autodiff, jax_pallas's is
the kernel's own custom VJP (its dK/dV and dQ kernels, 32 x 32 blocks).

The Pallas kernel needs Nq and Nk to be multiples of its blocks (min(128, N) forward,
min(32, N) backward, equal numbers of blocks for Q and K in the backward; it does not
check the backward's: at N = 77 its dQ held inf and NaN). Where they are not, the target
pads Q, K, V with zeros to a common length (a multiple of 32 up to 128, else of 128) and
masks the padded keys through the kernel's segment ids (real positions 0, padding 1):
a masked logit gets the kernel's -0.7 * fp32 max, its exp2 is exactly 0, and every real
row sums the same values as a kernel with ragged masking would. Segment ids
cover queries and keys alike, so rows past Nk (Nq > Nk) run in separate calls: under the
causal mask, rows Nk.. see every key (top-left), so they are a call without it.
"""

from __future__ import annotations

import math

import numpy as np
import torch

PALLAS_BLOCK = 128  # BlockSizes.get_default(): block_q = block_k = 128
PALLAS_BACKWARD_BLOCK = 32  # and 32 for every block of the backward kernels


def _jax():
    import jax  # noqa: F401 (imported here: the package is an optional extra)

    return jax


def to_jax(x: torch.Tensor):
    """A torch CPU tensor as a JAX array of the same dtype (bf16 through ml_dtypes)."""
    import jax.numpy as jnp
    import ml_dtypes

    x = x.detach().to("cpu").contiguous()
    if x.dtype == torch.bfloat16:
        return jnp.asarray(x.view(torch.int16).numpy().view(ml_dtypes.bfloat16))
    return jnp.asarray(x.numpy())


def to_torch(a) -> torch.Tensor:
    """A JAX array as a torch CPU tensor of the same dtype."""
    import ml_dtypes

    arr = np.asarray(a)
    if arr.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(arr.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(arr.copy())


class _JaxVJP(torch.autograd.Function):
    """f(q, k, v) in JAX under torch autograd: forward through jax.vjp of jax.jit(f),
    backward its vjp."""

    @staticmethod
    def forward(ctx, f, q, k, v):
        jax = _jax()
        out, vjp = jax.vjp(jax.jit(f), to_jax(q), to_jax(k), to_jax(v))
        ctx.vjp = vjp
        return to_torch(out)

    @staticmethod
    def backward(ctx, dout):
        dq, dk, dv = ctx.vjp(to_jax(dout.to(dout.dtype)))
        return None, to_torch(dq), to_torch(dk), to_torch(dv)


def _call(f, q, k, v):
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        return _JaxVJP.apply(f, q, k, v)
    return to_torch(_jax().jit(f)(to_jax(q), to_jax(k), to_jax(v)))


def _scale(q, scale):
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


def jax_xla(q, k, v, causal=False, scale=None):
    """jax.nn.dot_product_attention(implementation="xla"), torch (B, H, N, d) in and out."""
    import jax
    import jax.numpy as jnp

    s = _scale(q, scale)

    def f(q, k, v):
        o = jax.nn.dot_product_attention(jnp.swapaxes(q, 1, 2), jnp.swapaxes(k, 1, 2),
                                         jnp.swapaxes(v, 1, 2), scale=s, is_causal=causal,
                                         implementation="xla")
        return jnp.swapaxes(o, 1, 2)

    return _call(f, q, k, v)


def _pallas_padded(q, k, v, *, sm_scale, causal, interpret):
    """mha on JAX (B, N, H, d) arrays with Nq <= Nk, padding and masking as needed."""
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu.attention import mha

    nq, nk = q.shape[1], k.shape[1]
    kw = dict(sm_scale=sm_scale, causal=causal, interpret=interpret)
    n = max(nq, nk)
    step = PALLAS_BACKWARD_BLOCK if n <= PALLAS_BLOCK else PALLAS_BLOCK
    length = -(-n // step) * step
    if nq == nk == length:
        return mha(q, k, v, None, **kw)

    def pad(x):
        return jnp.pad(x, ((0, 0), (0, length - x.shape[1]), (0, 0), (0, 0)))

    seg = jnp.broadcast_to((jnp.arange(length) >= nk).astype(jnp.int32), (q.shape[0], length))
    return mha(pad(q), pad(k), pad(v), seg, **kw)[:, :nq]


def jax_pallas(q, k, v, causal=False, scale=None, interpret=None):
    """Pallas's FlashAttention kernel (mha), torch (B, H, N, d) in and out; interpret mode
    unless JAX sees a GPU."""
    import jax
    import jax.numpy as jnp

    s = _scale(q, scale)
    if interpret is None:
        interpret = jax.default_backend() == "cpu"

    def f(q, k, v):
        q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))
        nq, nk = q.shape[1], k.shape[1]
        kw = dict(sm_scale=s, interpret=interpret)
        if nq <= nk:
            o = _pallas_padded(q, k, v, causal=causal, **kw)
        else:  # rows past Nk: separate calls (segment ids are shared by rows and keys)
            parts = [_pallas_padded(q[:, :nk], k, v, causal=causal, **kw)]
            parts += [_pallas_padded(q[:, r:r + nk], k, v, causal=False, **kw)
                      for r in range(nk, nq, nk)]
            o = jnp.concatenate(parts, axis=1)
        return jnp.swapaxes(o, 1, 2)

    return _call(f, q, k, v)
