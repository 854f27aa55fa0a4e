"""method="fp64": float64 attention arranged for a small, stated error bound (max-shifted
softmax, blocked and pairwise sums; the bound of docs/reference.md per row), and plain64,
the same without a bound.

Both are functions of their inputs alone, on every machine: each dot product is
flashnum.numerics.accumulate's FMA chain (in chunks of FP64_CHUNK terms, then a pairwise
tree, for fp64), each row sum its cascade, exp and log correctly rounded
(flashnum.numerics.elementary), never a library's GEMM, reduction or exp."""

from __future__ import annotations

import math

import torch

from flashnum.numerics import elementary
from flashnum.numerics.accumulate import dot, rowsum
from flashnum.numerics.constants import gamma
from flashnum.numerics.tiling import causal_visible, check_causal
from flashnum.reference.balls import MIN_NORMAL, TINY, U
from flashnum.reference.result import empty


def _gamma(n: float) -> float:
    return gamma(n, U)


def _pairwise(x: torch.Tensor) -> torch.Tensor:
    """Pairwise (tree) sum over dim 1: error <= gamma_ceil(log2 n) * sum |x|."""
    while x.shape[1] > 1:
        if x.shape[1] % 2:
            x = torch.cat([x, torch.zeros_like(x[:, :1])], dim=1)  # adding 0 is exact
        x = x[:, 0::2] + x[:, 1::2]
    return x[:, 0]


def _tree_beta(n: int, chunk: int) -> int:
    """The gamma index of _tree_matmul: dots of `chunk` terms, then a tree of depth
    ceil(log2(n / chunk)); |error| <= gamma_beta * sum_k |a_ik b_kj| (Higham, 3.1, 4.2)."""
    n_ch = max(1, math.ceil(n / chunk))
    return min(chunk, n) + (math.ceil(math.log2(n_ch)) if n_ch > 1 else 0)


def _tree_matmul(a: torch.Tensor, b: torch.Tensor, chunk: int) -> torch.Tensor:
    """a @ b with the inner sum cut into float64 dots of `chunk` terms (accumulate's FMA
    chains; the bound holds for any order: gamma_chunk) whose results are summed pairwise."""
    r, n = a.shape
    n_ch = max(1, math.ceil(n / chunk))
    pad = n_ch * chunk - n
    ac = torch.nn.functional.pad(a, (0, pad)).reshape(r, n_ch, chunk).transpose(0, 1)
    bc = torch.nn.functional.pad(b, (0, 0, 0, pad)).reshape(n_ch, chunk, b.shape[1])
    return _pairwise(dot(ac, bc, "fp64").transpose(0, 1))  # (r, n_ch, c) chunk sums


FP64_CHUNK = 8  # terms per float64 dot before the pairwise tree (logits and P @ V)


def fp64(q, k, v, vis, scale):
    """Max-shifted softmax in float64; Q K^T and P @ [V | 1] by _tree_matmul;
    err_bound from the analysis in docs/reference.md, evaluated per row."""
    B, nq, d = q.shape
    nk, dv = k.shape[1], v.shape[2]
    out, lse, mx, err = empty(B, nq, dv)
    if nq == 0 or nk == 0:
        return out, lse, mx, err, {}
    sc = 1.0 / math.sqrt(d) if scale is None else scale
    ch = FP64_CHUNK
    # logits: the tree dot (gamma_beta_d), fl(1/sqrt(d)) (gamma_2) and the product by it
    g_s = _gamma(_tree_beta(d, ch) + 3)
    beta = _tree_beta(nk, ch)  # the sums l and o
    g_b = _gamma(beta)
    kappa = 2 * g_b / (1 - g_b) + U * (1 + 2 * g_b / (1 - g_b))
    safety = 1 + _gamma(nk + d + 30)  # covers evaluating the bound itself in float64
    vis_t = torch.from_numpy(vis)
    per_row = 12 * nk + math.ceil(d / ch) * nk + math.ceil(nk / ch) * (dv + 1)
    step = max(1, (1 << 23) // per_row)  # ~64 MB of temporaries per block of rows
    for b in range(B):
        K, V = k[b], v[b]
        V1 = torch.cat([V, torch.ones(nk, 1, dtype=torch.float64)], dim=1)
        absV, absKT, KT = V.abs(), K.abs().T, K.T.contiguous()
        for i0 in range(0, nq, step):
            i1 = min(nq, i0 + step)
            inside = torch.arange(nk)[None, :] < vis_t[i0:i1, None]
            live = inside.any(dim=1)
            qb = q[b, i0:i1]
            s = _tree_matmul(qb, KT, ch) * sc
            s = s.masked_fill(~inside, -math.inf)
            m = s.amax(dim=1).masked_fill(~live, 0.0)
            x = s - m[:, None]  # rounded: the u|x| term of the bound
            p = elementary.exp(x)  # correctly rounded: within half an ulp
            ol = _tree_matmul(p, V1, ch)  # (r, dv + 1): [o | l]
            l = ol[:, dv]
            o = ol[:, :dv] / l[:, None]
            # -- the bound: relative perturbation of every p, then the sums and the division --
            a = dot(qb.abs(), absKT, "fp64") / (1 - _gamma(d))  # >= sum_t |q_t k_t|
            sigma = abs(sc) * g_s * a + abs(sc) * (d + 1) * TINY
            tau = (sigma + U * x.abs() / (1 - U) + 2 * U / (1 - 2 * U)) * (1 + 10 * U)
            tau = tau.masked_fill(~inside, 0.0)
            rr = elementary.expm1(tau)
            rr = rr / (1 - rr)
            normal = p >= MIN_NORMAL  # relative model; the rest go to the absolute term eta
            w = torch.where(normal, p * rr, torch.zeros_like(p))
            wk = torch.where(normal, p * (rr + kappa), torch.zeros_like(p))
            lo = l * (1 - g_b)  # <= the exact sum of the computed p
            R = rowsum(w, "fp64") / lo
            Y = dot(wk, absV, "fp64") / lo[:, None] + R[:, None] * o.abs()
            n_sub = (inside & ~normal).sum(dim=1).to(torch.float64)
            vmax = absV.max() if dv else 0.0
            eta = n_sub * 2.0**-1019 * vmax
            e = (Y.amax(dim=1) if dv else torch.zeros_like(R)) / (1 - R)
            e = e * safety + eta
            # float64 overflowed (logits beyond 1e308): no bound
            bad = ~(torch.isfinite(o).all(dim=1) & torch.isfinite(e))
            e = e.masked_fill(bad, math.inf)
            out[b, i0:i1] = torch.where(live[:, None], o, 0.0)
            err[b, i0:i1] = torch.where(live, e, 0.0)
            mx[b, i0:i1] = torch.where(live, m, -math.inf)
            lse[b, i0:i1] = torch.where(live, m + elementary.log(l), -math.inf)
    return out, lse, mx, err, {"chunk": ch, "beta_dot": _tree_beta(d, ch), "beta_sum": beta}


# -- mpmath: the plain row loop ------------------------------------------------------------


def plain64(q, k, v, *, scale: float, causal=False) -> torch.Tensor:
    """softmax(scale Q K^T) V in plain float64, max-shifted (FA3's "attention in FP64").

    No bound and no cache: the quick reference of the reproductions and of the worst-case
    search's objective, whose error (~(Nk + d) 2^-53 max|V|) is far below any low-precision
    error they measure; final numbers come from `reference` (certified or fp64). Fully
    masked causal rows give 0, as every backend does.
    """
    q, k, v = (x.to(torch.float64) for x in (q, k, v))
    s = dot(q, k.transpose(-1, -2), "fp64") * scale
    if causal:
        s = s.masked_fill(~causal_visible(*s.shape[-2:], causal=check_causal(causal)),
                          -math.inf)
    m = s.amax(-1, keepdim=True)
    p = elementary.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
    return (dot(p, v, "fp64") / rowsum(p, "fp64")[..., None]).nan_to_num(0.0)
