"""The online-softmax recurrence, one key block at a time: the state and one step per variant.

    from flashnum.engine.recurrence import STEPS, Run, State, scan
    st = scan(run, State.initial(o), n_kb, load, STEPS["fa2"], trace)

A `State` holds, per query row, FlashAttention-2's running max m, normaliser l and
accumulator o (and how often a finite max grew). A step takes the state and one key
block's logits S_j and values V_j and returns the next state, rounding every value at
the site the policy names (flashnum.engine.arith.Arith) and nowhere else. `fa2_step` is
Dao (2023), Algorithm 1, lines 8-10; the other variants differ only in the running max
(lazy, qiu_yao), the base of the exponential (exp2) or the normalisation (fa1):

    fa2      m_i = max(m_{i-1}, rowmax(S_j)), P = exp(S_j - m_i), alpha = exp(m_{i-1} - m_i),
             l_i = alpha l_{i-1} + rowsum(P), o_i = alpha o_{i-1} + P V_j; out = o / l
    exp2     fa2 in base 2: log2(e) is folded into the scale, P = exp2(S_j - m_i) (Triton)
    lazy     fa2 that keeps m when it grows by at most tau (FlashAttention-4: 8, log2 units)
    qiu_yao  fa2 whose block max is beta * max (max > 0) or 0 (max < 0) where >= 2 logits lie
             within 1e-3 of it, so that no P is exactly 1 (Qiu & Yao 2025)
    qiu_yao_released  their attention.py as released: qiu_yao whose window max - 1e-3 is
             rounded into the logits' format, whose block row sum is clamped at 1e-10, and
             whose fully masked (causal) rows count as ties (block max 0)
    fa1      o kept normalised at every step (Dao et al. 2022, Algorithm 1, lines 9-12)

This is the readable path: every step builds new tensors. flashnum.engine.fast runs the
same operations in place, faster, with the same bits (tests/test_engine.py checks it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from flashnum.engine.arith import Arith, wider
from flashnum.engine.tiles import FP32, tile_dot

QIU_YAO_WINDOW = 1e-3  # "scores within 1e-3 of the block max" (Qiu & Yao 2025)
QIU_YAO_FLOOR = 1e-10  # attention.py's EPSILON: block_row_sums.clamp(min=EPSILON)


@dataclass(frozen=True)
class Run:
    """What every step of one run reads: the arithmetic and the variant's constants."""

    ar: Arith
    base2: bool  # exp2: logits in log2 units, P and alpha by exp2
    tau: float  # lazy: the growth of the max that is tolerated without a rescale
    beta: float  # qiu_yao: the factor applied to a positive block max
    f_diff: object  # the format of s - m: torch computes it in the wider of s's and m's
    tall: bool  # every query block takes the same key block at each step (one tall GEMM)


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


def fa2_step(run: Run, st: State, s: torch.Tensor, v_j: torch.Tensor, m_new=None,
             l_floor=None) -> State:
    """One key block of FlashAttention-2 (Dao 2023, Algorithm 1, lines 8-10).

    m_new: the new running max where a variant chooses it (lazy, qiu_yao); else
    max(m_{i-1}, rowmax(S_j)). The block's row sum and its P V tile are stored in l's
    and o's formats before they are added (a no-op when l and o are fp32, as in FA2).
    l_floor: the block row sum is clamped below at it (qiu_yao_released), else not.
    """
    ar = run.ar
    if m_new is None:
        m_new = torch.maximum(st.m, row_max(run, s))  # m_i = max(m_{i-1}, rowmax(S_j))
    m_safe = finite_or_zero(m_new)
    # alpha = exp(m_{i-1} - m_i): the rescale of what was accumulated so far
    alpha = ar.exp(ar.rnd(st.m - m_safe, ar.fmt("m")), ar.fmt("p"), run.base2)
    # P~ = exp(S_j - m_i), and P~ as it enters P~ V_j (FA2 casts it to the input dtype)
    p = ar.exp(ar.rnd(s - m_safe[..., None], run.f_diff), ar.fmt("p"), run.base2)
    p_cast = ar.site(p, "p_cast")
    # l_i = alpha l_{i-1} + rowsum(P~)
    l_blk = ar.site(ar.rowsum(p_cast if ar.policy.l_from == "p_cast" else p, ar.fmt("l_acc")),
                    "l")
    if l_floor is not None:
        l_blk = l_blk.clamp(min=l_floor)
    l = ar.site(ar.site(st.l * alpha, "l") + l_blk, "l")
    # o_i = alpha o_{i-1} + P~ V_j
    pv = ar.site(tile_dot(ar, p_cast, v_j, ar.fmt("pv_acc"), run.tall), "o")
    o = ar.site(ar.site(st.o * alpha[..., None], "o") + pv, "o")
    return State(m_new, l, o, st.n_rescales + grew(st.m, m_new))


def lazy_max(run: Run, m: torch.Tensor, m_blk: torch.Tensor) -> torch.Tensor:
    """The lazy running max: m stays while the block max exceeds it by at most tau."""
    m_grown = torch.maximum(m, m_blk)
    keep = torch.isfinite(m) & (m_grown - m <= run.tau)
    return torch.where(keep, m, m_grown)


def lazy_step(run: Run, st: State, s: torch.Tensor, v_j: torch.Tensor) -> State:
    """fa2 with a lazy rescale (FlashAttention-4): exp(S - m) may exceed 1 by up to e^tau."""
    return fa2_step(run, st, s, v_j, m_new=lazy_max(run, st.m, row_max(run, s)))


def qiu_yao_block_max(run: Run, s: torch.Tensor, m_blk: torch.Tensor) -> torch.Tensor:
    """Qiu & Yao's adjusted block max: where >= 2 logits lie within the window of the
    max, beta * max (max > 0, rounded into m's format) or 0 (max < 0)."""
    ar = run.ar
    near = (s >= (m_blk - QIU_YAO_WINDOW)[..., None]).sum(-1) >= 2
    adj = torch.where(m_blk > 0, ar.rnd(run.beta * m_blk, ar.fmt("m")), torch.zeros_like(m_blk))
    return torch.where(near & (m_blk != 0) & torch.isfinite(m_blk), adj, m_blk)


def qiu_yao_step(run: Run, st: State, s: torch.Tensor, v_j: torch.Tensor) -> State:
    """fa2 whose block max is Qiu & Yao's adjusted one, so that no P is exactly 1."""
    m_blk = qiu_yao_block_max(run, s, row_max(run, s))
    return fa2_step(run, st, s, v_j, m_new=torch.maximum(st.m, m_blk))


def qiu_yao_released_block_max(run: Run, s: torch.Tensor, m_blk: torch.Tensor,
                               m_old: torch.Tensor) -> torch.Tensor:
    """The block max of Qiu & Yao's attention.py (02f0ab6, STABLE=1) as it computes it.

    Their threshold `block_row_maxes - 1e-3` is a tensor op in the logits' dtype: fp32
    arithmetic rounded into s's format. For a bf16 max in [0.25, 0.5) (ulp 2^-9) max - 1e-3
    lies 0.512 ulp below the max and rounds to max - 1 ulp, so a logit one ulp below the
    max counts as a tie (the idealised window excludes it). Rows with no visible logit in
    the block (their masked causal tiles hold -finfo.max, all "within 1e-3" of a block max
    of -finfo.max) count as ties with a negative max: their block max becomes 0.
    """
    ar = run.ar
    f_s = ar.fmt("s")
    thr = ar.rnd(ar.rnd(m_blk - float(torch.tensor(QIU_YAO_WINDOW, dtype=torch.float32)),
                        wider(f_s, FP32), nearest=True), f_s, nearest=True)
    near = (s >= thr[..., None]).sum(-1) >= 2  # m_blk = -inf: thr = -inf, every column
    near &= torch.isfinite(m_blk) | torch.isfinite(m_old)
    adj = torch.where(m_blk > 0, ar.rnd(run.beta * m_blk, ar.fmt("m")), torch.zeros_like(m_blk))
    return torch.where(near & (m_blk != 0), adj, m_blk)


def qiu_yao_floor(run: Run) -> float:
    """attention.py's clamp of the block row sum, 1e-10 as l's format holds it."""
    return float(run.ar.rnd(torch.tensor(QIU_YAO_FLOOR, dtype=run.ar.dtype), run.ar.fmt("l"),
                            nearest=True))


def qiu_yao_released_step(run: Run, st: State, s: torch.Tensor, v_j: torch.Tensor) -> State:
    """qiu_yao as their attention.py computes it: the window rounded into s's format, fully
    masked rows taken as ties, and the block row sum clamped at 1e-10. With beta = 2 the
    largest P of a tied block is exp(-max): once t exp(-max) < 1e-10 (t ties; max > 23.7
    for two) the clamp replaces the row sum and the output collapses towards 0."""
    m_blk = qiu_yao_released_block_max(run, s, row_max(run, s), st.m)
    return fa2_step(run, st, s, v_j, m_new=torch.maximum(st.m, m_blk), l_floor=qiu_yao_floor(run))


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
    pv = ar.site(tile_dot(ar, p_cast, v_j, ar.fmt("pv_acc"), run.tall), "o")
    num = ar.site(
        ar.site(ar.site(st.l * a_old, "o")[..., None] * st.o, "o")
        + ar.site(a_blk[..., None] * pv, "o"),
        "o",
    )
    l_safe = torch.where(l_new > 0, l_new, torch.ones_like(l_new))
    o_new = ar.site(num / l_safe[..., None], "div")
    return State(m_new, l_new, o_new, st.n_rescales + grew(st.m, m_new))


STEPS: dict[str, Step] = {
    "fa2": fa2_step,
    "exp2": fa2_step,  # the same step: log2(e) is in the scale, run.base2 picks exp2
    "lazy": lazy_step,
    "qiu_yao": qiu_yao_step,
    "qiu_yao_released": qiu_yao_released_step,
    "fa1": fa1_step,
}


def scan(run: Run, st: State, n_kb: int, load, step: Step, trace: list | None) -> State:
    """Run `step` over the key blocks: load(t) gives step t's (S_j, V_j). With a trace
    list, the state (m, l) after each step is appended to it (here and nowhere else)."""
    for t in range(n_kb):
        s, v_j = load(t)
        st = step(run, st, s, v_j)
        if trace is not None:
            trace.append((st.m.clone(), st.l.clone()))
    return st
