"""What the a-priori bound (flashnum.analysis.bounds) reads of the exact problem: per row and per
entry, in float64 and in flashnum's own order (flashnum.numerics.accumulate: a bound's bits do
not depend on the machine), the softmax weights and what they weigh, and the key blocks.

    from flashnum.analysis.bound_data import row_data, block_data
    D = row_data(q, k, v, causal=False, scale=0.125, prob=False, shift0=variant.shift0)
"""

from __future__ import annotations

import math

import torch

from flashnum.numerics import elementary
from flashnum.numerics.accumulate import dot as _dot
from flashnum.numerics.accumulate import rowsum as _rowsum
from flashnum.numerics.tiling import visible_count


def dot(a, b):
    """a @ b in float64, in flashnum's order (flashnum.numerics.accumulate): a bound's
    bits do not depend on the machine."""
    return _dot(a, b, "fp64")


def rowsum(x):
    """The float64 sum over the last dim, in flashnum's order."""
    return _rowsum(x, "fp64")


def _visible_counts(nq: int, nk: int, causal) -> torch.Tensor:
    return visible_count(nq, nk, causal)


def _v_extremes(v3, n, causal):
    """Per row and column, the max, min and max |.| of V over the keys the row sees (a
    prefix of n[i] keys under the causal mask): (B, Nq, dv) each."""
    B, nq, dv = v3.shape[0], n.shape[0], v3.shape[-1]
    if causal:
        vmax_pref = torch.cummax(v3, dim=1).values
        vmin_pref = torch.cummin(v3, dim=1).values
        vabs_pref = torch.cummax(v3.abs(), dim=1).values
        idx = torch.clamp(n - 1, min=0)
        return vmax_pref[:, idx], vmin_pref[:, idx], vabs_pref[:, idx]
    return (v3.amax(1, keepdim=True).expand(B, nq, dv),
            v3.amin(1, keepdim=True).expand(B, nq, dv),
            v3.abs().amax(1, keepdim=True).expand(B, nq, dv))


def _prob_terms(pi, y, qc, S, Sv, Av, Msafe, v3, V2, K2, scale, shift0) -> dict:
    """The probabilistic bound's weighted variances of some rows (softmax pi, output y,
    logits S and their masked forms Sv, Av), as row_data stores them."""
    out = {"var": torch.clamp(dot(pi, V2) - y * y, min=0)}
    pi2 = pi * pi

    def wsq(W):
        # sum_j W_j (v_jc - y_c)^2, W >= 0
        return torch.clamp(dot(W, V2) - 2 * y * dot(W, v3) + y * y * rowsum(W)[..., None], min=0)

    out["Wv"] = dot(pi2, V2)
    out["W1"] = wsq(pi2)
    out["Ws2"] = wsq(pi2 * Sv * Sv)
    out["WA2"] = wsq(pi2 * Av * Av)
    qk2 = scale * scale * dot(qc * qc, K2.transpose(-1, -2))
    # pi = 0 on masked keys, so the weights need no masking
    out["Wk"] = wsq(pi2 * qk2)
    ms0, tau0 = shift0(Msafe)
    g0 = (ms0 + tau0)[..., None] - S
    out["Wg"] = wsq(pi2 * g0 * g0)
    out["Qterm"] = scale * scale * rowsum((qc * qc) * dot(pi, K2))
    return out


def row_data(q, k, v, *, causal, scale, prob, shift0):
    """Per row (B, Nq) and per entry (B, Nq, dv) quantities of the exact problem, in float64,
    but those of the key blocks (block_data).

    shift0(M) -> (Mshift0, tau0): the exact-arithmetic shift of the variant (for the
    probabilistic bound's exponent-argument term).
    """
    q3 = q.detach().to("cpu", torch.float64).reshape(-1, *q.shape[-2:])
    k3 = k.detach().to("cpu", torch.float64).reshape(-1, *k.shape[-2:])
    v3 = v.detach().to("cpu", torch.float64).reshape(-1, *v.shape[-2:])
    B, nq, d = q3.shape
    nk, dv = k3.shape[1], v3.shape[-1]
    n = _visible_counts(nq, nk, causal)  # (nq,)
    vmax, vmin, vabs = _v_extremes(v3, n, causal)
    kabs, qabs = k3.abs(), q3.abs()
    k_l1 = rowsum(kabs)  # (B, nk)
    V2 = v3 * v3
    K2 = k3 * k3
    rows = _chunk_rows(B, nq, nk)
    names_r = ("M", "smin", "Ms", "Sbar", "Sstar", "Abar", "Astar", "L1bar", "L1star", "Qterm")
    names_c = ("y", "nu", "var", "Wv", "W1", "Ws2", "WA2", "Wk", "Wg")
    R = {x: torch.zeros(B, nq, dtype=torch.float64) for x in names_r}
    C = {x: torch.zeros(B, nq, dv, dtype=torch.float64) for x in names_c}
    for r0 in range(0, nq, rows):
        r1 = min(nq, r0 + rows)
        qc = q3[:, r0:r1]
        S, A, Sm, Sv, Av, smin, kl1, any_vis = _masked_logits(
            qc, qabs[:, r0:r1], k3, kabs, k_l1, n[r0:r1] if causal else None, scale)
        q_l1 = rowsum(qabs[:, r0:r1])
        M = Sm.amax(-1)
        Msafe = torch.where(any_vis, M, torch.zeros_like(M))
        e = elementary.exp(Sm - Msafe[..., None])  # exp(-inf) = 0 where masked
        pi = e / torch.where(any_vis, rowsum(e), torch.ones_like(M))[..., None]
        R["M"][:, r0:r1] = Msafe
        R["smin"][:, r0:r1] = torch.where(any_vis, smin, Msafe)
        R["Ms"][:, r0:r1] = rowsum(pi * Sv)
        Sabs = Sv.abs()
        R["Sbar"][:, r0:r1] = rowsum(pi * Sabs)
        R["Sstar"][:, r0:r1] = Sabs.amax(-1)
        R["Abar"][:, r0:r1] = rowsum(pi * Av)
        R["Astar"][:, r0:r1] = Av.amax(-1)
        # L1_j = ||q||_1 + ||k_j||_1 over the visible keys
        R["L1bar"][:, r0:r1] = q_l1 * rowsum(pi) + rowsum(pi * kl1)
        R["L1star"][:, r0:r1] = torch.where(any_vis, q_l1 + kl1.amax(-1), torch.zeros_like(M))
        y = dot(pi, v3)
        C["y"][:, r0:r1] = y
        C["nu"][:, r0:r1] = dot(pi, v3.abs())
        if prob:
            for name, x in _prob_terms(pi, y, qc, S, Sv, Av, Msafe, v3, V2, K2, scale,
                                       shift0).items():
                (R if name == "Qterm" else C)[name][:, r0:r1] = x
    vis_rows = (n > 0).expand(B, nq)
    yv = C["y"]
    delta = torch.maximum(vmax - yv, yv - vmin)
    # evaluation slack: y and the extremes are float64 values of exact quantities
    delta = delta + 2.0**-40 * vabs
    data = dict(
        B=B, nq=nq, nk=nk, d=d, dv=dv,
        n=n.to(torch.float64).expand(B, nq).clone(),
        vis_rows=vis_rows, vabs=vabs, delta=delta,
        qmax=float(q3.abs().max()) if q3.numel() else 0.0,
        kmax=float(k3.abs().max()) if k3.numel() else 0.0,
        vmax_all=float(v3.abs().max()) if v3.numel() else 0.0,
        **R, **C,
    )
    return data


def _masked_logits(qc, qabs, k3, kabs, k_l1, n, scale):
    """A chunk's logits S = scale q.k, A = scale |q|.|k| and their masked forms: Sm (-inf),
    Sv and Av (0) where a key is not visible (n: keys each row sees; None: all), smin,
    the visible keys' ||k||_1, and which rows see a key."""
    B, r, nk = qc.shape[0], qc.shape[1], k3.shape[1]
    S = scale * dot(qc, k3.transpose(-1, -2))  # (B, r, nk)
    A = scale * dot(qabs, kabs.transpose(-1, -2))
    if n is None:  # every key visible: no masking passes
        return S, A, S, S, A, S.amin(-1), k_l1[:, None, :], torch.ones(B, r, dtype=torch.bool)
    ninf = torch.full_like(S, -math.inf)
    vis = (torch.arange(nk)[None, :] < n[:, None]).expand(B, -1, -1)
    zero = torch.zeros_like(S)
    return (S, A, torch.where(vis, S, ninf), torch.where(vis, S, zero),
            torch.where(vis, A, zero), torch.where(vis, S, -ninf).amin(-1),
            torch.where(vis, k_l1[:, None, :].expand_as(S), zero), vis.any(-1))


def _chunk_rows(B: int, nq: int, nk: int) -> int:
    """Query rows per pass of row_data and block_data: ~2^21 logits at once."""
    return max(1, min(nq, (1 << 21) // max(1, B * nk)))


def block_data(q, k, *, causal, scale, block_n):
    """What the bound needs of the key blocks: block_n, n_kb, T (key blocks each row
    visits) and Bmin (per row, the min over the visible key blocks of the block max: the
    first m of any order), from the logits formed as row_data forms them."""
    q3 = q.detach().to("cpu", torch.float64).reshape(-1, *q.shape[-2:])
    k3 = k.detach().to("cpu", torch.float64).reshape(-1, *k.shape[-2:])
    B, nq, nk = q3.shape[0], q3.shape[1], k3.shape[1]
    n = _visible_counts(nq, nk, causal)
    bn = block_n
    n_kb = max(1, math.ceil(nk / bn))
    Bmin = torch.zeros(B, nq, dtype=torch.float64)
    rows = _chunk_rows(B, nq, nk)
    for r0 in range(0, nq, rows):
        r1 = min(nq, r0 + rows)
        S = scale * dot(q3[:, r0:r1], k3.transpose(-1, -2))  # (B, r, nk)
        ninf = torch.full_like(S, -math.inf)
        if causal:
            vis = (torch.arange(nk)[None, :] < n[r0:r1, None]).expand(B, -1, -1)
            any_vis = vis.any(-1)
            Sm = torch.where(vis, S, ninf)
        else:
            any_vis, Sm = torch.ones(B, r1 - r0, dtype=torch.bool), S
        M = Sm.amax(-1)
        Msafe = torch.where(any_vis, M, torch.zeros_like(M))
        pad = n_kb * bn - nk
        Sp = torch.cat([Sm, ninf[..., :1].expand(*Sm.shape[:-1], pad)], -1) if pad else Sm
        bmax = Sp.reshape(B, r1 - r0, n_kb, bn).amax(-1)
        bmax = torch.where(torch.isfinite(bmax), bmax, torch.full_like(bmax, math.inf))
        Bmin[:, r0:r1] = torch.where(any_vis, bmax.amin(-1), Msafe)
    return dict(bn=bn, n_kb=n_kb, Bmin=Bmin,
                T=torch.ceil(n.to(torch.float64) / bn).expand(B, nq).clone())

