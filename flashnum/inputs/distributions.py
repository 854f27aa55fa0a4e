"""The adversarial catalogue: named, seeded generators of Q, K, V.

Each distribution stresses one failure mode of the online softmax; its docstring
says which, where the idea comes from, and which property it guarantees (the
tests check every such claim).

    from flashnum.inputs.distributions import make, DISTRIBUTIONS, describe, params
    inp = make("late_max", seq_len_q=1024, head_dim=64, block_n=64, seed=0, gap=4.0)
    inp.q, inp.k, inp.v        # float64, (batch, heads, N, d)
    inp.causal, inp.scale      # scale None means 1/sqrt(d)
    inp.params                 # every parameter as resolved (defaults filled in)
    logits(inp)                # (batch, heads, Nq, Nk) fp64 scaled logits, -inf where masked

Reproducibility: every generator draws from its own torch.Generator seeded from
sha256("flashnum:<name>:<seed>"), never from the global RNG, so the same
(name, seed, shape, params) gives bitwise identical tensors in every process.

Grids. `grid=` rounds Q, K, V at the end of generation: "none" (raw fp64),
a format name ("bf16", "fp16", ...), or "common": p = 8 significand bits with
fp16's exponent range, whose every number is both a bf16 and an fp16 number
(max 65280). Distributions whose property lives in exact values (ties, flat,
the logit-structured ones) default to "common", so the engine's input rounding
(bf16 or fp16) leaves them unchanged and the reference sees the same tensors.

Logit-structured distributions (late_max, ramp, early_max, sink, near_overflow,
underflow) are built with a *bias channel*: head dims 0 and 1 carry a magnitude c
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

Masking: logits of finite Q, K are finite; -inf logits arise only from the causal
mask. `masked` makes them with Nq > Nk (bottom-right causal alignment, see
flashnum.numerics.tiling): the first Nq - Nk query rows see no key at all.
"""

from __future__ import annotations

import hashlib
import inspect
import math
from dataclasses import dataclass, field

import torch
from scipy.special import stdtrit

from flashnum.engine import checks as engine_checks  # available_bytes read at each call
from flashnum.inputs.capture import select_rows
from flashnum.inputs.capture_file import call_shapes, file_sha256, load_bytes, load_call
from flashnum.inputs.io import load_inputs
from flashnum.numerics.accumulate import dot
from flashnum.numerics.formats import FORMATS, Format
from flashnum.numerics.tiling import causal_visible, clamp_block

# every number of this format is a bf16 number and an fp16 number
COMMON = Format("common", 8, -14, 15)
GRIDS = ("none", "common", *FORMATS)


@dataclass
class Inputs:
    """One draw of a distribution: what the engine, the kernel and the reference consume."""

    q: torch.Tensor  # (batch, heads, Nq, d) float64
    k: torch.Tensor  # (batch, heads, Nk, d) float64
    v: torch.Tensor  # (batch, heads, Nk, dv) float64
    causal: bool = False
    name: str = ""
    params: dict = field(default_factory=dict)
    scale: float | None = None  # None: 1/sqrt(d)
    seed: int = 0
    block_n: int = 64
    do: torch.Tensor | None = None  # (batch, heads, Nq, dv) float64: a captured call's dO

    @property
    def softmax_scale(self) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.q.shape[-1])

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.q, self.k, self.v


@dataclass(frozen=True)
class Shape:
    """What every generator is told: sizes, the key block size and its seeded generator."""

    batch: int
    heads: int
    nq: int
    nk: int
    d: int
    block_n: int
    nk_given: bool  # False when seq_len_k defaulted to seq_len_q

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.d)

    @property
    def n_kb(self) -> int:
        return max(1, math.ceil(self.nk / self.block_n))

    def block_of_key(self) -> torch.Tensor:
        return torch.arange(self.nk) // self.block_n


def _seed_of(name: str, seed: int) -> int:
    # sha256 instead of hash(): Python salts str hashes per process
    h = hashlib.sha256(f"flashnum:{name}:{int(seed)}".encode()).digest()
    return int.from_bytes(h[:8], "little") & (2**63 - 1)


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise ValueError(msg)


def _grid(grid):
    if grid is None or grid == "none":
        return None
    if grid == "common":
        return COMMON
    if grid in FORMATS:
        return FORMATS[grid]
    raise ValueError(f"unknown grid {grid!r}; valid: {', '.join(GRIDS)}")


def _round(x: torch.Tensor, grid) -> torch.Tensor:
    f = _grid(grid)
    return x if f is None else f.round(x)


def _randn(g, *shape) -> torch.Tensor:
    return torch.randn(*shape, generator=g, dtype=torch.float64)


def _rand(g, *shape) -> torch.Tensor:
    return torch.rand(*shape, generator=g, dtype=torch.float64)


def _qkv(g, sh: Shape, sq=1.0, sk=1.0, sv=1.0):
    q = _randn(g, sh.batch, sh.heads, sh.nq, sh.d) * sq
    k = _randn(g, sh.batch, sh.heads, sh.nk, sh.d) * sk
    v = _randn(g, sh.batch, sh.heads, sh.nk, sh.d) * sv
    return q, k, v


def dot_logits(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """scale * q k^T in fp64, summed over d in a fixed order, the same for every (i, j).

    A BLAS matmul may sum different output tiles in different orders; this loop
    does not, so equal key rows give bitwise equal logits (what the ties need).
    """
    s = torch.zeros(*q.shape[:-1], k.shape[-2], dtype=torch.float64)
    # in bands of query rows (about 2^18 logits each, 2 MiB) so that the d passes over a
    # band stay in cache: every logit is still summed t = 0, 1, ..., d-1 from zero, so
    # the band size changes no bit (at N = 8192 the whole-matrix passes took 10x longer)
    rows = max(1, (1 << 18) // max(1, k.shape[-2]))
    kt = k.transpose(-1, -2).contiguous()  # row t holds every key's entry t, contiguous
    for i in range(0, q.shape[-2], rows):
        band = s[..., i : i + rows, :]
        qt = q[..., i : i + rows, :].transpose(-1, -2).contiguous()
        prod = torch.empty_like(band)
        for t in range(q.shape[-1]):
            torch.mul(qt[..., t, :, None], kt[..., None, t, :], out=prod)
            band += prod
    return s * scale


def logits(inp: Inputs) -> torch.Tensor:
    """The scaled logits of an Inputs, fp64 (fixed-order), -inf where causally masked."""
    s = dot_logits(inp.q, inp.k, inp.softmax_scale)
    if inp.causal:
        s = s.masked_fill(~causal_visible(*s.shape[-2:]), -math.inf)
    return s


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


# -- the catalogue --------------------------------------------------------------------


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
    Bias channels (exact products, see the module docstring): dim 0 carries the peak
    (q0 = peak_gap / scale, k0 = 1 on peaks), dim 1 the ramp (q1 = ramp / scale,
    k1 = b, exact for b < 256), dim 2 the row spread (q2 = row_spread z_i / scale,
    k2 = 1 on peaks). Needs head_dim >= 4.
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


def worst_case(g, sh: Shape, *, path: str = ""):
    """Inputs saved by flashnum.inputs.search (a worst case found by the search), replayed bitwise.

    The shape arguments of make() are ignored: the tensors come from the file.
    """
    _check(bool(path), "worst_case needs path=<file saved by flashnum.inputs.search>")
    t, meta = load_inputs(path)
    return dict(q=t["q"], k=t["k"], v=t["v"], causal=meta["causal"], scale=meta["scale"],
                params=dict(path=str(path), source=meta["name"], **meta["params"]))


def captured(g, sh: Shape, *, path: str = "", call: int = 0, head_ids: list | None = None,
             rows: int | None = None, sha256: str = ""):
    """A real model's attention call, recorded by flashnum.capture: its Q, K, V exactly.

    path: the capture file; call: the call's index (its order in the model, as
    flashnum.load_capture reports it); head_ids: which of its heads (None: all); rows: how
    many query rows, drawn with `seed` (None: all; causal calls keep consecutive rows and
    the keys they see, which is bottom-right causal attention again: see
    flashnum.inputs.capture); sha256: the file's content hash (the harness fills it in,
    so that a changed capture is a different case; given, it must match).
    The scale is the one the model used; causal is the model's, in flashnum's terms
    (torch's top-left mask with Nq < Nk sees only the first Nq keys, kept as causal
    attention of Nq x Nq). The tensors are converted to float64 exactly; the shape
    arguments of make() are ignored. Calls flashnum cannot compute (an attn_mask other
    than causal, top-left causal with Nq > Nk) are refused with a ValueError. With a dO
    recorded (capture(backward=True)), Inputs.do holds it, selected like Q.
    """
    _check(bool(path), "captured needs path=<file written by flashnum.capture>")
    check_memory(path, call, head_ids, rows)  # the file checked and its cost, before reading
    if sha256 and file_sha256(path) != sha256:
        raise ValueError(f"{path} has changed: its sha256 is no longer {sha256}")
    c = load_call(path, call)
    c.check_plain()
    q, k, v = (t.to(torch.float64) for t in c.qkv)  # exact: every float format fits fp64
    do = c.do.to(torch.float64) if c.do is not None else None
    causal = c.causal
    if causal == "top_left":
        _check(q.shape[-2] <= k.shape[-2],
               f"captured call {call} is top-left causal with Nq = {q.shape[-2]} > Nk = "
               f"{k.shape[-2]}, which flashnum's bottom-right causal cannot express")
        k, v = k[..., : q.shape[-2], :], v[..., : q.shape[-2], :]  # keys no query sees
        causal = True
    if head_ids is not None:
        ok = isinstance(head_ids, (list, tuple)) and all(
            isinstance(h, int) and 0 <= h < q.shape[1] for h in head_ids)
        _check(ok and len(head_ids) > 0, f"head_ids must be a list of head indices in "
               f"0..{q.shape[1] - 1} of captured call {call}, got {head_ids!r}")
        q, k, v = q[:, head_ids], k[:, head_ids], v[:, head_ids]
        do = do[:, head_ids] if do is not None else None
    if rows is not None:
        _check(isinstance(rows, int) and not isinstance(rows, bool) and rows >= 1,
               f"rows must be an int >= 1 (query rows kept), got {rows!r}")
        nq, nk = q.shape[-2], k.shape[-2]
        idx, nk_kept = select_rows(nq, nk, rows, bool(causal), g, offset=nk - nq)
        if idx is not None:
            q, k, v = q[:, :, idx], k[:, :, :nk_kept], v[:, :, :nk_kept]
            do = do[:, :, idx] if do is not None else None
    return dict(q=q.contiguous(), k=k.contiguous(), v=v.contiguous(), causal=bool(causal),
                scale=c.scale, do=do.contiguous() if do is not None else None,
                params=dict(module=c.module, dtype=c.dtype))


# replayed from a file, not drawn: outside the catalogue that studies and screens loop over
FROM_FILE = ("worst_case", "captured")

DISTRIBUTIONS = {
    f.__name__: f
    for f in (
        gaussian, fa3_outliers, scaled, late_max, ramp, early_max, ties, sink, flat,
        near_overflow, heavy_tail, outlier_channels, low_rank, cancellation, masked,
        underflow, plateau, structured, worst_case, captured,
    )
}


def _selected(path, call, head_ids, rows) -> tuple:
    """The shapes (q, k, v, do or None) a case reads of the call, its heads and rows kept:
    what it costs, from the file's header alone (from above: a causal call's rows keep at
    most every key)."""
    sh = call_shapes(path, call)
    b, h, nq, d = sh["q"]
    nk, dv = sh["k"][2], sh["v"][3]
    h = len(head_ids) if isinstance(head_ids, (list, tuple)) and head_ids else h
    nq = min(nq, rows) if isinstance(rows, int) and not isinstance(rows, bool) else nq
    return (b, h, nq, d), (b, h, nk, d), (b, h, nk, dv), (b, h, nq, dv) if "do" in sh else None


def check_memory(path, call, head_ids=None, rows=None, *, block_m: int | None = None,
                 block_n: int | None = None, backward: bool = False) -> int:
    """The estimated peak memory of a case of captured call `call` (the call read as
    float64, and with blocks given the engine's estimate, flashnum.engine.checks.peak_bytes,
    at the kept shape); ValueError naming it when more than the machine has available,
    before a byte of a tensor is read. Returns the estimate."""
    need = load_bytes(path, call)
    q, k, v, _ = _selected(path, call, head_ids, rows)
    if block_m is not None and block_n is not None:
        meta = [torch.empty(s, device="meta") for s in (q, k, v)]
        need += engine_checks.peak_bytes(*meta, block_m=clamp_block(block_m, q[2]),
                                         block_n=clamp_block(block_n, k[2]), backward=backward)
    have = engine_checks.available_bytes()
    if have is not None and need > have:
        human = engine_checks.human
        raise ValueError(
            f"{path}: a case of captured call {call} needs an estimated {human(need)} of "
            f"memory (q {q}, k {k}, v {v}, read as float64 and computed) and {human(have)} "
            f"is available; valid: fewer rows (rows=N), fewer heads (head_ids=[...]) or a "
            f"smaller call")
    return need


def captured_case(params: dict, seed: int, *, block_m: int | None = None,
                  block_n: int | None = None, backward: bool = False) -> tuple[dict, dict]:
    """(params with the file's sha256, the shape and causal flag its inputs have).

    What the harness needs to name a captured case: its content, not just its path. The
    file is checked (flashnum.inputs.capture_file) and the case's memory estimated
    (check_memory, with the case's blocks) before the file is hashed or read: a bad file
    or a case too large for the machine is one ValueError.
    """
    p = {**params}
    _check(bool(p.get("path")), "distribution captured needs path=<file written by "
           "flashnum.capture> (distribution.path=FILE)")
    check_memory(p["path"], p.get("call", 0), p.get("head_ids"), p.get("rows"),
                 block_m=block_m, block_n=block_n, backward=backward)
    digest = file_sha256(p["path"])
    if p.get("sha256") and p["sha256"] != digest:
        raise ValueError(f"{p['path']} has changed: its sha256 is no longer {p['sha256']}")
    p["sha256"] = digest
    key = (repr(sorted(p.items())), seed)  # a grid names one call in many cases: load it once
    if key not in _CAPTURED_SHAPES:
        inp = make("captured", seed=seed, **p)
        b, h, nq, d = inp.q.shape
        _CAPTURED_SHAPES[key] = dict(batch=b, heads=h, seq_len_q=nq, seq_len_k=inp.k.shape[-2],
                                     head_dim=d, causal=inp.causal)
    return p, dict(_CAPTURED_SHAPES[key])


_CAPTURED_SHAPES: dict = {}


def _get(name: str):
    if name not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {name!r}; valid: {', '.join(DISTRIBUTIONS)}")
    return DISTRIBUTIONS[name]


def describe(name: str) -> str:
    """The docstring of a distribution: what it stresses and where the idea comes from."""
    return inspect.getdoc(_get(name)) or ""


def params(name: str) -> dict:
    """The default parameters of a distribution."""
    sig = inspect.signature(_get(name))
    return {p.name: p.default for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY}


def _check_int(name, x, lo=1):
    if isinstance(x, bool) or not isinstance(x, int) or x < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {x!r}")


def make(name: str, *, batch: int = 1, heads: int = 1, seq_len_q: int = 256,
         seq_len_k: int | None = None, head_dim: int = 64, seed: int = 0, block_n: int = 64,
         **kw) -> Inputs:
    """Draw Q, K, V (float64, (batch, heads, N, d)) from the named distribution."""
    fn = _get(name)
    defaults = params(name)
    bad = sorted(set(kw) - set(defaults))
    if bad:
        raise ValueError(
            f"unknown parameter(s) {', '.join(bad)} for distribution {name!r}; "
            f"valid: {', '.join(defaults) or '(none)'}"
        )
    for key, val in (("batch", batch), ("heads", heads), ("seq_len_q", seq_len_q),
                     ("head_dim", head_dim), ("block_n", block_n)):
        _check_int(key, val)
    if seq_len_k is not None:
        _check_int("seq_len_k", seq_len_k)
    _check_int("seed", seed, lo=0)
    if "grid" in kw:
        _grid(kw["grid"])  # a clear error before any work
    sh = Shape(batch, heads, seq_len_q, seq_len_k or seq_len_q, head_dim, block_n,
               nk_given=seq_len_k is not None)
    g = torch.Generator().manual_seed(_seed_of(name, seed))
    out = fn(g, sh, **kw)
    resolved = {**defaults, **kw, **out.get("params", {})}
    return Inputs(
        q=out["q"], k=out["k"], v=out["v"], causal=bool(out.get("causal", False)), name=name,
        params=resolved, scale=out.get("scale"), seed=seed, block_n=block_n, do=out.get("do"),
    )
