"""Keys repeated exactly or in near pairs: ties of the row max (ties), one logit everywhere
(flat), one repeated key under a peak (plateau), antithetic pairs (cancellation), and the
worst-case search's family whose corners these are (structured).

Identical key rows give bitwise identical logits in every format and every summation
order that is the same for all keys, so what these stress survives the input rounding.
"""

from __future__ import annotations

import math

import torch

from flashnum.inputs.draws import Shape, _check, _qkv, _randn, _round


def ties(g, sh: Shape, *, n_ties: int = 2, layout: str = "random", logit_std: float = 1.0,
         v_mean: float = -1.0, v_std: float = 0.5, grid: str = "common"):
    """Every row's max logit is attained by >= n_ties keys exactly: P has several exact 1s.

    Qiu & Yao 2025 (arXiv 2510.04212): repeated row maxima make several P entries
    exactly 1, the P @ V sums sit on round-to-nearest-even ties and, with V mostly
    negative (here V ~ N(v_mean, v_std^2), P(V < 0) = 98% at the defaults), a
    same-sign remainder breaks every tie the same way: a biased error in O.

    Construction: only Nk // n_ties distinct key vectors; each is repeated n_ties times
    (the Nk mod n_ties spare slots repeat the first few again), so *every* logit, the
    max included, occurs >= n_ties times in each row. Identical key rows give bitwise
    identical dots in any format, any rounding and any accumulation order that is the
    same for all keys, so the ties survive every input grid. layout "random" scatters
    the copies over key blocks (seeded permutation), "adjacent" puts them side by side.
    """
    _check(isinstance(n_ties, int) and n_ties >= 2, f"n_ties must be an int >= 2, got {n_ties}")
    _check(sh.nk >= n_ties, f"ties needs Nk >= n_ties, got Nk={sh.nk}, n_ties={n_ties}")
    layouts = ("random", "adjacent")
    _check(layout in layouts, f"unknown layout {layout!r}; valid: {', '.join(layouts)}")
    _check(logit_std >= 0 and v_std >= 0, "logit_std and v_std must be >= 0")
    n_distinct = sh.nk // n_ties
    s = math.sqrt(logit_std)
    q = _randn(g, sh.batch, sh.heads, sh.nq, sh.d) * s
    kd = _randn(g, sh.batch, sh.heads, n_distinct, sh.d) * s
    src = torch.arange(sh.nk) % n_distinct  # slot -> distinct key; counts >= n_ties
    src = torch.sort(src, stable=True).values  # adjacent copies
    if layout == "random":
        src = src[torch.randperm(sh.nk, generator=g)]
    k = kd[..., src, :]
    v = v_mean + v_std * _randn(g, sh.batch, sh.heads, sh.nk, sh.d)
    return dict(q=_round(q, grid), k=_round(k, grid), v=_round(v, grid))


def flat(g, sh: Shape, *, level: float = 2.0, grid: str = "common"):
    """All logits equal (in every row and column): P is all ones, l counts the keys.

    Every key is the same one-hot vector e_0 and every query has q[0] = level / scale,
    so each logit is the same product of the same two numbers: bitwise equal in any
    format and any summation order (the other products are exact zeros). The realised
    level is scale * grid(level / scale), exactly `level` when sqrt(d) is a power of
    two. exp(s - m) = 1 exactly, so l = Nk is exact in any format that holds Nk.
    """
    q, _, v = _qkv(g, sh)
    q[..., 0] = level / sh.scale
    k = torch.zeros(sh.batch, sh.heads, sh.nk, sh.d, dtype=torch.float64)
    k[..., 0] = 1.0
    q = _round(q, grid)
    return dict(q=q, k=k, v=_round(v, grid),
                params=dict(level=float(q.flatten()[0]) * sh.scale if q.numel() else level))


def cancellation(g, sh: Shape, *, delta: float = 0.01, layout: str = "random",
                 v_scale: float = 1.0, grid: str = "none"):
    """Antithetic keys: outputs sit near zero, so the relative error blows up.

    Keys come in pairs (k, k + delta * N(0, 1)) with values (v, -v): each pair adds
    (P_a - P_b) v = O(delta) to the output, while each term P v is O(1). With delta = 0
    the exact output is 0. layout "random" scatters the pair members over key blocks
    (so no single block's partial o cancels), "adjacent" keeps them side by side.
    With an odd Nk the unpaired last key has v = 0. Note that rounding K to a grid
    coarser than delta (bf16 ulp at 1 is 2^-7) may merge pairs into exact copies.
    """
    layouts = ("random", "adjacent")
    _check(layout in layouts, f"unknown layout {layout!r}; valid: {', '.join(layouts)}")
    _check(delta >= 0, f"delta must be >= 0, got {delta}")
    n_pairs = sh.nk // 2
    q = _randn(g, sh.batch, sh.heads, sh.nq, sh.d)
    ka = _randn(g, sh.batch, sh.heads, n_pairs, sh.d)
    kb = ka + delta * _randn(g, sh.batch, sh.heads, n_pairs, sh.d)
    va = v_scale * _randn(g, sh.batch, sh.heads, n_pairs, sh.d)
    k = torch.zeros(sh.batch, sh.heads, sh.nk, sh.d, dtype=torch.float64)
    v = torch.zeros_like(k)
    # interleave a, b (adjacent), then optionally permute the slots
    k[..., 0 : 2 * n_pairs : 2, :], k[..., 1 : 2 * n_pairs : 2, :] = ka, kb
    v[..., 0 : 2 * n_pairs : 2, :], v[..., 1 : 2 * n_pairs : 2, :] = va, -va
    if sh.nk % 2:
        k[..., -1, :] = _randn(g, sh.batch, sh.heads, sh.d)
    if layout == "random":
        perm = torch.randperm(sh.nk, generator=g)
        k, v = k[..., perm, :], v[..., perm, :]
    # rounding is odd-symmetric (nearest-even), so -v rounds to -(round v): pairs survive
    return dict(q=_round(q, grid), k=_round(k, grid), v=_round(v, grid))


def plateau(g, sh: Shape, *, gap: float = 3.0, spread: float = 1.0, n_peak: int = 1,
            peak_block: int = 0, v_mean: float = 4.0, v_std: float = 0.05,
            grid: str = "common"):
    """A peak key in the first block and every other key *identical*: the FA2 P-cast bias.

    The structure the worst-case search converges to for bf16 `fa2` (docs/distributions.md).
    The non-peak keys are one repeated vector, so in each row they share one logit,
    gap_i = gap + spread * z_i below the peak (z_i ~ N(0, 1) per query). With the peak
    in key block `peak_block` = 0, forward order meets the row max first, so every
    later block computes P = exp(-gap_i) against the final max: one fp32 number that
    the cast to the input format (FA2 casts P before P @ V) rounds the same way for
    all ~Nk keys, while l sums the fp32 P (Triton's tutorial: l and P @ V see
    different P). With V of one sign the errors add coherently: out is off by up to
    2^-8 relative in bf16 (P just above a power of two), not averaged away; the
    spread of gap_i over rows samples every position of that rounding sawtooth.
    V ~ N(v_mean, v_std^2) with v_mean = 4 (the largest |V| of a gaussian draw of
    1024 x 64) puts out just above 4, where bf16's ulp (2^-5) is largest relative
    to the value, so the output rounding adds up to half an ulp. v_std > 0 matters:
    with a constant V the exact output is a bf16 number and the rounding snaps back.
    With the peak in the last block instead, every earlier P is exactly 1 (no error).
    """
    _check(isinstance(n_peak, int) and 1 <= n_peak <= min(sh.block_n, sh.nk - 1),
           f"n_peak must be an int in [1, {min(sh.block_n, sh.nk - 1)}], got {n_peak!r}")
    _check(isinstance(peak_block, int) and -sh.n_kb <= peak_block < sh.n_kb,
           f"peak_block must be an int in [{-sh.n_kb}, {sh.n_kb}), got {peak_block!r}")
    _check(sh.d >= 2, f"plateau needs head_dim >= 2, got {sh.d}")
    _check(spread >= 0 and v_std >= 0, "spread and v_std must be >= 0")
    # dim 0: the peak's bias (q0 = 1, k0 = gap / scale); dim 1: its per-row spread
    q = torch.zeros(sh.batch, sh.heads, sh.nq, sh.d, dtype=torch.float64)
    k = torch.zeros(sh.batch, sh.heads, sh.nk, sh.d, dtype=torch.float64)
    q[..., 0] = 1.0
    q[..., 1] = spread * _randn(g, sh.batch, sh.heads, sh.nq)
    start = (peak_block % sh.n_kb) * sh.block_n
    peak = torch.arange(start, min(start + n_peak, sh.nk))
    k[..., peak, 0] = gap / sh.scale
    k[..., peak, 1] = 1.0 / sh.scale
    v = v_mean + v_std * _randn(g, sh.batch, sh.heads, sh.nk, sh.d)
    return dict(q=_round(q, grid), k=_round(k, grid), v=_round(v, grid),
                params=dict(peaks=peak.tolist()))


def structured(g, sh: Shape, *, logit_std: float = 1.0, distinct: float = 1.0,
               peak_gap: float = 0.0, peak_frac: float = 0.0, peak_pos: float = 0.0,
               row_spread: float = 0.0, ramp: float = 0.0, v_mean: float = 0.0,
               v_std: float = 1.0, v_clip: float = 0.0, grid: str = "common"):
    """The worst-case search's family: gaussian at the defaults, the catalogue at its corners.

    Keys: a pool of max(1, round(distinct * Nk)) random vectors (entries N(0, logit_std)
    in dims 3.., so the random logit has std ~logit_std); key slot j holds pool vector
    perm(j) mod pool size, so distinct < 1 repeats keys exactly (ties, a plateau).
    Peaks: n_peak = max(1, round(peak_frac * Nk)) contiguous keys from slot
    floor(peak_pos * (Nk - n_peak)) get logit bias peak_gap + row_spread * z_i (z_i ~
    N(0, 1) per query: the gap differs per row); peak_frac = 0 means no peak. Ramp:
    key block b gets bias ramp * b (> 0: ramp/late max; < 0: early max). Values:
    V ~ N(v_mean, v_std^2), clamped to [-v_clip, v_clip] when v_clip > 0.
    Bias channels (exact products, as in flashnum.inputs.logit_structured): dim 0
    carries the peak (q0 = peak_gap / scale, k0 = 1 on peaks), dim 1 the ramp (q1 =
    ramp / scale, k1 = b, exact for b < 256), dim 2 the row spread (q2 = row_spread
    z_i / scale, k2 = 1 on peaks). Needs head_dim >= 4.
    """
    _check(sh.d >= 4, f"structured needs head_dim >= 4, got {sh.d}")
    _check(logit_std >= 0 and v_std >= 0 and v_clip >= 0 and row_spread >= 0,
           "logit_std, row_spread, v_std and v_clip must be >= 0")
    _check(0 < distinct <= 1 and 0 <= peak_frac < 1 and 0 <= peak_pos <= 1,
           f"need 0 < distinct <= 1, 0 <= peak_frac < 1, 0 <= peak_pos <= 1; got "
           f"{distinct}, {peak_frac}, {peak_pos}")
    r = math.sqrt(logit_std)
    q = _randn(g, sh.batch, sh.heads, sh.nq, sh.d) * r
    n_pool = max(1, round(distinct * sh.nk))
    pool = _randn(g, sh.batch, sh.heads, n_pool, sh.d) * r
    k = pool[..., torch.randperm(sh.nk, generator=g) % n_pool, :].clone()
    z = _randn(g, sh.batch, sh.heads, sh.nq)
    v = v_mean + v_std * _randn(g, sh.batch, sh.heads, sh.nk, sh.d)
    if v_clip > 0:
        v = v.clamp(-v_clip, v_clip)
    peak = torch.zeros(sh.nk, dtype=torch.float64)
    n_peak = 0
    if peak_frac > 0:
        n_peak = max(1, round(peak_frac * sh.nk))
        start = math.floor(peak_pos * (sh.nk - n_peak))
        peak[start : start + n_peak] = 1.0
    q[..., 0] = peak_gap / sh.scale
    k[..., 0] = peak
    q[..., 1] = ramp / sh.scale
    k[..., 1] = sh.block_of_key().to(torch.float64)
    q[..., 2] = row_spread * z / sh.scale
    k[..., 2] = peak
    return dict(q=_round(q, grid), k=_round(k, grid), v=_round(v, grid),
                params=dict(n_pool=n_pool, n_peak=n_peak))
