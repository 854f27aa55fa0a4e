"""What docs/formats.md shows of block-scaled formats, input transforms and split-KV: tables
generated from experiments/block_scaled, input_transforms and splitkv_decode (TABLES), and
the cost of quantizing from bench/results/blockscaled.json (PASSAGES).
"""

from __future__ import annotations

import json

import pandas as pd

from flashnum.figures.docs.sources import bench, table
from flashnum.figures.docs.views import cell, view
from flashnum.figures.quoting import Passage, require


def block_scaled(F) -> pd.DataFrame:
    """experiments/block_scaled: the median max error over the distributions per P cast."""
    b = table(F, "block_scaled")
    require(bool(b.m_ok.all() and b.l_ok.all()), "m_ok and l_ok hold in every row")
    fmt = b.policy_sites.map(lambda s: json.loads(s)["p_cast"]).rename("P cast")
    med = b.groupby(fmt).max_abs_err.median().sort_values()
    return med.map(cell).reset_index(name="median max error")


def blockscaled_speed(F):
    b = bench(F, "blockscaled")
    r = [v / b["attention_fa2_bf16_s"] for k, v in b.items() if k.startswith("quantize_")]
    return [f"costs {min(r):.2f}-{max(r):.2f} of one emulated fa2 bf16 attention"]


TABLES = {"FormatsBlockScaled": block_scaled,
          "FormatsTransforms": view("input_transforms", "", ["ratio"],
                                    by=["inputs", "format", "transform"]),
          "FormatsSplitKv": view("splitkv_decode", "", ["max_abs_err"],
                                 by=["split_precision", "num_splits"],
                                 never={"not (m_ok and l_ok)": "m_ok and l_ok hold in every row"})}
PASSAGES = {"FormatsQuantizeCost": Passage("docs/formats.md: the cost of quantizing "
                                           "(bench/results/blockscaled.json)",
                                           blockscaled_speed)}
