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
                   interpreter without a GPU), fa2 policy, bottom-right alignment
  flash_attn       flash_attn.flash_attn_func (if installed; bottom-right since 2.1)
  pkg.mod:func     any importable callable with the signature above (alignment
                   top_left unless told)
"""

from __future__ import annotations

import importlib

import torch

NAMES = ("torch_sdpa", "torch_flash_cpu", "flashnum_triton", "flash_attn")


def torch_sdpa(q, k, v, causal=False, scale=None):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                            scale=scale)


def torch_flash_cpu(q, k, v, causal=False, scale=None):
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, is_causal=causal, scale=scale)[:2]
    return out, lse


def flashnum_triton(q, k, v, causal=False, scale=None):
    from flashnum.engine import attention

    precision = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[q.dtype]
    res = attention(q, k, v, precision=precision, policy="fa2", backend="triton",
                    causal=causal, scale=scale)
    return res.out.to(q.dtype), res.lse.float()


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
