"""Is Flash Attention Stable? (Golden et al. 2024): bf16 flash vs standard attention, max
deviation from fp64, its growth with N, tile size and swapped block dimensions.

    python -m flashnum.run experiment=repro_is_flash_stable
"""

from __future__ import annotations

import math

import pandas as pd

from flashnum.analysis.metrics import max_abs_err
from flashnum.api import attention
from flashnum.inputs.distributions import make
from flashnum.numerics.formats import FORMATS
from flashnum.reproduce.measure import (
    errors,
    head_rmse,
    reference64,
)
from flashnum.reproduce.reproduction import Reproduction

# seeds: how many independent draws (seed, seed + 1, ...): every cell is reported with
# its spread over them, not as one draw
IFS_SIZES = dict(
    full=dict(ns=(256, 1024, 4096, 16384), heads=2, rows=128, d=64, tile_n=4096,
              srams=(4096, 16384, 65536, 262144), seeds=5),
    quick=dict(ns=(256, 1024), heads=4, rows=64, d=64, tile_n=1024, srams=(4096, 65536),
               seeds=1),
)
IFS_PUBLISHED_RATIO = 10.0  # "about 10x more deviation than standard attention" at bf16


def golden_tiles(sram: int, d: int) -> tuple[int, int]:
    """Golden et al.'s tile rule: B_c = ceil(M / 4d) keys, B_r = min(ceil(M / 4d), d) rows."""
    bc = math.ceil(sram / (4 * d))
    return min(bc, d), bc


def is_flash_stable(quick: bool = False, seed: int = 0) -> pd.DataFrame:
    """bf16 flash vs standard attention: max abs deviation from an fp64 golden value.

    Golden et al. published no code, inputs or sizes; we use gaussian N(0, 1) Q, K, V
    (logits ~N(0, 1)), d = 64, and the fp64 golden value of the bf16-rounded inputs (the
    deviation of the algorithm, the same inputs for every method). Standard attention is
    policy naive (torch's bf16 attention: S and P stored in bf16). Their flash
    re-implementation ran "in a numeric format"; which sites that covered is not said, so
    we try fa2 (fp32 softmax state, what FlashAttention-2 kernels do) and lowp (every
    stored value in bf16, fp32 dot accumulation, as pure-PyTorch ports).

    length sweep: N keys, tiles from their rule at M = 16384 (B_r = B_c = 64 at d = 64).
    tile sweep:   N fixed, M varied: (block_m, block_n) = (B_r, B_c) and swapped (B_c, B_r).
    In the emulated recurrence block_m changes no rounding (query rows are independent):
    a swap can change the numerics only through block_n. `block_m_effect` shows it: the
    max |out(block_m = B_c) - out(block_m = B_r)| at the same block_n (0, or fp32 BLAS
    summation-order noise).

    Every cell is measured on sizes["seeds"] independent draws, seeds seed, seed + 1, ...
    (one row per seed, column `seed`): a max deviation is one extreme value of one draw,
    so the figures report each cell's spread over the draws.
    """
    sz = IFS_SIZES["quick" if quick else "full"]
    rows = []
    for s in range(int(seed), int(seed) + sz["seeds"]):
        rows += [dict(r, seed=s) for r in _one_draw(sz, s)]
    return pd.DataFrame(rows)


def _one_draw(sz: dict, seed: int) -> list[dict]:
    """The length and the tile sweep of is_flash_stable on the inputs of one seed."""
    d, heads, nrows = sz["d"], sz["heads"], sz["rows"]
    bf16 = FORMATS["bf16"]
    rows = []

    def case(n):
        inp = make("gaussian", heads=heads, seq_len_q=nrows, seq_len_k=n, head_dim=d,
                   seed=seed)
        q, k, v = inp.tensors()
        ref = reference64(bf16.round(q), bf16.round(k), bf16.round(v), 1.0 / math.sqrt(d))
        std = attention(q, k, v, precision="bf16", policy="naive")
        return q, k, v, ref, std

    def row(sweep, n, pol, bm, bn, out, ref, std, **extra):
        e = errors(out, ref)
        ratio = e["max_abs_err"] / max_abs_err(std.out, ref)
        flash = pol != "naive"
        return dict(sweep=sweep, distribution="gaussian", precision="bf16", policy=pol,
                    n=n, d=d, heads=heads, query_rows=nrows, block_m=bm, block_n=bn,
                    ref_inputs="bf16", **extra, metric="max_abs_err", ours=e["max_abs_err"],
                    published=math.nan, ratio_to_standard=ratio,
                    published_ratio=IFS_PUBLISHED_RATIO if flash else math.nan,
                    **{k: e[k] for k in ("rmse", "rmse_se")},
                    rmse_ratio_to_standard=e["rmse"] / head_rmse(std.out, ref)[0])

    br, bc = golden_tiles(16384, d)
    for n in sz["ns"]:
        q, k, v, ref, std = case(n)
        rows.append(row("length", n, "naive", 0, 0, std.out, ref, std, sram=16384,
                        swapped=False))
        for pol in ("fa2", "lowp"):
            res = attention(q, k, v, precision="bf16", policy=pol, block_m=br, block_n=bc)
            rows.append(row("length", n, pol, br, bc, res.out, ref, std, sram=16384,
                            swapped=False))
    n = sz["tile_n"]
    q, k, v, ref, std = case(n)
    for sram in sz["srams"]:
        br, bc = golden_tiles(sram, d)
        for pol in ("fa2", "lowp"):
            for swapped, (bm, bn) in ((False, (br, bc)), (True, (bc, br))):
                if swapped and br == bc:
                    continue  # B_r = B_c: the swap is the same tiling
                res = attention(q, k, v, precision="bf16", policy=pol, block_m=bm, block_n=bn)
                effect = math.nan
                if swapped:  # the same block_n with the unswapped block_m: only block_m moved
                    same_n = attention(q, k, v, precision="bf16", policy=pol, block_m=br,
                                       block_n=bn).out
                    effect = float((res.out - same_n).abs().max())
                rows.append(row("tiles", n, pol, bm, bn, res.out, ref, std, sram=sram,
                                swapped=swapped, block_m_effect=effect))
    return rows


REPRODUCTION = Reproduction(
    "is_flash_stable", is_flash_stable, IFS_SIZES,
    display=[
        "sweep", "policy", "seed", "n", "block_m", "block_n", "sram", "swapped", "ours",
        "ratio_to_standard", "published_ratio", "rmse", "rmse_ratio_to_standard",
        "block_m_effect"])
