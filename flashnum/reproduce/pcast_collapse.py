"""arXiv 2606.06521's collapse threshold: P cast to e4m3 (static scale S) in forward order
flushes the non-sink P once the sink leads by more than Delta_c = 10 ln 2 + ln S -
delta_k (6.93 + ln S - delta_k); the lost mass against the sink strength, the predicted
threshold beside it.

    python -m flashnum.run experiment=repro_pcast_threshold
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from flashnum.api import attention
from flashnum.numerics import elementary
from flashnum.numerics.accumulate import dot
from flashnum.numerics.formats import FORMATS, get_format
from flashnum.numerics.policy import make_policy
from flashnum.reproduce.measure import (
    LN2,
    softmax64,
)
from flashnum.reproduce.reproduction import Reproduction

PCT_SIZES = dict(
    quick=dict(n=512, rows=4, deltas=[4.0, 8.0, 12.0, 16.0], scales=[1.0, 256.0],
               spreads=[0.0]),
    full=dict(n=4096, rows=8, deltas=[0.5 * i for i in range(4, 41)], scales=[1.0, 256.0],
              spreads=[0.0, 2.0]),
)
E4M3_HALF_SUB = 2.0**-10  # below half of e4m3's least subnormal 2^-9 a value rounds to 0


def sink_rows(delta: float, spread: float, n: int, rows: int, seed: int):
    """Logits (scale 1): key 0 at `delta` (the sink, value row 0), every other key uniform
    in [-spread, 0] (value rows 1): the output is the non-sink share of the softmax mass."""
    g = torch.Generator().manual_seed(seed)
    q = torch.zeros(1, rows, 1, dtype=torch.float64)
    q[0, :, 0] = 1.0
    k = -spread * torch.rand(1, n, 1, generator=g, dtype=torch.float64)
    k[0, 0, 0] = delta
    v = torch.ones(1, n, 1, dtype=torch.float64)
    v[0, 0] = 0.0
    return q, k, v


def pcast_threshold(quick: bool = False, seed: int = 0) -> pd.DataFrame:
    """Relative error (the non-sink mass lost) against the sink's lead, e4m3 P cast.

    Policy fa2 at fp32 (inputs fp32, as the paper keeps Q, K, V) with p_cast e4m3 times a
    static scale S. Forward order meets the sink first: every later P is
    exp(s - delta) S, flushed to 0 below 2^-10 (half e4m3's least subnormal). The first
    non-sink entry (at -spread) is lost from delta_c = 10 ln 2 + ln S - spread on (the
    paper's Delta_c = 6.93 + ln S - delta_k with delta_k = spread), every one from
    10 ln 2 + ln S on. Reverse order meets the sink last. `flushed_fraction` counts the
    non-sink entries whose scaled P rounds to 0 (fp64 logits, no engine).
    """
    sz = PCT_SIZES["quick" if quick else "full"]
    e4m3 = FORMATS["fp8_e4m3"]
    rows = []
    for spread in sz["spreads"]:
        for delta in sz["deltas"]:
            q, k, v = sink_rows(delta, spread, sz["n"], sz["rows"], seed)
            ref = softmax64(q, k, v, 1.0)
            s = dot(q, k.transpose(-1, -2), "fp64")[..., 1:]
            for factor in sz["scales"]:
                cast = get_format(f"fp8_e4m3*{factor:g}") if factor != 1 else e4m3
                pol = make_policy("fa2", "fp32").with_sites(p_cast=cast, name="fa2_fp32_e4m3")
                flushed = float((e4m3.round(elementary.exp(s - delta) * factor) == 0)
                                .double().mean())
                for order in ("forward", "reverse"):
                    res = attention(q, k, v, policy=pol, order=order, scale=1.0, block_n=64)
                    rel = float(((res.out - ref).abs() / ref.abs()).max())
                    rows.append(dict(
                        spread=spread, delta=delta, p_scale=factor, order=order, n=sz["n"],
                        query_rows=sz["rows"], rel_err=rel, flushed_fraction=flushed,
                        delta_c=10 * LN2 + math.log(factor) - spread,
                        delta_all=10 * LN2 + math.log(factor)))
    return pd.DataFrame(rows)


REPRODUCTION = Reproduction(
    "pcast_threshold", pcast_threshold, PCT_SIZES,
    display=[
        "spread", "delta", "p_scale", "order", "rel_err", "flushed_fraction", "delta_c",
        "delta_all"])
