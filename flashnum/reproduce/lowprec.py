"""Today's low-precision attention, measured: FA4's fp8 P offset, the P-cast collapse
threshold, block-scaled Q/K/V/P, and split-KV decoding.

    python -m flashnum.reproduce {fp8_offset,pcast_threshold,block_scaled,splitkv_decode}
    from flashnum.reproduce import lowprec
    df = lowprec.fp8_offset(quick=True)

    fp8_offset       flash-attention #2716: P = exp(s - m) 2^offset cast to e4m3 / e5m2
                     under FA4's lazy rescale threshold (log2 units), against the strength
                     of a late attention sink; e4m3 saturates iff 2^offset e^growth > 448
                     with growth <= threshold, e5m2 (max 57344) does not
    pcast_threshold  arXiv 2606.06521: P cast to e4m3 (static scale S) in forward order
                     flushes the non-sink P once the sink leads by more than
                     Delta_c = 10 ln 2 + ln S - delta_k (6.93 + ln S - delta_k); the lost
                     mass against the sink strength, the predicted threshold beside it
    block_scaled     mxfp8/mxfp6/mxfp4/nvfp4 (and per-tensor fp8) on Q, K, V (head dim),
                     on P (key axis, before P @ V), or both, over the input catalogue;
                     K smoothing and the Hadamard rotation for the narrowest formats
    splitkv_decode   error of split-KV decoding against the number of splits and the
                     precision of the stored partials (o, lse), Nq 1 and 16, GQA 4:1,
                     Nk up to 131072

Every reference is fp64 softmax attention of the inputs as the kernel stores them
(unrounded inputs for block_scaled, whose input quantization is the thing measured).
"""

from __future__ import annotations

import math
import time

import pandas as pd
import torch

from flashnum.engine import attention
from flashnum.inputs.distributions import make
from flashnum.numerics.blockscaled import prepare_inputs
from flashnum.numerics.formats import FORMATS, get_format
from flashnum.numerics.policy import Policy, make_policy

LN2 = math.log(2.0)


def softmax64(q, k, v, scale: float) -> torch.Tensor:
    q, k, v = (x.to(torch.float64) for x in (q, k, v))
    s = q @ k.transpose(-1, -2) * scale
    p = torch.exp(s - s.amax(-1, keepdim=True))
    return p @ v / p.sum(-1, keepdim=True)


# ---------------------------------------------------------------------------
# fp8_offset: flash-attention #2716

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


# ---------------------------------------------------------------------------
# pcast_threshold: arXiv 2606.06521's collapse threshold

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
            s = (q @ k.transpose(-1, -2))[..., 1:]
            for factor in sz["scales"]:
                cast = get_format(f"fp8_e4m3*{factor:g}") if factor != 1 else e4m3
                pol = make_policy("fa2", "fp32").with_sites(p_cast=cast, name="fa2_fp32_e4m3")
                flushed = float((e4m3.round(torch.exp(s - delta) * factor) == 0)
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


# ---------------------------------------------------------------------------
# block_scaled: MX / NVFP4 on Q, K, V and P over the catalogue

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
                             rmse=float(err.pow(2).mean().sqrt())))
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------
# splitkv_decode

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
                                 rmse=float(err.pow(2).mean().sqrt()), cpu_s=cpu))
    return pd.DataFrame(rows)
