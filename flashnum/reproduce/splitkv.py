"""Split-KV decoding: the error against the number of splits and the precision of the
stored partials (o, lse), Nq 1 and 16, GQA 4:1, Nk up to 131072.

    python -m flashnum.run experiment=repro_splitkv_decode
"""

from __future__ import annotations

import time

import pandas as pd
import torch

from flashnum.api import attention
from flashnum.numerics.accumulate import mean
from flashnum.numerics.formats import FORMATS
from flashnum.numerics.policy import make_policy
from flashnum.reproduce.measure import (
    softmax64,
)
from flashnum.reproduce.reproduction import Reproduction

SKV_SIZES = dict(
    quick=dict(shapes=[(4096, 1), (4096, 16)], splits=[1, 4, 16], precisions=["fp32", "bf16"]),
    full=dict(shapes=[(4096, 1), (4096, 16), (32768, 1), (131072, 1)], splits=[1, 8, 64],
              precisions=["fp32", "bf16"]),
)


def splitkv_decode(quick: bool = False, seed: int = 0) -> pd.DataFrame:
    """Max error of bf16 fa2 decoding with S splits against fp64 attention of the bf16
    inputs: 8 query heads sharing 2 K/V heads (GQA), d 64, gaussian logits of std ~2.5;
    partials stored in `split_precision`, merged in fp32, output kept in fp32 (a bf16
    output cast would hide the partials' rounding under its own). `cpu_s`: the CPU time
    of the emulated attention call (time.process_time).

    Runs on one torch thread: a decoding tile is 16 rows x 256 keys, and on such GEMMs
    torch's intra-op threads cost ~50x the CPU time of one thread on a busy machine
    (measured: 512 tile GEMMs 2.8 s on 2 threads, 0.05 s on 1); a GEMM this small has no
    split reduction, so the values do not depend on it (the stored table is reproduced
    bit for bit either way)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _splitkv_rows(SKV_SIZES["quick" if quick else "full"], seed)
    finally:
        torch.set_num_threads(threads)


def _splitkv_rows(sz: dict, seed: int) -> pd.DataFrame:
    rows = []
    bf16 = FORMATS["bf16"]
    pol = make_policy("fa2", "bf16").with_sites(out="fp32", name="fa2_bf16_out_fp32")
    for nk, nq in sz["shapes"]:
        g = torch.Generator().manual_seed(seed)
        k = bf16.round(torch.randn(1, 2, nk, 64, generator=g, dtype=torch.float64) * 0.4)
        v = bf16.round(torch.randn(1, 2, nk, 64, generator=g, dtype=torch.float64))
        q = bf16.round(torch.randn(1, 8, nq, 64, generator=g, dtype=torch.float64) * 0.8)
        ref = softmax64(q, k.repeat_interleave(4, -3), v.repeat_interleave(4, -3),
                        1 / 8.0)
        for splits in sz["splits"]:
            for prec in sz["precisions"]:
                t0 = time.process_time()
                res = attention(q, k, v, precision="bf16", policy=pol,
                                num_splits=splits, split_precision=prec, block_m=16,
                                block_n=256)
                cpu = time.process_time() - t0
                err = res.out - ref
                rows.append(dict(nk=nk, nq=nq, q_heads=8, kv_heads=2, num_splits=splits,
                                 split_precision=prec, block_n=256,
                                 max_abs_err=float(err.abs().max()),
                                 rmse=float(mean(err.pow(2)).sqrt()), cpu_s=cpu))
    return pd.DataFrame(rows)


REPRODUCTION = Reproduction(
    "splitkv_decode", splitkv_decode, SKV_SIZES,
    display=[
        "nk", "nq", "num_splits", "split_precision", "max_abs_err", "rmse", "cpu_s"])
