"""The numbers registry: every experiment the paper reads and every number its text quotes.

    EXPERIMENTS  experiment name -> the command that writes its table (the placeholder
                 a missing table shows; one \\ifhave<Name> switch each in numbers.tex)
    NUMBERS      macro name -> what it is; a figure or table sets one with F.num(name, v),
                 a named quantity (flashnum.figures.quantities) sets itself
    FACTS        \\if name -> when it is true; a figure or table sets one with F.fact(name, b)
                 and paper.tex holds the sentences for both cases
    write_numbers(F, plots)  numbers.tex: the switches, one \\newif per fact (false when
                 nothing set it), one \\newcommand per number
                 (\\nyr when nothing set it) and one \\Sel<Figure> per plot

A new experiment the paper reads gets a line in EXPERIMENTS; a new quoted number a line in
NUMBERS (F.num refuses undeclared names, so the text never quotes an unknown macro), a
new yes/no in FACTS (F.fact likewise).
"""

from __future__ import annotations

from flashnum.figures.quantities import QUANTITIES
from flashnum.figures.tex import tex_name

_RUN = "python -m flashnum.run experiment={}"
_REPRO = "python -m flashnum.run experiment=repro_{}"
# every experiment the paper reads, and the command that writes its table
EXPERIMENTS = {
    "bf16_sweep": _RUN.format("bf16_sweep"),
    "fp16_sweep": _RUN.format("fp16_sweep"),
    "fp32_sweep": _RUN.format("fp32_sweep"),
    "block_order": _RUN.format("block_order"),
    "block_size": _RUN.format("block_size"),
    "seqlen_growth": _RUN.format("seqlen_growth"),
    "precision_bits": _RUN.format("precision_bits"),
    "kernel_vs_emulator": _RUN.format("kernel_vs_emulator"),
    "worst_case": _RUN.format("worst_case"),
    "attribution": _RUN.format("attribution"),
    "bwd_bf16_sweep": _RUN.format("bwd_bf16_sweep"),
    "bwd_order": _RUN.format("bwd_order"),
    "bwd_seqlen_growth": _RUN.format("bwd_seqlen_growth"),
    "repro_fa3_table3": _REPRO.format("fa3_table3"),
    "repro_is_flash_stable": _REPRO.format("is_flash_stable"),
    "repro_qiu_yao": _REPRO.format("qiu_yao"),
    "repro_fp8_pcast": _REPRO.format("fp8_pcast"),
    "repro_fp8_offset": _REPRO.format("fp8_offset"),
    "repro_pcast_threshold": _REPRO.format("pcast_threshold"),
    "repro_block_scaled": _REPRO.format("block_scaled"),
    "repro_splitkv_decode": _REPRO.format("splitkv_decode"),
    "kernel_audit": _RUN.format("kernel_audit"),
    "kernel_table": _RUN.format("kernel_table"),
    "trained_model": _RUN.format("trained_model"),
    "trained_model_stats": _RUN.format("trained_model_stats"),
    "bwd_trained_model": _RUN.format("bwd_trained_model"),
}

# the trained model's section (flashnum.figures.trained); its size from models/stdlib_lm.json
TRAINED = {
    "TrainedHeads": "trained_model: captured heads measured",
    "TrainedDists": "trained_model: catalogue distributions beside them",
    "TrainedFaBfMin": "trained_model: smallest fa2 bf16 normwise relative error of a head",
    "TrainedFaBfMax": "trained_model: largest fa2 bf16 normwise relative error of a head",
    "TrainedFaBfGauss": "trained_model: gaussian's fa2 bf16 normwise relative error",
    "TrainedOverGaussMedian": "trained_model: median over heads and settings of error / "
                              "gaussian's",
    "TrainedOverGaussMax": "trained_model: largest such ratio",
    "TrainedNearest": "trained_model: the distributions nearest the heads in error profile "
                      "(how many heads each)",
    "TrainedSinkMax": "trained_model_stats: largest mean probability on key 0 of a head",
    "TrainedMaxLogit": "trained_model_stats: largest logit of any head",
    "TrainedBwdCalls": "bwd_trained_model: captured heads through the backward",
    "TrainedBwdRuleFa": "bwd_trained_model: fa2 cases on the heads within 2x torch autograd's "
                        "error in every gradient (of all, bf16 and fp16)",
    "TrainedBwdRuleLowp": "bwd_trained_model: the same for lowp",
    "TrainedBwdDqOverGaussMedian": "bwd_trained_model: median over heads of fa2 bf16 dQ "
                                   "relative error / gaussian's (N = 128)",
    "TrainedBwdDqOverGaussMax": "bwd_trained_model: largest such ratio",
    "TrainedParams": "models/stdlib_lm.json: parameters, millions",
    "TrainedLayers": "models/stdlib_lm.json: layers",
    "TrainedDModel": "models/stdlib_lm.json: model width",
    "TrainedSteps": "models/stdlib_lm.json: optimizer steps",
    "TrainedTokens": "models/stdlib_lm.json: training tokens (bytes), millions",
    "TrainedMinutes": "models/stdlib_lm.json: training wall-clock minutes",
    "TrainedValLoss": "models/stdlib_lm.json: last validation loss, nats per byte",
}

# the reproductions the paper discusses: macro key, experiment (flashnum.figures.reproductions)
_KEYS = (("FaThree", "repro_fa3_table3"), ("Golden", "repro_is_flash_stable"),
         ("QiuYao", "repro_qiu_yao"), ("Pcast", "repro_fp8_pcast"))



def _quoted(*names: str) -> dict:
    """Named quantities (flashnum.figures.quantities) at this place of numbers.tex."""
    return {k: QUANTITIES[k].what for k in names}


# every number the text may quote: macro name -> what it is
NUMBERS = {
    **{f"Thresh{k}{m}": f"repro_pcast_threshold: {w} collapse lead, S = {s}, forward, spread 0"
       for k, s in (("One", 1), ("Scaled", 256))
       for m, w in (("Pred", "predicted"), ("Meas", "first measured (rel. error > 0.5)"))},
    "OffsetBudgetMax": "repro_fp8_offset: largest error / (u max|V|) where offset + "
                       "threshold <= log2(max)",
    "OffsetWorst": "repro_fp8_offset: largest e4m3 error / (u max|V|) where the budget breaks",
    **{f"BlockGain{k}": f"repro_block_scaled: median error ratio without / with {w} (Q, K, V "
                        "in the 4- and 6-bit formats)"
       for k, w in (("Smooth", "K smoothing"), ("Hadamard", "the Hadamard rotation"),
                    ("SmoothHadamard", "both"))},
    "BlockDists": "repro_block_scaled: distributions of the catalogue measured",
    "SplitFpRatioMax": "repro_splitkv_decode: largest error ratio, most splits / one, fp32 "
                       "partials",
    "SplitLowRatio": "repro_splitkv_decode: median error ratio, most splits / one, narrower "
                     "partials",
    "SplitTop": "repro_splitkv_decode: the most splits measured",
    "SplitNkMax": "repro_splitkv_decode: the largest Nk",
    **_quoted("ExpInputs", "ExpHard", "ExpFloatMisses"),
    "NMin": "smallest N in seqlen_growth",
    "NMax": "largest N in seqlen_growth",
    **{f"SlopeN{p}": f"exponent a of median error ~ N^a, {p} fa2 (seqlen_growth)"
       for p in ("BfSixteen", "FpSixteen", "FpThirtyTwo")},
    "SlopeNBfSixteenSeedMin": "smallest per-seed exponent a, bf16 fa2, gaussian (seqlen_growth)",
    "SlopeNBfSixteenSeedMax": "largest per-seed exponent a, bf16 fa2, gaussian (seqlen_growth)",
    "SlopeNSeeds": "seeds of seqlen_growth's gaussian bf16 fa2 rows",
    "SlopeNBfSixteenRel": "exponent a of median normwise relative error ~ N^a, bf16 fa2, "
                          "gaussian (seqlen_growth)",
    "SlopeNBfSixteenAll": "exponent a of median error ~ N^a over every distribution of "
                          "seqlen_growth pooled, bf16 fa2",
    "SlopeNDists": "distributions of seqlen_growth",
    "SlopeNOthers": "distributions of seqlen_growth other than gaussian",
    "SlopeNDistLo": "the smallest exponent a of one non-gaussian distribution, bf16 fa2 "
                    "(seqlen_growth)",
    "SlopeNDistLoName": "that distribution",
    "SlopeNDistHi": "the largest exponent a of one non-gaussian distribution, bf16 fa2 "
                    "(seqlen_growth)",
    "SlopeNDistHiName": "that distribution",
    **{f"BoundOverErrN{p}": f"median bound / error over N, {p} fa2 (seqlen_growth)"
       for p in ("BfSixteen", "FpSixteen", "FpThirtyTwo")},
    "SlopeBlockN": "exponent a of median error ~ block_n^a, policy fa2 (block_size)",
    "BlockNRatio": "median error at the smallest block_n / at the largest, fa2 (block_size)",
    "BlockNMin": "smallest block_n (block_size)",
    "BlockNMax": "largest block_n (block_size)",
    "BlockNRatioMin": "the smallest per-seed BlockNRatio (block_size)",
    "BlockNRatioMax": "the largest per-seed BlockNRatio (block_size)",
    "BlockNSeeds": "seeds of block_size's fa2 gaussian rows",
    "BlockNAtN": "the N of BlockNRatio (block_size's largest)",
    "OrderWorstRatioMin": "the smallest per-seed ratio of the worst order and distribution "
                          "(block_order)",
    "OrderWorstRatioMax": "the largest such per-seed ratio (block_order)",
    "OrderBestRatioMin": "the smallest per-seed ratio of the most favourable order and "
                         "distribution (block_order)",
    "OrderBestRatioMax": "the largest such per-seed ratio (block_order)",
    "OrderSeeds": "seeds of block_order's bf16 fa2 rows",
    "OrderWorst": "the order with the largest error ratio to forward (block_order)",
    "OrderWorstRatio": "that largest ratio (block_order)",
    "OrderWorstDist": "the distribution where it occurs (block_order)",
    "OrderBest": "the order with the smallest error ratio to forward (block_order)",
    "OrderBestRatio": "that smallest ratio (block_order)",
    "OrderBestDist": "the distribution where it occurs (block_order)",
    **_quoted("SweepCases"),
    "HeatWorstDist": "distribution with the largest fa2 error (bf16_sweep)",
    "HeatWorstRatio": "its fa2 error / gaussian's fa2 error (bf16_sweep)",
    "HeatWorstRelRatio": "its fa2 normwise relative error / gaussian's (bf16_sweep)",
    "HeatSeeds": "seeds of the heatmap's rows (bf16_sweep, block_n 64, forward order)",
    "HeatNaiveOverFa": "median over distributions of naive error / fa2 error (bf16_sweep)",
    "HeatLowpOverFa": "median over distributions of lowp error / fa2 error (bf16_sweep)",
    "BoundCases": "rows with a bound in the bf16/fp16/fp32 sweeps",
    "BoundViolations": "of those, rows whose error exceeds a finite deterministic bound",
    "BoundVacuous": "of those, rows whose deterministic bound is infinite (vacuous)",
    "TightnessMedian": "median finite bound / error, policy fa2, all sweeps",
    "TightnessWorst": "smallest finite bound / error, policy fa2, all sweeps",
    "AttrDominantSite": "site with the largest only-this-site error, gaussian (attribution)",
    "AttrDominantShare": "its only-this-site error / total error (attribution)",
    "AttrRssOverTotal": "root-sum-square of only-this-site errors / total, gaussian",
    "AttrTiesDominantSite": "the dominant site on the ties distribution (attribution)",
    "AttrSeeds": "seeds of the attribution table",
    "AttrDominantShareMin": "smallest over seeds of the dominant site's only-this-site error "
                            "/ total, gaussian, fa2, bf16 (attribution)",
    "AttrDominantShareMax": "the largest such share over seeds",
    "KernelCases": "cases run on both backends (kernel_vs_emulator)",
    "KernelEqualFrac": "fraction of them with equal max ulp error (kernel_vs_emulator)",
    "KernelMedianUlp": "median max ulp error of the kernel (kernel_vs_emulator)",
    "EmulatorMedianUlp": "median max ulp error of the emulator (kernel_vs_emulator)",
    "KernelMaxUlpDiff": "largest |kernel - emulator| max ulp error (kernel_vs_emulator)",
    "SlopeBits": "slope of log2(median error) against significand bits p (precision_bits)",
    "BitsMin": "smallest p (precision_bits)",
    "BitsMax": "largest p (precision_bits)",
    "BwdCases": "rows of the flash and naive slices (bwd_bf16_sweep)",
    "BwdBoundHeld": "of those, rows whose backward bound held for every entry of dQ, dK, dV",
    "BwdRuleFaFrac": "fraction of fa2 rows within 2x torch bf16 autograd's error, all gradients",
    "BwdFaOverTorchDq": "median fa2 dQ error / torch bf16 autograd's dQ error (bwd_bf16_sweep)",
    "BwdRuleFailDists": "the distributions of the fa2 rows that miss that rule (bwd_bf16_sweep)",
    "BwdOrderCases": "rows of bwd_order",
    "BwdOrderZeroFrac": "fraction of them where no dQ order changed dQ (bwd_order)",
    "BwdOrderMaxRatio": "largest dQ order spread / dQ error (bwd_order)",
    **{f"BwdSlope{p}{g}": f"median over distributions and seeds of alpha, {g} error / max|{g}| "
                          f"~ N^alpha, bf16 {w} (bwd_seqlen_growth)"
       for p, w in (("FaTwo", "fa2"), ("Naive", "naive"), ("Lowp", "lowp"))
       for g in ("Dq", "Dk", "Dv")},
    "BwdSlopeSpread": "largest max - min of those exponents over distributions and seeds",
    "BwdGrowthCases": "rows of bwd_seqlen_growth",
    "BwdGrowthNMax": "largest N of bwd_seqlen_growth",
    "BwdGrowthCertMaxN": "largest N with the certified reference (bwd_seqlen_growth)",
    "BwdGrowthRefRatio": "largest fp64 reference error / measured error where both ran",
    "BwdGrowthPairs": "(row, gradient) pairs of bwd_seqlen_growth",
    "BwdGrowthBoundHeld": "of those, the bound finite everywhere and covering every entry",
    "BwdGrowthBoundVacuous": "of those, the bound infinite somewhere (vacuous)",
    "BwdGrowthBoundViolated": "of those, the bound finite and exceeded somewhere",
    "BwdGrowthOverflow": "of those, a computed gradient with an inf or NaN entry",
    "BoundHeld": "rows whose deterministic bound is finite and covers the error (the sweeps)",
    "FaThreeProtocol": "repro_fa3_table3: the best-matching fp16 protocol",
    "FaThreeN": "repro_fa3_table3: N of the best fp16 protocol",
    "FaThreeD": "repro_fa3_table3: head dim of the best fp16 protocol",
    "FaThreeStd": "repro_fa3_table3: our fp16 standard-attention RMSE (best protocol)",
    "FaThreeFlash": "repro_fa3_table3: our fp16 FlashAttention-2 RMSE (best protocol)",
    "FaThreeRatio": "repro_fa3_table3: their ratio (published 1.7)",
    "FaThreeMatch": "repro_fa3_table3: match factor of the best fp16 protocol",
    "FaThreeEightMatch": "repro_fa3_table3: match factor of the best fp8 protocol",
    "FaThreeJointMatch": "repro_fa3_table3: match factor of the best single protocol for all rows",
    "GoldenRatioFa": "repro_is_flash_stable: median flash/standard max deviation, fa2",
    "GoldenRatioLowp": "repro_is_flash_stable: the same, lowp",
    "GoldenLenSlopeFa": "repro_is_flash_stable: exponent of deviation ~ N^a, fa2",
    "GoldenLenSlopeStd": "repro_is_flash_stable: exponent of deviation ~ N^a, standard",
    "GoldenSwapEffect": "repro_is_flash_stable: largest output change from block_m alone",
    "AuditCases": "kernel_audit: audited cases over every kernel and dtype",
    "AuditTorchWorst": "kernel_audit: torch CPU SDPA's largest error / flash-attn's bound",
    "AuditTorchModelMin": "kernel_audit: smallest % of elements where torch_cpu equals torch",
    "AuditTritonModelMean": "kernel_audit: mean % of elements where fa2 equals the Triton kernel",
    "AuditBfOverStd": "kernel_audit: median torch bf16 error / standard attention's in bf16",
    "AuditBfOverFa": "kernel_audit: median torch bf16 error / emulated fa2's",
    "AuditBfOverLowp": "kernel_audit: median torch bf16 error / emulated lowp's",
    "KernelTableKernels": "kernel_table: kernels that ran on this machine (torch_sdpa and "
                          "torch_flash_cpu are one kernel)",
    "KernelTableRows": "kernel_table: (kernel, dtype) pairs that ran, each kernel once",
    "KernelTableAllKept": "kernel_table: (kernel, dtype) pairs where every case kept every "
                          "rule",
    "KernelTableLowpModelMin": "kernel_table: smallest bf16/fp16 % where a kernel's model "
                               "equals it bit for bit",
    **_quoted("QiuYaoReleasedErr", "QiuYaoOnset", "QiuYaoOnsetMeasured"),
    "PcastRatio": "repro_fp8_pcast: median MSE gain of reverse + scale over forward",
    "PcastRatioMin": "repro_fp8_pcast: smallest such gain",
    "PcastRatioMax": "repro_fp8_pcast: largest such gain",
    "PcastReverseOnly": "repro_fp8_pcast: median gain of reverse order without a scale",
    "PcastUnderflowForward": "repro_fp8_pcast: median underflow fraction, forward, no scale",
    # the reproductions' numbers the paper's sentences quote (flashnum.figures.reproductions)
    **{f"{k}Missing": f"{e}: the needed columns a stored table lacks" for k, e in _KEYS},
    "AgreeFactor": "the factor within which a published number and ours agree",
    "FaThreeEightN": "repro_fa3_table3: N of the best fp8 protocol",
    "FaThreeEightD": "repro_fa3_table3: head dim of the best fp8 protocol",
    "FaThreeJointN": "repro_fa3_table3: N of the best single protocol for all rows",
    "FaThreeJointD": "repro_fa3_table3: head dim of the best single protocol for all rows",
    "FaThreeDisagreements": "repro_fa3_table3: the rows off by more than AgreeFactor",
    **{k: q.what for k, q in QUANTITIES.items()
       if k.startswith("FaThreeProtocol") and not q.fact},
    "GoldenPublished": "repro_is_flash_stable: the published flash / standard ratio",
    **{f"Golden{w}{k}": f"repro_is_flash_stable: {d}, {p}"
       for k, p in (("Fa", "fa2"), ("Lowp", "lowp"))
       for w, d in (("From", "flash / standard ratio at the smallest N"),
                    ("FromN", "the smallest N"),
                    ("To", "flash / standard ratio at the largest N"),
                    ("ToN", "the largest N"),
                    ("Tiles", "deviation at the largest tiles / at the smallest"))},
    "GoldenNear": "repro_is_flash_stable: the policies and N within AgreeFactor of the "
                  "published ratio",
    "GoldenSlopeList": "repro_is_flash_stable: exponents of deviation ~ N^a per policy",
    **_quoted("QiuYaoExactUpTo"),
    "QiuYaoCollapseMin": "repro_qiu_yao: smallest out/ref of the released fix in the sweep",
    "QiuYaoCollapseAt": "repro_qiu_yao: the largest max logit of the sweep",
    "PcastScale": "repro_fp8_pcast: the largest static scale S",
    "PcastPublishedLo": "repro_fp8_pcast: the published gain, low end",
    "PcastPublishedHi": "repro_fp8_pcast: the published gain, high end",
    "PcastScaleOnly": "repro_fp8_pcast: median gain of the scale without reverse order",
    **TRAINED,
    # the named quantities not listed above (flashnum.figures.quantities)
    **{k: q.what for k, q in QUANTITIES.items() if q.paper and not q.fact},
}

# every yes/no the text branches on (\\if<Name> ... \\else ... \\fi): name -> when true.
# The sentences live in paper.tex; these decide which of them it says.
FACTS = {
    **{f"{k}Incomplete": f"{e}: the stored table lacks columns the text needs" for k, e in _KEYS},
    "FaThreePair": "repro_fa3_table3: the best fp16 protocol has both standard and FA2 rows",
    "FaThreeEight": "repro_fa3_table3: an fp8 protocol was matched",
    "FaThreeJoint": "repro_fa3_table3: one protocol was matched to all rows",
    "FaThreePublished": "repro_fa3_table3: some row has a published number",
    "FaThreeDisagree": "repro_fa3_table3: some row is off by more than AgreeFactor",
    **_quoted("FaThreeProtocolMeasured", "FaThreeProtocolInside"),
    "GoldenLengthFa": "repro_is_flash_stable: the length sweep has fa2 rows",
    "GoldenLengthLowp": "repro_is_flash_stable: the length sweep has lowp rows",
    "GoldenMatched": "repro_is_flash_stable: some policy and N within AgreeFactor of the "
                     "published ratio",
    "GoldenMeasured": "repro_is_flash_stable: a flash policy was swept over length",
    "GoldenFaBelow": "repro_is_flash_stable: fa2 deviates less than standard at every N",
    "GoldenOnlyLowState": "repro_is_flash_stable: matched, but not by fa2",
    "GoldenSlopes": "repro_is_flash_stable: some policy has two lengths or more",
    "GoldenTilesFa": "repro_is_flash_stable: fa2 was run at two tile sizes or more",
    "GoldenTilesLowp": "repro_is_flash_stable: lowp was run at two tile sizes or more",
    "GoldenSwap": "repro_is_flash_stable: the swapped tiles were measured",
    "GoldenSwapExact": "repro_is_flash_stable: B_r alone changes no output bit",
    "QiuYaoTies": "repro_qiu_yao: a row for tied maxima under lowp",
    "QiuYaoHaveReleased": "repro_qiu_yao: the released fix was measured",
    "QiuYaoHaveOnset": "repro_qiu_yao: the clamp sweep was measured",
    "QiuYaoOnsetStraddled": "repro_qiu_yao: the sweep has max logits on both sides of it",
    "PcastBest": "repro_fp8_pcast: rows with reverse order and the largest scale",
    "PcastOneCase": "repro_fp8_pcast: only one such row",
    "PcastAlone": "repro_fp8_pcast: reverse order and the scale were measured alone",
    "PcastUnderflow": "repro_fp8_pcast: the underflow of forward order was measured",
    "PcastAgrees": "repro_fp8_pcast: every gain within AgreeFactor of the published range",
    "PcastLarger": "repro_fp8_pcast: the median gain lies above the published range",
    "TrainedSink": "trained_model_stats: some head's mean probability on key 0 is >= 0.1",
    "AttrDominantEverySeed": "attribution: gaussian, fa2, bf16: the same site has the largest "
                             "only-this-site error in every seed",
    # the named yes/nos not listed above (flashnum.figures.quantities)
    **{k: q.what for k, q in QUANTITIES.items() if q.paper and q.fact},
}


def quantities(F) -> None:
    """Every named quantity's macro or \\newif (flashnum.figures.quantities), where its source
    exists."""
    for name, q in QUANTITIES.items():
        v = q.value(F) if q.paper else None
        if v is not None and q.fact:
            F.fact(name, bool(v))
        elif v is not None:
            F.num(name, q.tex(v))


def write_numbers(F, plots) -> None:
    """numbers.tex from what the figures set on F; plots: the stems that get a \\Sel macro."""
    lines = [
        "% generated by python -m flashnum.figures from experiments/*: do not edit",
        r"\providecommand{\nyr}{\textsf{[not yet run]}}",
        r"\providecommand{\notyetrun}[1]{\fbox{not yet run: \texttt{#1}}}",
        r"\providecommand{\notdrawn}[1]{\fbox{not drawn: #1}}",
    ]
    for name in EXPERIMENTS:
        sw = f"have{tex_name(name)}"
        # an experiment whose figure could not be drawn is not quoted either
        ok = F.have(name) and name not in {e for _, e, _ in F.not_drawn}
        lines.append(f"\\newif\\if{sw} \\{sw}{'true' if ok else 'false'}")
    # a GPU run of the kernel benchmark (bench/bench_triton_gpu.py) is stored beside the code
    gpu = (F.experiments.parent / "bench" / "results" / "triton_gpu.json").exists()
    tf = "true" if gpu else "false"
    lines.append(f"\\newif\\ifhaveGpuMeasurements \\haveGpuMeasurements{tf}")
    for name, what in FACTS.items():
        lines.append(f"\\newif\\if{name} \\{name}{'true' if F.facts.get(name) else 'false'}"
                     f" % {what}")
    for name, what in NUMBERS.items():
        lines.append(f"\\newcommand{{\\{name}}}{{{F.numbers.get(name, chr(92) + 'nyr')}}}"
                     f" % {what}")
    for stem in plots:
        sel = F.selections.get(stem, chr(92) + "nyr")
        lines.append(f"\\newcommand{{\\Sel{tex_name(stem)}}}{{{sel}}}")
    (F.out / "numbers.tex").write_text("\n".join(lines) + "\n")
