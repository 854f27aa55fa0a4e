"""What docs/formats.md quotes about block-scaled formats, input transforms and split-KV,
as passages rebuilt from experiments/block_scaled, input_transforms, splitkv_decode and
bench/results/blockscaled.json.
"""

from __future__ import annotations

import json

import pandas as pd

from flashnum.figures.docs.digits import g2, sci
from flashnum.figures.docs.sources import bench, last_run, table
from flashnum.figures.quoting import Passage, require


def block_scaled_harness(F):
    b = table(F, "block_scaled")
    r = last_run(F, "block_scaled")
    require(r["git"]["dirty"] is False and bool(b.m_ok.all() and b.l_ok.all()),
            "block_scaled ran from a clean commit, m_ok and l_ok in every row")
    med = b.groupby(b.policy_sites.map(lambda s: json.loads(s)["p_cast"])).max_abs_err.median()
    m = {f: g2(x) for f, x in med.items()}
    require(m["mxfp6_e3m2"] == m["mxfp8_e5m2"],
            "mxfp6_e3m2 and mxfp8_e5m2 have the same median error")
    return [f"{b.distribution.nunique()} distributions of the catalogue",
            f"{len(b)} cases, {r['wall_s']:.0f} s wall on {r['n_workers']} workers at load ~16, "
            f"from the clean commit {r['git']['commit'][:7]}). Median max error over the "
            f"distributions: mxfp8_e4m3 {m['mxfp8_e4m3']}, fp8_e4m3 {m['fp8_e4m3']}, mxfp6_e2m3 "
            f"{m['mxfp6_e2m3']}, mxfp6_e3m2 and mxfp8_e5m2 {m['mxfp8_e5m2']} (the same two "
            f"mantissa bits), nvfp4 {m['nvfp4']}, nvfp4_row {m['nvfp4_row']}, nvfp4_1l "
            f"{m['nvfp4_1l']}, mxfp4 {m['mxfp4']}; m_ok and l_ok hold in every row"]


def input_transforms_docs(F):
    t = table(F, "input_transforms")
    r = {key: list(g.sort_values("seed").ratio)
         for key, g in t.groupby(["inputs", "format", "transform"])}
    span = lambda xs: f"{min(xs):.2f}-{max(xs):.2f}x"  # noqa: E731
    fmts = ("fp8_e4m3", "fp8_e4m3_tensor", "mxfp8_e4m3", "nvfp4")
    every = lambda inputs, tr: span([x for f in fmts for x in r[inputs, f, tr]])  # noqa: E731
    sm = [span(r["channel_offset", f, "smooth_k"]) for f in fmts]
    ha = [span(r["fa3_outliers", f, "hadamard"]) for f in fmts]
    return [f"{sm[0]} lower error with fp8_e4m3 inputs, {sm[1]} per-tensor scaled fp8, "
            f"{sm[2]} mxfp8_e4m3, {sm[3]} nvfp4; on fa3_outliers (no common offset) "
            f"{every('fa3_outliers', 'smooth_k')};",
            f"the rotation, fa3_outliers: {ha[0]} with fp8_e4m3, {ha[1]} per-tensor scaled "
            f"fp8, {ha[2]} mxfp8_e4m3, {ha[3]} nvfp4",
            f"on the K with a channel offset {every('channel_offset', 'hadamard')}."]


def blockscaled_speed(F):
    b = bench(F, "blockscaled")
    r = [v / b["attention_fa2_bf16_s"] for k, v in b.items() if k.startswith("quantize_")]
    return [f"costs {min(r):.2f}-{max(r):.2f} of one emulated fa2 bf16 attention"]


def splitkv_harness(F):
    s = table(F, "splitkv_decode")
    r = last_run(F, "splitkv_decode")
    require(r["git"]["dirty"] is False and bool(s.m_ok.all() and s.l_ok.all()),
            "splitkv_decode ran from a clean commit, m_ok and l_ok in every row")
    e = s.set_index(["seq_len_q", "seq_len_k", "split_precision", "num_splits"]).max_abs_err
    e = e.unstack("num_splits")
    f32, b16 = e.xs("fp32", level=2), e.xs("bf16", level=2)
    one = pd.concat([f32[8] / f32[1], f32[64] / f32[1]])
    vs = pd.concat([b16[8] / f32[8], b16[64] / f32[64]])
    fp32_all = s[s.split_precision == "fp32"].max_abs_err
    bf = pd.concat([b16[8], b16[64]])
    commit = r["git"]["commit"][:7]
    return [f"Stored (experiments/splitkv_decode, {len(s)} rows, {r['wall_s']:.0f} s wall on "
            f"{r['n_workers']} workers at load ~15, from the clean commit {commit};",
            f"give {one.min():.2f}-{one.max():.2f}x of one split's max error "
            f"({sci(fp32_all.min())} to {sci(fp32_all.max())} over all fp32 rows); bf16 partials "
            f"raise it to "
            f"{sci(bf.min())} - {sci(bf.max())}, {vs.min():.0f}-{vs.max():.0f}x the fp32-partials "
            f"error of the same splits"]


PASSAGES = {
    "FormatsBlockScaled": Passage("docs/formats.md: experiments/block_scaled",
                                  block_scaled_harness),
    "FormatsTransforms": Passage("docs/formats.md: experiments/input_transforms",
                                 input_transforms_docs),
    "FormatsQuantizeCost": Passage("docs/formats.md: the cost of quantizing "
                                   "(bench/results/blockscaled.json)", blockscaled_speed),
    "FormatsSplitKv": Passage("docs/formats.md: experiments/splitkv_decode", splitkv_harness),
}
