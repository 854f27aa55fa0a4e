"""Kernels an audit can be pointed at by name: one Target each, in TARGETS.

    from flashnum.audit.targets import TARGETS, resolve
    t = TARGETS["torch_sdpa"]; t.alignment, t.model, t.grad_model, t.packages, t.inference
    fn, alignment, model = resolve("torch_sdpa")      # or resolve("pkg.mod:func")

Every target is fn(q, k, v, causal=False, scale=None) -> out (or (out, lse)), with q, k, v
of one dtype and shape (B, H, N, d) and out in that dtype.

  torch_sdpa       torch.nn.functional.scaled_dot_product_attention (is_causal aligns
                   top-left: query i sees keys 0..i). On CPU it runs ATen's flash kernel,
                   modelled by model torch_cpu (flashnum.models)
  torch_flash_cpu  the same CPU kernel through its op, returning the log-sum-exp too
  flashnum_triton  flashnum's own Triton kernel (flashnum.backends.triton; the CPU
                   interpreter without a GPU), fa2 policy, bottom-right alignment; its
                   backward is flashnum.backends.triton_backward's kernels (64 x 64 blocks,
                   the emulated attention_backward's default, so that fa2 models it)
  flash_attn       flash_attn.flash_attn_func (if installed; bottom-right since 2.1)
  torch_math       torch's SDPA on its math backend (flashnum.audit.targets_torch)
  hf_eager         transformers' eager_attention_forward (flashnum.audit.targets_torch)
  torch_flex       torch.compile(flex_attention) on CPU, inductor's C++ flex template; causal
                   is the block mask q >= kv (top-left); model torch_flex (flashnum.models);
                   no backward on CPU: the gradient audit judges its forward alone
  torch_flex_eager flex_attention uncompiled (its dense path; flashnum.audit.targets_torch;
                   model torch_flex_eager, flashnum.models.library); no backward on CPU either
  jax_xla          jax.nn.dot_product_attention, implementation="xla"
                   (flashnum.audit.targets_jax; needs the [kernels] extra)
  jax_pallas       Pallas's FlashAttention kernel mha (flashnum.audit.targets_jax; [kernels])
  ort_attention    ONNX Attention (opset 23) on ONNX Runtime's CPU provider
                   (flashnum.audit.targets_ort; [kernels])
  ort_mha          com.microsoft.MultiHeadAttention on ONNX Runtime ([kernels])
  tinygrad         tinygrad's Tensor.scaled_dot_product_attention on its CPU device
                   (flashnum.audit.targets_tinygrad; the [tinygrad] extra: tinygrad, and
                   ziglang's clang where no clang >= 19 is on PATH), modelled by model
                   tinygrad; its backward is tinygrad's autograd
  pkg.mod:func     any importable callable with the signature above (alignment
                   top_left unless told)

Every target but ort_attention and ort_mha (inference kernels) and the two flex ones (no
CPU backward: the gradient audit judges their forward and says so) is differentiable through
autograd (audit(..., backward=True)): torch's SDPA and its CPU op through torch's own
backward, flash_attn through its own, flashnum_triton through the autograd.Function below,
torch_math and hf_eager through torch's, the JAX ones through jax.vjp (XLA's autodiff;
Pallas's own backward kernels).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Target:
    """One kernel an audit can be pointed at by name: everything the audit, the kernel
    table and the diagnosis know of it, in one place.

    fn          fn(q, k, v, causal=False, scale=None) -> out or (out, lse); a function of
                this module, or "module:function" imported on first use (a library's
                target lives in its own module)
    alignment   its causal mask: "top_left" (torch's is_causal) or "bottom_right"
    model       the flashnum model that reproduces it most closely (docs/audit.md, measured
                by experiment=kernel_table), as a model spec: a kernel model of
                flashnum.models.MODELS, or 'policy[:variant[:block_n or bm x bn]][@fp32]'
                (flashnum.audit.kernel_table.model_kwargs); None: none claimed
    grad_model  the model of its gradients, the same way (None: none claimed)
    packages    what it imports; a missing one is named with `install`, the command that
                installs it
    gpu_only    runs only on a CUDA GPU (the kernel table names the command that adds it)
    inference   no gradient (ONNX Runtime's kernels): the gradient audit says so, one line
    toolchain   "module:function" -> "" where what the kernel compiles with is here, else
                one line saying what to install (tinygrad's clang); None: nothing to check
    """

    name: str
    fn: Callable | str | None
    alignment: str
    model: str | None = None
    grad_model: str | None = None
    packages: tuple[str, ...] = ()
    install: str = "pip install 'flashnum[kernels]'"
    gpu_only: bool = False
    inference: bool = False
    what: str = ""
    toolchain: str | None = None

    def lacking(self) -> str:
        """"" where the target can run here, else one line: what is missing and its install."""
        gone = [p for p in self.packages if importlib.util.find_spec(p) is None]
        if gone:
            return f"target {self.name} needs the {', '.join(gone)} package: {self.install}"
        if self.toolchain is not None:
            mod, _, name = self.toolchain.partition(":")
            why = getattr(importlib.import_module(mod), name)()
            if why:
                return f"target {self.name}: {why}"
        return ""

    def function(self) -> Callable:
        """fn, imported where named by its module (after checking its packages)."""
        why = self.lacking()
        if why:
            raise ValueError(why)
        if self.fn is None:
            raise ValueError(f"target {self.name} has no function here ({self.what}): "
                             "python -m flashnum.audit target=MODULE:FUNCTION audits a wrapper")
        if isinstance(self.fn, str):
            mod, _, name = self.fn.partition(":")
            return getattr(importlib.import_module(mod), name)
        return self.fn


GPU_COMMAND = "python bench/audit_gpu.py"


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
        from flashnum.api import attention

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


_WRAPPER = ("python -m flashnum.audit target=MODULE:FUNCTION (a wrapper with the signature "
            "fn(q, k, v, causal, scale); no named target yet)")
TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("torch_sdpa", torch_sdpa, "top_left", "torch_cpu", "torch_cpu",
           what="torch.nn.functional.scaled_dot_product_attention"),
    Target("torch_flash_cpu", torch_flash_cpu, "top_left", "torch_cpu", "torch_cpu",
           what="the same CPU kernel through its op, with its LSE"),
    Target("flashnum_triton", flashnum_triton, "bottom_right", "fa2", "fa2",
           packages=("triton",), install="pip install 'flashnum[triton]'",
           what="flashnum's own Triton kernel"),
    Target("flash_attn", flash_attn, "bottom_right", "fa2", "fa2", packages=("flash_attn",),
           install=f"a CUDA GPU and flash-attn: {GPU_COMMAND}", gpu_only=True,
           what="flash-attn 2 (flash_attn_func)"),
    Target("torch_math", "flashnum.audit.targets_torch:torch_math", "top_left", "torch_math",
           "naive@fp32", what="torch's SDPA on its math backend"),
    Target("torch_flex", "flashnum.audit.targets_torch:torch_flex", "top_left", "torch_flex",
           what="torch.compile(flex_attention), inductor's CPU flex template"),
    Target("torch_flex_eager", "flashnum.audit.targets_torch:torch_flex_eager", "top_left",
           "torch_flex_eager", what="flex_attention uncompiled (its dense path)"),
    Target("hf_eager", "flashnum.audit.targets_torch:hf_eager", "bottom_right", "naive",
           "naive", what="transformers' eager_attention_forward"),
    Target("jax_xla", "flashnum.audit.targets_jax:jax_xla", "top_left", "jax_xla", "naive",
           packages=("jax",), what='jax.nn.dot_product_attention(implementation="xla")'),
    Target("jax_pallas", "flashnum.audit.targets_jax:jax_pallas", "top_left", "fa2:exp2:128",
           "fa2:exp2:32x32", packages=("jax",), what="Pallas's FlashAttention kernel mha"),
    Target("ort_attention", "flashnum.audit.targets_ort:ort_attention", "top_left", "ort_cpu",
           packages=("onnx", "onnxruntime"), inference=True,
           what="ONNX Attention (opset 23) on ONNX Runtime's CPU provider"),
    Target("ort_mha", "flashnum.audit.targets_ort:ort_mha", "top_left", "torch_math",
           packages=("onnx", "onnxruntime"), inference=True,
           what="com.microsoft.MultiHeadAttention on ONNX Runtime"),
    Target("tinygrad", "flashnum.audit.targets_tinygrad:tinygrad_sdpa", "top_left", "tinygrad",
           packages=("tinygrad",), install="pip install 'flashnum[tinygrad]'",
           toolchain="flashnum.audit.targets_tinygrad:toolchain",
           what="tinygrad's Tensor.scaled_dot_product_attention (CPU device)"),
    Target("cudnn", None, "bottom_right", gpu_only=True, install=GPU_COMMAND,
           what="cuDNN SDPA (SDPBackend.CUDNN_ATTENTION)"),
    Target("fa3", None, "bottom_right", gpu_only=True, install=GPU_COMMAND,
           what="FlashAttention-3 fp8 (flash_attn_interface, Hopper)"),
    Target("fa4", None, "bottom_right", gpu_only=True, install=_WRAPPER,
           what="FlashAttention-4 (flash_attn.cute, Blackwell)"),
    Target("sage", None, "bottom_right", gpu_only=True, install=_WRAPPER,
           what="SageAttention (sageattention.sageattn)"),
)}
NAMES = tuple(n for n, t in TARGETS.items() if t.fn is not None)  # what target= takes


def resolve(target: str):
    """(fn, alignment, model) for a target name or 'module:function' (alignment top_left
    unless told, no model)."""
    if target in TARGETS and TARGETS[target].fn is not None:
        t = TARGETS[target]
        return t.function(), t.alignment, t.model
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
