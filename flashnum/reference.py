"""Exact attention: the reference every error in flashnum is measured against.

    from flashnum.reference import reference
    ref = reference(q, k, v)                       # certified, correctly rounded fp64
    ref = reference(q, k, v, method="fp64")        # careful fp64, with an a-priori bound
    ref.out, ref.lse, ref.row_max, ref.err_bound, ref.masked

Options (defaults first):
  causal=False     True or "bottom_right": key j visible to query i iff j <= i + Nk - Nq;
                   "top_left": j <= i (torch's is_causal); flashnum.numerics.tiling.visible.
                   A row that sees no key gives out = 0, lse = row_max = -inf, err_bound = 0.
  scale=None       None is exactly 1/sqrt(d) (an exact ball in arb, not a rounded
                   float); a float is taken as the exact value it holds.
  method="certified"
     certified     arb ball arithmetic (python-flint). Every output is the float64
                   nearest to the exact attention of the given inputs: a value is
                   accepted only when its ball's relative radius is below 2^-60 and
                   both ends of the ball round to the same float64; otherwise the row
                   is recomputed at twice the precision (up to 16 * bits).
     fp64          float64 attention arranged for a small, stated error bound
                   (max-shifted softmax, blocked + pairwise sums); err_bound is the
                   a-priori bound of docs/reference.md evaluated per row. The row
                   max and lse of this method are the float64 values (no bound).
     mpmath        a plain row loop in mpmath at `bits` bits (an explicit context,
                   never the global mp): the independent cross-check of certified.
  plain64(q, k, v, scale=, causal=) is plain max-shifted float64 attention without a bound
  (the reproductions' "attention in FP64" and the search's quick objective).
  bits=256         the working precision (certified: the starting precision).
  cache=True       an in-memory LRU keyed by input_hash(...); with
                   reference_cache_dir(path) or the environment variable
                   FLASHNUM_CACHE set, results also persist as <path>/<hash>.pt.
  workers=None     processes for certified (default: every core when the job is big).

Inputs are taken as the exact values they hold (converted to float64, which is
exact for every float format); any leading batch/head dims, Nq != Nk allowed.
err_bound (..., Nq) bounds max_j |out_ij - exact_ij| for each row, where exact is
the real-number attention of the inputs with the exact scale.

Certified, how it runs (per block of query rows, see _arb_rows): the row max
D* = max_j q.k_j is located with float64 and a proven margin, then evaluated
exactly; X = scale * (Q K^T - D*) comes out of one arb_mat product (the shift is an
extra column, so the largest logit gives exp(0) = 1 exactly); P = exp(X) entry by
entry; [o | l] = P [V | 1] is a second arb_mat product. Entries whose logit lies
more than (prec + 30) ln 2 below the max are not exponentiated: they are replaced
by the ball [0 +- 2^-(prec + 30)], which contains them. Rows are spread over
processes; flint's precision (a process-wide setting) is set and restored around
every block.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import multiprocessing
import os
import warnings
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from flashnum.numerics.constants import gamma
from flashnum.numerics.tiling import causal_visible, check_causal

METHODS = ("certified", "fp64", "mpmath")
U = 2.0**-53  # unit roundoff of fp64
TINY = 5e-324  # smallest subnormal fp64
MIN_NORMAL = 2.0**-1022
REL_BITS = 61  # accept a ball when its relative radius is below 2^-60 (with a bit to spare)
ROWS_PER_TASK = 256
_LRU_SIZE = 32

_LRU: OrderedDict = OrderedDict()
_CACHE_DIR: str | None = None
_STATS = {"computed": 0, "memory_hits": 0, "disk_hits": 0}


@dataclass
class Reference:
    """Attention of the exact inputs, in float64 (leading dims as the inputs).

    out (..., Nq, dv); lse, row_max, err_bound (..., Nq): natural log-sum-exp and max
    of the scaled logits of each row, and a bound on max_j |out_ij - exact_ij|.
    """

    out: torch.Tensor
    lse: torch.Tensor
    row_max: torch.Tensor
    method: str
    err_bound: torch.Tensor
    bits: int
    info: dict = field(default_factory=dict)  # max precision used, uncertain rows, ...

    @property
    def masked(self) -> torch.Tensor:
        """Rows that see no key (their out is 0)."""
        return torch.isneginf(self.lse)


# -- inputs ------------------------------------------------------------------------


def _as_f64(name: str, x) -> tuple[torch.Tensor, str]:
    t = torch.as_tensor(x) if not isinstance(x, torch.Tensor) else x
    if t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"{name} has dtype {t.dtype}; valid: a real float or integer tensor")
    t64 = t.detach().to("cpu", torch.float64)
    if not t.is_floating_point() and not torch.equal(t64.to(t.dtype), t.detach().cpu()):
        raise ValueError(f"{name} holds integers beyond 2^53, not exact in float64")
    if not bool(torch.isfinite(t64).all()):
        bad = t64[~torch.isfinite(t64)].flatten()[0].item()
        raise ValueError(f"{name} contains {bad} (NaN/inf); valid: finite values only")
    return t64.contiguous(), str(t.dtype)


def _check(q, k, v, causal, scale, method, bits):
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; valid: {', '.join(METHODS)}")
    if isinstance(bits, bool) or not isinstance(bits, int) or bits < 64:
        raise ValueError(f"bits must be an integer >= 64, got {bits!r}")
    try:
        causal = check_causal(causal)
    except TypeError as e:
        raise ValueError(str(e)) from None
    (q, qd), (k, kd), (v, vd) = _as_f64("q", q), _as_f64("k", k), _as_f64("v", v)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.ndim < 2:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; valid: (..., N, d), ndim >= 2")
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(
            f"leading dims differ: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}; "
            "valid: q (..., Nq, d), k (..., Nk, d), v (..., Nk, dv) with the same ..."
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q has d={q.shape[-1]} but k has d={k.shape[-1]}; they must agree")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k has Nk={k.shape[-2]} but v has Nk={v.shape[-2]}; they must agree")
    if q.shape[-1] == 0:
        raise ValueError("q and k have d=0; valid: a head dim d >= 1")
    scale = check_scale(scale)
    return q, k, v, causal, scale, (qd, kd, vd)


def check_scale(scale) -> float | None:
    """The softmax scale as a float (None stays None: exactly 1/sqrt(d)); one-line error else."""
    if scale is None:
        return None
    try:
        scale = float(scale)
    except (TypeError, ValueError):
        raise ValueError(f"scale must be None or a finite real, got {scale!r}") from None
    if not math.isfinite(scale):
        raise ValueError(f"scale must be None or a finite real, got {scale!r}")
    return scale


def _visible_len(nq: int, nk: int, causal) -> np.ndarray:
    """Keys each query row sees: a prefix of length vis[i] (tiling.causal_visible)."""
    if not causal:
        return np.full(nq, nk, dtype=np.int64)
    vis = causal_visible(nq, nk, causal=causal).sum(-1).numpy().astype(np.int64)
    return vis


def input_hash(q, k, v, *, causal=False, scale=None, method="certified", bits=256) -> str:
    """sha256 of everything the reference depends on: values, shapes, dtypes, options."""
    q, k, v, causal, scale, dtypes = _check(q, k, v, causal, scale, method, bits)
    return _hash(q, k, v, dtypes, causal, scale, method, bits)


def _hash(q, k, v, dtypes, causal, scale, method, bits) -> str:
    h = hashlib.sha256()
    for t in (q, k, v):
        h.update(repr(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes())
    key = (dtypes, causal, None if scale is None else scale.hex(), method, bits, "v1")
    h.update(repr(key).encode())
    return h.hexdigest()


# -- cache ---------------------------------------------------------------------------


def reference_cache_dir(path: str | os.PathLike | None) -> str | None:
    """Persist references under `path` (None: only the env var FLASHNUM_CACHE, if set).
    Returns the previous setting."""
    global _CACHE_DIR
    old, _CACHE_DIR = _CACHE_DIR, (None if path is None else os.fspath(path))
    return old


def cache_info() -> dict:
    """How many references were computed, and served from memory or disk."""
    return dict(_STATS, size=len(_LRU))


def clear_cache() -> None:
    """Empty the in-memory cache (the disk cache is left alone)."""
    _LRU.clear()


def _cache_dir() -> str | None:
    return _CACHE_DIR or os.environ.get("FLASHNUM_CACHE") or None


def _copy(ref: Reference) -> Reference:
    return dataclasses.replace(
        ref,
        out=ref.out.clone(),
        lse=ref.lse.clone(),
        row_max=ref.row_max.clone(),
        err_bound=ref.err_bound.clone(),
        info=dict(ref.info),
    )


def _load(key: str) -> Reference | None:
    d = _cache_dir()
    if d is None:
        return None
    path = os.path.join(d, key + ".pt")
    if not os.path.exists(path):
        return None
    try:
        return Reference(**torch.load(path, weights_only=True))
    except Exception as e:  # truncated, garbage, another format: compute it again
        warnings.warn(f"reference cache entry {path} is unreadable "
                      f"({type(e).__name__}); recomputing it", stacklevel=3)
        return None


def _store(key: str, ref: Reference) -> None:
    d = _cache_dir()
    if d is None:
        return
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f".{key}.{os.getpid()}.tmp")
    torch.save(dataclasses.asdict(ref), tmp)
    os.replace(tmp, os.path.join(d, key + ".pt"))  # atomic: parallel sweeps may race


# -- the entry point -------------------------------------------------------------------


def reference(
    q, k, v, *, causal=False, scale=None, method="certified", bits=256, cache=True, workers=None
) -> Reference:
    """Attention of the exact inputs; see the module docstring for every option."""
    q, k, v, causal, scale, dtypes = _check(q, k, v, causal, scale, method, bits)
    key = _hash(q, k, v, dtypes, causal, scale, method, bits) if cache else None
    if key is not None:
        if key in _LRU:
            _LRU.move_to_end(key)
            _STATS["memory_hits"] += 1
            return _copy(_LRU[key])
        ref = _load(key)
        if ref is not None:
            _STATS["disk_hits"] += 1
            _remember(key, ref)
            return _copy(ref)
    lead = q.shape[:-2]
    nq, d, nk, dv = q.shape[-2], q.shape[-1], k.shape[-2], v.shape[-1]
    B = math.prod(lead)
    q3, k3, v3 = q.reshape(B, nq, d), k.reshape(B, nk, d), v.reshape(B, nk, dv)
    vis = _visible_len(nq, nk, causal)
    if method == "certified":
        out, lse, mx, err, info = _certified(q3, k3, v3, vis, scale, bits, workers)
    elif method == "fp64":
        out, lse, mx, err, info = _fp64(q3, k3, v3, vis, scale)
    else:
        out, lse, mx, err, info = _mpmath(q3, k3, v3, vis, scale, bits)
    _STATS["computed"] += 1
    ref = Reference(
        out=out.reshape(*lead, nq, dv),
        lse=lse.reshape(*lead, nq),
        row_max=mx.reshape(*lead, nq),
        method=method,
        err_bound=err.reshape(*lead, nq),
        bits=bits,
        info=info,
    )
    if key is not None:
        _remember(key, ref)
        _store(key, ref)
        return _copy(ref)
    return ref


def plain64(q, k, v, *, scale: float, causal=False) -> torch.Tensor:
    """softmax(scale Q K^T) V in plain float64, max-shifted (FA3's "attention in FP64").

    No bound and no cache: the quick reference of the reproductions and of the worst-case
    search's objective, whose error (~(Nk + d) 2^-53 max|V|) is far below any low-precision
    error they measure; final numbers come from `reference` (certified or fp64). Fully
    masked causal rows give 0, as every backend does.
    """
    q, k, v = (x.to(torch.float64) for x in (q, k, v))
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(~causal_visible(*s.shape[-2:], causal=check_causal(causal)),
                          -math.inf)
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
    return (torch.matmul(p, v) / p.sum(-1, keepdim=True)).nan_to_num(0.0)


def _remember(key: str, ref: Reference) -> None:
    _LRU[key] = ref
    _LRU.move_to_end(key)
    while len(_LRU) > _LRU_SIZE:
        _LRU.popitem(last=False)


def _empty(B, nq, dv):
    out = torch.zeros(B, nq, dv, dtype=torch.float64)
    minf = torch.full((B, nq), -math.inf, dtype=torch.float64)
    return out, minf.clone(), minf.clone(), torch.zeros(B, nq, dtype=torch.float64)


# -- rounding a ball or an mpf to float64 ----------------------------------------------


def _half_ulp(y: float) -> float:
    """An upper bound on |RN(x) - x| for any real x with RN(x) = y."""
    if math.isinf(y):
        return math.inf
    return math.ulp(y) * 0.5 if abs(y) >= MIN_NORMAL else TINY  # 2^-1075 is not a float


def _up(x: float) -> float:
    return math.nextafter(x, math.inf)


def _round_ball(x) -> tuple[float, bool, float]:
    """(RN(mid), certain, bound on |RN(exact) - exact| + radius) for an arb ball x.

    certain: both ends of the ball round to the same float64 (so that float64 is the
    correctly rounded exact value) and the relative radius is below 2^-60."""
    lo, hi = float(x.lower()), float(x.upper())  # float(arb) rounds the midpoint to nearest
    y = float(x)
    rad = float(x.rad())
    err = _up(_up(_half_ulp(y) + _up(rad)))
    certain = lo == hi and (lo == 0.0 or x.rel_accuracy_bits() >= REL_BITS)
    if certain and lo == 0.0:
        y = 0.0
    return y, certain, err


def _mpf_to_float(x) -> float:
    """Round an mpmath mpf to the nearest float64, ties to even, subnormals included
    (Python's int / int is correctly rounded; mpmath's own float() may round twice)."""
    sign, man, exp, _ = x._mpf_  # mpmath's raw (sign, |mantissa|, exponent, bitcount)
    man, exp = (-int(man) if sign else int(man)), int(exp)
    try:
        if exp >= 0:
            return float(man << exp)
        return man / (1 << -exp)
    except OverflowError:
        return math.copysign(math.inf, man)


# -- certified: arb ball arithmetic ------------------------------------------------------


@contextmanager
def _flint_prec(prec: int):
    """flint's precision is process-wide state: set it for one block, then restore it."""
    import flint

    old = flint.ctx.prec
    flint.ctx.prec = prec
    try:
        yield
    finally:
        flint.ctx.prec = old


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
    with _flint_prec(prec):
        mats = _W["mats"]
        if (b, prec) not in mats:
            mats.clear()  # one head at a time: a few MB of arb per head
            kt1 = np.vstack([k.T, np.ones((1, nk))])
            v1 = np.hstack([v, np.ones((nk, 1))])
            mats[(b, prec)] = (arb_mat(kt1.tolist()), arb_mat(v1.tolist()))
        KT1, V1 = mats[(b, prec)]
        if scale is None:
            e4 = int(round(math.log(d, 4)))
            sc = arb(2) ** (-e4) if 4**e4 == d else arb(d).rsqrt()  # exact when d = 4^k
            pow2 = 4**e4 == d
        else:
            sc = arb(scale)
            pow2 = scale != 0 and math.frexp(abs(scale))[0] == 0.5
        sgn = -1.0 if (scale is not None and scale < 0) else 1.0

        # -- locate the row max with float64, then evaluate it exactly --
        ql = qb[live]
        vl = vis[live]
        with np.errstate(over="ignore", invalid="ignore"):  # overflow: handled below
            dh = sgn * (ql @ k.T)
        inside = np.arange(nk)[None, :] < vl[:, None]
        dh = np.where(inside, dh, -np.inf)
        dmax = dh.max(axis=1)
        e = _dot_margin(ql, k, vl)
        dstar = []
        for t in range(live.size):
            if np.isfinite(dmax[t]) and np.isfinite(e[t]):
                cand = np.nonzero(dh[t] >= dmax[t] - 2 * e[t])[0]
            else:  # float64 overflowed: every visible key is a candidate
                cand = np.arange(int(vl[t]))
            dc = (arb_mat([ql[t].tolist()]) * arb_mat(k[cand].T.tolist())).entries()
            best = dc[0]
            for x in dc[1:]:
                best = best.max(x) if sgn > 0 else best.min(x)
            dstar.append(best)

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

        # -- divide, take logs, round every value to float64 and check the rounding --
        for t, i in enumerate(live.tolist()):
            base = t * (dv + 1)
            l = OL[base + dv]
            ok = True
            worst = 0.0
            for c in range(dv):
                y, good, bound = _round_ball(OL[base + c] / l)
                out[i, c] = y
                ok &= good
                worst = max(worst, bound)
            m = sc * dstar[t]
            mx[i], good_m, _ = _round_ball(m)
            lse[i], good_l, _ = _round_ball(m + l.log())
            err[i] = worst
            certain[i] = ok and good_m and good_l
    return b, rows, out, lse, mx, err, certain


def _certified(q, k, v, vis, scale, bits, workers):
    import flint  # noqa: F401  (fail here, clearly, if python-flint is missing)

    B, nq, dv = q.shape[0], q.shape[1], v.shape[2]
    nk = k.shape[1]
    out, lse, mx, err = _empty(B, nq, dv)
    out, lse, mx, err = out.numpy(), lse.numpy(), mx.numpy(), err.numpy()
    args = (q.numpy(), k.numpy(), v.numpy(), vis, scale)
    step = max(1, min(ROWS_PER_TASK, (1 << 20) // max(nk, 1)))
    tasks = [
        (b, np.arange(i, min(i + step, nq)), bits) for b in range(B) for i in range(0, nq, step)
    ]
    work = B * nq * max(nk, 1)
    if workers is None:
        workers = (os.cpu_count() or 1) if work >= (1 << 21) else 1
    if multiprocessing.current_process().daemon:
        workers = 1  # inside a Pool worker (a sweep's): daemons may not have children
    workers = max(1, min(int(workers), len(tasks)))
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
    info = {"max_prec": prec_used, "uncertain_rows": n_unc, "workers": workers}
    return (
        torch.from_numpy(out),
        torch.from_numpy(lse),
        torch.from_numpy(mx),
        torch.from_numpy(err),
        info,
    )


# -- fp64: careful float64 with an a-priori bound (docs/reference.md) ----------------------


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
    """a @ b with the inner sum cut into float64 dots of `chunk` terms (any order, FMA or
    not: gamma_chunk) whose results are summed pairwise."""
    r, n = a.shape
    n_ch = max(1, math.ceil(n / chunk))
    pad = n_ch * chunk - n
    ac = torch.nn.functional.pad(a, (0, pad)).reshape(r, n_ch, chunk)
    bc = torch.nn.functional.pad(b, (0, 0, 0, pad)).reshape(n_ch, chunk, b.shape[1])
    return _pairwise(torch.einsum("rkb,kbc->rkc", ac, bc))


FP64_CHUNK = 8  # terms per float64 dot before the pairwise tree (logits and P @ V)


def _fp64(q, k, v, vis, scale):
    """Max-shifted softmax in float64; Q K^T and P @ [V | 1] by _tree_matmul;
    err_bound from the analysis in docs/reference.md, evaluated per row."""
    B, nq, d = q.shape
    nk, dv = k.shape[1], v.shape[2]
    out, lse, mx, err = _empty(B, nq, dv)
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
            p = torch.exp(x)  # torch's float64 exp: within 1 ulp (SLEEF u10)
            ol = _tree_matmul(p, V1, ch)  # (r, dv + 1): [o | l]
            l = ol[:, dv]
            o = ol[:, :dv] / l[:, None]
            # -- the bound: relative perturbation of every p, then the sums and the division --
            a = (qb.abs() @ absKT) / (1 - _gamma(d))  # >= sum_t |q_t k_t|
            sigma = abs(sc) * g_s * a + abs(sc) * (d + 1) * TINY
            tau = (sigma + U * x.abs() / (1 - U) + 2 * U / (1 - 2 * U)) * (1 + 10 * U)
            tau = tau.masked_fill(~inside, 0.0)
            rr = torch.expm1(tau)
            rr = rr / (1 - rr)
            normal = p >= MIN_NORMAL  # relative model; the rest go to the absolute term eta
            w = torch.where(normal, p * rr, torch.zeros_like(p))
            wk = torch.where(normal, p * (rr + kappa), torch.zeros_like(p))
            lo = l * (1 - g_b)  # <= the exact sum of the computed p
            R = w.sum(dim=1) / lo
            Y = (wk @ absV) / lo[:, None] + R[:, None] * o.abs()
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
            lse[b, i0:i1] = torch.where(live, m + torch.log(l), -math.inf)
    return out, lse, mx, err, {"chunk": ch, "beta_dot": _tree_beta(d, ch), "beta_sum": beta}


# -- mpmath: the plain row loop ------------------------------------------------------------


def _mpmath(q, k, v, vis, scale, bits):
    """Row by row in mpmath at `bits` (fdot/fsum round once per dot, exp/log to ~1 ulp).
    err_bound: the fp64 analysis with u = 2^-bits (worst case over the row), plus the
    half-ulp of the final rounding to float64."""
    import mpmath

    ctx = mpmath.MPContext()
    ctx.prec = bits
    B, nq, d = q.shape
    nk, dv = k.shape[1], v.shape[2]
    out, lse, mx, err = _empty(B, nq, dv)
    sc = 1 / ctx.sqrt(d) if scale is None else ctx.mpf(scale)
    u = 2.0**-bits
    for b in range(B):
        K = [[ctx.mpf(x) for x in row] for row in k[b].tolist()]
        VT = [[ctx.mpf(x) for x in col] for col in v[b].T.tolist()]
        A = (q[b].abs() @ k[b].abs().T).numpy()
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
            row = [_mpf_to_float(ctx.fdot(p, vc if c == nk else vc[:c]) / l) for vc in VT]
            out[b, i] = torch.tensor(row, dtype=torch.float64)
            mx[b, i] = _mpf_to_float(m)
            lse[b, i] = _mpf_to_float(m + ctx.log(l))
            width = float(m - min(s))
            sigma = abs(float(sc)) * _g(d + 3, u) * float(A[i, :c].max()) * 1.01
            tau = (sigma + 2 * u * width + 3 * u) * 1.01
            rr = math.expm1(tau) / (1 - math.expm1(tau))
            kappa = 3 * _g(c + 1, u) + 2 * u
            e_mp = (2 * rr + kappa) * Mv * 1.01
            half = max(map(_half_ulp, row), default=0.0)
            err[b, i] = _up(half + e_mp)
    return out, lse, mx, err, {}


def _g(n: float, u: float) -> float:
    return gamma(n, u)
