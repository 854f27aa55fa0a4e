"""The recurrence itself in arbitrary precision (backend "mp", precision="mp").

Every operation of the blocked online softmax (dots, max, exp, the rescales,
the sums, the final division) is carried out by mpmath at `bits` significand
bits, in an explicit context (never mpmath's global `mp`). It answers "what does
the *algorithm* do when the arithmetic is nearly exact", and, at low `bits`,
"how does error scale with the mantissa" with an unbounded exponent range.

Cost: pure Python, one mpf operation per multiply-add. Measured with
`python bench/bench_engine.py --mp`: see README. Keep N to a few hundred.

The output is rounded to float64 for `res.out`; the mp values themselves are
kept in `res.info["out_mp"]` (an object array of mpf) so that differences far
below float64's resolution can be measured.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import torch

from flashnum.engine.result import Result, Trace
from flashnum.engine.variants import variant_of
from flashnum.numerics.tiling import (
    causal_visible,
    key_block_order,
    n_blocks,
    needs_block_max,
    needs_tile_classes,
    tile_classes,
)


def run_call(call) -> Result:
    """A checked call (flashnum.engine.call.Call) at call.mp_bits: the recurrence itself, no
    per-site formats, no rounding mode."""
    return attention_mp(call.q, call.k, call.v, bits=call.mp_bits, block_m=call.block_m,
                        block_n=call.block_n, order=call.order, variant=call.variant,
                        causal=call.causal, scale=call.scale, seed=call.seed,
                        trace=call.trace)


def attention_mp(q, k, v, *, bits=256, block_m=64, block_n=64, order="forward", variant="fa2",
                 causal=False, scale=None, seed=0, trace=False, tau=None, beta=None) -> Result:
    """The recurrence at `bits` bits; `variant` a flashnum.engine.variants.Variant or its
    name (tau, beta: its parameters when a name), whose max rules on mpmath scalars
    (block_max_mp, running_max_mp) this runs."""
    var = variant_of(variant, tau=tau, beta=beta)
    ctx = mpmath.MPContext()
    ctx.prec = int(bits)
    lead = q.shape[:-2]
    nq, nk, d, dv = q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    # float64 -> mpf is exact; the inputs are the values given
    Q = q.detach().to(torch.float64).reshape(-1, nq, d).numpy()
    K = k.detach().to(torch.float64).reshape(-1, nk, d).numpy()
    V = v.detach().to(torch.float64).reshape(-1, nk, dv).numpy()
    B = Q.shape[0]
    sc = ctx.mpf(1) / ctx.sqrt(d) if scale is None else ctx.mpf(float(scale))
    if var.base2:
        sc = sc / ctx.ln2  # log2(e) folded into the scale
    vis = causal_visible(nq, nk, causal=causal).numpy() if causal else None
    n_qb, n_kb = n_blocks(nq, block_m), n_blocks(nk, block_n)

    out_mp = np.empty((B, nq, dv), dtype=object)
    m_out, l_out, lse = np.zeros((B, nq)), np.zeros((B, nq)), np.zeros((B, nq))
    resc = np.zeros((B, nq), dtype=np.int64)
    tm, tl = np.full((B, n_kb, nq), -math.inf), np.zeros((B, n_kb, nq))
    orders = np.zeros((B, n_qb, n_kb), dtype=np.int64)
    for b in range(B):
        S = _logits(ctx, Q[b], K[b], sc, vis)
        bmax = _block_maxes(S, block_m, block_n, n_qb, n_kb) if needs_block_max(order) else None
        classes = (tile_classes(nq, nk, block_m, block_n, causal)
                   if needs_tile_classes(order) else None)
        perm = key_block_order(order, n_qb, n_kb, seed, bmax, classes).numpy()
        orders[b] = perm
        Vb = [[ctx.mpf(float(x)) for x in row] for row in V[b]]
        for i in range(nq):
            row = _Row(ctx, var, dv)
            for t, kb in enumerate(perm[i // block_m]):
                js = range(kb * block_n, min(nk, (kb + 1) * block_n))
                tm[b, t, i], tl[b, t, i] = row.step([S[i][j] for j in js], Vb, js)
            resc[b, i] = row.n_rescales
            out_mp[b, i], m_out[b, i], l_out[b, i], lse[b, i] = row.finish()
    out = torch.tensor(np.vectorize(float, otypes=[np.float64])(out_mp))
    m_t, l_t = torch.tensor(m_out), torch.tensor(l_out)
    tr = None
    if trace:
        tr = Trace(m=torch.tensor(tm).reshape(*lead, n_kb, nq),
                   l=torch.tensor(tl).reshape(*lead, n_kb, nq),
                   order=torch.tensor(orders).reshape(*lead, n_qb, n_kb))
    return Result(
        out=out.reshape(*lead, nq, dv), m=m_t.reshape(*lead, nq), l=l_t.reshape(*lead, nq),
        lse=torch.tensor(lse).reshape(*lead, nq), masked=(m_t == -math.inf).reshape(*lead, nq),
        n_rescales=torch.tensor(resc).reshape(*lead, nq), trace=tr, backend="mp",
        info={"out_mp": out_mp.reshape(*lead, nq, dv), "bits": int(bits)},
    )


def _logits(ctx, Qb, Kb, sc, vis) -> list[list]:
    """S = sc * Q K^T of one head as mpf, each dot exact to the context's precision
    (ctx.fdot); -inf where the causal mask hides the key."""
    minf = ctx.mpf("-inf")
    Kmp = [[ctx.mpf(float(x)) for x in row] for row in Kb]
    S = []
    for i in range(Qb.shape[0]):
        qi = [ctx.mpf(float(x)) for x in Qb[i]]
        S.append([sc * ctx.fdot(qi, Kmp[j]) if vis is None or vis[i, j] else minf
                  for j in range(len(Kmp))])
    return S


def _block_maxes(S, block_m: int, block_n: int, n_qb: int, n_kb: int) -> torch.Tensor:
    """(n_qb, n_kb) float64: each tile's largest logit, for the orders that sort by it."""
    nq, nk = len(S), len(S[0])
    return torch.tensor([[
        max((float(S[i][j]) for i in range(qb * block_m, min(nq, (qb + 1) * block_m))
             for j in range(kb * block_n, min(nk, (kb + 1) * block_n))), default=-math.inf)
        for kb in range(n_kb)] for qb in range(n_qb)])


class _Row:
    """One query row's m, l and o through its key blocks, every operation in ctx."""

    def __init__(self, ctx, var, dv: int):
        self.ctx, self.var = ctx, var
        self.exp = (lambda x: ctx.power(2, x)) if var.base2 else ctx.exp
        self.minf = ctx.mpf("-inf")
        self.m, self.l, self.o = self.minf, ctx.mpf(0), [ctx.mpf(0)] * dv
        self.n_rescales = 0

    def step(self, s: list, Vb, js) -> tuple[float, float]:
        """One key block (logits s of keys js); returns (m, l) after it, for the trace."""
        ctx, var, exp, minf = self.ctx, self.var, self.exp, self.minf
        m, l, o = self.m, self.l, self.o
        m_blk = var.block_max_mp(ctx, s, max(s))
        m_new = var.running_max_mp(m, m_blk)
        if m != minf and m_new > m:
            self.n_rescales += 1
        if m_new == minf:
            return -math.inf, 0.0
        dv = len(o)
        if var.normalised:  # fa1
            mb = m_blk if m_blk != minf else m_new
            p = [exp(x - mb) if x != minf else ctx.mpf(0) for x in s]
            a_old = exp(m - m_new) if m != minf else ctx.mpf(0)
            a_blk = exp(mb - m_new)
            l_new = a_old * l + a_blk * ctx.fsum(p)
            o = [(l * a_old * o[c] + a_blk * ctx.fdot(p, [Vb[j][c] for j in js])) / l_new
                 for c in range(dv)]
            l = l_new
        else:
            alpha = exp(m - m_new) if m != minf else ctx.mpf(0)
            p = [exp(x - m_new) if x != minf else ctx.mpf(0) for x in s]
            l = l * alpha + ctx.fsum(p)
            o = [o[c] * alpha + ctx.fdot(p, [Vb[j][c] for j in js]) for c in range(dv)]
        self.m, self.l, self.o = m_new, l, o
        return float(m_new), float(l)

    def finish(self) -> tuple[list, float, float, float]:
        """(out as mpf, m, l, lse) of the row; a row that saw no key gives 0 and -inf."""
        ctx, m, l = self.ctx, self.m, self.l
        if m == self.minf:
            return [ctx.mpf(0)] * len(self.o), -math.inf, 0.0, -math.inf
        out = self.o if self.var.normalised else [x / l for x in self.o]
        ln_l = ctx.ln(l)
        lse = float(m * ctx.ln2 + ln_l) if self.var.base2 else float(m + ln_l)
        return out, float(m), float(l), lse
