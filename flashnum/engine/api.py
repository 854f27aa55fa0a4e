"""The public entry point `attention` and its argument checks (backend "emulate" and the rest).

    import flashnum
    res = flashnum.attention(q, k, v, precision="bf16", policy="fa2",
                             block_m=64, block_n=64, order="forward", variant="fa2",
                             causal=False, scale=None, rounding="nearest", seed=0,
                             trace=False)

For every query block (all at once, vectorised over batch, heads and query
blocks) it visits the key blocks in the chosen order and runs FlashAttention-2's
recurrence (Dao 2023, Algorithm 1):

    m_i = max(m_{i-1}, rowmax(S_ij))
    l_i = l_{i-1} exp(m_{i-1} - m_i) + rowsum(exp(S_ij - m_i))
    o_i = o_{i-1} exp(m_{i-1} - m_i) + exp(S_ij - m_i) @ V_j
    out = o_last / l_last

rounding every value at the site the policy names (flashnum.numerics.policy) and nowhere
else. Memory is O(Nq * block_n): no Nq x Nk matrix is ever formed (the
`standard` structure, which must form S, works through row chunks).

Where it lives: this module checks the arguments and dispatches; flashnum.engine.flash
runs the blocked loop, whose steps are flashnum.engine.recurrence (the readable path,
one step function per variant) or flashnum.engine.fast (the same operations in place);
flashnum.engine.standard is the `standard` structure (policy `naive`);
flashnum.engine.tiles forms the logits of a tile; flashnum.engine.arith rounds.

Arithmetic model. Each elementwise operation (+, -, *, /, exp) is correctly
rounded into its site's format: computed exactly enough in a carrier, then
rounded once. Reductions (the two dots, the block row sum) accumulate in their
site's format: fp64/exact in float64, fp32 by real fp32 arithmetic (torch's
float32 matmul/sum, whose summation order is the BLAS's, as a GPU's is its
own), tf32 by rounding the operands to tf32 and summing in fp32 (tensor cores),
narrower formats by recursive summation rounded after every addition. A
block's row sum and its P @ V tile are stored in l's and o's formats before they
are added into l and o (what a pure-PyTorch port does with bf16 tensors; a no-op
when l and o are fp32, as in FA2 kernels). The
carrier is float32 when every site is fp32 or narrower (exact for +, -, *, /
since 24 >= 2p + 2 for p <= 11 makes the double rounding innocuous), else
float64. exp is always evaluated in float64 and then rounded once. For a float32
argument rounded into fp32 (the P site of every policy with fp32 softmax state)
that is the correctly rounded exp on every input (checked exhaustively, `python -m
flashnum.run experiment=exp_exhaustive`); otherwise it is correctly rounded except within ~2^-52
of a rounding boundary. The fp32 exp site runs in flashnum.engine.native's fused C kernel
when that is built, else in torch: the same values either way (docs/engine.md). FMA
contraction is not modelled (a GPU kernel may contract s * scale - m).

Variants (flashnum.engine.variants, one class each: fa2, fa1, exp2, lazy, qiu_yao,
qiu_yao_released) change the running max, the base of the exponential, a floor of the
block row sum, or keep o normalised at every step (fa1).
Fully masked rows (causal with Nq > Nk) give out = 0 and are flagged in
`res.masked`; l stays 0 and m stays -inf for them, never NaN.
"""

from __future__ import annotations

import inspect
import warnings

import torch

from flashnum.engine.checks import (  # noqa: F401 (BACKENDS: the engine's names)
    BACKENDS,
    VARIANTS,
    check_finite,
    check_memory,
    check_options,
    check_tensors,
)
from flashnum.engine.emulate import emulate
from flashnum.engine.kernel_models import KERNEL_MODELS
from flashnum.engine.result import Result
from flashnum.engine.splitkv import split_attention
from flashnum.engine.variants import EXP2_SCALES, Variant, variant_of
from flashnum.numerics.blockscaled import transform_inputs
from flashnum.numerics.policy import POLICIES, Policy, make_policy


def _warn_overflow(pol: Policy, **xs: torch.Tensor) -> bool:
    """Warn when finite inputs overflow the inputs format when stored (their rows come
    out non-finite, or saturated), naming how many values of which input."""
    fin = pol.fmt("inputs")
    threshold = getattr(fin, "overflow_threshold", None)  # None: exact, or a scaled format
    if threshold is None:
        return False
    warned = False
    for name, x in xs.items():
        a = x.detach().abs()
        if not float(a.amax()) > fin.max:  # the common case: one pass, nothing to do
            continue
        # IEEE formats: the tie at the threshold goes to the even infinity; e4m3: stays 448
        over = a > threshold if fin.max_override is not None else a >= threshold
        n = int(over.sum())
        if n:
            what = f"saturate to +-{fin.max:g}" if fin.saturate else "round to inf or NaN"
            warnings.warn(
                f"{name}: {n} of {x.numel()} finite values overflow the inputs format "
                f"{fin.name} (|x| beyond {fin.max:g}) and {what}; their rows are not what "
                "the inputs say (see res.nonfinite)", RuntimeWarning, stacklevel=3)
            warned = True
    return warned


def _warn_nonfinite(res: Result) -> None:
    """Warn when finite inputs gave rows whose output is not finite (a value overflowed
    its site's format: logits beyond fp32's range, an fp16 l, ...), naming how many."""
    n = int(res.nonfinite.sum())
    if n:
        warnings.warn(
            f"{n} of {res.nonfinite.numel()} output rows are not finite although every input "
            "is finite: a value overflowed the format of its site (see res.nonfinite)",
            RuntimeWarning, stacklevel=3)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    precision: str = "bf16",
    policy: str | Policy = "fa2",
    block_m: int = 64,
    block_n: int = 64,
    order="forward",
    variant: str | Variant = "fa2",
    causal: bool | str = False,
    scale: float | None = None,
    rounding: str = "nearest",
    seed: int = 0,
    trace: bool = False,
    backend: str = "emulate",
    mp_bits: int = 256,
    tau: float | None = None,
    beta: float | None = None,
    num_splits: int = 1,
    split_precision: str | None = None,
    merge_precision: str | None = None,
    input_transform: str = "none",
    exp2_scale: str | None = None,
) -> Result:
    """Attention softmax(scale Q K^T) V through the blocked online softmax.

    q (..., Nq, d), k (..., Nk, d), v (..., Nk, dv): real floating tensors of any dtypes
               (mixed too: each value is read exactly, then rounded into the policy's
               inputs format), any leading dims (none: one head; a 3-D tensor is (H, N, d));
               k, v may have fewer heads (dim -3) than q (GQA, through split-KV)
    causal:    False; True or "bottom_right": query i sees key j iff j <= i + Nk - Nq
               (flash-attn >= 2.1; rows with i < Nq - Nk see no key: out 0, res.masked);
               "top_left": j <= i (torch's scaled_dot_product_attention is_causal). The
               two agree when Nq == Nk (flashnum.numerics.tiling.visible)
    scale:     the softmax scale, a finite number > 0; None: 1/sqrt(d)
    block_m, block_n: query rows and keys per block (ints, numpy's too); one larger than
               max(Nq, 16) or max(Nk, 16) runs as that (flashnum.numerics.tiling.clamp_block:
               the same values, without the memory of the padding)
    precision: fp64 fp32 tf32 fp16 bf16 fp8_e4m3 fp8_e5m2 mp, or p<bits> (2..52)
    policy:    fa2 naive lowp exact uniform, or a flashnum.numerics.policy.Policy
               or torch_cpu (flashnum.engine.torch_cpu: torch's CPU SDPA kernel, its own
               splits), or triton_tutorial (flashnum.engine.triton_tutorial: the Triton
               tutorial's fp16 kernel, its own tiles), or jax_xla, torch_math, ort_cpu
               (flashnum.engine.kernel_models: library kernels that form S)
    order:     forward reverse random max_ascending max_descending, or a permutation
    variant:   a flashnum.engine.variants.Variant with its own parameters (Lazy(tau=4.0),
               QiuYao(beta=2.0), Exp2(exp2_scale="twice"), FA2(), FA1(), QiuYaoReleased()),
               or its name: fa2 fa1 exp2 lazy qiu_yao qiu_yao_released
    tau, beta, exp2_scale: shorthands for the parameters of a variant given by name
               (variant="lazy", tau=4.0 is Lazy(tau=4.0)); None: the variant's default
               (tau 8, beta 2, exp2_scale once); ignored by a variant that does not take
               them; with a Variant object, one given must agree with the object's
    rounding:  nearest stochastic (seeded by `seed`; inputs are always rounded to nearest)
    backend:   emulate (this module), triton (flashnum.backends), mp (mpmath at mp_bits)
    exp2_scale: how variant exp2 forms scale * log2(e) in fp32 (flashnum.engine.tiles.
               exp2_scale): once (fl32(scale log2 e): flashnum's Triton kernel) or twice
               (fl32(fl32(scale) fl32(1.44269504)): the Triton tutorial's kernel)
    num_splits, split_precision, merge_precision: split-KV decoding (flashnum.engine.
               splitkv): the keys in num_splits chunks (at most one per key block: more run
               as that many) whose partial (o, lse) are stored in split_precision and merged
               in merge_precision; by default the policy's o and l formats (fp32 in fa2,
               exact in exact: split-KV of the exact policy is exact). Backend emulate and
               the policies of make_policy only
    input_transform: none smooth_k hadamard smooth_k+hadamard: applied to Q, K in float64
               before the inputs site rounds them, as SageAttention (K minus its mean over
               the keys) and FA3 (Q, K times one random Hadamard matrix per head, signs
               from `seed`) do; softmax(Q K^T) is unchanged by either in exact arithmetic
               (flashnum.numerics.blockscaled.transform_inputs)

    Bad arguments raise one ValueError or TypeError naming the argument and what is valid.
    Empty shapes (Nq, Nk, d, dv or a batch dim of 0) are rejected with a ValueError, not
    returned as empty results. Inputs must be finite; finite inputs that overflow the
    inputs format when stored (fp16 beyond 65504, say) are computed as stored and warned
    about (RuntimeWarning naming how many values); their rows show in `res.nonfinite`, as
    do rows that overflow inside the algorithm (logits beyond fp32's range, say), warned
    about with how many rows. A call whose estimated peak memory exceeds the memory
    available is refused before it allocates (flashnum.engine.checks).
    """
    call, warned = prepare(
        q, k, v, precision=precision, policy=policy, block_m=block_m, block_n=block_n,
        order=order, variant=variant, causal=causal, scale=scale, rounding=rounding, seed=seed,
        trace=trace, backend=backend, mp_bits=mp_bits, tau=tau, beta=beta,
        num_splits=num_splits, split_precision=split_precision,
        merge_precision=merge_precision, input_transform=input_transform,
        exp2_scale=exp2_scale)
    res = run(**call)
    if not warned:
        _warn_nonfinite(res)
    return res


# The backends other than the emulator (mp, triton) sit above the engine and import it:
# flashnum.backends puts their entry points here, so that the engine never imports upward.
# Each takes run()'s arguments, the checked ones (flashnum.engine.checks).
RUNS: dict = {}

# attention()'s keyword defaults, for the doors that take a subset (split-KV)
DEFAULTS = {n: p.default for n, p in inspect.signature(attention).parameters.items()
            if p.default is not inspect.Parameter.empty}


def prepare(q, k, v, *, precision, policy, block_m, block_n, order, variant, causal, scale,
            rounding, seed, trace, backend, mp_bits, tau, beta, num_splits, split_precision,
            merge_precision, input_transform, exp2_scale) -> tuple[dict, bool]:
    """The checks of attention() (flashnum.engine.checks), the input transform and the
    overflow warning: the keyword arguments of `run`, and whether it warned."""
    check_tensors(q, k, v, gqa=True)
    if precision == "mp" and backend == "emulate":
        backend = "mp"
    o = check_options(q, k, v, precision=precision, policy=policy, block_m=block_m,
                      block_n=block_n, order=order, variant=variant, causal=causal,
                      scale=scale, rounding=rounding, seed=seed, trace=trace, backend=backend,
                      mp_bits=mp_bits, tau=tau, beta=beta, exp2_scale=exp2_scale,
                      num_splits=num_splits,
                      split_precision=split_precision, merge_precision=merge_precision,
                      input_transform=input_transform)
    if exp2_scale is not None and exp2_scale not in EXP2_SCALES:
        raise ValueError(f"unknown exp2_scale {exp2_scale!r}; valid: {', '.join(EXP2_SCALES)}")
    known = backend != "mp" and (isinstance(policy, Policy) or policy in POLICIES)
    check_memory(q, k, v, o, standard=known and make_policy(policy, precision).structure ==
                 "standard")
    check_finite(q=q, k=k, v=v)
    if input_transform != "none":  # on all the keys, before any split or rounding
        q, k, v = transform_inputs(q, k, v, input_transform, o.seed)
    warned = known and _warn_overflow(make_policy(policy, precision), q=q, k=k, v=v)
    return dict(q=q, k=k, v=v, precision=precision, policy=policy, block_m=o.block_m,
                block_n=o.block_n, order=order, variant=o.variant, causal=o.causal,
                scale=o.scale, rounding=rounding, seed=o.seed, trace=bool(trace),
                backend=backend, mp_bits=int(mp_bits), tau=None, beta=None,
                num_splits=o.num_splits, split_precision=split_precision,
                merge_precision=merge_precision, exp2_scale=None), warned


def attention_splitkv(q, k, v, *, num_splits: int, split_precision: str | None = None,
                      merge_precision: str | None = None, **kw) -> Result:
    """Split-KV attention (flashnum.engine.splitkv), num_splits = 1 included; every other
    argument as flashnum.attention takes it, and checked by the same checks.
    split_precision / merge_precision None: the policy's o and l formats."""
    call, _ = prepare(q, k, v, **{**DEFAULTS, **kw, "num_splits": num_splits,
                                  "split_precision": split_precision,
                                  "merge_precision": merge_precision})
    return split_attention(**call)


def run(q, k, v, *, precision, policy, block_m, block_n, order, variant, causal, scale,
        rounding, seed, trace, backend, mp_bits, tau=None, beta=None, num_splits=1,
        split_precision=None, merge_precision=None, exp2_scale=None) -> Result:
    """attention() on checked arguments (flashnum.engine.checks): the dispatch to split-KV,
    a kernel model, a backend or the engine. Split-KV runs each split through here. The
    variant goes on as its object (flashnum.engine.variants), which holds its parameters."""
    variant = variant_of(variant, tau=tau, beta=beta, exp2_scale=exp2_scale)
    tau = beta = exp2_scale = None
    gqa = q.ndim >= 3 and k.ndim >= 3 and q.shape[-3] != k.shape[-3]
    if num_splits != 1 or gqa:  # each split comes back through this function
        return split_attention(
            q, k, v, num_splits=num_splits, split_precision=split_precision,
            merge_precision=merge_precision, precision=precision, policy=policy,
            block_m=block_m, block_n=block_n, order=order, variant=variant, causal=causal,
            scale=scale, rounding=rounding, seed=seed, trace=trace, backend=backend,
            mp_bits=mp_bits, tau=tau, beta=beta, exp2_scale=exp2_scale,
        )
    if isinstance(policy, str) and policy == "torch_cpu":
        # a model of one real kernel: its own splits, exp and order (block sizes ignored);
        # top-left aligned, as torch's is_causal (bottom-right with Nq != Nk is refused)
        from flashnum.engine.torch_cpu import attention_torch_cpu

        return attention_torch_cpu(q, k, v, precision=precision, causal=bool(causal),
                                   scale=scale)
    if isinstance(policy, str) and policy == "triton_tutorial":
        # the Triton tutorial's fp16 kernel: its own 128 x 64 tile (block sizes ignored)
        from flashnum.engine.triton_tutorial import forward

        return forward(q, k, v, causal=causal, scale=scale, precision=precision)[0]
    if isinstance(policy, str) and policy in KERNEL_MODELS:
        # models of library kernels that form S (flashnum.engine.kernel_models)
        from flashnum.engine.kernel_models import attention_kernel_model

        return attention_kernel_model(q, k, v, policy, precision=precision, causal=causal,
                                      scale=scale)
    if backend != "emulate":  # mp, triton: above the engine (flashnum.backends puts them here)
        return RUNS[backend](
            q, k, v, precision=precision, policy=policy, block_m=block_m, block_n=block_n,
            order=order, variant=variant, causal=causal, scale=scale, rounding=rounding,
            seed=seed, trace=trace, mp_bits=mp_bits, tau=tau, beta=beta,
            exp2_scale=exp2_scale)
    return emulate(q, k, v, precision=precision, policy=policy, block_m=block_m,
                   block_n=block_n, order=order, variant=variant, causal=causal, scale=scale,
                   rounding=rounding, seed=seed, trace=trace, tau=tau, beta=beta,
                   exp2_scale=exp2_scale)
