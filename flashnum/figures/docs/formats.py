"""What docs/formats.md shows of block-scaled formats, input transforms and split-KV: tables
generated from experiments/block_scaled, input_transforms and splitkv_decode, and the cost
of quantizing from bench/results/blockscaled.json (TABLES).
"""

from __future__ import annotations

import json

import pandas as pd

from flashnum.figures.docs.sources import bench, table
from flashnum.figures.docs.views import cell, view
from flashnum.figures.quoting import require


def block_scaled(F) -> pd.DataFrame:
    """experiments/block_scaled: the median max error over the distributions per P cast."""
    b = table(F, "block_scaled")
    require(bool(b.m_ok.all() and b.l_ok.all()), "m_ok and l_ok hold in every row")
    fmt = b.policy_sites.map(lambda s: json.loads(s)["p_cast"]).rename("P cast")
    med = b.groupby(fmt).max_abs_err.median().sort_values()
    return med.map(cell).reset_index(name="median max error")


def quantize_cost(F) -> pd.DataFrame:
    """bench/results/blockscaled.json: each format's quantizing time, and as a share of one
    emulated fa2 bf16 attention of the same shape."""
    b = bench(F, "blockscaled")
    return pd.DataFrame([{"format": k[len("quantize_"):-len("_s")], "quantize s": cell(v),
                          "of one fa2 bf16 attention": cell(v / b["attention_fa2_bf16_s"], 2)}
                         for k, v in b.items() if k.startswith("quantize_")])


TABLES = {"FormatsBlockScaled": block_scaled, "FormatsQuantizeCost": quantize_cost,
          "FormatsTransforms": view("input_transforms", "", ["ratio"],
                                    by=["inputs", "format", "transform"]),
          "FormatsSplitKv": view("splitkv_decode", "", ["max_abs_err"],
                                 by=["split_precision", "num_splits"],
                                 never={"not (m_ok and l_ok)": "m_ok and l_ok hold in every row"})}
