"""The flashnum models an audited kernel is held beside: the one it claims, or the candidates
the diagnosis tries when it fails.

    from flashnum.audit.models import CANDIDATES, Candidate, available, forward, backward
    c = Candidate("lowp", "fa2")                   # a policy and a variant, block_n 64
    out = forward(c, q, k, v, precision="bf16", causal=True, alignment="top_left")
    g = backward(c, q, k, v, do, precision="bf16", causal=True, alignment="top_left")
    available("bf16", backward=True)               # the candidates this flashnum runs

CANDIDATES is the one list of what a kernel may be (every preset of
flashnum.numerics.policy.PRESETS with the variants that change its bits, then the models
of real kernels, `torch_cpu` and `triton_tutorial`). A candidate joins a diagnosis only
when the installed flashnum runs it (`available`: one tiny call each, in the forward,
and in the backward for a gradient audit), so that a model added to the engine joins
without an edit here, and one not yet there is left out instead of failing the audit.

Causal alignment: with Nq == Nk both alignments are one mask (causal=True). Otherwise
the model runs with causal=<the kernel's alignment> by name ("top_left", torch's
is_causal; "bottom_right", flash-attn >= 2.1) where the engine takes it, and is not run
(None) where it does not.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from flashnum.engine.variants import FA2, variant_of
from flashnum.models import MODELS
from flashnum.numerics.policy import PRESETS


@dataclass(frozen=True)
class Candidate:
    """A flashnum model of a kernel: a policy, a forward variant and the key block size."""

    policy: str
    variant: str = "fa2"
    block_n: int = 64

    @property
    def name(self) -> str:
        tail = "" if variant_of(self.variant) == FA2() else f", variant {self.variant}"
        return f"{self.policy}{tail}"

    @property
    def label(self) -> str:
        return f"{self.name}, block_n {self.block_n}" if self.tiled else self.name

    @property
    def tiled(self) -> bool:
        """Whether block_n changes its bits (the flash structure; not naive, not a kernel
        model with its own splits)."""
        return self.policy in PRESETS and self.policy != "naive"

    def _kw(self) -> dict:
        if self.policy in MODELS:  # a model of a real kernel: its own tiles and variant
            return dict(model=self.policy)
        return dict(policy=self.policy, variant=self.variant, block_n=self.block_n)

    @classmethod
    def of(cls, spec: str) -> Candidate:
        """The candidate a model spec names: 'policy[:variant[:block_n]]' (model= of the
        audit: "fa2:exp2:128" is Pallas's kernel, flashnum.audit.targets)."""
        policy, *rest = spec.split(":")
        return cls(policy, *rest[:1], *(int(b) for b in rest[1:2]))


# variants that change a flash preset's bits in ways kernels differ: exp2 (Triton's
# tutorial, flash-attn's CUDA code) and FA1's per-step normalisation
_FLASH_VARIANTS = ("fa2", "exp2", "fa1")
CANDIDATES: tuple[Candidate, ...] = (
    *(Candidate(p, v) for p in PRESETS if p not in ("naive", "exact") for v in _FLASH_VARIANTS),
    Candidate("naive"),
    Candidate("exact"),
    Candidate("torch_cpu"),
    Candidate("triton_tutorial"),
)
BLOCK_NS = (16, 32, 64, 128, 256)  # the tilings tried for the closest tiled candidate


def _causal(c: Candidate, causal: bool, alignment: str, nq: int, nk: int):
    """The causal= argument that gives the model the kernel's mask, or None if none does."""
    if not causal:
        return False
    if nq == nk:
        return True
    if _accepts_alignment(c, alignment):  # the alignment by name (True is bottom-right)
        return alignment
    own = MODELS[c.policy].alignment if c.policy in MODELS else "bottom_right"
    return True if own == alignment else None


@functools.cache
def _accepts_alignment(c: Candidate, alignment: str) -> bool:
    from flashnum.api import attention

    q = torch.zeros(1, 3, 4)
    try:
        attention(q, q[:, :2], q[:, :2], precision="fp32", causal=alignment, **c._kw())
    except (ValueError, TypeError, NotImplementedError):
        return False
    return True


def forward(c: Candidate, q, k, v, *, precision, causal, alignment, scale=None):
    """The model's output (float64), or None where it cannot take the kernel's mask."""
    from flashnum.api import attention

    cz = _causal(c, causal, alignment, q.shape[-2], k.shape[-2])
    if cz is None:
        return None
    return attention(q, k, v, precision=precision, causal=cz, scale=scale, **c._kw()).out


def backward(c: Candidate, q, k, v, do, *, precision, causal, alignment, scale=None):
    """The model's gradients (flashnum.attention_backward's Gradients), or None as forward."""
    from flashnum.api import attention_backward

    cz = _causal(c, causal, alignment, q.shape[-2], k.shape[-2])
    if cz is None:
        return None
    if c.policy in MODELS:
        return attention_backward(q, k, v, do, precision=precision, causal=cz, scale=scale,
                                  model=c.policy)
    return attention_backward(q, k, v, do, precision=precision, causal=cz, scale=scale,
                              policy=c.policy, block_n=c.block_n, **backward_kw(c.variant))


def backward_kw(variant) -> dict:
    """flashnum.attention_backward's keywords for a forward variant: the variant, and exp2
    where its exponential is base 2 (the backward recomputes P in the forward's base)."""
    return dict(variant=variant, exp2=variant_of(variant).base2)


@functools.cache
def runs(c: Candidate, precision: str, gradients: bool = False) -> bool:
    """Whether the installed flashnum runs candidate c in `precision` (and its backward)."""
    q = torch.linspace(-1, 1, 2 * 5 * 8).reshape(2, 5, 8)
    try:
        forward(c, q, q, q, precision=precision, causal=True, alignment="bottom_right")
        if gradients:
            backward(c, q, q, q, q, precision=precision, causal=True, alignment="bottom_right")
    except (ValueError, TypeError, NotImplementedError, KeyError):
        return False
    return True


def available(precision: str, backward: bool = False) -> list[Candidate]:
    """The CANDIDATES this flashnum runs in `precision` (with a backward, if asked)."""
    return [c for c in CANDIDATES if runs(c, precision, backward)]
