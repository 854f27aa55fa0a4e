"""The logit-structured distributions: where each row's max logit sits, and how far the
logits spread, set exactly (late_max, early_max, ramp, sink, near_overflow, underflow).

They are built with a *bias channel*: head dims 0 and 1 carry a magnitude c
in every query (q0 = c / scale, q1 = 128 q0) and a per-key weight w_j in the keys
(k0 = w_j mod 128, k1 = w_j div 128 for integer weights), so the scaled logit of
every query with key j gains the key bias c * w_j, on top of a random part from
the other d - 2 dims (entries N(0, logit_std), so the random logit has std
~logit_std). Both products are exact (8-bit by 7-bit numbers), so keys of equal
weight get bitwise equal biases and integer weights give biases exactly
proportional to w. Each such generator measures the realised logits (fixed-order
fp64 dot of the rounded tensors) and raises c to the least value that gives its
property with the stated margin; the realised c is what `params` reports. The
margins (>= 0.25 in logit units) dwarf the logit's own rounding in fp32 (about
d * 2^-24 * sum|q k|) and in bf16 (half an ulp: 0.125 for |s| in [32, 64)), so
the property survives every policy's logit rounding while |s| < 64.
"""

from __future__ import annotations

import math

import torch

from flashnum.inputs.draws import Shape, _check, _qkv, _rand, _round, dot_logits

# -- bias channel: logits = c * w_j + random part --------------------------------------


def _biased(g, sh: Shape, logit_std: float):
    """Q, K with channels 0, 1 reserved for a key bias (set by _set_bias), V ~ N(0, 1)."""
    _check(sh.d >= 3, f"head_dim must be >= 3 for a bias channel, got {sh.d}")
    _check(logit_std >= 0, f"logit_std must be >= 0, got {logit_std}")
    # entries N(0, sqrt(logit_std)) in d-2 dims: scale * q.k has std logit_std * sqrt((d-2)/d)
    q, k, v = _qkv(g, sh, math.sqrt(logit_std), math.sqrt(logit_std), 1.0)
    q[..., :2] = 0.0
    k[..., :2] = 0.0
    return q, k, v


def _set_bias(q, k, w: torch.Tensor, c: float, sh: Shape, grid):
    """Give key j the logit bias c * w_j (c a magnitude, w_j a per-key weight); round.

    The magnitude goes into the queries, q0 = c / scale and q1 = 128 q0 (the same for
    every row), the weight into the keys: integer weights w < 2^14 are split exactly
    into k0 = w mod 128 and k1 = w div 128 (7 bits each: exact in every grid), any
    other weight sits in k0. The products q0 k0, q1 k1 are exact in fp32, so every
    key with the same weight gets bitwise the same bias, and integer weights give
    biases exactly proportional to w (what ramp's equal steps need).
    """
    q, k = q.clone(), k.clone()
    q0 = float(_round(torch.tensor([c / sh.scale], dtype=torch.float64), grid)[0])
    q[..., 0], q[..., 1] = q0, 128.0 * q0
    integer = bool(torch.all(w == torch.round(w))) and float(w.abs().max()) < 2**14
    if integer:
        k[..., 0], k[..., 1] = torch.fmod(w, 128.0), torch.div(w, 128.0, rounding_mode="trunc")
    else:
        k[..., 0] = w
    return _round(q, grid), _round(k, grid)


def _block_max(s: torch.Tensor, sh: Shape) -> torch.Tensor:
    """(..., Nq, n_kb): the max logit of each key block (the last one may be short)."""
    pad = sh.n_kb * sh.block_n - sh.nk
    if pad:
        s = torch.nn.functional.pad(s, (0, pad), value=-math.inf)
    return s.reshape(*s.shape[:-1], sh.n_kb, sh.block_n).amax(-1)


def _magnitude(q: torch.Tensor, sh: Shape) -> float:
    """The realised bias magnitude c = scale * q0 (the same in every row)."""
    return float(q.reshape(-1, sh.d)[0, 0]) * sh.scale


def _raise_bias(build, sh: Shape, need, what: str, margin: float):
    """Build with extra bias e = 0, measure the realised logits, raise e until need(s) <= 0.

    build(e) -> rounded (q, k); need(s) -> how much more bias the property lacks.
    Each raise overshoots by margin / 2 so that the grid rounding of the magnitude
    (which moves the bias by up to half an ulp) cannot take the gain back.
    """
    extra = 0.0
    for _ in range(8):
        q, k = build(extra)
        lack = float(need(dot_logits(q, k, sh.scale)))
        if lack <= 0:
            return q, k, extra
        extra += lack + margin / 2
    raise ValueError(f"could not realise {what} (rounding keeps breaking it); try grid='none'")


# -- the generators -------------------------------------------------------------------


def late_max(g, sh: Shape, *, gap: float = 4.0, logit_std: float = 1.0, margin: float = 0.5,
             grid: str = "common"):
    """Every row's max logit sits in the last key block: one big rescale at the very end.

    The keys of the last block (in key order) get bias `gap`; the gap is raised if
    needed so that for every row max(last block) >= max(other blocks) + margin.
    Forward order then rescales all accumulated state by exp(m_old - m_new) last.
    """
    _check(gap >= 0 and margin > 0, f"need gap >= 0 and margin > 0, got {gap}, {margin}")
    _check(sh.n_kb >= 2, f"late_max needs >= 2 key blocks; Nk={sh.nk}, block_n={sh.block_n}")
    q0, k0, v = _biased(g, sh, logit_std)
    last = (sh.block_of_key() == sh.n_kb - 1).to(torch.float64)

    def need(s):
        bm = _block_max(s, sh)
        return (margin - (bm[..., -1] - bm[..., :-1].amax(-1))).max()

    q, k, _ = _raise_bias(lambda e: _set_bias(q0, k0, last, gap + e, sh, grid),
                              sh, need, "late_max", margin)
    return dict(q=q, k=k, v=_round(v, grid), params=dict(gap=_magnitude(q, sh)))


def early_max(g, sh: Shape, *, gap: float = 4.0, logit_std: float = 1.0, margin: float = 0.5,
              grid: str = "common"):
    """Every row's max logit sits in the first key block: in forward order m never grows again.

    The mirror of late_max: the keys of block 0 get bias `gap` (raised if needed so
    that max(block 0) >= max(other blocks) + margin in every row). No rescale after the
    first block: the error of the rescale is absent, the contrast case for late_max.
    """
    _check(gap >= 0 and margin > 0, f"need gap >= 0 and margin > 0, got {gap}, {margin}")
    _check(sh.n_kb >= 2, f"early_max needs >= 2 key blocks; Nk={sh.nk}, block_n={sh.block_n}")
    q0, k0, v = _biased(g, sh, logit_std)
    first = (sh.block_of_key() == 0).to(torch.float64)

    def need(s):
        bm = _block_max(s, sh)
        return (margin - (bm[..., 0] - bm[..., 1:].amax(-1))).max()

    q, k, _ = _raise_bias(lambda e: _set_bias(q0, k0, first, gap + e, sh, grid),
                              sh, need, "early_max", margin)
    return dict(q=q, k=k, v=_round(v, grid), params=dict(gap=_magnitude(q, sh)))


def ramp(g, sh: Shape, *, step: float = 1.0, logit_std: float = 0.5, margin: float = 0.25,
         grid: str = "common"):
    """The block max grows every key block, in every row: a rescale at every block.

    Keys of block b get bias b * step; step is raised to the least value that makes
    every row's block maxima increase by >= margin from each block to the next.
    The most rescales forward order can see (and none in reverse order).
    """
    _check(step >= 0 and margin > 0, f"need step >= 0 and margin > 0, got {step}, {margin}")
    _check(sh.n_kb >= 2, f"ramp needs >= 2 key blocks; Nk={sh.nk}, block_n={sh.block_n}")
    q0, k0, v = _biased(g, sh, logit_std)
    b = sh.block_of_key().to(torch.float64)

    def need(s):
        bm = _block_max(s, sh)
        # step must grow by (margin - smallest increase) / 1 (increments are one step each)
        return (margin - (bm[..., 1:] - bm[..., :-1]).min())

    q, k, _ = _raise_bias(lambda e: _set_bias(q0, k0, b, step + e, sh, grid),
                              sh, need, "ramp", margin)
    return dict(q=q, k=k, v=_round(v, grid), params=dict(step=_magnitude(q, sh)))


def sink(g, sh: Shape, *, height: float = 10.0, position: int = 0, logit_std: float = 1.0,
         margin: float = 1.0, grid: str = "common"):
    """One key (`position`) has a huge logit for every query: an attention sink.

    As in streaming LLMs (Xiao et al. 2023, attention sinks): the sink key gets bias
    `height`, raised if needed so that it beats every other key by >= margin in every
    row. P is ~1 at the sink and tiny elsewhere: the small P entries are what FP8
    P-casts flush to zero (arXiv 2606.06521).
    """
    _check(isinstance(position, int) and 0 <= position < sh.nk,
           f"position must be an int in [0, {sh.nk}), got {position!r}")
    _check(margin > 0, f"margin must be > 0, got {margin}")
    q0, k0, v = _biased(g, sh, logit_std)
    one = torch.zeros(sh.nk, dtype=torch.float64)
    one[position] = 1.0
    others = torch.ones(sh.nk, dtype=torch.bool)
    others[position] = False

    def need(s):
        return (margin - (s[..., position] - s[..., others].amax(-1))).max()

    q, k, _ = _raise_bias(lambda e: _set_bias(q0, k0, one, height + e, sh, grid),
                              sh, need, "sink", margin)
    return dict(q=q, k=k, v=_round(v, grid), params=dict(height=_magnitude(q, sh)))


def near_overflow(g, sh: Shape, *, level: float = 11.0, logit_std: float = 0.05,
                  v_level: float = 60000.0, grid: str = "common"):
    """Logits near ln(65504) = 11.09 (where fp16 exp overflows) and V near fp16's max.

    Every key gets bias `level` with a small random spread, so exp(s) without the max
    shift would sit at fp16's overflow threshold; V = v_level * (1 - U/10), all
    positive, so the unnormalised accumulator o = sum_j P_j V_j (with many P ~ 1)
    exceeds 65504 after two keys: fp16 o overflows unless it is kept wider. With the
    default grid "common" V is at most 65280 (the largest bf16-and-fp16 number).
    """
    _check(0 < v_level <= 65504, f"v_level must be in (0, 65504], got {v_level}")
    q, k, _ = _biased(g, sh, logit_std)
    q, k = _set_bias(q, k, torch.ones(sh.nk, dtype=torch.float64), level, sh, grid)
    v = v_level * (1.0 - 0.1 * _rand(g, sh.batch, sh.heads, sh.nk, sh.d))
    return dict(q=q, k=k, v=_round(v, grid))


def underflow(g, sh: Shape, *, span: float = 24.0, logit_std: float = 0.1,
              grid: str = "common"):
    """Each row's logits spread evenly over [max - span, max]: P spans many binades.

    Key j gets bias -span * u_j (u_j uniform in [0, 1), seeded; one key at u = 0).
    With span 24, exp(s - m) reaches e^-24 ~ 4e-11: below fp16's smallest subnormal
    (6e-8, from s - m < -16.6) and e4m3's (2^-9, from s - m < -6.2), so the P cast
    to those formats flushes part of each row to zero (arXiv 2606.06521); fp32 and
    bf16 underflow only past s - m < -87 (normal) / -103 (subnormal): use span ~110.
    """
    _check(span >= 0, f"span must be >= 0, got {span}")
    q, k, v = _biased(g, sh, logit_std)
    u = _rand(g, sh.nk)
    u[torch.randint(sh.nk, (1,), generator=g)] = 0.0
    q, k = _set_bias(q, k, -_round(u, grid), span, sh, grid)
    return dict(q=q, k=k, v=_round(v, grid))
