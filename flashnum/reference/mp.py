"""method="mpmath": a plain row loop in mpmath at `bits` bits (an explicit context, never
the global mp), the independent cross-check of the certified reference."""

from __future__ import annotations

import math

import torch

from flashnum.numerics.accumulate import dot
from flashnum.numerics.constants import gamma
from flashnum.reference.balls import half_ulp, mpf_to_float, up
from flashnum.reference.result import empty


def mpmath_rows(q, k, v, vis, scale, bits):
    """Row by row in mpmath at `bits` (fdot/fsum round once per dot, exp/log to ~1 ulp).
    err_bound: the fp64 analysis with u = 2^-bits (worst case over the row), plus the
    half-ulp of the final rounding to float64."""
    import mpmath

    ctx = mpmath.MPContext()
    ctx.prec = bits
    B, nq, d = q.shape
    nk, dv = k.shape[1], v.shape[2]
    out, lse, mx, err = empty(B, nq, dv)
    sc = 1 / ctx.sqrt(d) if scale is None else ctx.mpf(scale)
    u = 2.0**-bits
    for b in range(B):
        K = [[ctx.mpf(x) for x in row] for row in k[b].tolist()]
        VT = [[ctx.mpf(x) for x in col] for col in v[b].T.tolist()]
        A = dot(q[b].abs(), k[b].abs().T, "fp64").numpy()
        Mv = v[b].abs().max().item() if v[b].numel() else 0.0
        for i in range(nq):
            c = int(vis[i])
            if c == 0:
                continue
            qi = [ctx.mpf(x) for x in q[b, i].tolist()]
            s = [sc * ctx.fdot(qi, K[j]) for j in range(c)]
            m = max(s)
            p = [ctx.exp(x - m) for x in s]
            l = ctx.fsum(p)
            row = [mpf_to_float(ctx.fdot(p, vc if c == nk else vc[:c]) / l) for vc in VT]
            out[b, i] = torch.tensor(row, dtype=torch.float64)
            mx[b, i] = mpf_to_float(m)
            lse[b, i] = mpf_to_float(m + ctx.log(l))
            width = float(m - min(s))
            sigma = abs(float(sc)) * _g(d + 3, u) * float(A[i, :c].max()) * 1.01
            tau = (sigma + 2 * u * width + 3 * u) * 1.01
            rr = math.expm1(tau) / (1 - math.expm1(tau))
            kappa = 3 * _g(c + 1, u) + 2 * u
            e_mp = (2 * rr + kappa) * Mv * 1.01
            half = max(map(half_ulp, row), default=0.0)
            err[b, i] = up(half + e_mp)
    return out, lse, mx, err, {}


def _g(n: float, u: float) -> float:
    return gamma(n, u)
