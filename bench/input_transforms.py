"""What K smoothing and the Hadamard rotation do to low-precision inputs' error.

    python bench/input_transforms.py [--out bench/results/input_transforms.json]

RMSE of fa2 (fp32 dots and softmax state, output in fp64) with Q, K, V stored in a
low-precision or block-scaled format, against fp64 attention of the untransformed,
unquantized inputs; per seed 0-2, as a ratio without / with the transform (above 1: the
transform helps). Two inputs: K with a per-channel offset 8x its spread (SageAttention's
case for smoothing) and FA3's outlier inputs (fa3_outliers, the rotation's case); 2 heads,
64 queries, 512 keys, d = 64. tests/test_input_transform.py asserts the direction on the
same inputs; docs/formats.md quotes the ranges printed here.
"""

import argparse
import json

import torch

from flashnum.engine import attention
from flashnum.inputs.distributions import make
from flashnum.numerics.policy import make_policy
from flashnum.reference import plain64

SCALE = 0.125


def channel_offset(seed: int):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 64, 64, generator=g, dtype=torch.float64)
    k = (torch.randn(2, 512, 64, generator=g, dtype=torch.float64)
         + 8 * torch.randn(2, 1, 64, generator=g, dtype=torch.float64))
    v = torch.randn(2, 512, 64, generator=g, dtype=torch.float64)
    return q, k, v


def outliers(seed: int):
    return make("fa3_outliers", heads=2, seq_len_q=64, seq_len_k=512, head_dim=64,
                seed=seed).tensors()


def rmse(fmt, transform, q, k, v, seed):
    pol = make_policy("fa2", "fp32").with_sites(inputs=fmt, out="fp64")
    out = attention(q, k, v, policy=pol, scale=SCALE, input_transform=transform, seed=seed).out
    return float((out - plain64(q, k, v, scale=SCALE)).pow(2).mean().sqrt())


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for inputs, make_inputs in (("channel_offset", channel_offset), ("fa3_outliers", outliers)):
        for fmt in ("fp8_e4m3", "fp8_e4m3_tensor", "mxfp8_e4m3", "nvfp4"):
            for transform in ("smooth_k", "hadamard", "smooth_k+hadamard"):
                ratios = []
                for seed in range(3):
                    q, k, v = make_inputs(seed)
                    ratios.append(rmse(fmt, "none", q, k, v, seed)
                                  / rmse(fmt, transform, q, k, v, seed))
                rows.append(dict(inputs=inputs, format=fmt, transform=transform,
                                 ratios=ratios))
                print(f"{inputs:15s} {fmt:16s} {transform:18s} without / with: "
                      f"{min(ratios):.2f}-{max(ratios):.2f}")
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(rows, fh, indent=1)
            fh.write("\n")


if __name__ == "__main__":
    main()
