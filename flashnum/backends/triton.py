"""The real kernel: a Triton FlashAttention-2 forward with flashnum's knobs.

    from flashnum.backends.triton import attention_triton
    res = attention_triton(q, k, v, policy="fa2", precision="bf16", block_m=64, block_n=64,
                           order="reverse", variant="exp2", causal=True, trace=True)
    # or, the same call through the engine's front door:
    res = flashnum.attention(q, k, v, precision="bf16", backend="triton", ...)

The kernel (`_fa2_fwd`) is the recurrence of Triton's fused-attention tutorial
(python/tutorials/06-fused-attention.py), one program per (query block, batch*head):

    m_i = max(m_{i-1}, rowmax(S_j));  alpha = exp(m_{i-1} - m_i);  P = exp(S_j - m_i)
    l_i = l_{i-1} alpha + rowsum(P);   o_i = o_{i-1} alpha + cast(P) @ V_j
    out = o_last / l_last  (correctly rounded: tl.math.div_rn)

with every numerically relevant choice an argument, taken from the flashnum Policy:

    inputs        fp16, bf16, fp32 (fp8_e4m3 / fp8_e5m2 on a GPU only)
    qk_acc/pv_acc fp32 -> input_precision "ieee"; tf32 -> "tf32"; an explicit
                  input_precision="tf32x3" runs the fp32 dots as 3 tf32 dots
    p_cast        the format P is cast to before P @ V (fp16, bf16, fp32, fp8 on GPU)
    l_from        l sums the fp32 P ("p", FA2 and the tutorial) or the cast P
    variant       "fa2": exp, S = scale * QK^T; "exp2": log2(e) folded into the
                  scale (held in fp32, as the engine holds it) and exp2, so m, l are
                  in base-2 units
    s, m, p, l_acc, l, o, div  fp32 (the softmax state lives in registers as fp32)
    out           fp16, bf16 or fp32
    order         any key-block order: an int32 (Z or 1, n_qb, n_kb) index tensor
                  (flashnum.numerics.tiling.key_block_order; max_* orders from the tiles'
                  largest logits over their real rows, computed with torch first)
    fp_fusion     Triton's enable_fp_fusion (FMA contraction) on a GPU; default False
                  so that the GPU rounds where the policy says (the tutorial runs with
                  Triton's default, True)
    fp8_max_imprecise_acc  fp8 dots on sm_90 sum this many products in the MMA's
                  reduced-precision accumulator before promoting to fp32 (None keeps
                  Triton's default: 2^30 on sm_90, i.e. the whole dot unpromoted)

Fully masked rows (causal with Nq > Nk) keep m = -inf and l = 0 and give out = 0
(flagged in Result.masked); key tiles that are entirely above the causal diagonal
are skipped (a skipped tile would leave m, l, o unchanged anyway: alpha = 1, P = 0).
No autotuning: block_m and block_n are the experimental factor.

Layers: `attention_triton` (the call checked into a flashnum.engine.call.Call, policy ->
a Kernel's constexprs, input rounding, order, Result) -> `fa2_forward` (allocates and
launches on prepared tensors with a Kernel and a Launch; what the GPU benchmark times)
-> `_fa2_fwd` (the kernel, in flashnum.backends.triton_kernel with the jit helpers the
backward shares). `compare_with_engine` beside them is
the correctness check: kernel vs engine in ulps.

On a CPU: Triton's interpreter. Importing this module sets TRITON_INTERPRET=1 when
no CUDA GPU is present and the variable is not set. Triton reads the variable when a
function is decorated with @triton.jit, and triton.language decorates its own library
(tl.sum, tl.max) when it is first imported: so the variable must be set before triton
is first imported. Import this module (or call flashnum.attention(..., backend="triton"))
before anything imports triton, or export TRITON_INTERPRET=1. Otherwise the import
fails with a RuntimeError that says which of the two went wrong (TRITON_INTERPRET=0
without a GPU; triton imported earlier without the variable).

What the interpreter (triton 3.9) gets wrong, checked here, and what we do about it
(EMULATE=True, a constexpr that is False on a GPU so that the GPU keeps native casts):
  - bf16 is stored as raw uint16 and tl.dot multiplies the bit patterns (errors ~1e10):
    bf16 Q, K, V are passed widened to fp32 (exact) and the dots run on those; the
    products of two bf16 numbers are exact in fp32, as on tensor cores.
  - fp32 -> bf16 casts truncate, even with fp_downcast_rounding="rtne": P (p_cast bf16)
    and the output (out bf16) are rounded to nearest even by integer operations on the
    fp32 bits (`_round_rne`), kept in fp32 containers.
  - input_precision is ignored (numpy fp32 matmul): for "tf32" the operands are rounded
    to tf32 (nearest even, flashnum's tf32 format) before an fp32 dot; "tf32x3" is
    emulated as Triton's F32DotTC pass lowers it: big = tf32(a), small = a - big,
    dot(small, big') + dot(big, small') + dot(big, big').
  - fp8 conversions truncate and the fp8 dot goes through fp16: fp8 is refused on CPU.
What still differs between the interpreter and a GPU (by construction, not fixed):
  - exp/exp2: the interpreter calls numpy's float32 exp/exp2 (measured: 39% / 21% of
    float32 results differ from the correctly rounded value, by <= 2 / 1 ulp); a GPU
    runs the approximate ex2 instruction (tl.exp multiplies by log2(e) first, one more
    rounding); the engine's exp is correctly rounded.
  - accumulation order: the interpreter's dots are numpy matmuls and `acc = dot(p, v,
    acc)` is matmul + add (two roundings); a GPU's MMA accumulates into acc in its own
    order. tl.sum is np.sum (pairwise) here, a thread/warp tree on a GPU.
  - FMA contraction: never in the interpreter; on a GPU only with fp_fusion=True.
  - tf32 on a GPU: Triton hands the fp32 operands to the tf32 MMA without a rounding
    instruction and the tensor core drops the low 13 bits (truncation,
    triton-lang/triton#4574), not the nearest-even rounding emulated here.
  - subnormals: the GPU's approximate ex2 may flush subnormal results (its .ftz form);
    numpy keeps them.
  - the dots' summation order: numpy sums the head dim sequentially (measured for d up
    to 256: experiments/triton_interpreter); torch's CPU matmul (the engine's) gives the
    same bits there now, but has split the sum at d = 256 before (its BLAS's choice),
    so kernel and engine logits can differ in the last bit at large d on a CPU.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields

import torch

from flashnum.engine.call import call_of
from flashnum.engine.result import Result, Trace
from flashnum.engine.tiles import exp2_scale as exp2_scale_of
from flashnum.engine.variants import supporting
from flashnum.numerics.constants import LOG2E
from flashnum.numerics.formats import get_format
from flashnum.numerics.policy import POLICIES, PRODUCT_SITES, Policy, check_sites, make_policy
from flashnum.numerics.tiling import (
    causal_visible,
    check_block,
    key_block_order,
    n_blocks,
    needs_block_max,
    needs_tile_classes,
    tile_classes,
)

# first of the triton imports: without a GPU it sets TRITON_INTERPRET before triton loads
from flashnum.backends.triton_kernel import _TORCH, INTERPRET, _fa2_fwd  # isort: skip
import triton  # noqa: E402

BLOCKS = (16, 32, 64, 128)
HEAD_DIMS = (16, 256)  # smallest and largest head dim (others padded to a power of two)
VARIANTS = supporting("triton")  # fa2, exp2: the plain running max (flashnum.engine.variants)
PRECISIONS = ("ieee", "tf32", "tf32x3")
IN_FORMATS = ("fp16", "bf16", "fp32", "fp8_e4m3", "fp8_e5m2")
OUT_FORMATS = ("fp16", "bf16", "fp32")
FP8 = ("fp8_e4m3", "fp8_e5m2")
# the formats the kernel rounds each site into (the softmax state lives in registers as fp32;
# a site not named here, p_cast, is any format that widens exactly into the inputs')
KERNEL_SITES = {"inputs": IN_FORMATS, "qk_acc": ("fp32", "tf32"),
                **{site: ("exact",) for site in PRODUCT_SITES},  # tl.dot rounds no product
                **{site: ("fp32",) for site in ("s", "m", "p")}, "pv_acc": ("fp32", "tf32"),
                **{site: ("fp32",) for site in ("l_acc", "l", "o", "div")}, "out": OUT_FORMATS}
_RUNS_THERE = "the presets fa2 in fp16, bf16, fp32, tf32 (fp8 on a GPU)"
# inputs format -> the formats P may be cast to: their numbers widen exactly into the
# inputs' dtype, in which the P @ V dot runs
_EXACT_INTO = {
    "fp32": ("fp32", "tf32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2"),
    "fp16": ("fp16", "fp8_e4m3", "fp8_e5m2"),
    "bf16": ("bf16", "fp8_e4m3", "fp8_e5m2"),
    "fp8_e4m3": ("fp8_e4m3",),
    "fp8_e5m2": ("fp8_e5m2",),
}
_FP8_DTYPES = tuple(_TORCH[f] for f in FP8 if _TORCH[f] is not None)


# ---------------------------------------------------------------------------
# the host wrapper


def _kernel_spec(pol: Policy, input_precision: str | None):
    """Map a Policy to the kernel's constexprs, or say what the kernel implements."""
    if pol.structure != "flash":
        raise ValueError(f"policy {pol.name!r} cannot run on the triton kernel (structure="
                         f"{pol.structure!r}); it implements structure='flash'")
    check_sites(pol, KERNEL_SITES, "the triton kernel", hint=_RUNS_THERE)  # in one place
    if pol.inputs in _EXACT_INTO and pol.p_cast not in _EXACT_INTO[pol.inputs]:
        raise ValueError(
            f"policy {pol.name!r} cannot run on the triton kernel (p_cast={pol.p_cast!r} with "
            f"inputs={pol.inputs!r}); it implements a p_cast whose numbers widen exactly into "
            f"the inputs': {_RUNS_THERE}")
    if input_precision is not None and input_precision not in PRECISIONS:
        raise ValueError(
            f"unknown input_precision {input_precision!r}; valid: {', '.join(PRECISIONS)}, or "
            "None (from the policy: qk_acc/pv_acc fp32 -> ieee, tf32 -> tf32)"
        )

    def precision(site, operand_fmt):
        want = "tf32" if getattr(pol, site) == "tf32" else "ieee"
        if operand_fmt != "fp32" or input_precision is None:
            return want  # 16- and 8-bit operands: exact products, precision is moot
        if (want == "tf32") != (input_precision == "tf32"):
            raise ValueError(
                f"input_precision={input_precision!r} contradicts the policy's {site}="
                f"{getattr(pol, site)!r}; use precision='tf32' for tf32 dots, 'fp32' for ieee "
                "or tf32x3"
            )
        return input_precision

    return precision("qk_acc", pol.inputs), precision("pv_acc", pol.p_cast)


def _check_inputs(q, k, v, block_m, block_n):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.ndim < 2:
            raise ValueError(f"{name} must be a floating-point torch.Tensor (..., N, d)")
    if not q.dtype == k.dtype == v.dtype:
        raise ValueError(
            f"q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype}); pass one dtype "
            "(the policy's inputs format decides what the kernel sees)"
        )
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"shapes do not fit: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}; "
            "need q (..., Nq, d), k (..., Nk, d), v (..., Nk, dv)"
        )
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(f"batch dims differ: q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)}")
    if q.shape[-2] == 0 or k.shape[-2] == 0:
        raise ValueError("Nq and Nk must be >= 1")
    for name, dim in (("head dim d", q.shape[-1]), ("value dim dv", v.shape[-1])):
        if not HEAD_DIMS[0] <= dim <= HEAD_DIMS[1]:
            raise ValueError(
                f"{name}={dim} is not supported by the triton kernel; valid: "
                f"{HEAD_DIMS[0]}..{HEAD_DIMS[1]} (padded to a power of two)"
            )
    for name, b in (("block_m", block_m), ("block_n", block_n)):
        check_block(name, b)
        if b not in BLOCKS:
            raise ValueError(f"{name}={b} is not supported by the triton kernel; valid: "
                             f"{', '.join(map(str, BLOCKS))}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"{name} contains NaN or inf; inputs must be finite")


def _block_max(q3, k3, qk_scale, block_m, block_n, n_qb, n_kb, causal, precision):
    """(Z, n_qb, n_kb) largest logit over each tile's real rows and keys.

    Formed as the engine forms its logits (torch fp32 matmul on the CPU, fp32 scale),
    so that the two backends order the tiles alike; padded query rows do not count.
    """
    a, b = q3.float().cpu(), k3.float().cpu()
    if precision == "tf32":
        tf32 = get_format("tf32")
        a, b = tf32.round(a.double()).float(), tf32.round(b.double()).float()
    s = (a @ b.transpose(-1, -2)) * torch.tensor(qk_scale, dtype=torch.float32)
    nq, nk = s.shape[-2:]
    if causal:
        s = s.masked_fill(~causal_visible(nq, nk), -math.inf)
    s = torch.nn.functional.pad(s, (0, n_kb * block_n - nk, 0, n_qb * block_m - nq),
                                value=-math.inf)
    s = s.reshape(-1, n_qb, block_m, n_kb, block_n)
    return s.amax(dim=(2, 4))


@dataclass(frozen=True)
class Kernel:
    """What the kernel computes: its constexprs and the fp32 scale (attention_triton
    derives them from the Policy and the call)."""

    qk_scale: float  # the logits' scale as the kernel holds it, in fp32 (log2 e folded in)
    block_m: int
    block_n: int
    causal: bool
    base2: bool  # exp2 on base-2 logits
    l_from_cast: bool  # l sums the cast P
    qk_precision: str  # the dots' input precision: ieee, tf32, tf32x3
    pv_precision: str
    p_format: str  # the format P is cast to before P @ V
    out_format: str
    trace: bool = False


@dataclass(frozen=True)
class Launch:
    """The kernel's own options, which no policy names: the fp32 dots' input precision
    (None: from the policy), FMA contraction and fp8 promotion on a GPU (see the module
    docstring), and the GPU launch (no effect on the numbers' meaning)."""

    input_precision: str | None = None
    fp_fusion: bool = False
    fp8_max_imprecise_acc: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None


LAUNCH_OPTIONS = tuple(f.name for f in fields(Launch))


def fa2_forward(q3, k3, v3, order_t, kernel: Kernel, launch: Launch = Launch()) -> dict:
    """Launch the kernel on prepared tensors; no checks, no rounding (attention_triton's job).

    q3 (Z, Nq, d), k3 (Z, Nk, d), v3 (Z, Nk, dv) in the kernel's storage dtype (bf16 as
    fp32 on the interpreter), on the kernel's device; order_t int32 (Z or 1, n_qb, n_kb),
    or None for the forward order.
    Returns o (Z, Nq, dv) in the output format's storage dtype, m, l (Z, Nq) fp32,
    n_rescales (Z, Nq) int32, trace_m, trace_l (Z, n_kb, Nq) fp32 or None.
    """
    c = kernel
    q3, k3, v3 = (x if x.stride(-1) == 1 else x.contiguous() for x in (q3, k3, v3))
    Z, nq, d = q3.shape
    nk, dv = v3.shape[1], v3.shape[2]
    n_qb, n_kb = n_blocks(nq, c.block_m), n_blocks(nk, c.block_n)
    if order_t is None:  # forward: the kernel reads no order (no host sync either)
        forward, order_t = True, torch.zeros(1, 1, 1, dtype=torch.int32, device=q3.device)
    else:
        forward = bool((order_t == torch.arange(n_kb, device=order_t.device)).all())
    device = q3.device
    out_dtype = torch.float32 if (INTERPRET and c.out_format == "bf16") else _TORCH[c.out_format]
    o = torch.empty(Z, nq, dv, dtype=out_dtype, device=device)
    m = torch.empty(Z, nq, dtype=torch.float32, device=device)
    l = torch.empty_like(m)
    n_resc = torch.empty(Z, nq, dtype=torch.int32, device=device)
    if c.trace:
        tm = torch.empty(Z, n_kb, nq, dtype=torch.float32, device=device)
        tl_ = torch.empty_like(tm)
    else:
        tm = tl_ = m  # never written (TRACE=False)
    head_dim, head_dim_v = triton.next_power_of_2(d), triton.next_power_of_2(dv)
    gpu = {}
    if not INTERPRET:
        gpu = dict(
            num_warps=launch.num_warps or (4 if max(head_dim, head_dim_v) <= 64 else 8),
            num_stages=launch.num_stages or 2,
            enable_fp_fusion=bool(launch.fp_fusion),
        )
    _fa2_fwd[(n_qb, Z)](
        q3, k3, v3, o, order_t, m, l, n_resc, tm, tl_,
        c.qk_scale, nq, nk, n_kb,
        q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1), v3.stride(0), v3.stride(1),
        o.stride(0), o.stride(1), order_t.stride(0) if order_t.shape[0] > 1 else 0,
        D=d, DV=dv, HEAD_DIM=head_dim, HEAD_DIM_V=head_dim_v,
        BLOCK_M=c.block_m, BLOCK_N=c.block_n,
        CAUSAL=bool(c.causal), USE_EXP2=bool(c.base2), L_FROM_CAST=bool(c.l_from_cast),
        QK_PRECISION=c.qk_precision, PV_PRECISION=c.pv_precision,
        P_FORMAT=c.p_format, OUT_FORMAT=c.out_format,
        FP8_IMPRECISE=launch.fp8_max_imprecise_acc,
        FORWARD=forward, EMULATE=INTERPRET, TRACE=bool(c.trace),
        **gpu,
    )
    return dict(o=o, m=m, l=l, n_rescales=n_resc, trace_m=tm if c.trace else None,
                trace_l=tl_ if c.trace else None)


def _refuse_fp8(pol: Policy | None, q, k, v) -> None:
    """fp8 inputs or P on the interpreter, which truncates fp8 casts: one line."""
    fp8 = [f"{s}={getattr(pol, s)}" for s in ("inputs", "p_cast")
           if pol is not None and getattr(pol, s) in FP8]
    fp8 += [f"{n}.dtype={x.dtype}" for n, x in (("q", q), ("k", k), ("v", v))
            if isinstance(x, torch.Tensor) and x.dtype in _FP8_DTYPES]
    if INTERPRET and fp8:
        raise ValueError(
            f"fp8 ({', '.join(fp8)}) needs a CUDA GPU (sm_89+); Triton's CPU interpreter "
            "truncates fp8 casts. Valid on CPU: fp16, bf16, fp32"
        )


def _check_call(pol: Policy, var, rounding: str, q, k, v, block_m: int, block_n: int) -> None:
    """What attention_triton refuses, each with one line naming the valid choices."""
    if "triton" not in var.backends:
        raise ValueError(f"variant {var.name!r} is not implemented by the triton kernel; "
                         f"valid: {', '.join(VARIANTS)}")
    if rounding != "nearest":
        raise ValueError(f"rounding {rounding!r} is not available on the triton kernel; "
                         "valid: nearest")
    _refuse_fp8(pol, q, k, v)
    _check_inputs(q, k, v, block_m, block_n)
    if pol.inputs in FP8 and min(block_n, q.shape[-1], v.shape[-1]) <= 16:
        raise ValueError(
            f"fp8 dots need K >= 32 (Triton's minimum for 8-bit operands): got block_n="
            f"{block_n}, d={q.shape[-1]}, dv={v.shape[-1]}; valid: block_n >= 32, d, dv > 16"
        )


def _result(k_out: dict, order_full, device, lead, nq: int, dv: int, n_kb: int, base2: bool,
            info: dict) -> Result:
    """The kernel's outputs as the engine's Result (float64 on the inputs' device);
    order_full (Z, n_qb, n_kb) the key block order when a trace was asked for, else None."""
    o, m, l, n_resc = k_out["o"], k_out["m"], k_out["l"], k_out["n_rescales"]
    tm, tl_ = k_out["trace_m"], k_out["trace_l"]
    home = device

    def back(x, *tail):
        return x.to(home, torch.float64).reshape(*lead, *tail)

    m64, l64 = back(m, nq), back(l, nq)
    lse = m64 / LOG2E + torch.log(l64) if base2 else m64 + torch.log(l64)  # natural log
    tr = None
    if order_full is not None:
        tr = Trace(
            m=back(tm, n_kb, nq), l=back(tl_, n_kb, nq),
            order=order_full.reshape(*lead, *order_full.shape[1:]).to(home).clone(),
        )
    return Result(
        out=back(o, nq, dv), m=m64, l=l64, lse=lse, masked=~torch.isfinite(m64),
        n_rescales=n_resc.to(home, torch.int64).reshape(*lead, nq), trace=tr, backend="triton",
        info=info,
    )


def attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                     launch: Launch | None = None, **options) -> Result:
    """softmax(scale Q K^T) V by the Triton kernel; see the module docstring.

    q (..., Nq, d), k (..., Nk, d), v (..., Nk, dv), one float dtype; values are
    rounded (nearest even, from float64) to the policy's inputs format first.
    options: flashnum.attention's (flashnum.engine.call), as the kernel takes them:
    policy:          a Policy, or a preset name with `precision` (fa2 in fp16 bf16 fp32 tf32;
                     precision unset: bf16 for a preset, the Policy's inputs for a Policy)
    block_m/block_n: 16 32 64 128
    order:           forward reverse random max_ascending max_descending partial_first,
                     or a permutation
    variant:         fa2 (exp), exp2 (log2 e folded into the scale): a name or a
                     flashnum.engine.variants.Variant (Exp2(exp2_scale="twice"));
                     exp2_scale=once|twice with the name exp2 (flashnum.engine.tiles)
    rounding:        nearest (the only one a kernel does)
    and the kernel's own (a Launch, or its fields as keywords): input_precision None
    (from the policy), ieee, tf32, tf32x3 (fp32 dots only); fp_fusion; fp8_max_imprecise_acc;
    num_warps, num_stages.
    """
    own = {n: options.pop(n) for n in LAUNCH_OPTIONS if n in options}
    launch = dataclasses.replace(launch or Launch(), **own)
    policy = options.get("policy", "fa2")
    if options.get("precision") is None:  # a Policy names its own formats
        options["precision"] = policy.inputs if isinstance(policy, Policy) else "bf16"
    _refuse_fp8(make_policy(policy, options["precision"]) if isinstance(policy, Policy)
                or policy in POLICIES else None, q, k, v)
    # fp8 tensors (a GPU's) hold numbers fp32 holds exactly; the policy's inputs format
    # decides what the kernel sees
    if all(isinstance(x, torch.Tensor) and x.dtype in _FP8_DTYPES for x in (q, k, v)):
        q, k, v = (x.float() for x in (q, k, v))
    return run_call(call_of(q, k, v, backend="triton", **options), launch)


def run_call(call, launch: Launch | None = None) -> Result:
    """A checked call (flashnum.engine.call.Call) on the kernel, launched as `launch` says
    (the defaults when None)."""
    launch = launch or Launch()
    pol, var = call.pol, call.variant
    qk_prec, pv_prec = _kernel_spec(pol, launch.input_precision)
    q, k, v = call.q, call.k, call.v
    _check_call(pol, var, call.rounding, q, k, v, call.block_m, call.block_n)
    block_m, block_n, causal = call.block_m, call.block_n, bool(call.causal)
    lead = q.shape[:-2]
    nq, nk, dv = q.shape[-2], k.shape[-2], v.shape[-1]
    scale = call.softmax_scale
    # the scale is held in fp32, computed on the host: scale * log2(e) rounded once from
    # its float64 value (exp2_scale "once", the engine's default), or as the Triton
    # tutorial forms it in its kernel (exp2_scale "twice": flashnum.engine.tiles.exp2_scale)
    qk_scale = (exp2_scale_of(scale, var.exp2_form) if var.base2
                else float(torch.tensor(scale, dtype=torch.float64).float()))
    device = torch.device("cpu") if INTERPRET else torch.device("cuda")
    # inputs as stored: correctly rounded from float64; on the interpreter bf16 is
    # carried in fp32 (exact), because its bf16 dot multiplies raw bit patterns
    fin = get_format(pol.inputs)
    store = torch.float32 if (INTERPRET and pol.inputs == "bf16") else _TORCH[pol.inputs]
    q3, k3, v3 = (fin.round(x.detach().to(torch.float64)).to(store).to(device)
                  .reshape(-1, *x.shape[-2:]).contiguous() for x in (q, k, v))
    Z = q3.shape[0]
    n_qb, n_kb = n_blocks(nq, block_m), n_blocks(nk, block_n)
    if needs_block_max(call.order):
        bmax = _block_max(q3, k3, qk_scale, block_m, block_n, n_qb, n_kb, causal, qk_prec)
        perm = key_block_order(call.order, n_qb, n_kb, call.seed, bmax.cpu())
    else:
        classes = (tile_classes(nq, nk, block_m, block_n, call.causal)
                   if needs_tile_classes(call.order) else None)
        perm = key_block_order(call.order, n_qb, n_kb, call.seed,
                               classes=classes)[None]  # (1, n_qb, n_kb)
    kernel = Kernel(qk_scale, block_m, block_n, causal, var.base2, pol.l_from == "p_cast",
                    qk_prec, pv_prec, pol.p_cast, pol.out, call.trace)
    k_out = fa2_forward(q3, k3, v3, perm.to(torch.int32).to(device).contiguous(), kernel,
                        launch)
    info = dict(call.info(), causal=causal, input_precision=(qk_prec, pv_prec),
                interpreter=INTERPRET, fp_fusion=launch.fp_fusion,
                fp8_max_imprecise_acc=launch.fp8_max_imprecise_acc)
    order_full = perm.expand(Z, n_qb, n_kb) if call.trace else None
    return _result(k_out, order_full, q.device, lead, nq, dv, n_kb, var.base2, info)


# ---------------------------------------------------------------------------
# the correctness check beside the kernel: kernel vs engine, in ulps


def ulp_distribution(diff: torch.Tensor, unit: torch.Tensor) -> dict:
    """Fractions of |diff| within 0, 1, 2 units and the largest, in units `unit`."""
    x = (diff.abs() / unit).flatten()
    frac = {f"le{t}": float((x <= t).double().mean()) for t in (0, 1, 2)}
    return dict(n=x.numel(), **frac, max=float(x.max()) if x.numel() else 0.0)


def compare_with_engine(q, k, v, **kw) -> dict:
    """Run the kernel and the engine (same policy, tiling, order, variant) and measure.

    Returns {"elem": ..., "scaled": ..., "m_equal": bool, "masked_equal": bool} where
    "elem" counts |out_kernel - out_engine| in ulps of the output format at |out|, and
    "scaled" in ulps at (softmax(S) @ |V|): the magnitude that rounding errors of P, l
    and o are relative to (|P| |V| / l, as in a matmul's componentwise bound). Outputs
    that cancel (|out| << that magnitude) differ by many ulps of |out| for a one-ulp
    change of an fp32 intermediate; the scaled unit does not count cancellation.
    """
    from flashnum.engine.call import call_of
    from flashnum.engine.emulate import emulate

    q, k, v = (x.detach().cpu() for x in (q, k, v))
    res_k = attention_triton(q, k, v, **kw)
    kw_e = {a: b for a, b in kw.items() if a not in LAUNCH_OPTIONS}
    res_e = emulate(call_of(q, k, v, backend="emulate", **kw_e))
    pol = make_policy(kw.get("policy", "fa2"), kw.get("precision", "bf16"))
    fin, fout = get_format(pol.inputs), get_format(pol.out)
    qr, kr, vr = (fin.round(x.detach().to(torch.float64)) for x in (q, k, v))
    scale = kw.get("scale") or 1.0 / math.sqrt(q.shape[-1])
    s = scale * qr @ kr.transpose(-1, -2)
    if kw.get("causal", False):
        s = s.masked_fill(~causal_visible(s.shape[-2], s.shape[-1]), -math.inf)
    mag = torch.softmax(s, -1).nan_to_num(0.0) @ vr.abs()
    live = ~res_e.masked[..., None].expand_as(res_e.out)
    diff = (res_k.out - res_e.out)[live]
    return dict(
        elem=ulp_distribution(diff, fout.ulp(res_e.out)[live]),
        scaled=ulp_distribution(diff, fout.ulp(mag)[live]),
        m_equal=bool(torch.equal(res_k.m, res_e.m)),
        masked_equal=bool(torch.equal(res_k.masked, res_e.masked)),
    )


__all__ = [
    "attention_triton", "fa2_forward", "Kernel", "Launch", "LAUNCH_OPTIONS",
    "compare_with_engine", "ulp_distribution", "INTERPRET", "BLOCKS", "HEAD_DIMS", "VARIANTS",
    "PRECISIONS",
]
