"""Floating-point formats and rounding into them.

A `Format` is a binary floating-point format described by its precision p
(significand bits, the implicit bit included), its exponent range [emin, emax]
and its overflow behaviour. `fmt.round(x)` takes a float64 tensor and returns a
float64 tensor whose every element is representable in `fmt`, exactly as a
correctly rounded operation of that format would deliver it.

    from flashnum.numerics.formats import get_format   # every format by name
    bf16 = get_format("bf16")
    y = bf16.round(x)                      # round to nearest, ties to even
    y = bf16.round(x, "stochastic", gen)   # stochastic rounding, seeded generator
    bf16.u, bf16.max, bf16.min_normal, bf16.min_subnormal

Why our own rounding instead of torch's casts: torch converts float64 to
float16/bfloat16 through float32, which rounds twice and is wrong on about one
input in 2^29 (double rounding). Rounding from the float64 carrier in one step
is what Higham & Pranesh's chop and CPFloat do; fp64 as carrier gives correctly
rounded results for every target of <= 26 significand bits. The tests check
it against torch's own casts on float32 inputs (where no double rounding can
occur) and against exact rational arithmetic on float64 inputs, where torch
and ml_dtypes both double-round (e.g. -0.7402343453901017 -> bf16: both give
-0.7421875, the nearest is -0.73828125).

Overflow, per format (what the real format does):
  fp32, tf32, fp16, bf16, fp8_e5m2: IEEE; |x| >= (2 - 2^-p) 2^emax rounds to inf.
  fp8_e4m3 (OCP "e4m3fn", no infinities, max 448): saturates to +-448, as the
      hardware conversions used by FlashAttention-3 and Transformer Engine do
      (cvt ... .satfinite) and torch's float8_e4m3fn cast does (checked in the
      tests). `saturate=False` gives the raw OCP cast instead: |x| > 464 -> NaN
      (464 itself is the tie between 448 and the NaN encoding 480: it goes to even 448).
Subnormals are kept (gradual underflow) in every format; no flush to zero.
NaN stays NaN; +-inf stays +-inf (for e4m3 with saturation it becomes +-448).

`mp` is mpmath at `mp_bits` significand bits with an unbounded exponent; it has
no tensor rounding (the engine runs it through mpmath itself), but it knows its u.
`exact` is no rounding at all (u = 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

ROUNDINGS = ("nearest", "stochastic")


@dataclass(frozen=True)
class Format:
    """A binary floating-point format: p significand bits, exponents emin..emax."""

    name: str
    p: int  # significand bits, implicit bit included
    emin: int  # exponent of the smallest normal number
    emax: int  # exponent of the largest finite number
    max_override: float | None = None  # formats whose top encodings are NaN (e4m3)
    has_inf: bool = True
    saturate: bool = False  # overflow goes to +-max instead of inf/NaN
    torch_dtype: torch.dtype | None = None  # the native dtype, when torch has one

    @property
    def u(self) -> float:
        """Unit roundoff 2^-p (half the spacing of the numbers in [1, 2))."""
        return 2.0 ** (-self.p)

    @property
    def eps(self) -> float:
        """Machine epsilon 2^(1-p): the spacing of the numbers in [1, 2)."""
        return 2.0 ** (1 - self.p)

    @property
    def max(self) -> float:
        """Largest finite number."""
        if self.max_override is not None:
            return self.max_override
        return (2.0 - 2.0 ** (1 - self.p)) * 2.0**self.emax

    @property
    def min_normal(self) -> float:
        return 2.0**self.emin

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (self.emin - self.p + 1)

    @property
    def overflow_threshold(self) -> float:
        """Where round-to-nearest leaves the finite numbers: |x| >= this overflows (IEEE
        formats, whose tie at the threshold goes to the even infinity); for e4m3, whose
        max 448 = 1.110b * 2^8 is even, the tie itself stays finite and |x| > this overflows."""
        if self.max_override is not None:
            return self.max + 2.0 ** (self.emax - self.p + 1) / 2
        return (2.0 - 2.0**-self.p) * 2.0**self.emax

    def ulp(self, x: torch.Tensor) -> torch.Tensor:
        """Spacing of the format at |x| (the distance to the next larger magnitude)."""
        x = x.to(torch.float64).abs()
        e = torch.frexp(x).exponent.to(torch.float64) - 1
        e = torch.clamp(e, min=self.emin)
        return torch.exp2(e - (self.p - 1))

    def round(
        self,
        x: torch.Tensor,
        rounding: str = "nearest",
        generator: torch.Generator | None = None,
        saturate: bool | None = None,
    ) -> torch.Tensor:
        """Round a tensor into this format; returns float64.

        rounding="nearest": round to nearest, ties to even.
        rounding="stochastic": round up with probability (x - down) / (up - down),
        using `generator` (required, so that every run is reproducible).
        """
        if rounding not in ROUNDINGS:
            raise ValueError(f"unknown rounding {rounding!r}; valid: {', '.join(ROUNDINGS)}")
        x = x.to(torch.float64)
        if self.p >= 53 and self.emin <= -1022:
            return x  # fp64 into fp64
        if rounding == "nearest" and self.torch_dtype is torch.float32:
            # float64 -> float32 is a single correctly rounded conversion
            return x.to(torch.float32).to(torch.float64)
        if rounding == "nearest":
            y = _nearest(x, self.p, self.emin, self._round_general)
        else:
            y = self._round_general(x, rounding, generator)
        sat = self.saturate if saturate is None else saturate
        over = y.abs() > self.max
        if bool(over.any()):
            if sat:
                y = torch.where(over, torch.copysign(torch.tensor(self.max, dtype=y.dtype), y), y)
            elif self.has_inf:
                y = torch.where(over, torch.copysign(torch.tensor(math.inf, dtype=y.dtype), y), y)
            else:
                y = torch.where(over, torch.tensor(math.nan, dtype=y.dtype), y)
        return y

    def _round_general(self, x, rounding, generator) -> torch.Tensor:
        """Any finite value into [p bits, emin..inf): scaled to an integer, rounded, scaled
        back (subnormals included); non-finite values pass through. Overflow is the
        caller's."""
        finite = torch.isfinite(x)
        xf = torch.where(finite, x, torch.zeros((), dtype=x.dtype))
        # exponent of x, clamped at emin so that subnormals share one spacing
        e = torch.frexp(xf).exponent.to(torch.int32) - 1
        e = torch.clamp(e, min=self.emin)
        scale = torch.exp2((e - (self.p - 1)).to(torch.float64))  # exact powers of two
        t = xf / scale  # exact: division by a power of two, far from fp64's limits
        if rounding == "nearest":
            r = torch.round(t)  # half to even
        else:
            if generator is None:
                raise ValueError("stochastic rounding needs a seeded torch.Generator")
            noise = torch.rand(t.shape, generator=generator, dtype=torch.float64)
            r = torch.floor(t + noise)
        y = r * scale
        return torch.where(finite, y, x)

    def representable(self, x: torch.Tensor) -> bool:
        """True when every finite element of x is a number of this format."""
        x = x.to(torch.float64)
        f = torch.isfinite(x)
        return bool(torch.equal(self.round(x)[f], x[f]))

    def __str__(self) -> str:
        return self.name


_CHUNK = 1 << 20  # elements per pass (8 MiB): 1.6x less CPU than whole-tensor passes on
# one thread; far smaller chunks cost more in intra-op thread start-ups than they save


def _nearest(x: torch.Tensor, p: int, emin: int, general) -> torch.Tensor:
    """x (float64) rounded to p significand bits, ties to even. Normal values on their
    bits: add just under half a unit in the last kept place (plus the kept last bit, for
    ties to even) and clear the dropped bits; a carry out of the significand bumps the
    exponent, as it must. Right only where the format has no subnormals below x: the
    elements below 2^emin (not 0), infinities and NaNs go through `general` (the
    scaled-integer path, Format._round_general). Bit for bit what the general path gives
    (tests/test_rounding_paths.py), at a fraction of its CPU time. In chunks of _CHUNK."""
    if x.numel() <= _CHUNK:
        return _nearest_chunk(x, p, emin, general)
    flat = x.reshape(-1)
    out = torch.empty_like(flat)
    for i in range(0, flat.numel(), _CHUNK):
        out[i : i + _CHUNK] = _nearest_chunk(flat[i : i + _CHUNK], p, emin, general)
    return out.view(x.shape)


def _nearest_chunk(x: torch.Tensor, p: int, emin: int, general) -> torch.Tensor:
    drop = 53 - p  # float64's significand keeps 52 bits after the point
    b = x.view(torch.int64)
    half = (b >> drop) & 1
    half += (1 << (drop - 1)) - 1
    b = b + half
    b &= ~((1 << drop) - 1)
    y = b.view(torch.float64)
    a = x.abs()
    other = (a < 2.0**emin) & (a != 0) | ~(a < math.inf)  # subnormal in the format, inf, NaN
    if bool(other.any()):
        y[other] = general(x[other], "nearest", None)
    return y


@dataclass(frozen=True)
class Exact:
    """No rounding: the value is kept in the float64 carrier (u taken as 0)."""

    name: str = "exact"
    p: int = 53
    u: float = 0.0

    def round(self, x, rounding="nearest", generator=None, saturate=None):
        return x.to(torch.float64)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class MP:
    """mpmath at `bits` significand bits; the engine's mp backend uses it."""

    bits: int = 256

    @property
    def name(self) -> str:
        return f"mp{self.bits}"

    @property
    def p(self) -> int:
        return self.bits

    @property
    def u(self) -> float:
        return 2.0 ** (-self.bits)

    def __str__(self) -> str:
        return self.name


FORMATS: dict[str, Format] = {
    "fp64": Format("fp64", 53, -1022, 1023, torch_dtype=torch.float64),
    "fp32": Format("fp32", 24, -126, 127, torch_dtype=torch.float32),
    # TF32: fp32's exponent range with fp16's 10 stored significand bits.
    # NVIDIA's cvt.rna.tf32.f32 rounds ties away from zero; we round ties to
    # even (they differ only on exact ties). Triton's "tf32x3" splits into 3 dots.
    "tf32": Format("tf32", 11, -126, 127),
    "fp16": Format("fp16", 11, -14, 15, torch_dtype=torch.float16),
    "bf16": Format("bf16", 8, -126, 127, torch_dtype=torch.bfloat16),
    "fp8_e4m3": Format(
        "fp8_e4m3", 4, -6, 8, max_override=448.0, has_inf=False, saturate=True,
        torch_dtype=getattr(torch, "float8_e4m3fn", None),
    ),
    "fp8_e5m2": Format(
        "fp8_e5m2", 3, -14, 15, torch_dtype=getattr(torch, "float8_e5m2", None)
    ),
}
EXACT = Exact()
PRECISIONS = tuple(FORMATS) + ("mp",)  # the precisions a user may ask for
FORMAT_NAMES = tuple(FORMATS) + ("exact",)  # what a site may be given
