"""method="certified": attention in arb ball arithmetic (python-flint), every output the
float64 nearest the exact value (the package docstring says how it runs)."""

from __future__ import annotations

import math
import multiprocessing
import os
import warnings

import numpy as np
import torch

from flashnum.reference.balls import TINY, U, flint_prec, round_ball
from flashnum.reference.fast import fast_head
from flashnum.reference.result import empty

ROWS_PER_TASK = 256
# the fast path (~100 bits) stands in for arb from 128 bits; at 64 bits arb runs (and
# raises its precision where 64 bits do not settle a rounding)
FAST_MIN_BITS = 128


_W: dict = {}  # per-process worker state: the inputs and the arb matrices built from them


def _init_worker(q, k, v, vis, scale):
    _W.clear()
    _W.update(q=q, k=k, v=v, vis=vis, scale=scale, mats={})


def _dot_margin(qb: np.ndarray, k: np.ndarray, vis: np.ndarray) -> np.ndarray:
    """Per row, a bound E_i >= |fl(q_i.k_j) - q_i.k_j| over visible j: any float64 dot of
    length d (any order, with or without FMA) errs by <= gamma_d sum|q||k| plus d
    subnormal half-spacings; gamma_d is inflated for the rounding of the bound itself."""
    d = qb.shape[1]
    with np.errstate(over="ignore"):  # inf margin: every key becomes a candidate
        a = np.abs(qb) @ np.abs(k).T
    nk = k.shape[0]
    a = np.where(np.arange(nk)[None, :] < vis[:, None], a, 0.0)
    g = 2.0 * (d + 2) * U / (1 - (d + 2) * U)
    return g * a.max(axis=1, initial=0.0) + (d + 1) * TINY * 2


def _scale_ball(d: int, scale):
    """(sc, pow2, sgn): the softmax scale as an exact arb ball (None: 1/sqrt(d), exact when
    d = 4^k), whether it is a power of two, and its sign."""
    from flint import arb

    if scale is None:
        e4 = int(round(math.log(d, 4)))
        sc = arb(2) ** (-e4) if 4**e4 == d else arb(d).rsqrt()  # exact when d = 4^k
        pow2 = 4**e4 == d
    else:
        sc = arb(scale)
        pow2 = scale != 0 and math.frexp(abs(scale))[0] == 0.5
    return sc, pow2, (-1.0 if (scale is not None and scale < 0) else 1.0)


def _row_max(ql, vl, k, sgn):
    """Locate each row's max with float64 and a proven margin, then evaluate it exactly:
    (dh, dmax, e, inside, dstar), dstar the exact sgn-max of q_i.k_j as arb balls."""
    from flint import arb_mat

    nk = k.shape[0]
    with np.errstate(over="ignore", invalid="ignore"):  # overflow: handled below
        dh = sgn * (ql @ k.T)
    inside = np.arange(nk)[None, :] < vl[:, None]
    dh = np.where(inside, dh, -np.inf)
    dmax = dh.max(axis=1)
    e = _dot_margin(ql, k, vl)
    dstar = []
    for t in range(ql.shape[0]):
        if np.isfinite(dmax[t]) and np.isfinite(e[t]):
            cand = np.nonzero(dh[t] >= dmax[t] - 2 * e[t])[0]
        else:  # float64 overflowed: every visible key is a candidate
            cand = np.arange(int(vl[t]))
        dc = (arb_mat([ql[t].tolist()]) * arb_mat(k[cand].T.tolist())).entries()
        best = dc[0]
        for x in dc[1:]:
            best = best.max(x) if sgn > 0 else best.min(x)
        dstar.append(best)
    return dh, dmax, e, inside, dstar


def _round_rows(OL, live, dstar, sc, dv, out, lse, mx, err, certain) -> None:
    """Divide o by l, take logs, round every value to float64 and check the rounding, into
    the live rows of out, lse, mx, err and certain."""
    for t, i in enumerate(live.tolist()):
        base = t * (dv + 1)
        l = OL[base + dv]
        ok = True
        worst = 0.0
        for c in range(dv):
            y, good, bound = round_ball(OL[base + c] / l)
            out[i, c] = y
            ok &= good
            worst = max(worst, bound)
        m = sc * dstar[t]
        mx[i], good_m, _ = round_ball(m)
        lse[i], good_l, _ = round_ball(m + l.log())
        err[i] = worst
        certain[i] = ok and good_m and good_l


def _arb_rows(task):
    """Certified attention of some query rows of head b at precision prec.

    Returns (b, rows, out (r, dv), lse, row_max, err (r,), certain (r,) bool)."""
    from flint import arb, arb_mat

    b, rows, prec = task
    q, k, v, vis_all, scale = _W["q"][b], _W["k"][b], _W["v"][b], _W["vis"], _W["scale"]
    qb, vis = q[rows], vis_all[rows]
    r, d = qb.shape
    nk, dv = v.shape
    out = np.zeros((r, dv))
    lse = np.full(r, -math.inf)
    mx = np.full(r, -math.inf)
    err = np.zeros(r)
    certain = np.ones(r, dtype=bool)
    live = np.nonzero(vis > 0)[0]
    if live.size == 0:
        return b, rows, out, lse, mx, err, certain
    with flint_prec(prec):
        mats = _W["mats"]
        if (b, prec) not in mats:
            mats.clear()  # one head at a time: a few MB of arb per head
            kt1 = np.vstack([k.T, np.ones((1, nk))])
            v1 = np.hstack([v, np.ones((nk, 1))])
            mats[(b, prec)] = (arb_mat(kt1.tolist()), arb_mat(v1.tolist()))
        KT1, V1 = mats[(b, prec)]
        sc, pow2, sgn = _scale_ball(d, scale)

        ql = qb[live]
        vl = vis[live]
        dh, dmax, e, inside, dstar = _row_max(ql, vl, k, sgn)

        # -- entries too small to matter: exp(X) <= 2^-(prec+30), proven from float64 --
        drop_bits = prec + 30
        thresh = drop_bits * math.log(2)
        # gap <= sgn*(D* - D_ij): D* >= dmax - e, D_ij <= dh + e, less the rounding of gap
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, NaN: never skipped
            gap = (dmax[:, None] - dh) - 2 * e[:, None]
            gap = gap - 4 * U * (np.abs(dmax)[:, None] + np.abs(dh) + 2 * e[:, None])
            s_abs = abs(scale if scale is not None else 1 / math.sqrt(d))
            skip = inside & np.isfinite(gap) & (s_abs * gap * (1 - 1e-12) > thresh)
        skip_rows = skip.any(axis=1)
        tiny = arb(0, arb(2) ** (-drop_bits))

        # -- X = scale * (Q K^T - D*), one product: the shift is an extra column --
        flat = []
        for t in range(live.size):
            flat.extend(ql[t].tolist())
            flat.append(-dstar[t])
        Qa = arb_mat(live.size, d + 1, flat)
        # a power-of-two scale multiplies the small [Q | -D*] (exactly, in arb), not X
        X = (Qa * sc) * KT1 if pow2 else (Qa * KT1) * sc
        ent = X.entries()
        exp = arb.exp
        zero = arb(0)
        P = []
        for t in range(live.size):
            c = int(vl[t])
            row = ent[t * nk : t * nk + c]
            if skip_rows[t]:
                drop = skip[t, :c].tolist()
                P.extend([tiny if s else exp(x) for x, s in zip(row, drop, strict=True)])
            else:
                P.extend(map(exp, row))
            if c < nk:
                P.extend([zero] * (nk - c))
        del ent, X
        OL = (arb_mat(live.size, nk, P) * V1).entries()  # [o | l] = P [V | 1]
        del P

        _round_rows(OL, live, dstar, sc, dv, out, lse, mx, err, certain)
    return b, rows, out, lse, mx, err, certain


def certified(q, k, v, vis, scale, bits, workers, fast=True):
    """Every row through the fast path (fast.py) first, when bits >= FAST_MIN_BITS; the
    rows it cannot settle (and every row with fast=False) through _arb_rows, whose
    precision doubles until each value is certain (up to 16 * bits)."""
    import flint  # noqa: F401  (fail here, clearly, if python-flint is missing)

    B, nq, dv = q.shape[0], q.shape[1], v.shape[2]
    nk = k.shape[1]
    out, lse, mx, err = empty(B, nq, dv)
    out, lse, mx, err = out.numpy(), lse.numpy(), mx.numpy(), err.numpy()
    args = (q.numpy(), k.numpy(), v.numpy(), vis, scale)
    step = max(1, min(ROWS_PER_TASK, (1 << 20) // max(nk, 1)))
    todo = []  # (head, rows) left to the arb path
    for b in range(B):
        rows = np.arange(nq)
        if fast and bits >= FAST_MIN_BITS:
            o, ls, m, e, ok = fast_head(args[0][b], args[1][b], args[2][b], vis, scale)
            out[b, ok], lse[b, ok], mx[b, ok], err[b, ok] = o[ok], ls[ok], m[ok], e[ok]
            rows = rows[~ok]
        todo.append((b, rows))
    n_fast = B * nq - sum(len(rs) for _, rs in todo)
    tasks = [(b, rs[i : i + step], bits) for b, rs in todo for i in range(0, len(rs), step)]
    work = sum(len(rs) for _, rs in todo) * max(nk, 1)
    if workers is None:
        workers = (os.cpu_count() or 1) if work >= (1 << 21) else 1
    if multiprocessing.current_process().daemon:
        workers = 1  # inside a Pool worker (a sweep's): daemons may not have children
    workers = max(1, min(int(workers), max(len(tasks), 1)))
    max_prec = 16 * bits
    prec_used = bits
    pool = None
    try:
        if workers > 1:
            methods = multiprocessing.get_all_start_methods()
            mp_ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
            pool = mp_ctx.Pool(workers, initializer=_init_worker, initargs=args)
            run = lambda ts: pool.imap_unordered(_arb_rows, ts)
        else:
            _init_worker(*args)
            run = lambda ts: map(_arb_rows, ts)
        uncertain = []
        while tasks:
            uncertain = []
            for b, rows, o, ls, m, e, ok in run(tasks):
                out[b, rows], lse[b, rows], mx[b, rows], err[b, rows] = o, ls, m, e
                if not ok.all():
                    uncertain.append((b, rows[~ok]))
            prec = tasks[0][2] * 2
            if not uncertain or prec > max_prec:
                break
            prec_used = prec
            tasks = [
                (b, rs[i : i + step], prec) for b, rs in uncertain for i in range(0, len(rs), step)
            ]
    finally:
        if pool is not None:
            pool.close()
            pool.join()
        _W.clear()
    n_unc = int(sum(len(rs) for _, rs in uncertain))
    if n_unc:
        warnings.warn(
            f"{n_unc} row(s) not certified correctly rounded at {max_prec} bits (an exact tie "
            "or an exact zero under cancellation?); their err_bound still holds",
            stacklevel=3,
        )
    info = {"max_prec": prec_used, "uncertain_rows": n_unc, "workers": workers,
            "fast_rows": n_fast}
    return (
        torch.from_numpy(out),
        torch.from_numpy(lse),
        torch.from_numpy(mx),
        torch.from_numpy(err),
        info,
    )


# -- fp64: careful float64 with an a-priori bound (docs/reference.md) ----------------------
