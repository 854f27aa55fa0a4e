"""flashnum.attention and flashnum.attention_backward: one checked call, then the engine, a
backend or a kernel model.

    import flashnum
    res = flashnum.attention(q, k, v, precision="bf16", policy="fa2", block_n=64)
    res = flashnum.attention(q, k, v, precision="bf16", model="torch_cpu")   # a real kernel
    res = flashnum.attention(q, k, v, backend="triton")                     # the Triton kernel
    g = flashnum.attention_backward(q, k, v, do, precision="bf16", policy="fa2")

The arguments are checked once into a flashnum.engine.call.Call (every option and its
default declared there), which travels down: to a model of flashnum.models.MODELS
(`model=`), to a backend (flashnum.backends: the Triton kernel, the recurrence in mpmath),
or to the emulator (flashnum.engine.emulate; the backward: flashnum.engine.backward). This
module sits above the three, so none of them imports another's door. What is rounded
where, and the arithmetic model, is in flashnum/engine/__init__.py and docs/engine.md.
"""

from __future__ import annotations

import warnings

import torch

from flashnum.engine.backward import backward, check_backward
from flashnum.engine.call import OPTIONS, Call, backward_call_of, call_of
from flashnum.engine.checks import check_finite, check_memory
from flashnum.engine.emulate import emulate
from flashnum.engine.result import Gradients, Result
from flashnum.engine.splitkv import split_attention
from flashnum.models import MODELS, model_of
from flashnum.numerics.blockscaled import transform_inputs
from flashnum.numerics.policy import POLICIES, Policy, make_policy


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **options) -> Result:
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
    model:     None, or a model of a real kernel instead of a policy (flashnum.models.MODELS:
               torch_cpu, torch_math, jax_xla, ort_cpu, triton_tutorial): its own splits,
               orders, exp and casts; precision, causal and scale are its inputs
    order:     forward reverse random max_ascending max_descending partial_first, or a
               permutation
    variant:   a flashnum.engine.variants.Variant with its own parameters (Lazy(tau=4.0),
               QiuYao(beta=2.0), Exp2(exp2_scale="twice"), FA2(), FA1(), QiuYaoReleased()),
               or its name: fa2 fa1 exp2 lazy qiu_yao qiu_yao_released
               or a dict {"name": "lazy", "tau": 4.0}
    tau, beta, exp2_scale (every name of flashnum.engine.variants.PARAMS): shorthands
               for the parameters of a variant given by name (variant="lazy", tau=4.0 is
               Lazy(tau=4.0)); None: the variant's default (tau 8, beta 2, exp2_scale
               once); ignored by a variant that does not take them; with a Variant object,
               one given must agree with the object's
    rounding:  nearest stochastic (seeded by `seed`; inputs are always rounded to nearest)
    backend:   emulate (this module), triton (flashnum.backends), mp (mpmath at mp_bits)
               (exp2_scale: how variant exp2 forms scale * log2(e) in fp32, flashnum.engine.
               tiles.exp2_scale: once, fl32(scale log2 e), flashnum's Triton kernel; or
               twice, fl32(fl32(scale) fl32(1.44269504)), the Triton tutorial's kernel)
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
    call, warned = prepare(q, k, v, **options)
    res = run(call)
    if not warned:
        _warn_nonfinite(res)
    return res


def prepare(q, k, v, **options) -> tuple[Call, bool]:
    """attention()'s checks (flashnum.engine.call.call_of), its memory guard, the input
    transform and the overflow warning: the Call, and whether it warned."""
    call = call_of(q, k, v, **options)
    if call.model is not None:
        model_of(call.model).check(call.precision)
    known = call.model is None and call.backend != "mp" and (
        isinstance(call.policy, Policy) or call.policy in POLICIES)
    check_memory(q, k, v, call, standard=known and call.pol.structure == "standard")
    check_finite(q=q, k=k, v=v)
    if call.input_transform != "none":  # on all the keys, before any split or rounding
        q, k, v = transform_inputs(q, k, v, call.input_transform, call.seed)
        call = Call(q, k, v, **{f: getattr(call, f) for f in OPTIONS})
    warned = known and _warn_overflow(make_policy(call.policy, call.precision), q=q, k=k, v=v)
    return call, warned


def attention_splitkv(q, k, v, *, num_splits: int, **options) -> Result:
    """Split-KV attention through the merge (flashnum.engine.splitkv), num_splits = 1 included:
    the partials stored in split_precision and merged in merge_precision even for one split;
    every other argument as attention takes it."""
    call, _ = prepare(q, k, v, num_splits=num_splits, **options)
    return split_attention(call, emulate)


def run(call: Call) -> Result:
    """A checked call to its model, backend or the emulator."""
    if call.model is not None:
        return model_of(call.model).forward(call)
    if call.backend == "triton":  # above the engine: its module sets TRITON_INTERPRET first
        from flashnum.backends.triton import run_call

        return run_call(call)
    if call.backend == "mp":
        from flashnum.backends.mp import run_call

        return run_call(call)
    return emulate(call)


def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, do: torch.Tensor,
                       **options) -> Gradients:
    """Gradients of sum(dO * attention(q, k, v)) with respect to q, k, v, emulated.

    q (..., Nq, d), k (..., Nk, d), v (..., Nk, dv), do (..., Nq, dv): as flashnum.attention
              takes them (any real floating dtypes, any leading dims); the arguments are
              checked by the forward's checks (flashnum.engine.checks), scale included
    causal:   False; True or "bottom_right" (key j visible to query i iff j <= i + Nk - Nq,
              flash-attn >= 2.1); "top_left" (j <= i: torch's is_causal). Fully masked rows
              (bottom-right with Nq > Nk) get zero gradients
    scale:    the softmax scale, a finite number > 0; None: 1/sqrt(d)
    block_m, block_n: as in flashnum.attention (beyond max(N, 16): run as max(N, 16))
    policy:   fa2 naive lowp exact, or a BackwardPolicy (its .forward runs the forward)
    model:    None, or a model of a real kernel's backward (flashnum.models.MODELS):
              triton_tutorial (the Triton tutorial's fp16 kernels, their own blocks and
              orders; g.lse is its M in log2 units) or torch_cpu (torch's CPU SDPA
              backward kernel, its own splits; top-left as torch's is_causal:
              causal="top_left", or True where Nq == Nk)
    order:    the forward's key-block order (flashnum.attention)
    dq_order: forward reverse random (seeded by `seed`), or a permutation of the key
              blocks: the order in which key blocks add into dQ
    out, lse: the forward's O and natural-log LSE, if not to be recomputed
    measure_ds: also return g.ds_rowsum (one more pass over every dS tile)
    exp2:     P = exp2(S2 - L2) in log2 units (see the module docstring), flash only
    variant:  the forward's variant (flashnum.attention: a name or a Variant object)
              when the forward runs here: it changes O and L, which the backward reads
    """
    call = backward_call_of(q, k, v, do, **options)
    check_backward(call)
    if call.model is not None:
        m = model_of(call.model)
        m.check(call.precision)
        if m.backward is None:
            raise ValueError(f"model {m.name!r} has no backward; valid: "
                             f"{', '.join(n for n, x in MODELS.items() if x.backward)}")
        return m.backward(call)
    return backward(call)


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


__all__ = ["attention", "attention_backward", "attention_splitkv", "prepare", "run"]
