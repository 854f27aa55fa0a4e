"""flash-attention #2716: P = exp(s - m) 2^offset cast to e4m3 / e5m2 under FA4's lazy
rescale threshold (log2 units), against the strength of a late attention sink; e4m3
saturates iff 2^offset e^growth > 448 with growth <= threshold, e5m2 (max 57344) does not.

    python -m flashnum.run experiment=repro_fp8_offset
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from flashnum.api import attention
from flashnum.numerics.formats import FORMATS, get_format
from flashnum.numerics.policy import Policy
from flashnum.reproduce.measure import (
    LN2,
    softmax64,
)
from flashnum.reproduce.reproduction import Reproduction

OFFSET_SIZES = dict(
    quick=dict(n=128, rows=4, offsets=[4, 8], thresholds=[4.0], growths=[1.0, 2.5, 5.0]),
    full=dict(n=256, rows=16, offsets=[0, 2, 4, 6, 8], thresholds=[0.0, 2.0, 4.0, 8.0],
              growths=[0.25 * i for i in range(1, 33)]),
)


def late_sink(growth: float, n: int, rows: int, seed: int):
    """Logits (scale 1): the first key block near 0, later keys at -4 but one sink key per
    row at `growth` (so the row max grows by ~growth when the sink's block arrives); the
    sink's value row is 4, the others in [-3, 3]."""
    g = torch.Generator().manual_seed(seed)
    d = 16
    q = torch.zeros(1, rows, d, dtype=torch.float64)
    q[0, :, 0] = 1.0
    k = torch.randn(1, n, d, generator=g, dtype=torch.float64)
    k[0, :64, 0] *= 0.1
    k[0, 64:, 0] = -4.0
    sink = 64 + n // 4
    k[0, sink, 0] = growth
    v = torch.randn(1, n, d, generator=g, dtype=torch.float64).clamp(-3, 3)
    v[0, sink] = 4.0
    return q, k, v


def fp8_offset(quick: bool = False, seed: int = 0) -> pd.DataFrame:
    """Max error of FA4-style fp8 P (offset, lazy threshold) against a late sink's growth.

    Policy: every site exact but p_cast = the format with a static scale 2^offset (P
    2^offset rounded, then / 2^offset: exact, as the kernel's o and l both carry the
    2^offset that cancels in o / l), l summed from the uncast P, variant lazy with
    tau = threshold ln 2 (FA4 keeps the threshold in log2 units). `predicted_saturation`:
    no rescale happened (growth <= tau) and 2^offset e^growth > the format max.
    `budget_ok`: offset + threshold <= log2(max), the fix of PR #2717.
    """
    sz = OFFSET_SIZES["quick" if quick else "full"]
    rows = []
    for growth in sz["growths"]:
        q, k, v = late_sink(growth, sz["n"], sz["rows"], seed)
        ref = softmax64(q, k, v, 1.0)
        vmax = float(v.abs().max())
        for fmt in ("fp8_e4m3", "fp8_e5m2"):
            f = FORMATS[fmt]
            for offset in sz["offsets"]:
                cast = get_format(f"{fmt}*{2 ** offset}")
                pol = Policy(p_cast=cast, l_from="p", name=f"fa4_p_{cast.name}")
                for thr in sz["thresholds"]:
                    res = attention(q, k, v, policy=pol, variant="lazy", tau=thr * LN2,
                                    scale=1.0, block_n=64)
                    err = float((res.out - ref).abs().max())
                    rescaled = bool((res.n_rescales > 0).any())
                    rows.append(dict(
                        format=fmt, offset=offset, threshold=thr, growth=growth, n=sz["n"],
                        query_rows=sz["rows"], block_n=64, max_abs_err=err,
                        err_over_u_vmax=err / (f.u * vmax), rescaled=rescaled,
                        predicted_saturation=(not rescaled
                                              and 2.0**offset * math.exp(growth) > f.max),
                        budget_ok=offset + thr <= math.log2(f.max)))
    return pd.DataFrame(rows)


REPRODUCTION = Reproduction(
    "fp8_offset", fp8_offset, OFFSET_SIZES,
    display=[
        "format", "offset", "threshold", "growth", "max_abs_err", "err_over_u_vmax",
        "rescaled", "predicted_saturation", "budget_ok"])
