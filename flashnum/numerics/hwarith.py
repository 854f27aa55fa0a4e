"""Kernel arithmetic that is not a plain rounding: FA4's software exp2, the fp8 MMA
accumulator.

    from flashnum.numerics.hwarith import exp2_poly, POLY3, FP22, FP32_POLY3
    y = exp2_poly(x)            # x float32 tensor -> FlashAttention-4's emulated 2^x, float32
    Policy(p="fp32_poly3", ...) # the exp site evaluated by that polynomial (variant exp2)
    Policy(pv_acc="fp22", ...)  # the Hopper fp8 MMA accumulator (SageAttention2's "FP22")

exp2_poly: FlashAttention-4 (flash_attn/cute/utils.py, ex2_emulation) computes part of
its exponentials on the FMA pipe instead of the MUFU unit:
    x <- max(x, -127)
    j <- fp32(x + (2^23 + 2^22)) rounded toward -inf   (floor(x) lands in the low bits)
    f <- x - (j - (2^23 + 2^22))                       (f in [0, 1), exact)
    p <- ((C3 f + C2) f + C1) f + C0                   (three fp32 FMAs, Horner)
    2^x <- the fp32 whose bits are bits(p) + (floor(x) << 23)   (exponent add, no rounding)
with C0..C3 = 1, 0.695146143436431884765625, 0.227564394474029541015625,
0.077119089663028717041015625: the degree-3 coefficients in FA4's POLY_EX2 table (a
minimax-type fit of 2^f on [0, 1) with p(0) = 1 exact; all four are fp32 numbers). Its
relative error as an approximation is max |p(f) / 2^f - 1| ~ 8.8e-5 ~ 2^-13.5 (measured in
tests/test_fa4.py on a dense grid in exact arithmetic), far above fp32's rounding
(2^-24) and below bf16's (2^-9): P is then cast to bf16 or fp8, whose rounding dominates.
FMA: an fp32 a * b + c rounded once; here the product is exact in float64 and the sum is
rounded to float64 then to fp32 (equal to a true FMA except on a double-rounding tie, about
one argument in 2^29). For x with floor(x) <= -127 the exponent field becomes 0 and the
bits read as a subnormal, as on the GPU (ftz then flushes such a P to 0 in later ops; we
keep the subnormal: below 2^-126 it makes no difference to attention).

FP22: SageAttention2 (Zhang et al. 2025, section 4.2) reports that Hopper's fp8 MMA
(mma.sync / wgmma with f8 inputs and an f32 accumulator) keeps only 22 bits of its
accumulator: 1 sign, 8 exponent and 13 mantissa bits; DeepSeek-V3 (section 3.3.2)
measures "around 14 bits" of accumulation precision on H800. We model it as a format of
p = 14 significant bits with fp32's exponent range, each addition into the accumulator
rounded toward zero (the products of two fp8 numbers are exact in it). What that models:
`pv_acc="fp22"` accumulates each block's P V in that register; with `o="fp32"` the block
result is then added to an fp32 O (the two-level fix of SageAttention2 and DeepSeek-V3:
promote to fp32 after each block of 64-128 products); with `o="fp22"` the O accumulator
itself stays in the MMA register across key blocks (one level). Not modelled: the order
within an MMA's k-group of 32 products (we add them one at a time).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from flashnum.numerics.formats import Format

POLY3 = (1.0, 0.695146143436431884765625, 0.227564394474029541015625,
         0.077119089663028717041015625)  # FA4 POLY_EX2[3]: C0, C1, C2, C3
_ROUND_INT = float(2**23 + 2**22)


def _fma32(a: torch.Tensor, b: torch.Tensor, c: float) -> torch.Tensor:
    """fp32 a * b + c (see the module docstring on how it is rounded)."""
    return (a.to(torch.float64) * b.to(torch.float64) + c).to(torch.float32)


def exp2_poly(x: torch.Tensor, poly=POLY3) -> torch.Tensor:
    """FA4's emulated 2^x on float32 x (finite or -inf; x <= 127): float32."""
    x = torch.clamp(x.to(torch.float32), min=-127.0)
    # fp32 add rounded toward -inf: floor of the exact sum is what add.rm gives for this
    # magic constant (|x| < 2^22: the sum's ulp is 1, so rm(x + C) = floor(x) + C)
    j = torch.floor(x.to(torch.float64)).to(torch.int32)
    f = (x.to(torch.float64) - j.to(torch.float64)).to(torch.float32)  # exact: f in [0, 1)
    p = torch.full_like(f, poly[-1])
    for c in reversed(poly[:-1]):
        p = _fma32(p, f, c)
    bits = p.view(torch.int32) + (j << 23)  # the exponent add of combine_int_frac_ex2
    return bits.view(torch.float32)


@dataclass(frozen=True)
class PolyExpFormat(Format):
    """fp32 whose exp site is FA4's polynomial exp2 (natural exp goes through log2(e))."""

    def exp(self, x: torch.Tensor, base2: bool) -> torch.Tensor:
        x32 = x.to(torch.float32)
        if not base2:
            x32 = (x.to(torch.float64) * (1 / math.log(2))).to(torch.float32)
        return exp2_poly(x32)


@dataclass(frozen=True)
class TruncFormat(Format):
    """A format whose rounding is toward zero (an accumulator that drops low bits)."""

    def round(self, x, rounding="nearest", generator=None, saturate=None):
        x = x.to(torch.float64)
        finite = torch.isfinite(x)
        xf = torch.where(finite, x, torch.zeros((), dtype=x.dtype))
        e = torch.clamp(torch.frexp(xf).exponent.to(torch.int32) - 1, min=self.emin)
        scale = torch.exp2((e - (self.p - 1)).to(torch.float64))
        y = torch.trunc(xf / scale) * scale
        y = torch.where(finite, y, x)
        return torch.where(y.abs() > self.max, torch.copysign(torch.tensor(math.inf), y), y)


FP32_POLY3 = PolyExpFormat("fp32_poly3", 24, -126, 127, torch_dtype=torch.float32)
FP22 = TruncFormat("fp22", 14, -126, 127)
HW_FORMATS = {"fp32_poly3": FP32_POLY3, "fp22": FP22}
