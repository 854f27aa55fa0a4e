"""The blocked online softmax (the `flash` structure): tiles, key order, the loop, the result.

    from flashnum.engine.flash import flash
    res = flash(call, call.pol)     # a checked flashnum.engine.call.Call, its Policy

Called by flashnum.engine.emulate once the call is checked. For every query block
(all at once, vectorised over batch, heads and query blocks) it visits the key blocks in
the chosen order and runs one step of flashnum.engine.recurrence per key block, then
divides o by l. The path is chosen once, before the loop: the readable steps
(recurrence.step_of the variant), or their in-place equivalent (flashnum.engine.fast) when
every large-tensor site is fp32, or all of it in one C loop where flashnum.engine.fused
claims the call. Memory is O(Nq * block_n): no Nq x Nk matrix is formed.
"""

from __future__ import annotations

import math

import torch

from flashnum.engine.arith import Arith, carrier, wider
from flashnum.engine.call import Call
from flashnum.engine.fast import in_place_ok, run_in_place
from flashnum.engine.fused import fused_forward
from flashnum.engine.recurrence import Run, State, scan, step_of
from flashnum.engine.result import Result, Trace
from flashnum.engine.tiles import (
    Tiles,
    gather,
    scale_in_logits_format,
    stored_inputs,
    tile_logits,
)
from flashnum.numerics import elementary
from flashnum.numerics.constants import LOG2E
from flashnum.numerics.policy import Policy
from flashnum.numerics.tiling import (
    key_block_order,
    needs_block_max,
    needs_tile_classes,
    tile_classes,
    varies_by_query_block,
)


def flash(call: Call, pol: Policy) -> Result:
    """Blocked online-softmax attention of a checked call under `pol` (see the module
    docstring)."""
    q, variant, causal, order, seed = call.q, call.variant, call.causal, call.order, call.seed
    ar = Arith(pol, call.rounding, seed, carrier(pol))
    q3, k3, v3 = stored_inputs(ar, q, call.k, call.v)
    tiles = Tiles.of(q3, k3, v3, call.block_m, call.block_n)
    run = Run(ar, variant=variant, f_diff=wider(pol.fmt("s"), pol.fmt("m")),
              tall=not varies_by_query_block(order))
    scale_s = scale_in_logits_format(ar, call.softmax_scale, variant.base2, variant.exp2_form)
    perm = _key_order(run, tiles, order, seed, scale_s, causal)
    trace = call.trace
    fused = fused_forward(run, tiles, perm, scale_s, causal, variant, trace)
    if fused is not None:  # the same operations in one C loop (fused.claim decides)
        states, traces = fused
    elif not variant.normalised and in_place_ok(ar):
        states, traces = run_in_place(run, tiles, perm, scale_s, causal, trace)
    else:
        def load(t):
            kb = perm[..., t]
            return (tile_logits(ar, tiles, kb, scale_s, causal, run.tall),
                    gather(tiles.v, kb, run.tall))

        o = torch.zeros(*tiles.q.shape[:3], tiles.v.shape[-1], dtype=ar.dtype)
        traces = [[] if trace else None]
        states = [scan(run, State.initial(o), tiles.n_kb, load, step_of(variant), traces[0])]
    return _result(run, states, traces, perm, q.shape[:-2], tiles)


def _key_order(run: Run, tiles: Tiles, order, seed: int, scale_s: float, causal: bool):
    """(B or 1, n_qb, n_kb): the key block each query block processes at each step."""
    n_qb, n_kb = tiles.n_qb, tiles.n_kb
    if needs_tile_classes(order):
        classes = tile_classes(tiles.nq, tiles.nk, tiles.bm, tiles.bn, causal)
        return key_block_order(order, n_qb, n_kb, seed, classes=classes)[None]
    if not needs_block_max(order):
        return key_block_order(order, n_qb, n_kb, seed)[None]
    # a tile's largest logit over its *real* query rows: padded rows would add logit 0
    real = (torch.arange(n_qb)[:, None] * tiles.bm + torch.arange(tiles.bm) < tiles.nq)[..., None]
    bmax = torch.stack(
        [
            tile_logits(run.ar, tiles, torch.full((1, n_qb), j), scale_s, causal, run.tall)
            .masked_fill(~real, -math.inf)
            .amax(dim=(-1, -2))
            for j in range(n_kb)
        ],
        dim=-1,
    )  # (B, n_qb, n_kb)
    return key_block_order(order, n_qb, n_kb, seed, bmax)


def _result(run: Run, states, traces, perm, lead, tiles: Tiles) -> Result:
    """out = o / l (fa1: o as it is), rounded into the output format; masked rows 0."""
    ar, nq = run.ar, tiles.nq
    m, l, o, n_rescales = (torch.cat([getattr(st, x) for st in states]) if len(states) > 1
                           else getattr(states[0], x) for x in ("m", "l", "o", "n_rescales"))
    B, n_qb, bm = m.shape
    masked = m == -math.inf  # +inf (an overflowed logit) is not masking: it shows as NaN
    if run.variant.normalised:
        out = o  # already normalised at every step (fa1)
    else:
        l_safe = torch.where(l > 0, l, torch.ones_like(l))
        out = ar.site(o / l_safe[..., None], "div")
    out = ar.site(out, "out")
    if bool(masked.any()):
        out = torch.where(masked[..., None], torch.zeros_like(out), out)
    # a row is finite iff its sum is, unless the sum overflows: check those rows again
    nonfinite = ~torch.isfinite(out.sum(-1))
    if bool(nonfinite.any()):
        nonfinite = ~torch.isfinite(out).all(dim=-1)

    def rows(x):
        return x.reshape(B, n_qb * bm, *x.shape[3:])[:, :nq].reshape(*lead, nq, *x.shape[3:])

    m64, l64 = rows(m).to(torch.float64), rows(l).to(torch.float64)
    lse = m64 / LOG2E + elementary.log(l64) if run.base2 else m64 + elementary.log(l64)
    tr = None
    if traces[0] is not None:
        def stacked(i):  # (B, n_kb, Nq) over the chunks of heads
            per_step = [torch.cat([c[t][i] for c in traces]) for t in range(tiles.n_kb)]
            return torch.stack([x.reshape(B, -1)[:, :nq] for x in per_step], dim=1)

        tr = Trace(
            m=stacked(0).reshape(*lead, tiles.n_kb, nq).to(torch.float64),
            l=stacked(1).reshape(*lead, tiles.n_kb, nq).to(torch.float64),
            order=perm.expand(B, n_qb, tiles.n_kb).reshape(*lead, n_qb, tiles.n_kb).clone(),
        )
    return Result(
        out=rows(out).to(torch.float64), m=m64, l=l64, lse=lse, masked=rows(masked),
        n_rescales=rows(n_rescales), trace=tr, nonfinite=rows(nonfinite),
    )
