"""The in-place fast path of the fa2-like variants: the readable steps' operations, in place.

    from flashnum.engine.fast import in_place_ok, run_in_place
    if not run.variant.normalised and in_place_ok(ar):
        states, traces = run_in_place(run, tiles, perm, scale_s, causal, trace)

When s, m, p, l and o are all fp32 on the fp32 carrier and rounding is to nearest, the
fa2 step of flashnum.engine.recurrence (every variant that is not `normalised`) runs here
instead: the same operations in the same order, on buffers each step reuses, a few heads
at a time. It changes no rounding: an in-place op rounds exactly as the op that returns a
new tensor, and fp32 sites on the fp32 carrier need no rounding step. It exists for
speed: torch's CPU allocator does not cache large blocks, so every large temporary costs
page faults, and tiles that fit in cache are much faster.

Where flashnum.engine.native's C kernel is built, P = fp32(exp(fl(s - m))) and its bf16
cast run in one pass (the scale folded in: max fl(c s) = fl(c max s) for c > 0, rounding
being monotone), and so do fa2's state update and the l and o updates; every choice
is made once, before the loop. tests/test_engine.py checks that this path equals the
readable one bit for bit.
"""

from __future__ import annotations

import math

import torch

from flashnum.engine import native
from flashnum.engine.recurrence import Run, State, finite_or_zero, grew, row_max, scan
from flashnum.engine.tiles import Tiles, gather, is_fp32, tile_dot, tile_visible
from flashnum.numerics import elementary
from flashnum.numerics.formats import EXACT
from flashnum.numerics.policy import PRODUCT_SITES

CHUNK = 1 << 18  # logit-tile elements per thread per chunk of heads (~1 MiB: L2)


def in_place_ok(ar) -> bool:
    """Whether every large-tensor site of an fa2-like step is plain fp32 arithmetic (and
    no product is rounded before its sum: its dots are the readable path's alone)."""
    if ar.dtype is not torch.float32 or ar.stochastic:
        return False
    if any(ar.fmt(x) is not EXACT for x in PRODUCT_SITES):
        return False
    return all(is_fp32(ar.fmt(x)) for x in ("s", "m", "p", "l_acc", "l", "o"))


class Buffers:
    """Tiles reused across key blocks: s (then P, in place), P as cast, the per-row
    shift and alpha; the cast targets and P in float64 (for torch's exp) made on first use."""

    def __init__(self, B, n_qb, bm, bn, dv):
        self.s = torch.empty(B, n_qb, bm, bn, dtype=torch.float32)
        self.pc = torch.empty(B, n_qb, bm, bn, dtype=torch.float32)
        self.m_safe = torch.empty(B, n_qb, bm, dtype=torch.float32)
        self.alpha = torch.empty(B, n_qb, bm, dtype=torch.float32)
        self._like_s = {}

    def like_s(self, dtype: torch.dtype) -> torch.Tensor:
        """A tile of s's shape in `dtype` (float64 for torch's exp, or a cast target)."""
        if dtype not in self._like_s:
            self._like_s[dtype] = torch.empty(self.s.shape, dtype=dtype)
        return self._like_s[dtype]


class InPlace:
    """One chunk of heads on the fast path: the loader of each step's (S_j, V_j) into the
    buffers, and the fa2-like step, both fixed before the loop."""

    def __init__(self, run: Run, tiles: Tiles, perm, scale_s, causal):
        self.run, self.tiles, self.perm, self.causal = run, tiles, perm, causal
        self.scale_s = scale_s
        self.bufs = Buffers(tiles.q.shape[0], tiles.n_qb, tiles.bm, tiles.bn, tiles.v.shape[-1])
        # the key block per step when every query block shares the order
        self.js = perm.reshape(-1, tiles.n_kb)[0].tolist() if run.tall else None
        # fold: the exp pass takes the scale (only the max and P read the scaled logits)
        var = self.variant = run.variant
        self.fold = not var.reads_logits and scale_s > 0 and native.available()
        # fa2's state update in C: the plain running max
        self.native_state = self.fold and var.max_rule == "max"
        self.l_floor = var.floor(run.ar)

    def load(self, t: int):
        run_tall = self.js is not None
        kb = self.perm[..., t]
        s = _logits_into(self.run.ar, self.tiles, kb, None if self.fold else self.scale_s,
                         self.causal, self.js[t] if run_tall else None, self.bufs)
        v_j = self.tiles.v[:, self.js[t]].unsqueeze(1) if run_tall else gather(
            self.tiles.v, kb, False)
        return s, v_j

    def step(self, run: Run, st: State, s: torch.Tensor, v_j: torch.Tensor) -> State:
        """recurrence.fa2_step with s overwritten by P, l and o updated in place."""
        ar, bufs, var = run.ar, self.bufs, self.variant
        m_blk = s.amax(dim=-1).mul_(self.scale_s) if self.fold else row_max(run, s)
        m_blk = var.block_max(ar, s, m_blk, st.m)  # s is unscaled when fold (not read)
        if self.native_state and native.fa2_state(st.m, m_blk, st.n_rescales, bufs.m_safe,
                                                  bufs.alpha, run.base2) is not None:
            m_new, m_safe, alpha = st.m, bufs.m_safe, bufs.alpha  # m, n_rescales in place
        else:
            m_new = var.running_max(st.m, m_blk)
            st.n_rescales += grew(st.m, m_new)
            m_safe = finite_or_zero(m_new)
            alpha = ar.exp(ar.rnd(st.m - m_safe, ar.fmt("m")), ar.fmt("p"), run.base2)
        l, o = _update_in_place(run, s, v_j, m_safe, alpha, st.l, st.o, bufs,
                                self.scale_s if self.fold else 1.0, self.l_floor)
        return State(m_new, l, o, st.n_rescales)


def run_in_place(run: Run, tiles: Tiles, perm, scale_s: float, causal: bool, trace: bool):
    """The fast path over every head, a few at a time: each (batch, head) is independent,
    the GEMM shapes per head are unchanged, and a chunk holds about one L2's worth of
    logits per intra-op thread. Returns the final State and the trace (m, l) per chunk."""
    B, n_qb, bm = tiles.q.shape[:3]
    per_head = n_qb * bm * max(tiles.bn, tiles.v.shape[-1])
    step = max(1, CHUNK * torch.get_num_threads() // per_head)
    states, traces = [], []
    for b0 in range(0, B, step):
        sub = tiles.heads(b0, b0 + step)
        path = InPlace(run, sub, perm[b0 : b0 + step] if perm.shape[0] > 1 else perm, scale_s,
                       causal)
        st = State.initial(torch.zeros(*sub.q.shape[:3], sub.v.shape[-1], dtype=torch.float32))
        tr = [] if trace else None
        states.append(scan(run, st, tiles.n_kb, path.load, path.step, tr))
        traces.append(tr)
    return states, traces


def _logits_into(ar, tiles: Tiles, kb, scale_s, causal: bool, j, bufs: Buffers):
    """tiles.tile_logits writing into bufs.s: the same GEMM shape, fp32 s and its fp32
    scaling (scale_s None: left to the exp pass); j is the key block when tall (kb's
    common value), else None."""
    tall = j is not None
    kt = (tiles.k[:, j].unsqueeze(1) if tall else gather(tiles.k, kb, False)).transpose(-1, -2)
    f = ar.fmt("qk_acc")
    s = tile_dot(ar, tiles.q, kt, f, tall)
    if scale_s is not None:
        s.mul_(scale_s)  # the fp32 product s * scale_s, rounded once (site s is fp32)
    vis = tile_visible(tiles, kb, causal)
    if vis is not None:
        s.masked_fill_(~vis, -math.inf)
    return s


def _exp_in_place(s, m_safe, bufs: Buffers, base2: bool, scale: float, bf16: bool) -> bool:
    """s <- P = fp32(exp(fl(s * scale - m))) from a float64 exp, as Arith.exp does; the
    native kernel also writes P's bf16 cast into bufs.pc when asked. True if it did."""
    if native.exp_rows(s, m_safe, s, bufs.pc if bf16 else None, "bf16" if bf16 else None,
                       base2, scale):
        return bf16
    if scale != 1.0:
        s.mul_(scale)
    p64 = bufs.like_s(torch.float64) if s.shape == bufs.s.shape else torch.empty(
        s.shape, dtype=torch.float64)
    s.sub_(m_safe[..., None])
    p64.copy_(s)
    hard = [(s == h, v) for h, v in native.float64_fixes(base2)]  # see Arith.exp
    s.copy_(elementary.exp2(p64) if base2 else elementary.exp(p64))
    for mask, v in hard:
        s.masked_fill_(mask, v)
    return False


def _cast_p(ar, p, bufs: Buffers, cast_done: bool):
    """P as it enters P V (the p_cast site), into bufs.pc where a cast is needed."""
    f_pc = ar.fmt("p_cast")
    if cast_done:
        return bufs.pc
    if is_fp32(f_pc):
        return p
    if (f_pc is not EXACT and f_pc.torch_dtype is not None and f_pc.p < 24
            and f_pc.saturate == (f_pc.name == "fp8_e4m3") and p.shape == bufs.pc.shape):
        # fp32 -> low -> fp32: one round-to-nearest-even, as in Arith.rnd
        low = bufs.like_s(f_pc.torch_dtype)
        low.copy_(p)
        bufs.pc.copy_(low)
        return bufs.pc
    return ar.site(p, "p_cast")


def _update_in_place(run: Run, s, v_j, m_safe, alpha, l, o, bufs: Buffers, scale=1.0,
                     l_floor=None):
    """l and o of an fa2-like step; s (times `scale` if not yet scaled) is overwritten
    with P. The operations of recurrence.fa2_step after alpha, in its order (l_floor:
    the block row sum clamped below, qiu_yao_released)."""
    ar = run.ar
    f_pc = ar.fmt("p_cast")
    bf16 = f_pc is not EXACT and f_pc.name == "bf16" and s.shape == bufs.pc.shape
    p = s
    cast_done = _exp_in_place(s, m_safe, bufs, run.base2, scale, bf16)
    pc = _cast_p(ar, p, bufs, cast_done)
    l_blk = ar.rowsum(pc if ar.policy.l_from == "p_cast" else p, ar.fmt("l_acc"))
    if l_floor is not None:
        l_blk.clamp_(min=l_floor)
    if not native.rescale_add(l.unsqueeze(-1), alpha, l_blk.unsqueeze(-1)):  # l in place
        l = ar.site(ar.site(l * alpha, "l") + l_blk, "l")
    pv = ar.site(tile_dot(ar, pc, v_j, ar.fmt("pv_acc"), run.tall), "o")
    if not native.rescale_add(o, alpha, pv):  # the same two fp32 roundings in one pass
        o.mul_(alpha[..., None])
        o.add_(pv)
    return l, o
