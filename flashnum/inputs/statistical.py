"""Random draws whose statistics stress the softmax: the scale of the logits, heavy tails,
outliers (entries and channels), correlated keys, and fully masked rows.

Masking: logits of finite Q, K are finite; -inf logits arise only from the causal
mask. `masked` makes them with Nq > Nk (bottom-right causal alignment, see
flashnum.numerics.tiling): the first Nq - Nk query rows see no key at all.
"""

from __future__ import annotations

import math

import torch
from scipy.special import stdtrit

from flashnum.inputs.draws import Shape, _check, _qkv, _rand, _randn, _round
from flashnum.numerics.accumulate import dot


def gaussian(g, sh: Shape, *, sigma: float = 1.0, grid: str = "none"):
    """Every entry of Q, K, V ~ N(0, sigma^2): the baseline every study compares against.

    With sigma = 1 and scale 1/sqrt(d) the logits are ~N(0, 1): a mild softmax.
    """
    _check(sigma > 0, f"sigma must be > 0, got {sigma}")
    q, k, v = _qkv(g, sh, sigma, sigma, sigma)
    return dict(q=_round(q, grid), k=_round(k, grid), v=_round(v, grid))


def fa3_outliers(g, sh: Shape, *, p: float = 0.001, outlier_std: float = 10.0,
                 grid: str = "none"):
    """Each entry N(0, 1) + N(0, outlier_std^2) * Bernoulli(p), independently for Q, K, V.

    FlashAttention-3 (Shah et al. 2024, s4.3, Table 3): N(0,1) + N(0,100) * Bernoulli(0.001),
    i.e. 0.1% of entries get an extra N(0, 10^2); their accuracy table uses it.
    """
    _check(0 <= p <= 1, f"p must be in [0, 1], got {p}")
    _check(outlier_std >= 0, f"outlier_std must be >= 0, got {outlier_std}")
    out = {}
    for name, n in (("q", sh.nq), ("k", sh.nk), ("v", sh.nk)):
        shape = (sh.batch, sh.heads, n, sh.d)
        base = _randn(g, *shape)
        extra = _randn(g, *shape) * outlier_std
        hit = _rand(g, *shape) < p
        out[name] = _round(base + torch.where(hit, extra, torch.zeros_like(extra)), grid)
    return out


def scaled(g, sh: Shape, *, temperature: float = 8.0, grid: str = "none"):
    """Gaussian Q, K scaled so that the logits are ~N(0, temperature^2); V ~ N(0, 1).

    A low softmax temperature (sharp attention): a wide logit range in every row,
    so the exponentials span many binades and the running max moves by large steps.
    """
    _check(temperature > 0, f"temperature must be > 0, got {temperature}")
    s = math.sqrt(temperature)
    q, k, v = _qkv(g, sh, s, s, 1.0)
    return dict(q=_round(q, grid), k=_round(k, grid), v=_round(v, grid))


def heavy_tail(g, sh: Shape, *, df: float = 3.0, sigma: float = 1.0, clip: float = 0.0,
               grid: str = "none"):
    """Every entry of Q, K, V Student-t with `df` degrees of freedom (df = 1: Cauchy).

    Heavy tails give rare huge logits and values (df <= 2: infinite variance).
    Drawn by the inverse CDF (scipy.special.stdtrit) of seeded uniforms, so the draw
    is as reproducible as the uniforms. clip > 0 clamps entries to [-clip, clip]
    (fp16 inputs turn entries beyond 65504 into inf).
    """
    _check(df > 0 and sigma > 0 and clip >= 0, f"need df > 0, sigma > 0, clip >= 0; got "
           f"df={df}, sigma={sigma}, clip={clip}")
    out = {}
    for name, n in (("q", sh.nq), ("k", sh.nk), ("v", sh.nk)):
        u = _rand(g, sh.batch, sh.heads, n, sh.d)
        u = (u * (2.0**53 - 1) + 0.5) / 2.0**53  # strictly inside (0, 1)
        x = torch.from_numpy(stdtrit(df, u.numpy())) * sigma
        if clip > 0:
            x = x.clamp(-clip, clip)
        out[name] = _round(x, grid)
    return out


def outlier_channels(g, sh: Shape, *, n_channels: int = 4, magnitude: float = 4.0,
                     grid: str = "none"):
    """A few head dims of Q and K are `magnitude` times larger, the rest N(0, 1).

    As in LLM activations (Dettmers et al. 2022, LLM.int8(); Sun et al. 2024, massive
    activations): the same few channels dominate Q and K, so the logits are driven by
    a handful of products of large numbers (std ~ magnitude^2 sqrt(n_channels)/sqrt(d)).
    The channels are a seeded choice, shared by Q and K, listed in params.
    """
    _check(isinstance(n_channels, int) and 0 <= n_channels <= sh.d,
           f"n_channels must be an int in [0, {sh.d}], got {n_channels!r}")
    q, k, v = _qkv(g, sh)
    ch = torch.randperm(sh.d, generator=g)[:n_channels].sort().values
    q[..., ch] *= magnitude
    k[..., ch] *= magnitude
    return dict(q=_round(q, grid), k=_round(k, grid), v=_round(v, grid),
                params=dict(channels=ch.tolist()))


def low_rank(g, sh: Shape, *, rank: int = 2, noise: float = 0.01, grid: str = "none"):
    """Correlated keys: K = A B / sqrt(rank) + noise * N(0, 1), A (Nk x rank), B (rank x d).

    The keys span ~rank directions, so each row's logits are a smooth function of a
    few coordinates: many near-equal logits (near-ties) and long runs of similar P.
    """
    _check(isinstance(rank, int) and 1 <= rank <= sh.d, f"rank must be in [1, {sh.d}]")
    _check(noise >= 0, f"noise must be >= 0, got {noise}")
    q = _randn(g, sh.batch, sh.heads, sh.nq, sh.d)
    a = _randn(g, sh.batch, sh.heads, sh.nk, rank)
    b = _randn(g, sh.batch, sh.heads, rank, sh.d)
    k = dot(a, b, "fp64") / math.sqrt(rank) + noise * _randn(g, sh.batch, sh.heads, sh.nk, sh.d)
    v = _randn(g, sh.batch, sh.heads, sh.nk, sh.d)
    return dict(q=_round(q, grid), k=_round(k, grid), v=_round(v, grid))


def masked(g, sh: Shape, *, n_masked: int = 0, sigma: float = 1.0, grid: str = "none"):
    """Causal attention with fully masked rows (bottom-right aligned, Nq > Nk).

    Query i sees key j iff j <= i + (Nk - Nq) (flashnum.numerics.tiling), so the first
    Nq - Nk rows see no key: their logits are all -inf and every backend must
    return 0 and flag them. Finite Q and K cannot give -inf logits; the -inf here
    come from the causal mask only. Nk is seq_len_k when given (it must be < Nq),
    else Nq - n_masked (n_masked = 0 means Nq // 4, at least 1).
    """
    if sh.nk_given:
        _check(sh.nk < sh.nq, f"masked needs seq_len_k < seq_len_q, got {sh.nk} >= {sh.nq}")
        _check(n_masked in (0, sh.nq - sh.nk),
               f"n_masked={n_masked} disagrees with seq_len_q - seq_len_k = {sh.nq - sh.nk}")
        nk = sh.nk
    else:
        n = n_masked or max(1, sh.nq // 4)
        _check(isinstance(n, int) and 1 <= n < sh.nq,
               f"n_masked must be an int in [1, {sh.nq}), got {n_masked!r}")
        nk = sh.nq - n
    q = _randn(g, sh.batch, sh.heads, sh.nq, sh.d) * sigma
    k = _randn(g, sh.batch, sh.heads, nk, sh.d) * sigma
    v = _randn(g, sh.batch, sh.heads, nk, sh.d) * sigma
    return dict(q=_round(q, grid), k=_round(k, grid), v=_round(v, grid), causal=True,
                params=dict(n_masked=sh.nq - nk))
