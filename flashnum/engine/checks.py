"""The argument checks of the public API: one home for attention, attention_backward and
split-KV, so that every door refuses the same inputs with the same words.

    from flashnum.engine.checks import check_tensors, check_options, check_finite
    check_tensors(q, k, v)                  # types, devices, shapes (before anything runs)
    o = check_options(call, variant, params)  # a flashnum.engine.call.Call's every option
    o.block_m, o.block_n, o.num_splits      # clamped to the shape, numpy integers as int
    o.causal                                # False, True (bottom-right) or "top_left"
    check_finite(q=q, k=k, v=v)             # one pass unless a value is not finite

Every refusal is one ValueError (a bad value) or TypeError (a bad type) whose message
names the argument, the value given and what is valid. What is accepted and not obvious:

  shapes   q (..., Nq, d), k (..., Nk, d), v (..., Nk, dv) with any number of leading
           dims, none included: a 2-D tensor is one head, a 3-D tensor is (H, N, d).
           K and V may have fewer heads than Q (dim -3, GQA: Hq a multiple of Hkv).
  dtypes   float64, float32, bfloat16, float16, mixed too: each value is read exactly and
           rounded into the policy's inputs format (a bf16 q beside a float64 k means their
           values). The narrower dtypes (float8_e4m3fn, float8_e5m2, float4_e2m1fn_x2, ...)
           have no arithmetic on the CPU: a TypeError says to pass x.float() (exact) and
           name the fp8 format as the precision.
  integers numpy integers wherever an int is asked for (block_m=np.int64(64)).
  blocks   block_m > max(Nq, 16) and block_n > max(Nk, 16) run as max(Nq, 16) and
           max(Nk, 16) (flashnum.numerics.tiling.clamp_block: a block beyond the data holds
           only padding, which costs memory and adds nothing); num_splits beyond the key
           blocks runs as num_splits = key blocks (the extra splits are empty and merge to
           nothing).
  memory   a call whose estimated peak memory exceeds what the machine has available
           (MemAvailable) is refused before it allocates, naming the estimate.
"""

from __future__ import annotations

import importlib.util
import math
import numbers
import os
from dataclasses import dataclass

import numpy as np
import torch

from flashnum.engine.variants import VARIANTS as VARIANT_CLASSES
from flashnum.engine.variants import Variant, supporting, variant_of
from flashnum.numerics.formats import ROUNDINGS, get_format
from flashnum.numerics.policy import POLICIES, Policy, check_precision
from flashnum.numerics.tiling import ORDERS, check_block, check_causal, clamp_block, n_blocks

VARIANTS = tuple(VARIANT_CLASSES)  # the variants' names (flashnum.engine.variants)
BACKENDS = ("emulate", "triton", "mp")
INPUT_TRANSFORMS = ("none", "smooth_k", "hadamard", "smooth_k+hadamard")
SEED_RANGE = (-(2**63), 2**63 - 1)  # what torch.Generator.manual_seed takes
# the float dtypes torch computes with on every device; the narrower ones (float8_*,
# float4) have no arithmetic on the CPU: refused in one line that says how to pass them
WIDE = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def check_tensors(q, k, v, do=None, *, gqa: bool = False) -> None:
    """Types, devices and shapes of q (..., Nq, d), k (..., Nk, d), v (..., Nk, dv) and
    do (..., Nq, dv) if given; gqa=True lets K, V have fewer heads (dim -3) than Q."""
    xs = (("q", q), ("k", k), ("v", v)) + ((("do", do),) if do is not None else ())
    for name, x in xs:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"{name} must be floating point, got {x.dtype}; valid: a real "
                            "floating dtype (float64, float32, bfloat16, float16)")
        if x.dtype not in WIDE:
            raise TypeError(
                f"{name} has dtype {x.dtype}, which torch cannot compute with here; valid: "
                f"float64, float32, bfloat16, float16 ({name}.float() holds every fp8 value "
                f"exactly; precision='fp8_e4m3' or 'fp8_e5m2' rounds the inputs to fp8)")
        if x.is_meta:
            raise ValueError(f"{name} is a meta tensor (a shape without values); valid: a "
                             "tensor holding values (cpu or cuda)")
        if x.ndim < 2:
            raise ValueError(f"{name} must have shape (..., N, d), got {tuple(x.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k head dims differ: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v key counts differ: k {tuple(k.shape)}, v {tuple(v.shape)}")
    if k.shape[:-2] != v.shape[:-2] or not (q.shape[:-2] == k.shape[:-2] or (
            gqa and q.ndim == k.ndim >= 3 and q.shape[:-3] == k.shape[:-3]
            and q.shape[-3] % max(1, k.shape[-3]) == 0)):
        raise ValueError(
            f"batch dims differ: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
            + ("; valid: equal leading dims, or query heads (dim -3) a multiple of "
               "key/value heads (GQA)" if gqa else "; valid: equal leading dims")
        )
    for what, n in (("query count Nq (q.shape[-2])", q.shape[-2]),
                    ("key count Nk (k.shape[-2])", k.shape[-2]),
                    ("head dim d (q.shape[-1])", q.shape[-1]),
                    ("value dim dv (v.shape[-1])", v.shape[-1])):
        if n == 0:
            raise ValueError(f"{what} is 0; attention needs at least 1 (empty shapes are "
                             "rejected, not returned empty)")
    if 0 in q.shape[:-2] or 0 in k.shape[:-2]:
        raise ValueError(f"batch dims {tuple(q.shape[:-2])} hold no head; every batch dim "
                         "must be >= 1 (empty shapes are rejected, not returned empty)")
    if do is not None and tuple(do.shape) != (*q.shape[:-1], v.shape[-1]):
        raise ValueError(f"do has shape {tuple(do.shape)}; valid: "
                         f"{(*q.shape[:-1], v.shape[-1])} (the output's shape)")


def check_finite(**xs: torch.Tensor) -> None:
    """Every value finite (mask with causal=, never with inf)."""
    for name, x in xs.items():
        x = x.detach()  # no autograd: a grad-requiring input is read, not differentiated
        # a finite sum needs every term finite (one pass); only a sum that is not finite
        # (an inf or NaN, or merely an overflow) needs the elementwise check
        if math.isfinite(float(x.sum())):
            continue
        if not bool(torch.isfinite(x).all()):
            bad = "NaN" if bool(torch.isnan(x).any()) else "inf"
            raise ValueError(f"{name} contains {bad}; inputs must be finite (mask with causal=)")


def check_int(name: str, x, lo: int | None = None, hi: int | None = None) -> int:
    """x an integer (numpy's too, not a bool) within [lo, hi]; returned as an int."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {x!r} ({type(x).__name__})")
    if (lo is not None and x < lo) or (hi is not None and x > hi):
        rng = f">= {lo}" if hi is None else f"in [{_pow2(lo)}, {_pow2(hi)}]"
        raise ValueError(f"{name} must be an integer {rng}, got {x!r}")
    return int(x)


def _pow2(x: int) -> str:
    """-2**63 and 2**63 - 1 as such, other numbers as they are."""
    for e in (31, 32, 63, 64):
        if x == -(2**e):
            return f"-2**{e}"
        if x == 2**e - 1:
            return f"2**{e} - 1"
    return str(x)


def check_number(name: str, x, lo: float | None = None, positive: bool = False) -> float:
    """x a finite real number (not a bool), >= lo or > 0 if asked; returned as a float."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {x!r} ({type(x).__name__})")
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {x!r}")
    if lo is not None and x < lo:
        raise ValueError(f"{name} must be >= {lo}, got {x!r}")
    if positive and not x > 0:
        raise ValueError(f"{name} must be > 0, got {x!r}; valid: a finite {name} > 0 "
                         "(None: 1/sqrt(d))")
    return float(x)


def check_flag(name: str, x) -> bool:
    if not isinstance(x, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {x!r}")
    return bool(x)


def check_order(name: str, order, n_kb: int, valid=ORDERS):
    """A named order of `valid`, or a permutation of range(n_kb) of integers (a list,
    tuple, array or 1-D integer tensor)."""
    choices = f"{', '.join(valid)}, or a permutation of range({n_kb}) (the key blocks)"
    if isinstance(order, str):
        if order not in valid:
            raise ValueError(f"unknown {name} {order!r}; valid: {choices}")
        return order
    if isinstance(order, torch.Tensor):
        items = order.tolist() if order.ndim == 1 and not order.is_floating_point() and \
            order.dtype is not torch.bool else None
    elif isinstance(order, (list, tuple, np.ndarray)):
        items = list(order)
    else:
        items = None
    if items is None or any(isinstance(i, (bool, np.bool_)) or not isinstance(
            i, numbers.Integral) for i in items):
        raise TypeError(f"{name} must be one of {choices}; got {order!r}")
    if sorted(int(i) for i in items) != list(range(n_kb)):
        raise ValueError(f"{name} {[int(i) for i in items][:16]} is not a permutation of "
                         f"range({n_kb}) (there are {n_kb} key blocks); valid: {choices}")
    return [int(i) for i in items]


def check_policy(policy, precision, *, num_splits: int, gqa: bool, backend: str,
                 valid=POLICIES) -> None:
    """A policy name of `valid` or a Policy; split-KV and GQA only where they exist."""
    if not isinstance(policy, Policy) and not (isinstance(policy, str) and policy in valid):
        raise ValueError(f"unknown policy {policy!r}; valid: {', '.join(valid)}, or a "
                         "flashnum.numerics.policy.Policy (a model of a real kernel, such as "
                         "torch_cpu, is model=, not policy=: flashnum.models.MODELS)")
    if isinstance(policy, Policy) and (precision == "mp" or backend == "mp"):
        # mp carries every operation at mp_bits bits: it has no sites to give formats to
        raise ValueError("a Policy is not supported by backend 'mp' (every operation at "
                         "mp_bits bits, no per-site formats); valid: a policy name with "
                         "backend 'mp', or a Policy with backend 'emulate' or 'triton'")
    if num_splits > 1 or gqa:
        what = f"split-KV (num_splits={num_splits})" if num_splits > 1 else \
            "GQA (K, V with fewer heads than Q, run through split-KV)"
        lacking = ("precision 'mp' (backend mp)" if precision == "mp" or backend == "mp" else
                   f"backend {backend!r}" if backend != "emulate" else None)
        if lacking:
            raise ValueError(f"{what} is not supported for {lacking}; valid: backend "
                             f"'emulate' with policy {', '.join(POLICIES)} or a Policy")


@dataclass
class Options:
    """The checked options, as the engine takes them."""

    block_m: int
    block_n: int
    num_splits: int
    causal: bool | str
    seed: int
    scale: float | None
    variant: Variant | None = None  # the variant a name (and tau, beta, exp2_scale) stands for


def check_options(c, variant="fa2", params: dict | None = None, *,
                  backward: bool = False) -> Options:
    """Every option of a call `c` (a flashnum.engine.call.Call or BackwardCall, its tensors
    checked already), the variant as given and its shorthand parameters; raises the first
    bad one. Blocks and splits come back clamped to the shape. With a kernel model
    (model=, flashnum.models), the policy is the model's own: not checked."""
    q, k = c.q, c.k
    precision, policy, backend, model = c.precision, c.policy, c.backend, c.model
    num_splits, block_m, block_n, order = c.num_splits, c.block_m, c.block_n, c.order
    dq_order = getattr(c, "dq_order", None)
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")
    check_precision(precision, mp=not backward)  # a policy's precision (p<bits> too), or mp
    num_splits = check_int("num_splits", num_splits, lo=1)
    gqa = q.ndim >= 3 and q.shape[-3] != k.shape[-3]
    if model is not None and (num_splits > 1 or gqa or backend != "emulate"):
        raise ValueError(f"model {model!r} is a model of one kernel (its own splits, on the "
                         "emulator): num_splits=1, K and V with as many heads as Q, backend "
                         "'emulate' only")
    if not backward and model is None:
        check_policy(policy, precision, num_splits=num_splits, gqa=gqa, backend=backend)
    nq, nk = q.shape[-2], k.shape[-2]
    block_m, block_n = check_block("block_m", block_m), check_block("block_n", block_n)
    if backend != "triton":  # the kernel takes its own block sizes (BLOCKS) and masks
        # the rows of one K/V head: GQA packs a group's query heads into one call
        rows = nq * (q.shape[-3] // k.shape[-3] if gqa else 1)
        block_m, block_n = clamp_block(block_m, rows), clamp_block(block_n, nk)
    n_kb = n_blocks(nk, block_n)
    num_splits = min(num_splits, n_kb)
    check_order("order", order, n_kb)
    if dq_order is not None:
        check_order("dq_order", dq_order, n_kb, valid=("forward", "reverse", "random"))
    variant = check_variant(variant, backend, **(params or {}))
    causal = check_causal(c.causal)
    check_flag("trace", c.trace)
    scale = None if c.scale is None else check_number("scale", c.scale, positive=True)
    if c.rounding not in ROUNDINGS:
        raise ValueError(f"unknown rounding {c.rounding!r}; valid: {', '.join(ROUNDINGS)}")
    seed = check_int("seed", c.seed, *SEED_RANGE)
    check_int("mp_bits", c.mp_bits, lo=2)
    for name in ("split_precision", "merge_precision"):
        f = getattr(c, name)
        if f is not None and not hasattr(get_format(f), "round"):
            raise ValueError(f"{name} must be a format with a rounding, got {f!r}")
    if c.input_transform not in INPUT_TRANSFORMS:
        raise ValueError(f"unknown input_transform {c.input_transform!r}; valid: "
                         f"{', '.join(INPUT_TRANSFORMS)}")
    if backend == "triton":
        # asked without importing it: flashnum.backends.triton sets TRITON_INTERPRET first
        if importlib.util.find_spec("triton") is None:
            raise ValueError(
                "backend='triton' needs the triton package, which is not installed: "
                "pip install triton (or pip install -e .[triton])")
        if causal == "top_left":  # the kernels write the bottom-right rule out themselves
            raise ValueError("causal='top_left' is not supported by backend 'triton' (its "
                             "kernels are bottom-right aligned); valid there: False, True, "
                             "'bottom_right'")
    return Options(block_m=block_m, block_n=block_n, num_splits=num_splits, causal=causal,
                   seed=seed, scale=scale, variant=variant)


def _takes(variant) -> tuple[str, ...] | None:
    """The shorthand parameters a variant named by `variant` takes (None: not a name)."""
    if isinstance(variant, str) and variant in VARIANT_CLASSES:
        return tuple(VARIANT_CLASSES[variant].params())
    return None


def check_variant(variant, backend: str = "emulate", **params) -> Variant:
    """The Variant a name or object stands for (flashnum.engine.variants.variant_of), its
    shorthand parameters checked as numbers, refused where `backend` does not run it. A
    parameter the named variant does not take (tau with fa2) is ignored, as documented,
    whatever its value."""
    takes = _takes(variant)
    params = {n: x for n, x in params.items() if takes is None or n in takes}
    for name, lo in (("tau", 0.0), ("beta", None)):
        if params.get(name) is not None:
            check_number(name, params[name], lo=lo)
    var = variant_of(variant, **params)
    if backend not in var.backends:
        raise ValueError(f"variant {var.name!r} is not run by backend {backend!r}; valid "
                         f"there: {', '.join(supporting(backend))}")
    return var


# ---------------------------------------------------------------------------
# memory

def available_bytes() -> int | None:
    """Memory the machine can give now (Linux MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def peak_bytes(q, k, v, *, block_m: int, block_n: int, num_splits: int = 1,
               backward: bool = False, standard: bool = False) -> int:
    """An estimate, from above, of the memory one call adds: the inputs and their copies
    on the float64 carrier, padded to whole blocks (4 in the forward, 6 in the backward),
    the (B, Nq, block_n) tiles the blocked loop keeps (8; 12), num_splits partial outputs,
    and for the standard structure its chunk of at most 2^24 logits (4 copies; 6).
    `python bench/memory_estimate.py` (2-core Xeon, OMP_NUM_THREADS=1, bf16, B H = 2,
    d = 64): at N = 2048 with blocks of 2048 the estimate is 1.5-11.5x the growth of the
    peak RSS, at N = 4096 with blocks of 64 1.2-3.2x, over fa2, lowp, exact and naive,
    forward and backward."""
    nq, nk, d, dv = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    b = q.numel() // (nq * d)
    nqp, nkp = n_blocks(nq, block_m) * block_m, n_blocks(nk, block_n) * block_n
    tiles = (12 if backward else 8) * b * nqp * block_n
    data = (6 if backward else 4) * b * (nqp + nkp) * (d + dv)
    splits = 3 * num_splits * b * nq * (dv + 2) if num_splits > 1 else 0
    chunk = (6 if backward else 4) * min(b * nq * nk, 1 << 24) if standard else 0
    return 8 * (tiles + data + splits + chunk)


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1024 or unit == "PB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} PB"


def check_memory(q, k, v, opts: Options, backward: bool = False,
                 standard: bool = False) -> None:
    """Refuse a call whose estimated peak memory exceeds what is available."""
    need = peak_bytes(q, k, v, block_m=opts.block_m, block_n=opts.block_n,
                      num_splits=opts.num_splits, backward=backward, standard=standard)
    have = available_bytes()
    if have is not None and need > have:
        raise ValueError(
            f"this call needs an estimated {human(need)} of memory (block_m={opts.block_m}, "
            f"block_n={opts.block_n}, num_splits={opts.num_splits}, q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}) and {human(have)} is available; valid: smaller blocks, "
            "fewer heads or a shorter sequence")
