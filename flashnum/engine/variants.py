"""The softmax variants of the blocked recurrence: one class each, the one home of a variant.

    from flashnum.engine.variants import Lazy, variant_of
    flashnum.attention(q, k, v, variant=Lazy(tau=4.0))   # or variant="lazy", tau=4.0
    v = variant_of("qiu_yao", beta=2.0)                  # the object a name stands for

A variant is a frozen dataclass: its fields are its parameters (with their defaults), and
its class attributes say what every other module reads from it:

    name        the string shorthand (attention(variant="lazy"), the config, the stored rows)
    max_rule    how the running max is chosen: "max" (m_i = max(m_{i-1}, rowmax S_j)),
                "lazy", "qiu_yao", "qiu_yao_released" (the methods below compute it; the
                fused C loop, flashnum.engine.fused, runs "max" and "lazy" itself)
    base2       the exponential: exp2 with log2(e) folded into the scale, else exp
    normalised  o kept normalised at every step (fa1's recurrence), else divided at the end
    reads_logits  the block max looks at the logits beyond their max (the fast path then
                scales the logits before the max instead of inside the exp pass)
    backends    the backends that run it (flashnum.engine.checks refuses the others)
    bounded     flashnum.analysis.bounds has a bound for it

and its methods hold its rules, each written once: `block_max` (the block's max as the
variant takes it), `running_max` (the new m), `floor` (a clamp of the block row sum), the
same two rules on mpmath scalars for backend "mp" (`block_max_mp`, `running_max_mp`), and
the hooks of the a-priori bound and of the invariants (`bound_shift`, `bound_tau`,
`bound_dM`, `m_window`). The recurrence itself (flashnum.engine.recurrence) reads them:
fa2_step for every variant that is not `normalised`, fa1_step for the others.

Adding a variant: a class here, its entry in VARIANTS, and its name in the parametrisation of
tests/test_engine.py::test_fast_path_is_bit_identical_to_the_readable_steps (if fa2-like).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from flashnum.engine.arith import wider
from flashnum.numerics.formats import FORMATS

QIU_YAO_WINDOW = 1e-3  # "scores within 1e-3 of the block max" (Qiu & Yao 2025)
QIU_YAO_FLOOR = 1e-10  # attention.py's EPSILON: block_row_sums.clamp(min=EPSILON)
EXP2_SCALES = ("once", "twice")  # how an exp2 kernel forms scale * log2(e) (exp2_scale)
FP32 = FORMATS["fp32"]


def _real(name: str, x, lo: float | None = None) -> float:
    """A parameter: a finite real number (not a bool), >= lo if given."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {x!r} ({type(x).__name__})")
    if not math.isfinite(float(x)):
        raise ValueError(f"{name} must be finite, got {x!r}")
    if lo is not None and float(x) < lo:
        raise ValueError(f"{name} must be >= {lo}, got {x!r}")
    return float(x)


@dataclass(frozen=True)
class Variant:
    """FlashAttention-2 (Dao 2023, Algorithm 1): m_i = max(m_{i-1}, rowmax(S_j)),
    P = exp(S_j - m_i), out = o / l at the end. Every other variant changes one rule."""

    name: ClassVar[str] = "fa2"
    max_rule: ClassVar[str] = "max"
    base2: ClassVar[bool] = False
    normalised: ClassVar[bool] = False
    reads_logits: ClassVar[bool] = False
    backends: ClassVar[tuple[str, ...]] = ("emulate", "triton", "mp")
    bounded: ClassVar[bool] = True

    @classmethod
    def params(cls) -> tuple[str, ...]:
        """The names of the parameters this variant takes (its fields)."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @property
    def exp2_form(self) -> str:
        """How scale * log2(e) is formed in fp32 (flashnum.engine.tiles.exp2_scale)."""
        return EXP2_SCALES[0]

    # -- the max rule on torch tensors (flashnum.engine.recurrence, flashnum.engine.fast) --
    def block_max(self, ar, s: torch.Tensor, m_blk: torch.Tensor,
                  m_old: torch.Tensor) -> torch.Tensor:
        """The block's max as the variant takes it, from rowmax(S_j) = m_blk."""
        return m_blk

    def running_max(self, m: torch.Tensor, m_blk: torch.Tensor) -> torch.Tensor:
        """m_i from m_{i-1} and the block max."""
        return torch.maximum(m, m_blk)  # m_i = max(m_{i-1}, rowmax(S_j))

    def floor(self, ar) -> float | None:
        """The block row sum is clamped below at this (None: not clamped)."""
        return None

    # -- the same rules on mpmath scalars (flashnum.backends.mp) --
    def block_max_mp(self, ctx, s: list, m_blk):
        return m_blk

    def running_max_mp(self, m, m_blk):
        return max(m, m_blk)

    # -- hooks of the a-priori bound (flashnum.analysis.bounds) and the invariants --
    def bound_shift(self, M: torch.Tensor) -> torch.Tensor:
        """The exact-arithmetic running max of a row whose logits' max is M."""
        return M

    def bound_tau(self) -> float:
        """How far exp(S - m) may exceed 1, in the exponent (lazy: tau)."""
        return 0.0

    def bound_dM(self, M: torch.Tensor, e_m: torch.Tensor, u_m, eta_m) -> torch.Tensor:
        """A bound on |computed m - M| given e_m, the error of the computed logits' max
        and its rounding (u_m: m's unit roundoff, eta_m: its underflow)."""
        return e_m

    def m_window(self, lo: torch.Tensor, hi: torch.Tensor, slack: torch.Tensor, u_m):
        """(lo, hi): where the final m of a row lies given the row max lo = hi (the
        invariant m_ok, flashnum.analysis.invariants), before the logits' slack."""
        return lo, hi


@dataclass(frozen=True)
class FA2(Variant):
    pass


@dataclass(frozen=True)
class FA1(Variant):
    """FlashAttention-1 (Dao et al. 2022, Algorithm 1, lines 9-12): P relative to the block
    max, o kept normalised at every step."""

    name: ClassVar[str] = "fa1"
    normalised: ClassVar[bool] = True
    backends: ClassVar[tuple[str, ...]] = ("emulate", "mp")


@dataclass(frozen=True)
class Exp2(Variant):
    """fa2 in base 2: log2(e) folded into the scale, P = exp2(S_j - m_i) (Triton's kernels).
    exp2_scale: how the kernel forms scale * log2(e) in fp32: once (fl32(scale log2 e),
    flashnum's Triton kernel) or twice (fl32(fl32(scale) fl32(1.44269504)): the tutorial)."""

    name: ClassVar[str] = "exp2"
    base2: ClassVar[bool] = True
    exp2_scale: str = EXP2_SCALES[0]

    def __post_init__(self):
        if self.exp2_scale not in EXP2_SCALES:
            raise ValueError(f"unknown exp2_scale {self.exp2_scale!r}; valid: "
                             f"{', '.join(EXP2_SCALES)}")

    @property
    def exp2_form(self) -> str:
        return self.exp2_scale


@dataclass(frozen=True)
class Lazy(Variant):
    """fa2 that keeps m while the block max exceeds it by at most tau (FlashAttention-4:
    8, in log2 units): exp(S - m) may exceed 1 by up to e^tau."""

    name: ClassVar[str] = "lazy"
    max_rule: ClassVar[str] = "lazy"
    backends: ClassVar[tuple[str, ...]] = ("emulate", "mp")
    tau: float = 8.0

    def __post_init__(self):
        object.__setattr__(self, "tau", _real("tau", self.tau, lo=0.0))

    def running_max(self, m, m_blk):
        m_grown = torch.maximum(m, m_blk)
        keep = torch.isfinite(m) & (m_grown - m <= self.tau)
        return torch.where(keep, m, m_grown)

    def running_max_mp(self, m, m_blk):
        m_new = max(m, m_blk)
        return m if m != -math.inf and m_new - m <= self.tau else m_new

    def bound_tau(self) -> float:
        return self.tau

    def m_window(self, lo, hi, slack, u_m):
        return lo - self.tau, hi  # the old max stays unless it grows by more than tau


@dataclass(frozen=True)
class QiuYao(Variant):
    """fa2 whose block max is beta * max (max > 0) or 0 (max < 0) where >= 2 logits lie
    within 1e-3 of it, so that no P is exactly 1 (Qiu & Yao 2025, the idealised fix)."""

    name: ClassVar[str] = "qiu_yao"
    max_rule: ClassVar[str] = "qiu_yao"
    reads_logits: ClassVar[bool] = True
    backends: ClassVar[tuple[str, ...]] = ("emulate", "mp")
    beta: float = 2.0

    def __post_init__(self):
        object.__setattr__(self, "beta", _real("beta", self.beta))

    def _adjusted(self, ar, m_blk):
        """beta * max (max > 0, rounded into m's format) or 0 (max < 0)."""
        return torch.where(m_blk > 0, ar.rnd(self.beta * m_blk, ar.fmt("m")),
                           torch.zeros_like(m_blk))

    def block_max(self, ar, s, m_blk, m_old):
        near = (s >= (m_blk - QIU_YAO_WINDOW)[..., None]).sum(-1) >= 2
        return torch.where(near & (m_blk != 0) & torch.isfinite(m_blk),
                           self._adjusted(ar, m_blk), m_blk)

    def block_max_mp(self, ctx, s, m_blk):
        if m_blk != -math.inf and m_blk != 0:
            if sum(1 for x in s if x >= m_blk - QIU_YAO_WINDOW) >= 2:
                return self.beta * m_blk if m_blk > 0 else ctx.mpf(0)
        return m_blk

    def bound_shift(self, M):
        return self.beta * torch.clamp(M, min=0)

    def bound_dM(self, M, e_m, u_m, eta_m):
        Mp, Mn = torch.clamp(M, min=0), torch.clamp(-M, min=0)
        return ((self.beta - 1) * Mp + self.beta * e_m * (1 + u_m) + self.beta * Mp * u_m
                + eta_m + Mn)

    def m_window(self, lo, hi, slack, u_m):
        # beta * max, rounded to m's format, or 0
        return lo, torch.maximum(hi * self.beta, torch.zeros_like(hi)) * (1 + u_m) + \
            slack * self.beta


@dataclass(frozen=True)
class QiuYaoReleased(QiuYao):
    """qiu_yao as their attention.py (02f0ab6, STABLE=1) computes it: the window max - 1e-3
    rounded into the logits' format, fully masked (causal) rows taken as ties (block max
    0), and the block row sum clamped at 1e-10. With beta = 2 the largest P of a tied block
    is exp(-max): once t exp(-max) < 1e-10 (t ties; max > 23.7 for two) the clamp replaces
    the row sum and the output collapses towards 0. It models bf16 code: emulated only."""

    name: ClassVar[str] = "qiu_yao_released"
    max_rule: ClassVar[str] = "qiu_yao_released"
    backends: ClassVar[tuple[str, ...]] = ("emulate",)
    bounded: ClassVar[bool] = False

    def block_max(self, ar, s, m_blk, m_old):
        """Their threshold `block_row_maxes - 1e-3` is a tensor op in the logits' dtype:
        fp32 arithmetic rounded into s's format. For a bf16 max in [0.25, 0.5) (ulp 2^-9)
        max - 1e-3 lies 0.512 ulp below the max and rounds to max - 1 ulp, so a logit one
        ulp below the max counts as a tie (the idealised window excludes it). Rows with no
        visible logit in the block (their masked causal tiles hold -finfo.max, all "within
        1e-3" of a block max of -finfo.max) count as ties with a negative max: block max 0."""
        f_s = ar.fmt("s")
        thr = ar.rnd(ar.rnd(m_blk - float(torch.tensor(QIU_YAO_WINDOW, dtype=torch.float32)),
                            wider(f_s, FP32), nearest=True), f_s, nearest=True)
        near = (s >= thr[..., None]).sum(-1) >= 2  # m_blk = -inf: thr = -inf, every column
        near &= torch.isfinite(m_blk) | torch.isfinite(m_old)
        return torch.where(near & (m_blk != 0), self._adjusted(ar, m_blk), m_blk)

    def floor(self, ar) -> float:
        """attention.py's clamp of the block row sum, 1e-10 as l's format holds it."""
        return float(ar.rnd(torch.tensor(QIU_YAO_FLOOR, dtype=ar.dtype), ar.fmt("l"),
                            nearest=True))

    def block_max_mp(self, ctx, s, m_blk):
        raise NotImplementedError("qiu_yao_released models bf16 code: backend emulate only")

    def m_window(self, lo, hi, slack, u_m):
        return lo, hi  # as the stored invariants were computed: the plain row max


VARIANTS: dict[str, type[Variant]] = {
    cls.name: cls for cls in (FA2, FA1, Exp2, Lazy, QiuYao, QiuYaoReleased)}
# every parameter some variant takes, with its default: the shorthand options of attention
# (variant="lazy", tau=4.0) and the value the grid fixes an inert parameter to (so that it
# does not change a case's id); read from the classes, so that a new one needs no entry here
PARAMS = {f.name: f.default for cls in VARIANTS.values() for f in dataclasses.fields(cls)}


def variant_of(variant, **params) -> Variant:
    """The Variant a name or an object stands for. With a name, `params` (tau, beta,
    exp2_scale; None: the variant's default) set the parameters the variant takes and are
    ignored by the others (the shorthand attention(variant="lazy", tau=4.0)); with an
    object, a parameter given (not None) must agree with the object's own."""
    if isinstance(variant, Variant):
        for key, x in params.items():
            if x is not None and key in variant.params() and x != getattr(variant, key):
                raise ValueError(f"{key}={x!r} disagrees with variant {variant!r}; give the "
                                 "parameter in the variant only")
        return variant
    if not isinstance(variant, str):
        raise TypeError(f"variant must be a name ({', '.join(VARIANTS)}) or a "
                        f"flashnum.engine.variants.Variant, got {type(variant).__name__}")
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; valid: {', '.join(VARIANTS)}")
    cls = VARIANTS[variant]
    return cls(**{k: x for k, x in params.items() if x is not None and k in cls.params()})


def supporting(backend: str) -> tuple[str, ...]:
    """The names of the variants a backend runs."""
    return tuple(n for n, cls in VARIANTS.items() if backend in cls.backends)
