"""Block-scaled and scaled low-precision formats: MX, NVFP4 and FP8 with a scale.

    from flashnum.numerics.blockscaled import quantize, get_block_format
    y = quantize(x, "mxfp4", axis=-1)                   # dequantized float64, same shape
    y = quantize(x, "nvfp4", rounding="stochastic", generator=g)
    fmt = get_block_format("mxfp8_e4m3"); fmt.round(x)  # a site format (last axis)

A block-scaled value is an element of a narrow format times a scale shared by a
block of consecutive elements along `axis` (for attention: the head dim of Q, K, V;
the key axis of P). `quantize` returns the dequantized values (element * scale) in the
float64 carrier, which is what the matrix units multiply. A last, partial block is
padded with zeros (as kernels pad), which changes no block maximum.

Formats (facts and sources in docs/formats.md):

    mxfp8_e4m3 mxfp8_e5m2 mxfp6_e3m2 mxfp6_e2m3 mxfp4
        OCP Microscaling Formats (MX) v1.0: blocks of 32, a shared E8M0 scale
        X = 2^(floor(log2 amax) - emax_elem), clamped to E8M0's 2^-127..2^127; each
        element x / X rounded to nearest even (or stochastically) into the element format
        and saturated to its max (the spec's conversion; amax / X lies in
        [2^emax, 2^(emax+1)), so the block's top values may saturate). A block holding an
        inf or NaN dequantizes to NaN (X is the E8M0 NaN). An all-zero block stays zero.
    nvfp4
        NVIDIA's NVFP4 (as Transformer Engine's reference quantizer): E2M1 elements in
        blocks of 16; a per-tensor fp32 encode scale S = 448 * 6 / amax(tensor); a per-block
        decode scale d_b = e4m3(amax_b / 6 * S) (round to nearest, saturating); elements
        e2m1(fp32(x * fp32(S / d_b))); dequantized e * d_b / S. All scale arithmetic in fp32.
    nvfp4_row
        nvfp4 with the fp32 scale per row (every index but `axis`) instead of per tensor:
        SageAttention3's two-level quantization of P (a per-token fp32 scale, then NVFP4).
    nvfp4_1l
        nvfp4 without the fp32 scale (S = 1): the one-level form, whose e4m3 block scale
        underflows when a block's amax / 6 falls below e4m3's subnormals (SageAttention3).
    fp8_e4m3_tensor fp8_e5m2_tensor
        one fp32 scale amax / max for the whole tensor (per-tensor scaling, FA3's baseline).

`quantize_tiles(x, fmt, block)` is FA3's block quantization (one scale amax / max per
block of `block` rows of each head, over all columns); `scaled(fmt, factor)` a cast with a
static scale (arXiv 2606.06521's S = 256 before the e4m3 cast of P); `random_hadamard`
FA3's incoherent processing; `smooth_k` SageAttention's K smoothing. These need no
engine support: apply them to Q, K, V before attention (they are exact in exact
arithmetic: softmax is invariant to a per-row shift of the logits, and H is orthogonal).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from flashnum.numerics.accumulate import dot, rowsum
from flashnum.numerics.floats import FORMATS, ROUNDINGS, Format

# element formats (OCP MX v1.0, section 5.3): no infinities or NaN in fp6/fp4; saturating
E2M1 = Format("fp4_e2m1", 2, 0, 2, has_inf=False, saturate=True)
E3M2 = Format("fp6_e3m2", 3, -2, 4, has_inf=False, saturate=True)
E2M3 = Format("fp6_e2m3", 4, 0, 2, has_inf=False, saturate=True)
E4M3 = FORMATS["fp8_e4m3"]  # max 448, saturating (OCP e4m3fn)
E5M2_SAT = Format("fp8_e5m2", 3, -14, 15, has_inf=False, saturate=True)  # MX: saturated
ELEMENTS = {"e2m1": E2M1, "e3m2": E3M2, "e2m3": E2M3, "e4m3": E4M3, "e5m2": E5M2_SAT}
E8M0_EMIN, E8M0_EMAX = -127, 127  # E8M0 encodes 2^-127 .. 2^127 (0xFF is NaN)
FP32 = FORMATS["fp32"]


@dataclass(frozen=True)
class BlockFormat:
    """A block-scaled format: `elem` values times a scale shared by `block` elements.

    scale: "e8m0" (MX), "e4m3" (NVFP4's block scale, with the fp32 scale `second`:
    "tensor", "row" or "none"), "amax" (one fp32 scale amax / max, block=None: the tensor).
    As a site format it rounds along the last axis; p, emin, emax, u are the element's
    precision with fp32's range (the engine keeps the dequantized values on its carrier).
    """

    name: str
    elem: Format
    block: int | None
    scale: str
    second: str = "none"

    p = property(lambda self: self.elem.p)
    u = property(lambda self: self.elem.u)
    emin = property(lambda self: FP32.emin)
    emax = property(lambda self: FP32.emax)
    max = property(lambda self: math.inf)  # the scale reaches any finite value
    torch_dtype = None
    saturate = True
    has_inf = False

    def round(self, x, rounding="nearest", generator=None, saturate=None):
        return quantize(x, self, -1, rounding, generator)

    def __str__(self) -> str:
        return self.name


BLOCK_FORMATS: dict[str, BlockFormat] = {
    "mxfp8_e4m3": BlockFormat("mxfp8_e4m3", E4M3, 32, "e8m0"),
    "mxfp8_e5m2": BlockFormat("mxfp8_e5m2", E5M2_SAT, 32, "e8m0"),
    "mxfp6_e3m2": BlockFormat("mxfp6_e3m2", E3M2, 32, "e8m0"),
    "mxfp6_e2m3": BlockFormat("mxfp6_e2m3", E2M3, 32, "e8m0"),
    "mxfp4": BlockFormat("mxfp4", E2M1, 32, "e8m0"),
    "nvfp4": BlockFormat("nvfp4", E2M1, 16, "e4m3", "tensor"),
    "nvfp4_row": BlockFormat("nvfp4_row", E2M1, 16, "e4m3", "row"),
    "nvfp4_1l": BlockFormat("nvfp4_1l", E2M1, 16, "e4m3", "none"),
    "fp8_e4m3_tensor": BlockFormat("fp8_e4m3_tensor", E4M3, None, "amax"),
    "fp8_e5m2_tensor": BlockFormat("fp8_e5m2_tensor", FORMATS["fp8_e5m2"], None, "amax"),
}


def get_block_format(name) -> BlockFormat:
    if isinstance(name, BlockFormat):
        return name
    if name not in BLOCK_FORMATS:
        raise ValueError(f"unknown block format {name!r}; valid: {', '.join(BLOCK_FORMATS)}")
    return BLOCK_FORMATS[name]


def _blocks(x: torch.Tensor, block: int):
    """x (..., n) -> (..., nb, block), zero-padded; and n."""
    n = x.shape[-1]
    nb = max(1, math.ceil(n / block))
    pad = nb * block - n
    if pad:
        x = torch.nn.functional.pad(x, (0, pad))
    return x.reshape(*x.shape[:-1], nb, block), n


def _elem(fmt: Format, t, rounding, generator):
    return fmt.round(t, rounding, generator, saturate=True)


def _mx(xb, fmt: BlockFormat, rounding, generator):
    amax = xb.abs().amax(-1, keepdim=True)
    # floor(log2 amax): frexp's exponent is exact (amax = f 2^e, f in [0.5, 1))
    e = torch.frexp(amax).exponent.to(torch.float64) - 1 - fmt.elem.emax
    e = torch.clamp(e, E8M0_EMIN, E8M0_EMAX)
    scale = torch.exp2(e)
    y = _elem(fmt.elem, xb / scale, rounding, generator) * scale
    bad = ~torch.isfinite(amax)
    return torch.where(bad, torch.full_like(y, math.nan), y) if bool(bad.any()) else y


def _f32(x):
    return x.to(torch.float32).to(torch.float64)  # one fp32 rounding (float64 -> float32)


def _nvfp4(xb, fmt: BlockFormat, rounding, generator):
    emax = fmt.elem.max  # 6
    amax_b = xb.abs().amax(-1, keepdim=True)  # (..., nb, 1)
    if fmt.second == "tensor":
        g = amax_b.amax()
    elif fmt.second == "row":
        g = amax_b.amax(-2, keepdim=True)
    else:
        g = None
    if g is None:
        s_enc = torch.ones((), dtype=torch.float64)
    else:
        s_enc = _f32(E4M3.max * emax / g)
        s_enc = torch.where((g > 0) & torch.isfinite(s_enc), s_enc, torch.ones_like(s_enc))
    d_b = E4M3.round(_f32(_f32(amax_b / emax) * s_enc))  # the stored e4m3 block scale
    enc_b = torch.where(d_b > 0, _f32(s_enc / d_b), torch.zeros_like(d_b))
    q = _elem(fmt.elem, _f32(xb * enc_b), rounding, generator)
    y = q * d_b / s_enc  # the decode the GEMM applies (d_b / S, exact enough in float64)
    bad = ~torch.isfinite(amax_b)
    return torch.where(bad, torch.full_like(y, math.nan), y) if bool(bad.any()) else y


def quantize(x: torch.Tensor, fmt, axis: int = -1, rounding: str = "nearest",
             generator: torch.Generator | None = None) -> torch.Tensor:
    """x quantized into the block-scaled `fmt` along `axis`, dequantized, float64.

    rounding: nearest (ties to even) or stochastic (the elements only; the scales are
    computed as the spec says); stochastic needs a seeded torch.Generator.
    """
    fmt = get_block_format(fmt)
    if rounding not in ROUNDINGS:
        raise ValueError(f"unknown rounding {rounding!r}; valid: {', '.join(ROUNDINGS)}")
    if rounding == "stochastic" and generator is None:
        raise ValueError("stochastic rounding needs a seeded torch.Generator")
    x = x.to(torch.float64)
    if x.ndim == 0:
        raise ValueError("quantize needs a tensor of at least one dimension")
    if fmt.scale == "amax":
        amax = x.abs().amax() if x.numel() else torch.zeros((), dtype=torch.float64)
        s = _f32(amax / fmt.elem.max)
        s = torch.where(s > 0, s, torch.ones_like(s))
        return _elem(fmt.elem, x / s, rounding, generator) * s
    xm = x.movedim(axis, -1)
    xb, n = _blocks(xm, fmt.block)
    y = (_mx if fmt.scale == "e8m0" else _nvfp4)(xb, fmt, rounding, generator)
    y = y.reshape(*xm.shape[:-1], -1)[..., :n]
    return y.movedim(-1, axis)


# ---------------------------------------------------------------------------
# scaled fp8 forms (FA3's and arXiv 2606.06521's), rotations and smoothing


@dataclass(frozen=True)
class ScaledFormat(Format):
    """A cast with a static scale: x -> round(x * factor) / factor in the base format.

    Models P * S before the cast to e4m3 and / S after (arXiv 2606.06521's static
    scale S = 256; dividing by a power of two is exact). torch_dtype stays None so the
    engine's Arith.rnd takes its generic path (fmt.round on the float64 carrier).
    """

    factor: float = 1.0

    def round(self, x, rounding="nearest", generator=None, saturate=None):
        base = Format(self.name, self.p, self.emin, self.emax, self.max_override,
                      self.has_inf, self.saturate)
        y = base.round(x.to(torch.float64) * self.factor, rounding, generator, saturate)
        return y / self.factor


def scaled(fmt: Format, factor: float) -> ScaledFormat:
    """`fmt` cast with a static scale `factor` (see ScaledFormat)."""
    return ScaledFormat(f"{fmt.name}*{factor:g}", fmt.p, fmt.emin, fmt.emax, fmt.max_override,
                        fmt.has_inf, fmt.saturate, None, float(factor))


def quantize_tiles(x: torch.Tensor, fmt: Format = E4M3, block: int | None = None) -> torch.Tensor:
    """Scaled quantization to `fmt`, dequantized: round(x / s) * s with s = amax / fmt.max.

    block=None: one s per tensor (every batch and head together: per-tensor scaling).
    block=b:    one s per block of b rows of each head (FA3's block quantization).
    Computed in the float64 carrier; s is not rounded (a real kernel keeps it in fp32).
    """
    x = x.to(torch.float64)
    if block is None:
        s = x.abs().amax() / fmt.max
        s = torch.where(s > 0, s, torch.ones_like(s))
        return fmt.round(x / s) * s
    *lead, n, d = x.shape
    nb = math.ceil(n / block)
    pad = nb * block - n
    xp = torch.cat([x, x.new_zeros(*lead, pad, d)], dim=-2) if pad else x
    xb = xp.reshape(*lead, nb, block, d)
    s = xb.abs().amax(dim=(-1, -2), keepdim=True) / fmt.max
    s = torch.where(s > 0, s, torch.ones_like(s))
    return (fmt.round(xb / s) * s).reshape(*lead, nb * block, d)[..., :n, :]


def random_hadamard(d: int, heads: int, seed: int = 0) -> torch.Tensor:
    """(heads, d, d) orthogonal matrices diag(signs) H / sqrt(d), random signs per head.

    FA3's incoherent processing: Q H and K H with the same H per head, so that
    (Q H)(K H)^T = Q K^T in exact arithmetic while outliers spread over all d dims.
    """
    from scipy.linalg import hadamard

    if d & (d - 1):
        raise ValueError(f"incoherent processing needs a power-of-two head dim, got d={d}")
    h = torch.from_numpy(hadamard(d).astype(np.float64)) / math.sqrt(d)
    g = torch.Generator().manual_seed(int(seed))
    signs = torch.randint(0, 2, (heads, d, 1), generator=g, dtype=torch.int64) * 2 - 1
    return signs.to(torch.float64) * h


def smooth_k(k: torch.Tensor) -> torch.Tensor:
    """K minus its mean over the keys (SageAttention's smoothing): every logit of a query
    row shifts by the same q . mean(k), which softmax ignores, and K loses its common
    channel offset before it is quantized."""
    k = k.to(torch.float64)
    return k - (rowsum(k.transpose(-1, -2), "fp64") / k.shape[-2]).unsqueeze(-2)


TRANSFORMS = ("none", "smooth_k", "hadamard", "smooth_k+hadamard")


def transform_inputs(q, k, v, transform: str = "none", seed: int = 0):
    """Q, K, V (float64) after an input transform of TRANSFORMS, before any rounding:
    smooth_k subtracts K's mean over the keys (SageAttention); hadamard rotates Q and K by
    the same random Hadamard matrix per K/V head (FA3's incoherent processing; query heads
    sharing a K/V head under GQA share its matrix). Both leave softmax(Q K^T) unchanged in
    exact arithmetic. flashnum.attention(..., input_transform=) applies it."""
    if transform not in TRANSFORMS:
        raise ValueError(f"unknown input transform {transform!r}; valid: {', '.join(TRANSFORMS)}")
    q, k, v = (x.to(torch.float64) for x in (q, k, v))
    if "smooth_k" in transform:
        k = smooth_k(k)
    if "hadamard" in transform:
        d = q.shape[-1]
        heads = k.shape[-3] if k.ndim >= 3 else 1
        h = random_hadamard(d, heads, seed)
        if k.ndim < 3:
            h = h[0]
        g = q.shape[-3] // heads if q.ndim >= 3 else 1
        q, k = dot(q, h.repeat_interleave(g, dim=0) if g > 1 else h, "fp64"), dot(k, h, "fp64")
    return q, k, v


def prepare_inputs(q, k, v, fmt=None, *, smooth: bool = False, hadamard: bool = False,
                   seed: int = 0):
    """Q, K, V as a low-precision kernel stores them: optionally K smoothed and Q, K rotated
    by a random Hadamard matrix per head (transform_inputs), then each quantized into the
    block format `fmt` along the head dim (None: left in float64)."""
    name = "+".join(t for t, on in (("smooth_k", smooth), ("hadamard", hadamard)) if on)
    q, k, v = transform_inputs(q, k, v, name or "none", seed)
    if fmt is not None:
        q, k, v = (quantize(x, fmt, -1) for x in (q, k, v))
    return q, k, v
