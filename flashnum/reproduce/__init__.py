"""Reproductions of published numerical results on attention, ours beside theirs.

    python -m flashnum.run experiment=repro_<name> [quick=true]   # stored, printed

    from flashnum import reproduce
    df = reproduce.fa3_table3(quick=True)      # a tidy DataFrame: ours beside the published
    reproduce.save("repro_fa3_table3", df, config)

One module per published result, each exporting a Reproduction (flashnum.reproduce.
reproduction: its name, the function that measures it, its sizes, the columns printed):

    fa3             fa3_table3       FlashAttention-3 (Shah et al. 2024), Table 3
    golden          is_flash_stable  Is Flash Attention Stable? (Golden et al. 2024)
    qiu_yao_bias    qiu_yao          Qiu & Yao 2025: biased bf16 rounding under tied maxima
    pcast_order     fp8_pcast        arXiv 2606.06521: the P cast, forward vs reverse order
    fa4_offset      fp8_offset       flash-attention #2716: FA4's fp8 P offset and threshold
    pcast_collapse  pcast_threshold  arXiv 2606.06521: the P-cast collapse threshold
    mx_formats      block_scaled     block-scaled (MX, NVFP4) Q, K, V and P
    splitkv         splitkv_decode   split-KV decoding: splits and stored partials

Each function returns tidy rows: the protocol columns (sizes, policy, tiling, reference,
...), our measured value (`ours`, with its standard error `ours_se` where it is a sample
estimate) and the published number (`published`, NaN where the paper gives none).
flashnum.reproduce.runner holds the registry, stores each table under
experiments/repro_<name>/ and is the command line; flashnum.reproduce.measure the
fp64 references and the errors with their standard errors over independent heads
(fp64 softmax attention, 10^8 below the smallest error measured here; tests check it
against flashnum.reference's certified values). docs/reproductions.md discusses every
number. A new reproduction: its module, and its line in runner.REGISTRY.
"""

from flashnum.reproduce.fa3 import fa3_table3
from flashnum.reproduce.fa4_offset import fp8_offset
from flashnum.reproduce.golden import golden_tiles, is_flash_stable
from flashnum.reproduce.measure import reference64
from flashnum.reproduce.mx_formats import block_scaled
from flashnum.reproduce.pcast_collapse import pcast_threshold
from flashnum.reproduce.pcast_order import PC_PUBLISHED, fp8_pcast
from flashnum.reproduce.qiu_yao_bias import qiu_yao
from flashnum.reproduce.runner import REGISTRY, REPRODUCTIONS, case_ids, main, save
from flashnum.reproduce.splitkv import splitkv_decode

__all__ = ["PC_PUBLISHED", "REGISTRY", "REPRODUCTIONS", "block_scaled", "case_ids",
           "fa3_table3", "fp8_offset", "fp8_pcast", "golden_tiles", "is_flash_stable",
           "main", "pcast_threshold", "qiu_yao", "reference64", "save", "splitkv_decode"]
