"""torch's math SDPA and the Hugging Face eager-attention pattern as audit targets.

    from flashnum.audit.targets_torch import torch_math, hf_eager
    out = torch_math(q, k, v, causal=True)           # (B, H, N, d) in and out

  torch_math  torch.nn.functional.scaled_dot_product_attention under
              torch.nn.attention.sdpa_kernel(SDPBackend.MATH): ATen's
              _scaled_dot_product_attention_math (on CPU, bf16 and fp16 inputs are
              computed in fp32 and the output cast back; Q and K are each multiplied by
              sqrt(scale) before Q K^T). is_causal is top-left.
  hf_eager    transformers' eager_attention_forward (models/llama/modeling_llama.py):
              S = (Q K^T) * scaling in the dtype, plus an additive mask, softmax with
              dtype=float32 cast back to the dtype, then P V in the dtype. The installed
              function is called where transformers is present (with the two module
              attributes it reads: num_key_value_groups = 1, training = False), else
              the same lines in plain torch. The causal mask is additive,
              torch.finfo(dtype).min where masked (transformers' masking_utils), and
              bottom-right aligned: with a KV cache the queries are the last positions.

  torch_flex  torch.compile(flex_attention) on CPU: inductor's C++ flex template (model
              torch_flex, flashnum/models/torch_flex.py). No mask when not causal; causal
              is create_block_mask(q >= kv), top-left. Compiled once per shape, dtype,
              mask and scale (dynamic=False), the block masks cached per (Nq, Nk). The
              template has no backward on CPU: with inputs requiring grad it raises
              NotImplementedError, and the gradient audit judges its forward alone.
  torch_flex_eager  flex_attention uncompiled: its dense reference path (a score matrix
              in fp32, the mask, an fp32 softmax, P cast to the dtype, P V); it refuses
              inputs requiring grad on CPU too (flex_attention checks before either path)

torch_math and hf_eager are differentiable through torch autograd.
"""

from __future__ import annotations

import functools
import importlib.util
import math
from types import SimpleNamespace

import torch


def torch_math(q, k, v, causal=False, scale=None):
    """SDPA restricted to the math backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                scale=scale)


def _eager_plain(module, query, key, value, attention_mask, scaling, dropout=0.0):
    """transformers' eager_attention_forward without the KV-group repeat (groups = 1)."""
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = torch.nn.functional.softmax(attn_weights, dim=-1,
                                               dtype=torch.float32).to(query.dtype)
    attn_weights = torch.nn.functional.dropout(attn_weights, p=dropout,
                                               training=module.training)
    attn_output = torch.matmul(attn_weights, value)
    return attn_output.transpose(1, 2).contiguous(), attn_weights


def _eager():
    if importlib.util.find_spec("transformers") is None:
        return _eager_plain
    from transformers.models.llama.modeling_llama import eager_attention_forward

    return eager_attention_forward


def hf_eager(q, k, v, causal=False, scale=None):
    """The eager attention of transformers, (B, H, N, d) in and out."""
    nq, nk = q.shape[-2], k.shape[-2]
    scaling = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    mask = None
    if causal:
        i = torch.arange(nq)[:, None]
        j = torch.arange(nk)[None, :]
        mask = torch.zeros(nq, nk, dtype=q.dtype).masked_fill(
            j > i + (nk - nq), torch.finfo(q.dtype).min)[None, None]
    module = SimpleNamespace(num_key_value_groups=1, training=False)
    out, _ = _eager()(module, q, k, v, mask, scaling)
    return out.transpose(1, 2)


# ---------------------------------------------------------------------------
# flex attention

FLEX_RECOMPILES = 256  # shapes one audit compiles for (dynamo's default stops at 8)


def _causal(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx  # top-left: query i sees keys 0..i


@functools.cache
def _block_mask(nq: int, nk: int):
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(_causal, None, None, nq, nk, device="cpu")


@functools.cache
def _flex_compiled():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _refuse_grad(q, k, v):
    """flex_attention's own check, made before dynamo sees the call: traced, its
    NotImplementedError for inputs that require grad on CPU makes dynamo run every later
    call of flex_attention, any shape, on the eager dense path instead of the compiled
    kernel (measured: 52% of a bf16 output then equal to the compiled kernel's)."""
    from torch.nn.attention import flex_attention as flex

    check = getattr(flex, "_validate_device", None)
    if check is not None:
        check(q, k, v)
    elif q.device.type == "cpu" and any(x.requires_grad for x in (q, k, v)):
        raise NotImplementedError("FlexAttention does not support backward on CPU. Please set "
                                  "the input requires_grad to False or use another device.")


def torch_flex(q, k, v, causal=False, scale=None):
    """torch.compile(flex_attention) on CPU, (B, H, N, d) in and out; every new shape
    compiles (tens of seconds), and a shape past dynamo's recompile limit raises rather
    than falling back to the eager path."""
    _refuse_grad(q, k, v)
    mask = _block_mask(q.shape[-2], k.shape[-2]) if causal else None
    with torch._dynamo.config.patch(recompile_limit=FLEX_RECOMPILES,
                                    fail_on_recompile_limit_hit=True):
        return _flex_compiled()(q, k, v, block_mask=mask, scale=scale)


def torch_flex_eager(q, k, v, causal=False, scale=None):
    """flex_attention without torch.compile (its dense path), (B, H, N, d) in and out."""
    import warnings

    from torch.nn.attention.flex_attention import flex_attention

    mask = _block_mask(q.shape[-2], k.shape[-2]) if causal else None
    with warnings.catch_warnings():  # "flex_attention called without torch.compile"
        warnings.simplefilter("ignore", UserWarning)
        return flex_attention(q, k, v, block_mask=mask, scale=scale)
