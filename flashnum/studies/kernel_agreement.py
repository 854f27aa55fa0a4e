"""Models of real kernels against the kernels themselves, bit for bit: torch's CPU SDPA
forward and backward against attention(model="torch_cpu") and attention_backward(
model="torch_cpu"), the Triton tutorial's fused attention against fa2 and policy
triton_tutorial, and Triton's CPU interpreter against the engine. One function per table
experiment (conf/table/NAME.yaml names it); each section below describes one.

-- torch_cpu_backward --

How exactly attention_backward(model="torch_cpu") reproduces torch's CPU SDPA backward:
the table of the experiment torch_cpu_backward (conf/table/torch_cpu_backward.yaml;
docs/audit.md and README quote it through flashnum.figures.docs, tests/test_quoted.py).

    python -m flashnum.run experiment=torch_cpu_backward

For fp32, bf16 and fp16, causal (torch's is_causal: top-left) or not, and a set of shapes
(ragged N, Nq != Nk both ways, decode rows, d = 64, 80, 128), it runs autograd through
torch.nn.functional.scaled_dot_product_attention (ATen's cpu_flash_attention_backward) and
counts, for dQ, dK and dV each, the entries that flashnum gives bit for bit:

  backward   policy torch_cpu given torch's forward O and LSE: the backward model alone
  end_to_end policy torch_cpu with flashnum's own torch_cpu forward (what
             attention_backward(..., model="torch_cpu") returns by default)
  fa2, naive the emulator's presets (their own forward; block_m = block_n = 64), where
             their causal mask is torch's (non-causal, or Nq = Nk): the baseline (else NaN)

One row per (precision, shape, causal, seed): the shares WAY_GRAD (backward_dq, ...), the
entries of each gradient (elements_dq, ...), the forward's share (forward_bitwise), the
timings, and the machine it ran on (threads, cpu, cpu_count, cpu_capability). Run it as a
fresh process (`python -m flashnum.run` is one) without OMP_NUM_THREADS: nothing here
calls torch.set_num_threads, which would switch MKL's dynamic threading off and change
torch's own fp32 gradients (see flashnum/models/torch_cpu_backward.py).
`torch_cpu_backward_summary(df)` gives each gradient's share over all its entries per
precision and way.

-- torch_cpu_forward --

How exactly attention(model="torch_cpu") reproduces torch's CPU SDPA forward: the table
of the experiment torch_cpu_forward (conf/table/torch_cpu_forward.yaml; docs/audit.md
quotes it through flashnum.figures.docs, tests/test_quoted.py).

    python -m flashnum.run experiment=torch_cpu_forward

For fp32, bf16 and fp16, causal (torch's is_causal: top-left) or not, and a set of shapes
(ragged N, decode shapes with a few query rows against thousands of keys, head dims 64, 80,
128), it compares flashnum.attention(..., model="torch_cpu") with ATen's
_scaled_dot_product_flash_attention_for_cpu (what scaled_dot_product_attention runs on a
CPU) element by element. One row per (precision, shape, causal, seed): the share of output
elements and of LSEs equal bit for bit, the largest difference in units of the output's
ulp, and the machine it ran on (threads, cpu, cpu_count, cpu_capability: the kernel's
vector code and its split over threads are the CPU's). Run it as a fresh process without
OMP_NUM_THREADS, as torch_cpu_backward. bench/bench_torch_cpu.py times the two.

-- triton_tutorial_forward, triton_tutorial_backward --

The Triton tutorial's fused attention against flashnum: the tables of the experiments
triton_tutorial_forward (its forward against fa2 with exp2) and triton_tutorial_backward
(its backward against policy triton_tutorial), conf/table/triton_tutorial_*.yaml;
docs/audit.md shows them as tables generated whole.

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

-- triton_interpreter --

What Triton's CPU interpreter computes differently from the engine, and how far flashnum's
Triton kernel run on it is from the engine: the table of the experiment triton_interpreter
(conf/table/triton_interpreter.yaml; README and docs/kernel.md quote it through
flashnum.figures.docs.kernel).

    python -m flashnum.run experiment=triton_interpreter

Rows of kind "fact" (what tl.exp, tl.exp2 and tl.dot run on the interpreter):
  exp, exp2   numpy's float32 exp / exp2 against the correctly rounded value over 2e6
              arguments uniform in [-30, 0] (numpy seed 0): the share not correctly
              rounded and the largest difference in ulps;
  dot_dD      numpy's fp32 matmul (the interpreter's tl.dot) on fp16-valued operands of
              shape (64, D) x (D, 64): its share equal to a sequential sum over D and to
              torch's matmul (the engine's).
Rows of kind "fidelity": flashnum.backends.triton.compare_with_engine, the kernel on the
interpreter against the engine (same policy, tiling and order) for 2 x 2 heads, Nq = 96,
Nk = 110, d = 64, 32 x 32 blocks, inputs N(0, 1), seeds 0, 1, 2, fp16 / bf16 / fp32, fa2
and exp2 (tests/test_triton.py's case and two more seeds): the shares of outputs within
0, 1 and 2 ulps of the output format at |out| ("elem") and at softmax(S) @ |V|
("scaled"), the largest of each, and whether the running max and the masked rows agree.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import math
import os
import platform
import time
import types
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from flashnum.api import attention, attention_backward
from flashnum.models.torch_cpu_backward import attention_backward_torch_cpu

# -- torch_cpu_backward --


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
GRADS = ("dq", "dk", "dv")
WAYS = ("backward", "end_to_end", "fa2", "naive")
SHAPE = ("batch", "heads", "seq_len_q", "seq_len_k", "head_dim")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _shares(g, want) -> dict:
    return {n: float((getattr(g, n).to(want[n].dtype) == want[n]).double().mean())
            for n in GRADS}


def torch_cpu_backward_row(precision: str, shape, causal: bool, seed: int) -> dict:
    """One row: torch's autograd against the model, end to end and the two presets."""
    b, h, nq, nk, d = shape
    dtype = DTYPES[precision]
    gen = torch.Generator().manual_seed(seed)
    q, k, v = [torch.randn(b, h, n, d, generator=gen).to(dtype) for n in (nq, nk, nk)]
    do = torch.randn(b, h, nq, d, generator=gen).to(dtype)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    t0 = time.perf_counter()
    F.scaled_dot_product_attention(*leaves, is_causal=causal).backward(do)
    torch_s = time.perf_counter() - t0
    want = dict(zip(GRADS, (x.grad for x in leaves), strict=True))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, is_causal=causal)[:2]
    mask = "top_left" if causal else False
    t0 = time.perf_counter()
    g = attention_backward_torch_cpu(q, k, v, do, precision=precision, causal=mask,
                                     out=out, lse=lse)
    model_s = time.perf_counter() - t0
    ways = {"backward": _shares(g, want)}
    e2e = attention_backward(q, k, v, do, precision=precision, model="torch_cpu", causal=mask)
    ways["end_to_end"] = _shares(e2e, want)
    for name in ("fa2", "naive"):  # flashnum's causal=True is bottom-right: torch's if Nq = Nk
        if not causal or nq == nk:
            ways[name] = _shares(attention_backward(q, k, v, do, precision=precision,
                                                    policy=name, causal=causal, block_m=64,
                                                    block_n=64), want)
        else:
            ways[name] = dict.fromkeys(GRADS, float("nan"))
    return dict(precision=precision, **dict(zip(SHAPE, shape, strict=True)), causal=causal,
                seed=seed, **{f"elements_{n}": x.numel() for n, x in zip(GRADS, (q, k, v),
                                                                         strict=True)},
                **{f"{w}_{n}": ways[w][n] for w in WAYS for n in GRADS},
                forward_bitwise=float((e2e.out.to(dtype) == out).double().mean()),
                torch_s=torch_s, model_s=model_s)


def torch_cpu_backward_table(shapes, precisions=tuple(DTYPES), seed: int = 0) -> pd.DataFrame:
    """One row per precision x shape (B, H, Nq, Nk, d) x causal or not."""
    rows = []
    for precision in precisions:
        for shape in shapes:
            for causal in (False, True):
                r = torch_cpu_backward_row(precision, tuple(shape), causal, seed)
                rows.append(r)
                print(f"{precision} {tuple(shape)} causal={causal}: " + " ".join(
                    f"{n} {100 * r[f'backward_{n}']:.4f}%" for n in GRADS), flush=True)
    return pd.DataFrame(rows).assign(
        threads=torch.get_num_threads(), cpu=cpu_name(), cpu_count=os.cpu_count(),
        cpu_capability=torch.backends.cpu.get_cpu_capability())


def torch_cpu_backward_summary(df: pd.DataFrame) -> dict:
    """{precision: {way: {grad: {share (over all entries), worst, comparisons}}}}, the ways
    without a value (a preset under a mask that is not torch's) left out."""
    out = {}
    for prec in DTYPES:
        mine = df[df.precision == prec]
        out[prec] = {}
        for way in WAYS:
            have = mine[mine[f"{way}_dq"].notna()]
            if len(have):
                out[prec][way] = {
                    n: dict(share=float((have[f"{way}_{n}"] * have[f"elements_{n}"]).sum()
                                        / have[f"elements_{n}"].sum()),
                            worst=float(have[f"{way}_{n}"].min()), comparisons=len(have))
                    for n in GRADS}
    return out


# -- torch_cpu_forward --


def ulp(x: torch.Tensor) -> torch.Tensor:
    """The spacing of the output format at |x| (its ulp), as float64."""
    info = torch.finfo(x.dtype)
    mag = x.double().abs().clamp_min(info.tiny)
    return torch.exp2(torch.floor(torch.log2(mag))) * info.eps


def torch_cpu_forward_row(precision: str, shape, causal: bool, seed: int) -> dict:
    """One row: torch's CPU kernel against the model, output and LSE."""
    b, h, nq, nk, d = shape
    dtype = DTYPES[precision]
    g = torch.Generator().manual_seed(seed)
    q, k, v = [torch.randn(b, h, n, d, generator=g).to(dtype) for n in (nq, nk, nk)]
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, is_causal=causal)[:2]
    res = attention(q, k, v, precision=precision, model="torch_cpu",
                    causal="top_left" if causal else False)  # torch's is_causal
    mine = res.out.to(dtype)
    diff = (mine.double() - out.double()).abs()
    return dict(precision=precision, **dict(zip(SHAPE, shape, strict=True)), causal=causal,
                seed=seed, elements=out.numel(),
                bitwise=float((mine == out).double().mean()),
                lse_bitwise=float((res.lse.float() == lse).double().mean()),
                max_ulps=float((diff / ulp(out)).max()))


def torch_cpu_forward_table(shapes, precisions=tuple(DTYPES), seed: int = 0) -> pd.DataFrame:
    """One row per precision x shape (B, H, Nq, Nk, d) x causal or not."""
    rows = []
    for precision in precisions:
        for shape in shapes:
            for causal in (False, True):
                r = torch_cpu_forward_row(precision, tuple(shape), causal, seed)
                rows.append(r)
                print(f"{precision} {tuple(shape)} causal={causal}: bitwise "
                      f"{100 * r['bitwise']:.4f}% lse {100 * r['lse_bitwise']:.4f}% max "
                      f"{r['max_ulps']:.2f} ulp", flush=True)
    return pd.DataFrame(rows).assign(
        threads=torch.get_num_threads(), cpu=cpu_name(), cpu_count=os.cpu_count(),
        cpu_capability=torch.backends.cpu.get_cpu_capability())


# -- triton_tutorial_forward, triton_tutorial_backward --


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
                    ulp_of_max = 2.0 ** (math.floor(math.log2(float(big))) - 10)
                    row[f"max_diff_{name}"] = float(diff)
                    row[f"max_diff_ulps_of_max_{name}"] = float(diff) / ulp_of_max
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


# -- triton_interpreter --


def interpreter_facts(dims=(64, 128, 192, 256)) -> list[dict]:
    """The kind "fact" rows (see the module's docstring)."""
    rng = np.random.default_rng(0)
    x = (-rng.random(2_000_000) * 30).astype(np.float32)
    rows = []
    for name, fn in (("exp", np.exp), ("exp2", np.exp2)):
        cr = fn(x.astype(np.float64)).astype(np.float32)  # float64, rounded once
        ulps = np.abs(fn(x).astype(np.float64) - cr) / np.spacing(cr)
        rows.append(dict(kind="fact", name=name,
                         frac_not_correctly_rounded=float(np.mean(ulps > 0)),
                         max_ulp=float(ulps.max())))
    for d in dims:
        a = rng.standard_normal((64, d)).astype(np.float16).astype(np.float32)
        b = rng.standard_normal((d, 64)).astype(np.float16).astype(np.float32)
        seq = np.zeros((64, 64), np.float32)
        for i in range(d):  # one term at a time, in fp32
            seq += a[:, i : i + 1] * b[i : i + 1, :]
        n = np.matmul(a, b)
        t = (torch.from_numpy(a) @ torch.from_numpy(b)).numpy()
        rows.append(dict(kind="fact", name=f"dot_d{d}",
                         numpy_eq_sequential=float(np.mean(n == seq)),
                         numpy_eq_torch=float(np.mean(n == t))))
    return rows


def fidelity_rows(lead, nq, nk, ds, precisions, variants, block, seeds=(0,),
                  fusion=(False,)) -> list[dict]:
    """The kernel against the engine, one row per seed x d x precision x variant x fusion:
    compare_with_engine's ulp shares flattened (elem_le1, scaled_max, ...)."""
    from flashnum.backends import triton as tf  # sets TRITON_INTERPRET=1 without a GPU

    rows = []
    for seed in seeds:
        for d in ds:
            g = torch.Generator().manual_seed(seed)
            q = torch.randn(*lead, nq, d, generator=g)
            k, v = (torch.randn(*lead, nk, d, generator=g) for _ in range(2))
            for precision in precisions:
                for variant in variants:
                    for fp_fusion in fusion if precision == "bf16" else (False,):
                        c = tf.compare_with_engine(q, k, v, precision=precision,
                                                   block_m=block, block_n=block,
                                                   variant=variant, fp_fusion=fp_fusion)
                        rows.append(dict(
                            kind="fidelity", name=f"{precision}/{variant}", lead=list(lead),
                            nq=nq, nk=nk, d=d, block=block, seed=seed, precision=precision,
                            variant=variant, fp_fusion=fp_fusion,
                            **{f"{part}_{k}": float(x) for part in ("elem", "scaled")
                               for k, x in c[part].items()},
                            m_equal=bool(c["m_equal"]), masked_equal=bool(c["masked_equal"])))
    return rows


def triton_interpreter_table(seeds=(0, 1, 2)) -> pd.DataFrame:
    """The facts, then the fidelity rows of tests/test_triton.py's case at `seeds`."""
    rows = interpreter_facts() + fidelity_rows((2, 2), 96, 110, (64,), ("fp16", "bf16", "fp32"),
                                               ("fa2", "exp2"), block=32, seeds=tuple(seeds))
    df = pd.DataFrame(rows)
    df["lead"] = df["lead"].map(lambda x: "x".join(map(str, x)) if isinstance(x, list) else None)
    return df
