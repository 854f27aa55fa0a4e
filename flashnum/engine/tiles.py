"""Tiles of the emulated recurrence: inputs as stored, cut into blocks, and each block's logits.

    from flashnum.engine.tiles import Tiles, stored_inputs, tile_logits
    q3, k3, v3 = stored_inputs(ar, q, k, v)        # rounded into the inputs format, (B, N, d)
    tiles = Tiles.of(q3, k3, v3, block_m, block_n)
    s = tile_logits(ar, tiles, kb, scale_s, causal, tall)   # (B, n_qb, bm, bn), masked -inf

    flashnum.engine.logits(q, k, ...)              # the whole computed Nq x Nk logit matrix

Shared by the readable recurrence (flashnum.engine.recurrence), the in-place path
(flashnum.engine.fast) and `logits`, so that all three form every logit through the same
GEMM shape and the same roundings. Causal visibility is flashnum.numerics.tiling's rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from flashnum.engine.arith import Arith, carrier, wider
from flashnum.engine.variants import EXP2_SCALES, variant_of
from flashnum.numerics.constants import LOG2E
from flashnum.numerics.formats import EXACT, FORMATS
from flashnum.numerics.policy import make_policy
from flashnum.numerics.tiling import n_blocks, varies_by_query_block, visible

FP32 = FORMATS["fp32"]


@dataclass
class Tiles:
    """Inputs reshaped into padded tiles: q (B, n_qb, bm, d), k/v (B, n_kb, bn, .)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    nq: int
    nk: int

    @classmethod
    def of(cls, q3, k3, v3, block_m: int, block_n: int) -> Tiles:
        return cls(_pad_blocks(q3, block_m), _pad_blocks(k3, block_n), _pad_blocks(v3, block_n),
                   q3.shape[1], k3.shape[1])

    @property
    def bm(self) -> int:
        return self.q.shape[2]

    @property
    def bn(self) -> int:
        return self.k.shape[2]

    @property
    def n_qb(self) -> int:
        return self.q.shape[1]

    @property
    def n_kb(self) -> int:
        return self.k.shape[1]

    def heads(self, b0: int, b1: int) -> Tiles:
        """The tiles of (batch * head) rows b0:b1."""
        return Tiles(self.q[b0:b1], self.k[b0:b1], self.v[b0:b1], self.nq, self.nk)


def _pad_blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    b, n, d = x.shape
    nb = n_blocks(n, block)
    pad = nb * block - n
    if pad:
        x = torch.cat([x, x.new_zeros(b, pad, d)], dim=1)
    return x.reshape(b, nb, block, d)


def stored_inputs(ar: Arith, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The inputs as stored in memory (a round-to-nearest cast into the inputs format), on
    the carrier, leading dims flattened: (B, N, d) each."""
    fin = ar.policy.fmt("inputs")
    return tuple(_round_input(ar, x, fin).reshape(-1, *x.shape[-2:]) for x in xs)


def _round_input(ar: Arith, x: torch.Tensor, fin) -> torch.Tensor:
    x = x.detach().to("cpu")
    if x.dtype is torch.float32 and ar.dtype is torch.float32:
        # an fp32 value is its own float64 carrier: Arith.rnd's fp32 -> low cast is then
        # the one correctly rounded conversion (no double rounding), without the trip
        # through float64
        return ar.rnd(x, fin, nearest=True)
    return ar.rnd(x.to(torch.float64), fin, nearest=True).to(ar.dtype)




def exp2_scale(scale: float, form: str = "once") -> float:
    """scale * log2(e) as an exp2 kernel holds it, in fp32:

        once   fl32(scale * log2 e), the product of the float64 values rounded once (the
               host computes it: flashnum's Triton kernel, flashnum.backends.triton)
        twice  fl32(fl32(scale) * fl32(1.44269504)): the Triton tutorial's fused
               attention (`qk_scale = sm_scale; qk_scale *= 1.44269504` inside the kernel,
               on fp32 scalars). For about a quarter of scales (1.3; 1/sqrt(d) at d = 48,
               80) the two differ by one fp32 ulp.
    """
    if form not in EXP2_SCALES:
        raise ValueError(f"unknown exp2_scale {form!r}; valid: {', '.join(EXP2_SCALES)}")
    if form == "once":
        return float(torch.tensor(scale * LOG2E, dtype=torch.float64).float())
    s32 = torch.tensor(scale, dtype=torch.float64).float()
    return float(s32 * torch.tensor(1.44269504, dtype=torch.float64).float())


def scale_in_logits_format(ar: Arith, scale: float, base2: bool, form: str = "once") -> float:
    """The scale as the code holds it: in the logits' format, but never narrower than fp32
    (exp2 variants fold log2(e) into it first, as `form` says: exp2_scale). A kernel holds
    sm_scale in fp32; a pure-PyTorch port multiplies its bf16/fp16 logits by a Python
    float, which torch applies as an fp32 product rounded to the dtype (Qiu & Yao's
    attention.py, torch's own math attention): so a narrow logits format does not round
    the scale itself."""
    if base2 and form == "twice":
        return exp2_scale(scale, form)  # an fp32 product: what the kernel holds
    c = scale * (LOG2E if base2 else 1.0)
    return float(ar.rnd(torch.tensor(c, dtype=ar.dtype), wider(ar.policy.fmt("s"), FP32)))


def tile_visible(tiles: Tiles, kb: torch.Tensor, causal: bool) -> torch.Tensor | None:
    """(.., n_qb, bm, bn) bool for the key blocks `kb` ((B or 1, n_qb)): the key exists
    (ragged last block) and, if causal, the query sees it. None if all are visible."""
    bm, bn = tiles.bm, tiles.bn
    if not causal and tiles.n_kb * bn == tiles.nk:
        return None
    i = torch.arange(tiles.n_qb)[:, None] * bm + torch.arange(bm)[None, :]  # (n_qb, bm)
    j = kb[..., None] * bn + torch.arange(bn)  # (B?, n_qb, bn)
    vis = (j < tiles.nk)[..., None, :].expand(*j.shape[:-1], bm, bn)
    if causal:
        vis = vis & visible(i[..., :, None], j[..., None, :], tiles.nq, tiles.nk, causal)
    return vis


def gather(x: torch.Tensor, kb: torch.Tensor, tall: bool) -> torch.Tensor:
    """x (B, n_kb, bn, d), kb (B or 1, n_qb) -> (B, 1, bn, d) when every query block takes
    the same key block (tall), else (B, n_qb, bn, d)."""
    if tall:
        return x[:, int(kb.flatten()[0])].unsqueeze(1)
    kb = kb.expand(x.shape[0], -1)
    b = torch.arange(x.shape[0])[:, None]
    return x[b, kb]


def tile_dot(ar: Arith, a: torch.Tensor, b: torch.Tensor, fmt, tall: bool,
             product=EXACT) -> torch.Tensor:
    """a (B, n_qb, bm, x) @ b (B, 1 or n_qb, x, y), accumulated in fmt, each product
    rounded into `product` first (a product site; EXACT: none).

    tall: one (n_qb bm) x x x y GEMM when b is shared by every query block (orders that
    are the same for all query blocks), faster than n_qb small ones. Every entry is one
    FMA chain whatever the shape (flashnum.numerics.accumulate), so the two agree.
    """
    if tall:
        B, n_qb, bm, x = a.shape
        return ar.dot(a.reshape(B, 1, n_qb * bm, x), b, fmt, product).reshape(B, n_qb, bm, -1)
    return ar.dot(a, b, fmt, product)


def tile_logits(ar: Arith, tiles: Tiles, kb, scale_s: float, causal: bool, tall: bool):
    """S_j = fl_s(fl_s(Q K_j^T) * scale) for the key blocks kb, invisible keys -inf."""
    kt = gather(tiles.k, kb, tall).transpose(-1, -2)
    s = tile_dot(ar, tiles.q, kt, ar.fmt("qk_acc"), tall, ar.fmt("qk_product"))
    s = ar.site(ar.site(s, "s") * scale_s, "s")
    vis = tile_visible(tiles, kb, causal)
    if vis is not None:
        s = s.masked_fill(~vis, -math.inf)
    return s


def logits(q, k, *, precision="bf16", policy="fa2", block_m=64, block_n=64, causal=False,
           scale=None, order="forward", variant="fa2", exp2_scale=None) -> torch.Tensor:
    """The computed logits (..., Nq, Nk) exactly as the emulated flash recurrence forms them
    (same tiles, same roundings), masked entries -inf. Forms the whole Nq x Nk matrix:
    for checks (the invariant "final m is the row max of the computed logits"), not sweeps.
    """
    pol = make_policy(policy, precision)
    ar = Arith(pol, "nearest", 0, carrier(pol))
    d, nq, nk = q.shape[-1], q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    q3, k3 = stored_inputs(ar, q, k)
    tiles = Tiles.of(q3, k3, k3, block_m, block_n)
    var = variant_of(variant, exp2_scale=exp2_scale)
    scale_s = scale_in_logits_format(ar, scale, var.base2, var.exp2_form)
    tall = not varies_by_query_block(order)
    cols = [tile_logits(ar, tiles, torch.full((1, tiles.n_qb), j), scale_s, causal, tall)
            for j in range(tiles.n_kb)]
    s = torch.cat(cols, dim=-1).reshape(q3.shape[0], -1, tiles.n_kb * block_n)
    return s[:, :nq, :nk].reshape(*q.shape[:-2], nq, nk)


def is_fp32(fmt) -> bool:
    """Whether a site's format is plain fp32 (on the fp32 carrier: no rounding step)."""
    return fmt is not EXACT and fmt.name == "fp32"
