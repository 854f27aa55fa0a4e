"""Kernels an audit can be pointed at by name, and how each aligns its causal mask.

    from flashnum.audit.targets import resolve
    fn, alignment, model = resolve("torch_sdpa")

Every target is fn(q, k, v, causal=False, scale=None) -> out (or (out, lse)), with q, k, v
of one dtype and shape (B, H, N, d) and out in that dtype.

  torch_sdpa       torch.nn.functional.scaled_dot_product_attention (is_causal aligns
                   top-left: query i sees keys 0..i). On CPU it runs ATen's flash kernel,
                   modelled by policy torch_cpu
  torch_flash_cpu  the same CPU kernel through its op, returning the log-sum-exp too
  flashnum_triton  flashnum's own Triton kernel (flashnum.backends.triton; the CPU
                   interpreter without a GPU), fa2 policy, bottom-right alignment; its
                   backward is flashnum.backends.triton_backward's kernels (64 x 64 blocks,
                   the emulated attention_backward's default, so that fa2 models it)
  flash_attn       flash_attn.flash_attn_func (if installed; bottom-right since 2.1)
  torch_math       torch's SDPA on its math backend (flashnum.audit.targets_torch)
  hf_eager         transformers' eager_attention_forward (flashnum.audit.targets_torch)
  jax_xla          jax.nn.dot_product_attention, implementation="xla"
                   (flashnum.audit.targets_jax; needs the [kernels] extra)
  jax_pallas       Pallas's FlashAttention kernel mha (flashnum.audit.targets_jax; [kernels])
  ort_attention    ONNX Attention (opset 23) on ONNX Runtime's CPU provider
                   (flashnum.audit.targets_ort; [kernels])
  ort_mha          com.microsoft.MultiHeadAttention on ONNX Runtime ([kernels])
  pkg.mod:func     any importable callable with the signature above (alignment
                   top_left unless told)

Every target but ort_attention and ort_mha (inference kernels) is differentiable through
autograd (audit(..., backward=True)): torch's SDPA and its CPU op through torch's own
backward, flash_attn through its own, flashnum_triton through the autograd.Function below,
torch_math and hf_eager through torch's, the JAX ones through jax.vjp (XLA's autodiff;
Pallas's own backward kernels).
"""

from __future__ import annotations

import importlib

import torch

NAMES = ("torch_sdpa", "torch_flash_cpu", "flashnum_triton", "flash_attn", "torch_math",
         "hf_eager", "jax_xla", "jax_pallas", "ort_attention", "ort_mha")
# target -> (module, the packages it imports, causal alignment, model): the targets of
# other libraries, each in its own module; a missing package is named with the extra
# that installs it. The model is the flashnum policy that reproduces the kernel most
# closely (docs/audit.md, measured by experiment=kernel_table), as a model spec
# 'policy[:variant[:block_n]]' (flashnum.audit.models.Candidate.of).
LIBRARY_TARGETS = {
    "torch_math": ("targets_torch", (), "top_left", "torch_math"),
    "hf_eager": ("targets_torch", (), "bottom_right", "naive"),
    "jax_xla": ("targets_jax", ("jax",), "top_left", "jax_xla"),
    "jax_pallas": ("targets_jax", ("jax",), "top_left", "fa2:exp2:128"),
    "ort_attention": ("targets_ort", ("onnx", "onnxruntime"), "top_left", "ort_cpu"),
    "ort_mha": ("targets_ort", ("onnx", "onnxruntime"), "top_left", "torch_math"),
}
EXTRA = "kernels"  # pip install 'flashnum[kernels]': jax, onnx, onnxruntime


def torch_sdpa(q, k, v, causal=False, scale=None):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                            scale=scale)


def torch_flash_cpu(q, k, v, causal=False, scale=None):
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, is_causal=causal, scale=scale)[:2]
    return out, lse


BWD_BLOCK = 64  # the Triton backward's block_m = block_n: attention_backward's default


class _TritonAttention(torch.autograd.Function):
    """flashnum's Triton forward, and its Triton backward kernels for dQ, dK, dV."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        from flashnum.engine import attention

        precision = _PRECISION[q.dtype]
        res = attention(q, k, v, precision=precision, policy="fa2", backend="triton",
                        causal=causal, scale=scale)
        ctx.save_for_backward(q, k, v, res.out, res.lse)
        ctx.causal, ctx.scale, ctx.precision = causal, scale, precision
        lse = res.lse.float()
        ctx.mark_non_differentiable(lse)
        return res.out.to(q.dtype), lse

    @staticmethod
    def backward(ctx, do, _dlse):
        from flashnum.backends.triton_backward import attention_backward_triton

        q, k, v, out, lse = ctx.saved_tensors
        g = attention_backward_triton(q, k, v, do, precision=ctx.precision,
                                      block_m=BWD_BLOCK, block_n=BWD_BLOCK, causal=ctx.causal,
                                      scale=ctx.scale, out=out, lse=lse)
        return g.dq.to(q.dtype), g.dk.to(k.dtype), g.dv.to(v.dtype), None, None


_PRECISION = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}


def flashnum_triton(q, k, v, causal=False, scale=None):
    return _TritonAttention.apply(q, k, v, causal, scale)


def flash_attn(q, k, v, causal=False, scale=None):
    from flash_attn import flash_attn_func  # (B, N, H, d) layout

    out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                          softmax_scale=scale, causal=causal)
    return out.transpose(1, 2)


def resolve(target: str):
    """(fn, alignment, model) for a target name or 'module:function'."""
    if target == "torch_sdpa":
        return torch_sdpa, "top_left", "torch_cpu"
    if target == "torch_flash_cpu":
        return torch_flash_cpu, "top_left", "torch_cpu"
    if target == "flashnum_triton":
        return flashnum_triton, "bottom_right", "fa2"
    if target == "flash_attn":
        if importlib.util.find_spec("flash_attn") is None:
            raise ValueError("target flash_attn: the flash_attn package is not installed")
        return flash_attn, "bottom_right", "fa2"
    if target in LIBRARY_TARGETS:
        mod, needs, alignment, model = LIBRARY_TARGETS[target]
        for pkg in needs:
            if importlib.util.find_spec(pkg) is None:
                raise ValueError(f"target {target} needs the {pkg} package: "
                                 f"pip install 'flashnum[{EXTRA}]'")
        fn = getattr(importlib.import_module(f"flashnum.audit.{mod}"), target)
        return fn, alignment, model
    if ":" in target:
        mod, _, name = target.partition(":")
        try:
            fn = getattr(importlib.import_module(mod), name)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"target {target!r} cannot be imported: {e}") from None
        if not callable(fn):
            raise ValueError(f"target {target!r} is not callable")
        return fn, "top_left", None
    raise ValueError(f"unknown target {target!r}; valid: {', '.join(NAMES)}, or module:function")
