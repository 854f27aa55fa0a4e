"""The flashnum models an audited kernel is held beside: the one it claims, or the candidates
the diagnosis tries when it fails.

    from flashnum.audit.models import CANDIDATES, Candidate, available, forward, backward
    c = Candidate("lowp", "fa2")                   # a policy and a variant, block_n 64
    Candidate("fa2", block_n=ROW)                  # one key block of the whole row
    Candidate("fa2", block_n=128, order="partial_first")  # FlexAttention's block order
    out = forward(c, q, k, v, precision="bf16", causal=True, alignment="top_left")
    g = backward(c, q, k, v, do, precision="bf16", causal=True, alignment="top_left")
    available("bf16", backward=True)               # the candidates this flashnum runs

CANDIDATES is the one list of what a kernel may be (every preset of
flashnum.numerics.policy.PRESETS with the variants that change its bits, then every model
of a real kernel in flashnum.models.MODELS). A candidate joins a diagnosis only when the
installed flashnum runs it (`available`: one tiny call each, in the forward, and in the
backward for a gradient audit), so that a model added to the engine or to MODELS joins
without an edit here, and one not yet there is left out instead of failing the audit.
TILINGS are the (block_n, order) a diagnosis scans its best flash candidates over: every
block of BLOCK_NS, one block of the whole row (ROW), each in forward order and in
FlexAttention's (partial_first); `bits_key` says which of them compute the same values
on a case, so that each is run once.

Causal alignment: with Nq == Nk both alignments are one mask (causal=True). Otherwise
the model runs with causal=<the kernel's alignment> by name ("top_left", torch's
is_causal; "bottom_right", flash-attn >= 2.1) where the engine takes it, and is not run
(None) where it does not.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from flashnum.engine.call import Call
from flashnum.engine.variants import FA2, variant_of
from flashnum.models import MODELS
from flashnum.numerics.policy import PRESETS
from flashnum.numerics.tiling import ORDERS, clamp_block, key_block_order, n_blocks, tile_classes

ROW = "row"  # block_n: one key block of the whole row, N keys whatever the case's N
# how a label says a key order other than forward
ORDER_WORDS = {"partial_first": "partial-then-full order"}


@dataclass(frozen=True)
class Candidate:
    """A flashnum model of a kernel: a policy, a forward variant, the key block size (an
    int, or ROW: one block of the row) and the key-block order."""

    policy: str
    variant: str = "fa2"
    block_n: int | str = 64
    order: str = "forward"

    @property
    def name(self) -> str:
        tail = "" if variant_of(self.variant) == FA2() else f", variant {self.variant}"
        return f"{self.policy}{tail}"

    @property
    def label(self) -> str:
        if not self.tiled:
            return self.name
        if self.block_n == ROW:
            return f"{self.name}, one key block of the row"
        tail = "" if self.order == "forward" else \
            f", {ORDER_WORDS.get(self.order, f'order {self.order}')}"
        return f"{self.name}, block_n {self.block_n}{tail}"

    @property
    def tiled(self) -> bool:
        """Whether block_n changes its bits (the flash structure; not naive, not a kernel
        model with its own splits)."""
        return self.policy in PRESETS and self.policy != "naive"

    def block_n_for(self, nk: int) -> int:
        """The key block size on a case with nk keys (ROW: nk)."""
        return max(int(nk), 1) if self.block_n == ROW else self.block_n

    def _kw(self, nk: int = 1) -> dict:
        if self.policy in MODELS:  # a model of a real kernel: its own tiles and variant
            return dict(model=self.policy)
        kw = dict(policy=self.policy, variant=self.variant, block_n=self.block_n_for(nk))
        if self.order != "forward":
            # a block mask's tiles are square (FlexAttention's one BLOCK_SIZE): the query
            # block decides which tiles the mask cuts, so which order each block follows
            kw.update(order=self.order, block_m=kw["block_n"])
        return kw

    def bits_key(self, nq: int, nk: int, causal, backward: bool = False) -> tuple:
        """What decides this candidate's values on a case of nq queries and nk keys under
        the engine's `causal` argument: two candidates with one key compute the same values
        there. Blocks past the data are clamped to it (flashnum.numerics.tiling.clamp_block);
        in the forward each row's values depend only on the key blocks it visits, in their
        order, so the query block counts only through the order, and an order that visits
        as forward does is forward. The backward sums dK and dV over query blocks: there
        the query block counts too."""
        if not self.tiled:
            return (self.policy, self.variant)
        kw = self._kw(nk)
        bn = clamp_block(kw["block_n"], nk)
        bm = clamp_block(kw.get("block_m", Call.block_m), nq)  # the engine's default
        order = kw.get("order", "forward")
        if order == "partial_first":
            n_kb = n_blocks(nk, bn)
            perm = key_block_order(order, n_blocks(nq, bm), n_kb,
                                   classes=tile_classes(nq, nk, bm, bn, causal))
            order = "forward" if bool((perm == torch.arange(n_kb)).all()) else order
        if order != "forward" or backward:
            return (self.policy, self.variant, bn, order, bm)
        return (self.policy, self.variant, bn, order)

    @classmethod
    def of(cls, spec: str) -> Candidate:
        """The candidate a model spec names: 'policy[:variant[:block_n[:order]]]', block_n
        an integer or "row" (model= of the audit: "fa2:exp2:128" is Pallas's kernel,
        flashnum.audit.targets; "fa2:fa2:128:partial_first")."""
        policy, *rest = spec.split(":")
        if len(rest) > 3:
            raise ValueError(f"model spec {spec!r} has too many parts; valid: "
                             "policy[:variant[:block_n[:order]]]")
        kw = dict(zip(("variant", "block_n", "order"), rest, strict=False))
        if "block_n" in kw:
            b = kw["block_n"]
            if b != ROW and not (b.isdigit() and int(b) > 0):
                raise ValueError(f"block_n {b!r} of model spec {spec!r} is not valid; valid: "
                                 f"a positive integer, or {ROW!r} (one block of the row)")
            kw["block_n"] = b if b == ROW else int(b)
        if kw.get("order", "forward") not in ORDERS:
            raise ValueError(f"order {kw['order']!r} of model spec {spec!r} is not valid; "
                             f"valid: {', '.join(ORDERS)}")
        return cls(policy, **kw)


# variants that change a flash preset's bits in ways kernels differ: exp2 (Triton's
# tutorial, flash-attn's CUDA code) and FA1's per-step normalisation
_FLASH_VARIANTS = ("fa2", "exp2", "fa1")
BLOCK_NS = (16, 32, 64, 128, 256)
TILINGS: tuple[tuple[int | str, str], ...] = (
    *((bn, order) for bn in BLOCK_NS for order in ("forward", "partial_first")),
    (ROW, "forward"),  # one key block: no order to choose
)


def candidates() -> tuple[Candidate, ...]:
    """Every preset with its variants, then every model of flashnum.models.MODELS as it
    stands now (a model registered there joins the diagnosis without an edit here)."""
    return (
        *(Candidate(p, v) for p in PRESETS if p not in ("naive", "exact")
          for v in _FLASH_VARIANTS),
        Candidate("naive"),
        Candidate("exact"),
        *(Candidate(m) for m in MODELS),
    )


CANDIDATES: tuple[Candidate, ...] = candidates()


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
    return attention(q, k, v, precision=precision, causal=cz, scale=scale,
                     **c._kw(k.shape[-2])).out


def backward(c: Candidate, q, k, v, do, *, precision, causal, alignment, scale=None):
    """The model's gradients (flashnum.attention_backward's Gradients), or None as forward."""
    from flashnum.api import attention_backward

    cz = _causal(c, causal, alignment, q.shape[-2], k.shape[-2])
    if cz is None:
        return None
    if c.policy in MODELS:
        return attention_backward(q, k, v, do, precision=precision, causal=cz, scale=scale,
                                  model=c.policy)
    kw = c._kw(k.shape[-2])
    kw.update(backward_kw(kw["variant"]))
    return attention_backward(q, k, v, do, precision=precision, causal=cz, scale=scale, **kw)


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
    """The candidates() this flashnum runs in `precision` (with a backward, if asked)."""
    return [c for c in candidates() if runs(c, precision, backward)]
