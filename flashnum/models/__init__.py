"""Models of real attention kernels, bit for bit: one registry, chosen by `model=`.

    import flashnum
    res = flashnum.attention(q, k, v, precision="bf16", model="torch_cpu")
    g = flashnum.attention_backward(q, k, v, do, precision="bf16", model="torch_cpu")
    from flashnum.models import MODELS
    MODELS["torch_cpu"].kernel, MODELS["torch_cpu"].alignment

A policy is a format per site of flashnum's recurrence (flashnum.numerics.policy); a model
is the arithmetic of one library kernel, written from its source (its own splits, GEMM
orders, exp and casts), which no choice of sites states. Each is a Model below: the
kernel it follows, its causal alignment, the precisions it takes, its forward (and
backward) on a checked call (flashnum.engine.call). A model follows the machine where
its kernel does (torch_cpu.c calls the same MKL sgemm as torch's kernel): its tables are
compared on the CPU class that stored them (flashnum.store.compare).

  torch_cpu        torch's CPU SDPA flash kernel, forward and backward (torch_cpu.py,
                   its exps torch_cpu_exp.py and GEMMs torch_cpu_gemm.py, torch_cpu_backward.py)
  torch_math       ATen's _scaled_dot_product_attention_math (library.py)
  jax_xla          jax.nn.dot_product_attention(implementation="xla") (library.py)
  ort_cpu          ONNX Runtime's CPU Attention (library.py)
  torch_flex       torch.compile(flex_attention) on CPU, inductor's C++ flex template
                   (torch_flex.py)
  torch_flex_eager flex_attention uncompiled, its dense math path (library.py)
  triton_tutorial  the Triton tutorial's fused attention, fp16, forward and backward
                   (triton_tutorial.py)
  tinygrad         tinygrad's scaled_dot_product_attention on its CPU device, fp32 and
                   bf16, forward (tinygrad.py)

A new model: its module here, and its Model in MODELS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Model:
    """A model of one real kernel (see the module docstring)."""

    name: str
    kernel: str  # the kernel it follows, one line
    forward: Callable  # (call: flashnum.engine.call.Call) -> Result
    backward: Callable | None = None  # (call: BackwardCall) -> Gradients
    alignment: str = "bottom_right"  # the kernel's own causal alignment
    precisions: tuple[str, ...] = ("fp32", "bf16", "fp16")

    def check(self, precision: str) -> None:
        if precision not in self.precisions:
            raise ValueError(f"model {self.name!r} does not model precision {precision!r}; "
                             f"valid: {', '.join(self.precisions)}")


def _torch_cpu(call):
    from flashnum.models.torch_cpu import forward

    return forward(call)


def _torch_cpu_backward(call):
    from flashnum.models.torch_cpu_backward import backward

    return backward(call)


def _torch_flex(call):
    from flashnum.models.torch_flex import forward

    return forward(call)


def _library(name: str) -> Callable:
    def forward(call):
        from flashnum.models.library import attention_kernel_model

        return attention_kernel_model(call.q, call.k, call.v, name, precision=call.precision,
                                      causal=call.causal, scale=call.scale)
    return forward


def _tutorial(call):
    from flashnum.models.triton_tutorial import forward

    return forward(call.q, call.k, call.v, causal=call.causal, scale=call.scale,
                   precision=call.precision)[0]


def _tutorial_backward(call):
    from flashnum.models.triton_tutorial import gradients

    return gradients(call)


def _tinygrad(call):
    from flashnum.models.tinygrad import forward

    return forward(call.q, call.k, call.v, precision=call.precision, causal=call.causal,
                   scale=call.scale)


MODELS: dict[str, Model] = {m.name: m for m in (
    Model("torch_cpu", "torch's CPU scaled_dot_product_attention (ATen's flash kernel)",
          _torch_cpu, _torch_cpu_backward, alignment="top_left"),
    Model("torch_math", "ATen's _scaled_dot_product_attention_math", _library("torch_math"),
          alignment="top_left"),
    Model("jax_xla", "jax.nn.dot_product_attention, implementation='xla'",
          _library("jax_xla"), alignment="top_left"),
    Model("ort_cpu", "ONNX Runtime's CPU Attention (opset 23)", _library("ort_cpu"),
          alignment="top_left"),
    Model("torch_flex", "torch.compile(flex_attention) on CPU (inductor's C++ flex template)",
          _torch_flex, alignment="top_left"),
    Model("torch_flex_eager", "flex_attention uncompiled on CPU (its dense math path)",
          _library("torch_flex_eager"), alignment="top_left"),
    Model("triton_tutorial", "the Triton tutorial's fused attention (06-fused-attention.py)",
          _tutorial, _tutorial_backward, precisions=("fp16",)),
    Model("tinygrad", "tinygrad's Tensor.scaled_dot_product_attention (CPU device)",
          _tinygrad, alignment="top_left", precisions=("fp32", "bf16")),
)}


def model_of(name) -> Model:
    """The Model called `name`; ValueError naming the valid ones."""
    if not isinstance(name, str) or name not in MODELS:
        raise ValueError(f"unknown model {name!r}; valid: {', '.join(MODELS)}")
    return MODELS[name]


__all__ = ["MODELS", "Model", "model_of"]
