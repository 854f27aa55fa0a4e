"""The Triton tutorial's fused attention against flashnum: the tables of the experiments
triton_tutorial_forward (its forward against fa2 with exp2) and triton_tutorial_backward
(its backward against policy triton_tutorial), conf/table/triton_tutorial_*.yaml;
docs/audit.md and README quote them as passages.

    FLASHNUM_TRITON_TUTORIAL=PATH/06-fused-attention.py \
        python -m flashnum.run experiment=triton_tutorial_backward   # or ..._forward

The forward: the tutorial's own `attention(q, k, v, causal, sm_scale)` runs its `_attn_fwd`
unchanged with 128 x 64 tiles, fp16, 1 x 2 heads, d = 64, N 256 and 512, causal and not,
sm_scale 0.5 and 1.3, seed 0; each output is compared element by element with
flashnum.attention(precision="fp16", policy="fa2", block_m=128, block_n=64,
variant="exp2") under both forms of the exp2 scale site (exp2_scale "twice", the
tutorial's, and "once", flashnum's kernel's).

PATH is triton-lang/triton's python/tutorials/06-fused-attention.py (it never enters this
repository; the run records its sha256; the one measured is upstream's #8853, the
facebookexperimental/triton mirror at f0504daf, sha256 69a2a3fc...). Its module is loaded
under Triton's CPU interpreter (TRITON_INTERPRET=1). The backward: its own autograd runs
its `_attn_bwd_preprocess` and `_attn_bwd` kernels unchanged: fp16, 1 x 2 heads, d = 64, N 256
and 384 (the tutorial's backward asserts N % 128 == 0), causal and not, sm_scale
1/sqrt(d) = 0.125, 0.5 (its test's) and 1.3 (its benchmark's); q, k, v, dO standard
normal, seed 0. Each case runs the kernels five times: on the interpreter as it is; with
one of the engine's operations put into it (a correctly rounded exp2, a correctly rounded
log2, torch's row sum in place of numpy's); and with all three (nothing else changed).
The baseline beside it: policy="fa2" with exp2=True and 128 x 32 blocks.

Three things the tutorial needs that a CPU lacks, supplied here without touching its
code: an active Triton driver (a stand-in that names the CPU device), a single tile
configuration (the autotuner would time configurations), and, on Triton releases whose
interpreter converts a one-element array with int() (numpy 2 refuses), an __index__ that
takes the element. One row per case: the shares of entries equal bit for bit per
arithmetic and tensor (interpreter_dq, engine_out, ..., fa2_dq) and the largest difference
(max_diff_dq, and in fp16 ulps of the gradient's largest entry).
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import math
import os
import types

import pandas as pd
import torch

from flashnum.api import attention, attention_backward


class _HostDriver:
    """The part of a Triton driver the tutorial's module asks for, for the CPU."""

    def get_active_torch_device(self):
        return torch.device("cpu")

    def get_current_target(self):
        return types.SimpleNamespace(backend="cpu", arch=0, warp_size=32,
                                     is_cuda_backend=lambda: False)

    def get_benchmarker(self):
        return lambda *a, **k: 0.0


class _OneConfig:
    """kernel[grid](...) with fixed meta-parameters, in place of the autotuned kernel."""

    def __init__(self, fn, **meta):
        self.fn, self.meta = fn, meta

    def __getitem__(self, grid):
        g = grid(self.meta) if callable(grid) else grid
        return lambda *a, **kw: self.fn[g](*a, **self.meta, **kw)


def load(path: str, block_m: int = 128, block_n: int = 64):
    """The tutorial's module, ready to run on the interpreter with one tile shape."""
    os.environ["TRITON_INTERPRET"] = "1"  # read when the tutorial's @triton.jit runs
    import triton
    import triton.runtime.interpreter as interp

    try:
        triton.runtime.driver.active.get_current_target()
    except RuntimeError:  # no GPU driver: "0 active drivers"
        triton.runtime.driver.set_active(_HostDriver())
    patch = getattr(interp, "_patch_lang_tensor", None)
    # Triton 3.2's takes (tensor) and calls int() on the array; 3.9's takes (tensor, scope)
    # and squeezes it first, which numpy 2 accepts
    if (patch is not None and not getattr(patch, "one_element_index", False)
            and len(inspect.signature(patch).parameters) == 1):
        def patched(tensor):
            patch(tensor)
            tensor.__index__ = lambda self: int(self.handle.data.reshape(-1)[0])
        patched.one_element_index = True
        interp._patch_lang_tensor = patched
    spec = importlib.util.spec_from_file_location("triton_tutorial_06", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod._attn_fwd = _OneConfig(getattr(mod._attn_fwd, "fn", mod._attn_fwd), BLOCK_M=block_m,
                               BLOCK_N=block_n)
    return mod


BACKWARD_CASES = [(n, causal, s) for n in (256, 384) for causal in (False, True)
                  for s in (0.125, 0.5, 1.3)]


# the interpreter as it is, with one of the engine's three operations put in, with all three
ARITHMETIC = {"interpreter": (), "exp2": ("exp2",), "log2": ("log2",), "sum": ("sum",),
              "engine": ("exp2", "log2", "sum")}


@contextlib.contextmanager
def engine_arithmetic(parts=("exp2", "log2", "sum")):
    """The interpreter with the engine's exp2, log2 (correctly rounded: float64, rounded
    once) and row sum (torch's), those of them named in `parts`: numpy's float32 exp2 and
    log2 are not correctly rounded, and np.sum adds in another order (docs/kernel.md)."""
    import numpy as np
    from triton.runtime import interpreter as it

    def correctly_rounded(f64):
        return lambda self, a: self.unary_op(
            a, lambda x: f64(x.astype(np.float64)).astype(x.dtype))

    def torch_sum(self, input):
        x = torch.from_numpy(np.ascontiguousarray(input.handle.data))
        return self.to_tensor(x.sum(self.axis, keepdim=self.keep_dims).numpy(), input.dtype)

    new = {"exp2": (it.InterpreterBuilder, "create_exp2", correctly_rounded(np.exp2)),
           "log2": (it.InterpreterBuilder, "create_log2", correctly_rounded(np.log2)),
           "sum": (it.ReduceOps, "sum", torch_sum)}
    saved = [new[p][:2] for p in parts]
    old = [getattr(owner, name) for owner, name in saved]
    for p in parts:
        setattr(*new[p])
    try:
        yield
    finally:
        for (owner, name), f in zip(saved, old, strict=True):
            setattr(owner, name, f)


def _share(mine: torch.Tensor, theirs: torch.Tensor) -> float:
    return float((mine.to(torch.float16) == theirs).double().mean())


def backward_agreement(mod, seed: int = 0) -> list[dict]:
    """One row per case of BACKWARD_CASES (see the module's docstring)."""
    rows = []
    for n, causal, sm_scale in BACKWARD_CASES:
        g = torch.Generator().manual_seed(seed)
        q, k, v, do = (torch.randn(1, 2, n, 64, generator=g).half() for _ in range(4))
        row = dict(n=n, causal=causal, sm_scale=sm_scale, elements=q.numel())
        model = attention_backward(q, k, v, do, precision="fp16", model="triton_tutorial",
                                   causal=causal, scale=sm_scale)
        base = attention_backward(q, k, v, do, precision="fp16", policy="fa2", block_m=128,
                                  block_n=32, exp2=True, causal=causal, scale=sm_scale)
        for arith, parts in ARITHMETIC.items():
            with engine_arithmetic(parts):
                qq, kk, vv = (x.clone().requires_grad_() for x in (q, k, v))
                out = mod.attention(qq, kk, vv, causal, sm_scale)
                out.backward(do)
            grads = dict(dq=qq.grad, dk=kk.grad, dv=vv.grad)
            row[f"{arith}_out"] = _share(model.out, out.detach())
            for name, theirs in grads.items():
                row[f"{arith}_{name}"] = _share(getattr(model, name), theirs)
                if arith == "interpreter":
                    row[f"fa2_{name}"] = _share(getattr(base, name), theirs)
                    # how far the differing entries are: in fp16 ulps of the gradient's
                    # largest entry (the scale its fp32 accumulator works at)
                    diff = (getattr(model, name) - theirs.double()).abs().max()
                    big = theirs.double().abs().max()
                    ulp = 2.0 ** (math.floor(math.log2(float(big))) - 10)
                    row[f"max_diff_{name}"] = float(diff)
                    row[f"max_diff_ulps_of_max_{name}"] = float(diff) / ulp
        rows.append(row)
        print(f"N={n} causal={causal} sm_scale={sm_scale}: triton_tutorial dq/dk/dv "
              + " ".join(f"{100 * row[f'interpreter_{x}']:.2f}%" for x in ("dq", "dk", "dv"))
              + " (engine arithmetic: "
              + " ".join(f"{100 * row[f'engine_{x}']:.2f}%" for x in ("dq", "dk", "dv"))
              + "".join(f"; {a} only: " + " ".join(f"{100 * row[f'{a}_{x}']:.2f}%"
                                                   for x in ("dq", "dk", "dv"))
                        for a in ("exp2", "log2", "sum"))
              + "), fa2 "
              + " ".join(f"{100 * row[f'fa2_{x}']:.2f}%" for x in ("dq", "dk", "dv")),
              flush=True)
    return rows


FORWARD_CASES = [(n, causal, s) for n in (256, 512) for causal in (False, True)
                  for s in (0.5, 1.3)]


def forward_agreement(mod, seed: int = 0) -> list[dict]:
    """One row per case of FORWARD_CASES: the tutorial's forward output against
    flashnum.attention(precision="fp16", policy="fa2", block_m=128, block_n=64,
    variant="exp2") under both forms of the exp2 scale site: "twice", the tutorial's
    fl32(fl32(sm_scale) * fl32(1.44269504)), and "once", sm_scale * log2(e) rounded once
    (flashnum's own kernel)."""
    rows = []
    for n, causal, sm_scale in FORWARD_CASES:
        g = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(1, 2, n, 64, generator=g).half() for _ in range(3))
        out = mod.attention(q, k, v, causal, sm_scale)
        row = dict(n=n, causal=causal, sm_scale=sm_scale, elements=out.numel())
        for form in ("twice", "once"):
            res = attention(q, k, v, precision="fp16", policy="fa2", block_m=128, block_n=64,
                            variant="exp2", causal=causal, scale=sm_scale, exp2_scale=form)
            row[f"bitwise_{form}"] = _share(res.out, out)
            row[f"max_diff_{form}"] = float((res.out.half().double() - out.double())
                                            .abs().max())
        rows.append(row)
        print(f"N={n} causal={causal} sm_scale={sm_scale}: bitwise "
              f"{100 * row['bitwise_twice']:.3f}% (exp2_scale twice), "
              f"{100 * row['bitwise_once']:.3f}% (once)", flush=True)
    return rows


def triton_tutorial_forward_table(path: str, seed: int = 0) -> pd.DataFrame:
    """The tutorial's forward at `path` against fa2 with exp2, one row per case."""
    return pd.DataFrame(forward_agreement(load(path), seed))


def triton_tutorial_backward_table(path: str, seed: int = 0) -> pd.DataFrame:
    """The tutorial at `path` against the model, one row per case."""
    return pd.DataFrame(backward_agreement(load(path), seed))
