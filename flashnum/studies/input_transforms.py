"""What K smoothing and the Hadamard rotation do to low-precision inputs' error: the table
of the experiment input_transforms (conf/table/input_transforms.yaml; docs/formats.md
quotes it).

    python -m flashnum.run experiment=input_transforms

RMSE of fa2 (fp32 dots and softmax state, output in fp64) with Q, K, V stored in a
low-precision or block-scaled format, against fp64 attention of the untransformed,
unquantized inputs; per seed, as a ratio without / with the transform (above 1: the
transform helps). Two inputs: K with a per-channel offset 8x its spread (SageAttention's
case for smoothing) and FA3's outlier inputs (fa3_outliers, the rotation's case); 2 heads,
64 queries, 512 keys, d = 64. tests/test_input_transform.py asserts the direction on the
same inputs.
"""

from __future__ import annotations

import pandas as pd
import torch

from flashnum.api import attention
from flashnum.inputs.distributions import make
from flashnum.numerics.accumulate import mean
from flashnum.numerics.policy import make_policy
from flashnum.reference import plain64

SCALE = 0.125
FORMATS = ("fp8_e4m3", "fp8_e4m3_tensor", "mxfp8_e4m3", "nvfp4")
TRANSFORMS = ("smooth_k", "hadamard", "smooth_k+hadamard")


def channel_offset(seed: int):
    """Gaussian Q, K, V with a common offset per channel of K, 8x its spread."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 64, 64, generator=g, dtype=torch.float64)
    k = (torch.randn(2, 512, 64, generator=g, dtype=torch.float64)
         + 8 * torch.randn(2, 1, 64, generator=g, dtype=torch.float64))
    v = torch.randn(2, 512, 64, generator=g, dtype=torch.float64)
    return q, k, v


def outliers(seed: int):
    return make("fa3_outliers", heads=2, seq_len_q=64, seq_len_k=512, head_dim=64,
                seed=seed).tensors()


INPUTS = {"channel_offset": channel_offset, "fa3_outliers": outliers}


def rmse(fmt: str, transform: str, q, k, v, seed: int) -> float:
    pol = make_policy("fa2", "fp32").with_sites(inputs=fmt, out="fp64")
    out = attention(q, k, v, policy=pol, scale=SCALE, input_transform=transform, seed=seed).out
    return float(mean((out - plain64(q, k, v, scale=SCALE)).pow(2)).sqrt())


def input_transforms_table(seeds=(0, 1, 2)) -> pd.DataFrame:
    """One row per (inputs, format, transform, seed): the RMSE without and with the
    transform and their ratio."""
    torch.set_num_threads(1)
    rows = []
    for inputs, make_inputs in INPUTS.items():
        for fmt in FORMATS:
            for transform in TRANSFORMS:
                for seed in seeds:
                    q, k, v = make_inputs(seed)
                    without = rmse(fmt, "none", q, k, v, seed)
                    with_ = rmse(fmt, transform, q, k, v, seed)
                    rows.append(dict(inputs=inputs, format=fmt, transform=transform,
                                     seed=seed, rmse_without=without, rmse_with=with_,
                                     ratio=without / with_))
    return pd.DataFrame(rows)
