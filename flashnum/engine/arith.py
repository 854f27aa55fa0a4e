"""Arithmetic on the emulator's carrier: where and how a value is rounded.

    from flashnum.engine.arith import Arith, carrier, wider
    ar = Arith(policy, rounding="nearest", seed=0, dtype=carrier(policy))
    ar.site(x, "p_cast")          # round x into the format of site p_cast
    ar.exp(x, fmt), ar.dot(a, b, fmt), ar.rowsum(x, fmt)

Every elementwise operation is computed exactly enough on the carrier (float32 when
every site is fp32 or narrower, else float64) and rounded once into its site's format;
reductions accumulate in their site's format (see flashnum.engine for the whole model),
in flashnum's own order (flashnum.numerics.accumulate: a dot is one FMA chain over k from
+0, a row sum ATen's cascade with fixed lanes; a narrower format adds one term at a time,
each product and partial sum rounded), never in a library's.
The fp32 exp site and bf16 casts may run in flashnum.engine.native's C kernel: the same
values on every input.
"""

from __future__ import annotations

import torch

from flashnum.engine import native
from flashnum.numerics import accumulate, elementary
from flashnum.numerics.formats import EXACT, FORMATS, Exact, Format
from flashnum.numerics.policy import PRODUCT_SITES, Policy


def wider(f, g):
    """The more precise of two formats (exact beats everything)."""
    if isinstance(f, Exact) or isinstance(g, Exact):
        return EXACT
    return f if (f.p, -f.emin) >= (g.p, -g.emin) else g


class Arith:
    """Correctly rounded arithmetic into site formats, on a float32 or float64 carrier."""

    def __init__(self, policy: Policy, rounding: str, seed: int, dtype: torch.dtype):
        self.policy = policy
        self.stochastic = rounding == "stochastic"
        self.gen = torch.Generator().manual_seed(int(seed)) if self.stochastic else None
        self.dtype = dtype
        self._fmts = {}  # site -> format, looked up once per run (the policy is fixed)

    def fmt(self, site: str):
        f = self._fmts.get(site)
        if f is None:
            f = self._fmts[site] = self.policy.fmt(site)
        return f

    def rnd(self, x: torch.Tensor, fmt, nearest: bool = False) -> torch.Tensor:
        if fmt is EXACT or fmt.p >= 53:
            return x
        stochastic = self.stochastic and not nearest
        if x.dtype is torch.float32 and not stochastic:
            if fmt.name == "fp32":
                return x  # fp32 ops on the fp32 carrier are already rounded once
            if fmt.torch_dtype is not None and fmt.saturate == (fmt.name == "fp8_e4m3"):
                # torch's fp32 -> low cast is one round-to-nearest-even (checked in tests);
                # a float64 value (the inputs) must not take it: fp64 -> fp32 -> low
                # would round twice. bf16: the native kernel's one pass, the same values
                y = native.round_bf16(x) if fmt.name == "bf16" else None
                return x.to(fmt.torch_dtype).to(torch.float32) if y is None else y
        rounding = "stochastic" if stochastic else "nearest"
        y = fmt.round(x.to(torch.float64), rounding, self.gen)
        return y.to(self.dtype)

    def site(self, x: torch.Tensor, site: str, nearest: bool = False) -> torch.Tensor:
        return self.rnd(x, self.fmt(site), nearest)

    def exp(self, x: torch.Tensor, fmt, base2: bool = False) -> torch.Tensor:
        if hasattr(fmt, "exp"):  # a format with its own exp (FA4's polynomial exp2)
            return fmt.exp(x, base2).to(self.dtype)
        # the correctly rounded float64 exp (flashnum.numerics.elementary), rounded once
        # into the format
        if (x.dtype is torch.float32 and self.dtype is torch.float32 and not self.stochastic
                and fmt is not EXACT and fmt.name == "fp32"):
            y = torch.empty_like(x, memory_format=torch.contiguous_format)
            if native.exp_rows(x.contiguous(), None, y, base2=base2):  # the same fp32 values
                return y
        x64 = x.to(torch.float64)
        y = elementary.exp2(x64) if base2 else elementary.exp(x64)
        if fmt is EXACT or fmt.p >= 53:
            return y.to(self.dtype)
        if self.dtype is torch.float32 and fmt.name == "fp32" and not self.stochastic:
            y = y.to(torch.float32)
            if x.dtype is torch.float32:
                native.fix_float64(x, y, base2)  # the few inputs float64 alone misses
            return y
        rounding = "stochastic" if self.stochastic else "nearest"
        return fmt.round(y, rounding, self.gen).to(self.dtype)

    def dot(self, a: torch.Tensor, b: torch.Tensor, fmt, product=EXACT) -> torch.Tensor:
        """a @ b (batched), accumulated in `fmt` (see the module docstring); `product` the
        format each product is rounded into before its sum (a product site; EXACT: none,
        the dot is one FMA chain)."""
        if product is not EXACT:
            if not isinstance(product, Format):
                raise ValueError(f"a product site takes a plain format, not "
                                 f"{getattr(product, 'name', product)!r}; valid: bf16, fp16, "
                                 "fp32, p<bits>, exact")
            return self.product_dot(a, b, fmt, product)
        if fmt is EXACT or fmt.p >= 53:
            return accumulate.dot(a, b, "fp64").to(self.dtype)
        if hasattr(fmt, "dot"):  # an accumulator with its own adder (hwarith.KGroupFormat)
            return fmt.dot(a, b).to(self.dtype)
        if fmt.name in ("fp32", "tf32"):
            a32, b32 = a.to(torch.float32), b.to(torch.float32)
            if fmt.name == "tf32":  # tensor cores read tf32 operands, sum in fp32
                a32 = FORMATS["tf32"].round(a32.double()).float()
                b32 = FORMATS["tf32"].round(b32.double()).float()
            return accumulate.dot(a32, b32, "fp32").to(self.dtype)
        # recursive summation in a narrow format: every product and partial sum rounded
        acc = torch.zeros(a.shape[:-1] + b.shape[-1:], dtype=self.dtype)
        for t in range(a.shape[-1]):
            prod = self.rnd(a[..., :, t, None] * b[..., t, None, :], fmt)
            acc = self.rnd(acc + prod, fmt)
        return acc

    def product_dot(self, a: torch.Tensor, b: torch.Tensor, fmt, product) -> torch.Tensor:
        """a @ b with each exact product rounded into `product` (one rounding, from
        float64; fp64: the float64 product itself), then summed in order in `fmt`
        (flashnum.numerics.accumulate.product_dot; a narrow `fmt` rounds each partial sum
        too)."""
        def rounded(x64):
            return self.rnd(x64, product)

        if fmt is EXACT or fmt.p >= 53:
            return accumulate.product_dot(a, b, rounded, "fp64").to(self.dtype)
        if hasattr(fmt, "dot") or fmt.name == "tf32":
            raise ValueError(f"a product site in {product.name} before an accumulator in "
                             f"{fmt.name} is not modelled; valid accumulators: fp32, fp64, "
                             "exact or a plain format")
        if fmt.name == "fp32":
            if product.p > 24 or product.emin < -126:
                raise ValueError(f"a product in {product.name} is not an fp32 number: its "
                                 "sum in fp32 would round twice; valid: a format within fp32")
            return accumulate.product_dot(a, b, rounded, "fp32").to(self.dtype)
        acc = torch.zeros(a.shape[:-1] + b.shape[-1:], dtype=self.dtype)
        a64, b64 = a.to(torch.float64), b.to(torch.float64)
        for t in range(a.shape[-1]):
            prod = self.rnd(rounded(a64[..., :, t, None] * b64[..., t, None, :]), fmt)
            acc = self.rnd(acc + prod, fmt)
        return acc

    def rowsum(self, x: torch.Tensor, fmt) -> torch.Tensor:
        """Sum over the last dim, accumulated in `fmt`."""
        if fmt is EXACT or fmt.p >= 53:
            return accumulate.rowsum(x, "fp64").to(self.dtype)
        if fmt.name in ("fp32", "tf32"):
            return accumulate.rowsum(x, "fp32").to(self.dtype)
        acc = torch.zeros(x.shape[:-1], dtype=self.dtype)
        for t in range(x.shape[-1]):
            acc = self.rnd(acc + x[..., t], fmt)
        return acc


def carrier(policy: Policy) -> torch.dtype:
    """float32 iff every site is fp32 or narrower (exact +,-,*,/ then round once), else float64.
    An exact product site is no rounding (its dot is the accumulator's): it does not count."""
    for site in policy.sites():
        f = policy.fmt(site)
        if site in PRODUCT_SITES and isinstance(f, Exact):
            continue
        if isinstance(f, Exact) or f.p > 24 or f.emin < -126:
            return torch.float64
    return torch.float32
