"""The online-softmax recurrence, one key block at a time: the state and its two steps.

    from flashnum.engine.recurrence import Run, State, scan, step_of
    st = scan(run, State.initial(o), n_kb, load, step_of(run.variant), trace)

A `State` holds, per query row, FlashAttention-2's running max m, normaliser l and
accumulator o (and how often a finite max grew). A step takes the state and one key
block's logits S_j and values V_j and returns the next state, rounding every value at
the site the policy names (flashnum.engine.arith.Arith) and nowhere else. `fa2_step` is
Dao (2023), Algorithm 1, lines 8-10:

    m_i = max(m_{i-1}, rowmax(S_j)), P = exp(S_j - m_i), alpha = exp(m_{i-1} - m_i),
    l_i = alpha l_{i-1} + rowsum(P), o_i = alpha o_{i-1} + P V_j; out = o / l

and the variants (flashnum.engine.variants: exp2, lazy, qiu_yao, qiu_yao_released) change
its running max, the base of its exponential or a floor of the block row sum; `fa1_step`
keeps o normalised at every step (Dao et al. 2022, Algorithm 1, lines 9-12).

This is the readable path: every step builds new tensors. flashnum.engine.fast runs the
same operations in place, faster, with the same bits (tests/test_engine.py checks it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from flashnum.engine.arith import Arith
from flashnum.engine.tiles import tile_dot
from flashnum.engine.variants import Variant


@dataclass(frozen=True)
class Run:
    """What every step of one run reads: the arithmetic and the variant's constants."""

    ar: Arith
    variant: Variant  # its max rule, base, floor and parameters (flashnum.engine.variants)
    f_diff: object  # the format of s - m: torch computes it in the wider of s's and m's
    tall: bool  # every query block takes the same key block at each step (one tall GEMM)

    @property
    def base2(self) -> bool:
        """exp2: logits in log2 units, P and alpha by exp2."""
        return self.variant.base2


@dataclass
class State:
    """The softmax state of every query row: (B, n_qb, bm) each, o (B, n_qb, bm, dv)."""

    m: torch.Tensor  # running row max m_i (-inf while a row has seen no key)
    l: torch.Tensor  # running normaliser l_i
    o: torch.Tensor  # accumulator o_i (fa1: already divided by l_i)
    n_rescales: torch.Tensor  # int64: steps at which a finite m grew

    @classmethod
    def initial(cls, o: torch.Tensor) -> State:
        """m = -inf, l = 0, no rescale, and the accumulator o (zeros, the carrier's dtype)."""
        shape = o.shape[:-1]
        return cls(torch.full(shape, -torch.inf, dtype=o.dtype), torch.zeros(shape, dtype=o.dtype),
                   o, torch.zeros(shape, dtype=torch.int64))


Step = Callable[[Run, State, torch.Tensor, torch.Tensor], State]


def row_max(run: Run, s: torch.Tensor) -> torch.Tensor:
    """rowmax(S_j) in m's format (max is exact; a rounding only when m is narrower than s)."""
    return run.ar.rnd(s.amax(dim=-1), run.ar.fmt("m"))


def finite_or_zero(m: torch.Tensor) -> torch.Tensor:
    """The shift of a row: m where finite, else 0, so that a row that has seen no key yet
    (m = -inf) gives exp(-inf - 0) = 0, never NaN."""
    return torch.where(torch.isfinite(m), m, torch.zeros_like(m))


def grew(m_old: torch.Tensor, m_new: torch.Tensor) -> torch.Tensor:
    """Rows whose finite max grew (a rescale of what was accumulated)."""
    return (m_new > m_old) & torch.isfinite(m_old)


def fa2_step(run: Run, st: State, s: torch.Tensor, v_j: torch.Tensor) -> State:
    """One key block of FlashAttention-2 (Dao 2023, Algorithm 1, lines 8-10), and of every
    variant that is not `normalised`: the variant chooses the block max and the running max
    (max(m_{i-1}, rowmax(S_j)) in fa2) and may clamp the block row sum below (its floor).
    The block's row sum and its P V tile are stored in l's and o's formats before they are
    added (a no-op when l and o are fp32, as in FA2).
    """
    ar, var = run.ar, run.variant
    m_new = var.running_max(st.m, var.block_max(ar, s, row_max(run, s), st.m))
    m_safe = finite_or_zero(m_new)
    # alpha = exp(m_{i-1} - m_i): the rescale of what was accumulated so far
    alpha = ar.exp(ar.rnd(st.m - m_safe, ar.fmt("m")), ar.fmt("p"), run.base2)
    # P~ = exp(S_j - m_i), and P~ as it enters P~ V_j (FA2 casts it to the input dtype)
    p = ar.exp(ar.rnd(s - m_safe[..., None], run.f_diff), ar.fmt("p"), run.base2)
    p_cast = ar.site(p, "p_cast")
    # l_i = alpha l_{i-1} + rowsum(P~)
    l_blk = ar.site(ar.rowsum(p_cast if ar.policy.l_from == "p_cast" else p, ar.fmt("l_acc")),
                    "l")
    l_floor = var.floor(ar)
    if l_floor is not None:
        l_blk = l_blk.clamp(min=l_floor)
    l = ar.site(ar.site(st.l * alpha, "l") + l_blk, "l")
    # o_i = alpha o_{i-1} + P~ V_j
    pv = ar.site(tile_dot(ar, p_cast, v_j, ar.fmt("pv_acc"), run.tall, ar.fmt("pv_product")),
                 "o")
    o = ar.site(ar.site(st.o * alpha[..., None], "o") + pv, "o")
    return State(m_new, l, o, st.n_rescales + grew(st.m, m_new))


def fa1_step(run: Run, st: State, s: torch.Tensor, v_j: torch.Tensor) -> State:
    """FlashAttention-1 (Dao et al. 2022, Algorithm 1, lines 9-12): P relative to the
    block max, o kept normalised."""
    ar = run.ar
    f_p, f_m = ar.fmt("p"), ar.fmt("m")
    m_blk = row_max(run, s)
    m_new = torch.maximum(st.m, m_blk)
    m_blk_safe, m_new_safe = finite_or_zero(m_blk), finite_or_zero(m_new)
    p = ar.exp(ar.rnd(s - m_blk_safe[..., None], run.f_diff), f_p)  # P~ relative to the block max
    p_cast = ar.site(p, "p_cast")
    l_blk = ar.site(ar.rowsum(p_cast if ar.policy.l_from == "p_cast" else p, ar.fmt("l_acc")),
                    "l")
    a_old = ar.exp(ar.rnd(st.m - m_new_safe, f_m), f_p)
    a_blk = ar.exp(ar.rnd(m_blk - m_new_safe, f_m), f_p)
    l_new = ar.site(ar.site(a_old * st.l, "l") + ar.site(a_blk * l_blk, "l"), "l")
    pv = ar.site(tile_dot(ar, p_cast, v_j, ar.fmt("pv_acc"), run.tall, ar.fmt("pv_product")),
                 "o")
    num = ar.site(
        ar.site(ar.site(st.l * a_old, "o")[..., None] * st.o, "o")
        + ar.site(a_blk[..., None] * pv, "o"),
        "o",
    )
    l_safe = torch.where(l_new > 0, l_new, torch.ones_like(l_new))
    o_new = ar.site(num / l_safe[..., None], "div")
    return State(m_new, l_new, o_new, st.n_rescales + grew(st.m, m_new))


def step_of(variant: Variant) -> Step:
    """The step of a variant: fa1's when o is kept normalised, else fa2's (whose max rule,
    base and floor are the variant's)."""
    return fa1_step if variant.normalised else fa2_step


def scan(run: Run, st: State, n_kb: int, load, step: Step, trace: list | None) -> State:
    """Run `step` over the key blocks: load(t) gives step t's (S_j, V_j). With a trace
    list, the state (m, l) after each step is appended to it (here and nowhere else)."""
    for t in range(n_kb):
        s, v_j = load(t)
        st = step(run, st, s, v_j)
        if trace is not None:
            trace.append((st.m.clone(), st.l.clone()))
    return st
