"""One attention call, checked once: the inputs and every option as every layer below reads them.

    from flashnum.engine.call import Call, call_of
    call = call_of(q, k, v, precision="bf16", block_n=32, variant="lazy", tau=4.0)
    call.variant, call.block_n, call.causal      # checked: a Variant, clamped, normalised
    dataclasses.replace(call, k=k_a, v=v_a)       # one split of split-KV, still checked

flashnum.attention(q, k, v, **options) makes one Call (flashnum.api), and the engine, the
backends and the kernel models read it: the options and their defaults are declared here
once, as the fields below (BackwardCall adds the backward's); attention's docstring says
what each means. A variant's parameters live in its object (flashnum.engine.variants):
`variant=Lazy(tau=4.0)`, or a name with its parameters as options (`variant="lazy",
tau=4.0`: every parameter in flashnum.engine.variants.PARAMS is such an option), or a
dict `{"name": "lazy", "tau": 4.0}`; the Call holds the object.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from flashnum.engine.checks import (
    check_flag,
    check_options,
    check_tensors,
)
from flashnum.engine.variants import FA2, PARAMS, Variant
from flashnum.numerics.policy import Policy, make_policy


@dataclass(frozen=True)
class Call:
    """A checked call of flashnum.attention: its tensors and options (flashnum.api)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    precision: str = "bf16"
    policy: str | Policy = "fa2"
    block_m: int = 64
    block_n: int = 64
    order: object = "forward"  # a name of flashnum.numerics.tiling.ORDERS or a permutation
    variant: Variant = FA2()
    causal: bool | str = False
    scale: float | None = None  # None: 1/sqrt(d)
    rounding: str = "nearest"
    seed: int = 0
    trace: bool = False
    backend: str = "emulate"
    mp_bits: int = 256
    num_splits: int = 1
    split_precision: str | None = None
    merge_precision: str | None = None
    input_transform: str = "none"
    model: str | None = None  # a kernel model of flashnum.models.MODELS instead

    @property
    def pol(self) -> Policy:
        """The policy as an object (flashnum.numerics.policy.make_policy)."""
        return make_policy(self.policy, self.precision)

    @property
    def softmax_scale(self) -> float:
        """The scale as a number: the given one, else 1/sqrt(d)."""
        return 1.0 / math.sqrt(self.q.shape[-1]) if self.scale is None else float(self.scale)

    def info(self, **extra) -> dict:
        """What a Result records of its call (res.info)."""
        return dict(precision=self.precision, policy=self.pol.name, block_m=self.block_m,
                    block_n=self.block_n,
                    order=self.order if isinstance(self.order, str) else "permutation",
                    variant=self.variant.name, causal=self.causal, scale=self.softmax_scale,
                    rounding=self.rounding, seed=self.seed, **extra)


@dataclass(frozen=True)
class BackwardCall(Call):
    """A checked call of flashnum.attention_backward: a Call, dO and the backward's options."""

    do: torch.Tensor | None = None
    dq_order: object = "forward"
    out: torch.Tensor | None = None  # the forward's O and LSE, when not recomputed
    lse: torch.Tensor | None = None
    measure_ds: bool = False
    exp2: bool = False


OPTIONS = tuple(f.name for f in dataclasses.fields(Call) if f.name not in ("q", "k", "v"))
BACKWARD_OPTIONS = tuple(f.name for f in dataclasses.fields(BackwardCall)
                         if f.name not in ("q", "k", "v", "do", "backend", "mp_bits",
                                           "num_splits", "split_precision",
                                           "merge_precision", "input_transform", "trace"))


def split_options(options: dict, valid: tuple[str, ...]) -> tuple[dict, dict]:
    """(the call's options, the variant's shorthand parameters); TypeError naming an
    option that is neither."""
    params = {p: options[p] for p in PARAMS if p in options}
    rest = {n: x for n, x in options.items() if n not in PARAMS}
    bad = sorted(set(rest) - set(valid))
    if bad:
        raise TypeError(f"unknown option {bad[0]!r}; valid: {', '.join(valid)}, and a "
                        f"variant's parameters {', '.join(PARAMS)}")
    return rest, params


def call_of(q, k, v, **options) -> Call:
    """The Call of attention(q, k, v, **options), every argument checked once
    (flashnum.engine.checks): ValueError or TypeError naming the first bad one."""
    opts, params = split_options(options, OPTIONS)
    check_tensors(q, k, v, gqa=True)
    c = Call(q, k, v, **opts)
    if c.precision == "mp" and c.backend == "emulate":  # mp: the recurrence in mpmath
        c = dataclasses.replace(c, backend="mp")
    o = check_options(c, options.get("variant", "fa2"), params)
    return dataclasses.replace(c, block_m=o.block_m, block_n=o.block_n, variant=o.variant,
                               causal=o.causal, scale=o.scale, seed=o.seed,
                               trace=bool(c.trace), mp_bits=int(c.mp_bits),
                               num_splits=o.num_splits)


def backward_call_of(q, k, v, do, **options) -> BackwardCall:
    """The BackwardCall of attention_backward(q, k, v, do, **options), checked once."""
    opts, params = split_options(options, BACKWARD_OPTIONS)
    check_tensors(q, k, v, do)
    c = BackwardCall(q, k, v, do=do, **opts)
    o = check_options(c, options.get("variant", "fa2"), params, backward=True)
    check_flag("measure_ds", c.measure_ds)
    return dataclasses.replace(c, block_m=o.block_m, block_n=o.block_n, variant=o.variant,
                               causal=o.causal, scale=o.scale, seed=o.seed,
                               exp2=check_flag("exp2", c.exp2))


__all__ = ["Call", "BackwardCall", "call_of", "backward_call_of", "OPTIONS",
           "BACKWARD_OPTIONS"]
