"""Kernel arithmetic that is not a plain rounding: FA4's software exp2, the fp8 MMA
accumulator.

    from flashnum.numerics.hwarith import exp2_poly, POLY3, FP22, FP32_POLY3, kgroup_dot
    y = exp2_poly(x)            # x float32 tensor -> FlashAttention-4's emulated 2^x, float32
    Policy(p="fp32_poly3", ...) # the exp site evaluated by that polynomial (variant exp2)
    Policy(pv_acc="fp22", ...)  # the Hopper fp8 MMA accumulator (SageAttention2's "FP22")
    Policy(pv_acc="fp22_k32", ...)  # the same with its k-group adder (kgroup_dot)

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
itself stays in the MMA register across key blocks (one level). `fp22` adds the products
one at a time, each sum truncated to 14 bits.

FP22_K32 (`pv_acc="fp22_k32"`, `qk_acc` too): the adder inside one MMA k-group, as
DeepSeek-V3 (arXiv 2412.19437, section 3.3.2) describes Hopper's fp8 GEMM: "fixed-point
accumulation, aligning the mantissa products by right-shifting based on the maximum
exponent before addition ... it only uses the highest 14 bits of each mantissa product
after sign-fill right shifting, and truncates bits exceeding this range"; SageAttention2's
probe (A = B = 0, D = A B + C) returns C with its 10 low mantissa bits cut, so the
accumulator C passes through the same 14-bit window. Modelled (kgroup_sum): the k = 32
products of one fp8 k-group (wgmma's K for 8-bit inputs) and the accumulator are
aligned to the largest exponent among all 33, each cut to 14 bits below it, summed
exactly, and the sum stored in fp32; groups follow one another along the reduction
dim. Assumed, not published: that the accumulator joins the alignment (its window is
relative to the largest addend, not its own exponent; the probe cannot tell), that the
group sum is exact before it is stored (a 33-term sum of 14-bit values needs 20 bits,
within fp32), k = 32 for every fp8 shape, and the cut's direction for negative values:
"trunc" (toward zero; `fp22_k32`) or "floor" (two's complement sign-fill shift;
`fp22_k32_floor`). tests/test_fa4.py checks kgroup_sum and kgroup_dot against an
exact-rational implementation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from flashnum.numerics.floats import Format

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


def kgroup_sum(acc: torch.Tensor, terms: torch.Tensor, bits: int = 14,
               shift: str = "trunc") -> torch.Tensor:
    """One MMA k-group: acc (...) plus terms (..., k) by an aligned fixed-point adder.

    Every addend (the k products and the accumulator) is shifted to the largest exponent
    E among them and keeps the `bits` bits below 2^(E+1): its value is cut to a multiple
    of 2^(E + 1 - bits), toward zero (shift="trunc") or toward -inf (shift="floor", a
    two's complement "sign-fill" right shift); the cut addends are summed exactly (the
    sum of k + 1 numbers of at most `bits` bits on one grid needs bits + log2(k + 1) bits,
    within fp32's 24 for k <= 512) and the sum is written to the fp32 register as is.
    float64 in, float64 out (each term must be exact in float64: fp8 x fp8 products are).
    """
    if shift not in ("trunc", "floor"):
        raise ValueError(f"unknown shift {shift!r}; valid: trunc, floor")
    x = torch.cat([acc.unsqueeze(-1), terms], dim=-1).to(torch.float64)
    big = x.abs().amax(dim=-1, keepdim=True)
    e = torch.frexp(big).exponent.to(torch.int32)  # big in [2^(e-1), 2^e): E = e - 1
    grid = torch.exp2((e - bits).to(torch.float64))  # the last kept bit: 2^(E + 1 - bits)
    cut = torch.trunc(x / grid) if shift == "trunc" else torch.floor(x / grid)
    return (cut * grid).sum(dim=-1)  # exact: integers below 2^53 times one power of 2


def kgroup_dot(a: torch.Tensor, b: torch.Tensor, k: int = 32, bits: int = 14,
               shift: str = "trunc") -> torch.Tensor:
    """a @ b (batched, float64) as a chain of MMA k-groups: the reduction dim in groups of
    k products, each group added into the running accumulator by kgroup_sum (the
    accumulator starts at 0, as a fresh MMA tile does)."""
    a, b = a.to(torch.float64), b.to(torch.float64)
    acc = torch.zeros(a.shape[:-1] + b.shape[-1:], dtype=torch.float64)
    for g0 in range(0, a.shape[-1], k):
        prods = a[..., :, g0 : g0 + k, None] * b[..., None, g0 : g0 + k, :]  # (.., M, k, N)
        acc = kgroup_sum(acc, prods.movedim(-2, -1), bits, shift)
    return acc


@dataclass(frozen=True)
class KGroupFormat(TruncFormat):
    """The fp8 MMA accumulator with its k-group adder: as a dot site, kgroup_dot; as a
    storage site, truncation to p bits (TruncFormat)."""

    k: int = 32
    shift: str = "trunc"

    def dot(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return kgroup_dot(a, b, self.k, self.p, self.shift)


FP32_POLY3 = PolyExpFormat("fp32_poly3", 24, -126, 127, torch_dtype=torch.float32)
FP22 = TruncFormat("fp22", 14, -126, 127)
FP22_K32 = KGroupFormat("fp22_k32", 14, -126, 127)
FP22_K32_FLOOR = KGroupFormat("fp22_k32_floor", 14, -126, 127, shift="floor")
HW_FORMATS = {"fp32_poly3": FP32_POLY3, "fp22": FP22, "fp22_k32": FP22_K32,
              "fp22_k32_floor": FP22_K32_FLOOR}
