"""What every generator of the catalogue (flashnum.inputs.distributions) draws with: the
Inputs a draw returns, the Shape it is told, its seeded generator, the grids and the
fixed-order logits.

Reproducibility: every generator draws from its own torch.Generator seeded from
sha256("flashnum:<name>:<seed>"), never from the global RNG, so the same
(name, seed, shape, params) gives bitwise identical tensors in every process.

Grids. `grid=` rounds Q, K, V at the end of generation: "none" (raw fp64),
a format name ("bf16", "fp16", ...), or "common": p = 8 significand bits with
fp16's exponent range, whose every number is both a bf16 and an fp16 number
(max 65280). Distributions whose property lives in exact values (ties, flat,
the logit-structured ones) default to "common", so the engine's input rounding
(bf16 or fp16) leaves them unchanged and the reference sees the same tensors.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import torch

from flashnum.numerics.formats import FORMATS, Format
from flashnum.numerics.tiling import causal_visible

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
