"""The softmax-state invariants every results row checks, and the bound they rest on.

    m_ok, l_ok = invariants(case, pol, eng_prec, q, k, res, ref, causal, scale, rows=None)

`case` is anything with the case fields (a flashnum.harness.grid.Case: head_dim,
backend, block_m, block_n, order, variant, mp_bits, tau, beta); `pol` its Policy
(None for the mp recurrence), `eng_prec` the precision the engine ran at, `q`, `k`
the inputs as the kernel stored them, `res` the AttentionResult, `ref` the reference;
`rows` a dict kept across the calls on the same q, k (flashnum.analysis.memo): |Q| |K|^T's
row maxima and whether q, k lie on the inputs' grid are computed once there.

    m_ok  the final running max is the row max of the logits: within the proven error
          of the computed logits (logit_slack: inputs, dot, scale and m roundings, plus
          the reference's own) of the exact row max that flashnum.reference computed
          in float64 from the same stored inputs. The oracle shares no code with the
          engine (its logits, tiles and roundings are not consulted); the bitwise check
          of m on inputs whose logits are exact lives in tests/test_oracles.py. The
          variant widens that window (its m_window: lazy may stay up to tau below it,
          qiu_yao may exceed it). With a trace, m must also never decrease from one
          key block to the next.
    l_ok  l > 0 and finite in every row that sees a key; l = 0 and the row flagged
          masked in every row that sees none.
"""

from __future__ import annotations

import math

import torch

from flashnum.analysis.memo import kept
from flashnum.engine.variants import variant_of
from flashnum.numerics.accumulate import dot
from flashnum.numerics.constants import LOG2E, gamma
from flashnum.numerics.formats import Format
from flashnum.numerics.tiling import causal_visible, visible_count

U64 = 2.0**-53  # unit roundoff of the float64 reference


def _variant(case):
    """The case's variant (flashnum.engine.variants) with the case's tau and beta."""
    return variant_of(case.variant, tau=getattr(case, "tau", None),
                      beta=getattr(case, "beta", None))


def logit_slack(case, pol, absdot, row_max, scale, on_grid=False):
    """A proven bound on |computed row max - exact row max| per row (natural units).

    computed s = fl_s(fl_s(fl_acc(q^ . k^)) * fl_s(scale)), q^ = fl_in(q): relative
    errors u_in on each operand, gamma_d(u_acc) on the dot (any summation order),
    (1 + u_s)^3 for the two roundings to s and the rounded scale, then u_m for m.
    max is 1-Lipschitz in the sup norm, so the row max errs by at most the worst
    logit. The fp64 reference's row max errs by gamma_{d+4}(2^-53) of the same sum.
    Underflow adds at most half a subnormal of fp32 per operation: (d + 4) 2^-150.
    on_grid: q and k are already numbers of the inputs' format (their cast is exact).
    """
    d = case.head_dim
    if pol is None:  # mp: every operation at mp_bits
        u = 2.0 ** -case.mp_bits
        u_in = u_op = 0.0
        u_s = u_m = u
        u_acc = u
    else:
        u_in, u_s, u_m = pol.fmt("inputs").u, pol.fmt("s").u, pol.fmt("m").u
        u_in = 0.0 if on_grid else u_in
        acc = pol.fmt("qk_acc")
        u_op = acc.u if acc.name == "tf32" else 0.0
        u_acc = 2.0**-24 if acc.name == "tf32" else acc.u
    e = (1 + u_s) ** 3 * (1 + u_in) ** 2 * (1 + u_op) ** 2 * (1 + gamma(d, u_acc)) - 1
    e_ref = gamma(d + 4, U64)
    t = scale * absdot * (e + e_ref) + (d + 4) * 2.0**-150
    t = t + u_m * (row_max.abs() + t) + 4 * U64 * row_max.abs()
    if _variant(case).base2:
        t = t * (1 + 4 * U64) + 4 * U64 * row_max.abs()  # m / log2(e) back to natural units
    return t


def _abs_dot_max(q, k, causal):
    """max over the visible keys of |q_i| . |k_j|, per row."""
    nq, nk = q.shape[-2], k.shape[-2]
    absdot = dot(q.abs(), k.abs().transpose(-1, -2), "fp64")
    if causal:
        absdot = absdot.masked_fill(~causal_visible(nq, nk, causal=causal), 0.0)
    return absdot.amax(dim=-1)


def _row_max_window(case, pol, q, k, ref, causal, scale, rows=None):
    """(row max, slack): where the final m of each row must lie, before the variants' slack."""
    scale_f = scale if scale is not None else 1.0 / math.sqrt(case.head_dim)
    absdot = kept(rows, (q, k), ("abs_dot_max", causal), lambda: _abs_dot_max(q, k, causal))
    fin = pol.fmt("inputs") if pol is not None else None
    on_grid = kept(rows, (q, k), ("on_grid_qk", fin), lambda: isinstance(fin, Format)
                   and fin.p < 53 and all(bool(fin.representable(x)) for x in (q, k)))
    slack = logit_slack(case, pol, absdot, ref.row_max.nan_to_num(0.0, 0.0, 0.0), scale_f,
                        on_grid)
    base2 = _variant(case).base2
    smax = ref.row_max * (LOG2E if base2 else 1.0)
    slack = slack * (LOG2E if base2 else 1.0)
    return smax, slack


def invariants(case, pol, eng_prec, q, k, res, ref, causal, scale,
               rows: dict | None = None) -> tuple[bool, bool]:
    """(m_ok, l_ok); see the module docstring."""
    nq, nk = q.shape[-2], k.shape[-2]
    vis = (visible_count(nq, nk, causal) > 0).expand(res.m.shape)  # rows that see a key
    l_ok = bool(
        (res.l[vis] > 0).all() and torch.isfinite(res.l[vis]).all()
        and (res.l[~vis] == 0).all() and torch.equal(res.masked, ~vis)
    )
    m = res.m
    u_m = pol.fmt("m").u if pol is not None else 2.0 ** -case.mp_bits
    smax, slack = _row_max_window(case, pol, q, k, ref, causal, scale, rows)
    lo, hi = _variant(case).m_window(smax, smax, slack, u_m)
    mv, lov, hiv, sl = m[vis], lo[vis], hi[vis], slack[vis]
    m_ok = bool(((mv >= lov - sl) & (mv <= hiv + sl)).all()) and bool(
        torch.isneginf(m[~vis]).all()
    )
    tr = res.trace
    if tr is not None and tr.m.shape[-2] > 0:
        steps = tr.m
        m_ok = m_ok and bool((steps[..., 1:, :] >= steps[..., :-1, :]).all())
        m_ok = m_ok and bool(torch.equal(steps[..., -1, :], m))
    return m_ok, l_ok
