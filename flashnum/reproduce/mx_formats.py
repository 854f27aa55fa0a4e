"""mxfp8/mxfp6/mxfp4/nvfp4 (and per-tensor fp8) on Q, K, V (head dim), on P (key axis,
before P @ V), or both, over the input catalogue; K smoothing and the Hadamard rotation
for the narrowest formats. The reference is fp64 softmax attention of the unrounded
inputs (their quantization is the thing measured).

    python -m flashnum.run experiment=repro_block_scaled
"""

from __future__ import annotations

import math

import pandas as pd

from flashnum.api import attention
from flashnum.inputs.distributions import make
from flashnum.numerics.accumulate import mean
from flashnum.numerics.blockscaled import prepare_inputs
from flashnum.numerics.policy import make_policy
from flashnum.reproduce.measure import (
    softmax64,
)
from flashnum.reproduce.reproduction import Reproduction

BS_SIZES = dict(
    quick=dict(n=256, heads=1, rows=32, d=64, dists=["gaussian", "fa3_outliers"],
               formats=["mxfp8_e4m3", "mxfp4", "nvfp4"]),
    full=dict(n=1024, heads=2, rows=64, d=64,
              dists=["gaussian", "fa3_outliers", "scaled", "late_max", "early_max", "ramp",
                     "ties", "sink", "plateau", "outlier_channels", "heavy_tail"],
              formats=["mxfp8_e4m3", "mxfp8_e5m2", "mxfp6_e3m2", "mxfp6_e2m3", "mxfp4",
                       "nvfp4", "nvfp4_row", "nvfp4_1l", "fp8_e4m3_tensor"]),
)


def _bs_cases(formats):
    """(format, site, transform): Q/K/V alone, P alone (one- and two-level nvfp4), both;
    smoothing and rotation for the 4- and 6-bit formats at the inputs."""
    for fmt in formats:
        yield fmt, "qkv", "none"
        yield fmt, "p", "none"
        yield fmt, "qkv+p", "none"
        if fmt in ("mxfp4", "nvfp4", "mxfp6_e2m3"):
            yield fmt, "qkv", "smooth_k"
            yield fmt, "qkv", "hadamard"
            yield fmt, "qkv", "smooth_k+hadamard"


def block_scaled(quick: bool = False, seed: int = 0) -> pd.DataFrame:
    """Max and RMS error of fa2 (fp32 softmax state and dots) with block-scaled Q, K, V
    (quantized along the head dim, K optionally smoothed and Q, K rotated first) and/or P
    (quantized along the key axis in each key block of 64 before P @ V; l sums the
    unquantized P, as FA2 kernels do). Reference: fp64 attention of the unquantized inputs.
    """
    sz = BS_SIZES["quick" if quick else "full"]
    base = make_policy("fa2", "fp32").with_sites(out="fp64")
    rows = []
    for dist in sz["dists"]:
        inp = make(dist, heads=sz["heads"], seq_len_q=sz["rows"], seq_len_k=sz["n"],
                   head_dim=sz["d"], seed=seed)
        q, k, v = inp.tensors()
        scale = 1.0 / math.sqrt(sz["d"])
        ref = softmax64(q, k, v, scale)
        for fmt, site, transform in _bs_cases(sz["formats"]):
            if "qkv" in site:
                qq, kq, vq = prepare_inputs(q, k, v, fmt, smooth="smooth_k" in transform,
                                            hadamard="hadamard" in transform, seed=seed)
            else:
                qq, kq, vq = q, k, v
            pol = base.with_sites(p_cast=fmt if "p" in site.split("+") else "fp32",
                                  name=f"fa2_fp32_{site}_{fmt}")
            res = attention(qq, kq, vq, policy=pol, scale=scale, block_n=64)
            err = res.out - ref
            rows.append(dict(distribution=dist, format=fmt, site=site, transform=transform,
                             n=sz["n"], d=sz["d"], heads=sz["heads"], query_rows=sz["rows"],
                             max_abs_err=float(err.abs().max()),
                             rmse=float(mean(err.pow(2)).sqrt())))
    return pd.DataFrame(rows)


REPRODUCTION = Reproduction(
    "block_scaled", block_scaled, BS_SIZES,
    display=[
        "distribution", "format", "site", "transform", "max_abs_err", "rmse"])
