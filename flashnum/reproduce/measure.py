"""What every reproduction measures with: the fp64 references, the errors with their
standard errors over independent heads, ratios and the match factor."""

from __future__ import annotations

import math

import numpy as np
import torch

from flashnum.analysis.metrics import head_rmse, max_abs_err, signed_err
from flashnum.numerics import elementary
from flashnum.numerics.accumulate import dot, mean, rowsum, std
from flashnum.numerics.formats import FORMATS
from flashnum.numerics.policy import PRODUCT_SITES, SITES, Policy
from flashnum.reference import plain64

E4M3 = FORMATS["fp8_e4m3"]
LN2 = math.log(2.0)


def softmax64(q, k, v, scale: float) -> torch.Tensor:
    q, k, v = (x.to(torch.float64) for x in (q, k, v))
    s = dot(q, k.transpose(-1, -2), "fp64") * scale
    p = elementary.exp(s - s.amax(-1, keepdim=True))
    return dot(p, v, "fp64") / rowsum(p, "fp64")[..., None]




# ---------------------------------------------------------------------------
# shared pieces: the fp64 reference (scaled casts, quantization and rotation live in
# flashnum.numerics.blockscaled)


def reference64(q, k, v, scale: float) -> torch.Tensor:
    """softmax(scale Q K^T) V in float64, max-shifted (FA3's "attention in FP64")."""
    return plain64(q, k, v, scale=scale)


def uniform(precision: str) -> Policy:
    """Every site in `precision`, dot accumulations included (the textbook model)."""
    return Policy(**{s: precision for s in SITES if s not in PRODUCT_SITES}, name="uniform")


def head_mean_z(x: torch.Tensor) -> tuple[float, float, float]:
    """Mean of per-head values x (..., heads), its standard error over heads, and the z-score.

    The heads of one draw are independent (own Q, K, V), the rows and columns of one head
    are not (they share K and V), so the honest sample is one number per head.
    """
    x = x.reshape(-1).to(torch.float64)
    m = float(mean(x))
    se = float(std(x)) / math.sqrt(x.numel()) if x.numel() > 1 else math.nan
    z = m / se if se > 0 else (0.0 if m == 0 else math.copysign(math.inf, m))
    return m, se, z


def errors(out, ref) -> dict:
    """The measures every reproduction reports, with standard errors over heads."""
    e = out - ref
    r, r_se = head_rmse(out, ref)
    _, mse_se, _ = head_mean_z(mean(e.pow(2), (-1, -2)))
    m, se, z = head_mean_z(mean(e, (-1, -2)))
    return dict(max_abs_err=max_abs_err(out, ref), rmse=r, rmse_se=r_se, mse=r * r,
                mse_se=mse_se, mean_signed_err=m, signed_err_se=se, z_heads=z,
                z_entries=signed_err(out, ref)["signed_err_z"])


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else (math.nan if a == 0 else math.inf)


def match_factor(ours, published) -> float:
    """exp of the RMS of log(ours / published): 1 is a perfect match, 2 is 'off by ~2x'."""
    r = np.log(np.asarray(ours, dtype=float) / np.asarray(published, dtype=float))
    return float(np.exp(np.sqrt(np.mean(r**2))))
