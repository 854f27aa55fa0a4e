"""The numbers registry: every experiment the paper reads and every number its text quotes.

    EXPERIMENTS  experiment name -> the command that writes its table (the placeholder
                 a missing table shows; one \\ifhave<Name> switch each in numbers.tex)
    NUMBERS      macro name -> what it is; a figure or table sets one with F.num(name, v)
    write_numbers(F, plots)  numbers.tex: the switches, one \\newcommand per number
                 (\\nyr when nothing set it) and one \\Sel<Figure> per plot

A new experiment the paper reads gets a line in EXPERIMENTS; a new quoted number a line in
NUMBERS (F.num refuses undeclared names, so the text never quotes an unknown macro).
"""

from __future__ import annotations

import json

from flashnum.figures.tex import tex_name, tex_num

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
    "TrainedSinkText": "trained_model_stats: whether a head is an attention sink (generated)",
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
    "ExpInputs": "float32 arguments of exp and exp2 checked (bench/exp_exhaustive.py)",
    "ExpHard": "arguments whose float64 value lies within 4 float64 ulps of an fp32 rounding "
               "boundary (same)",
    "ExpFloatMisses": "arguments a float64 evaluation alone rounds wrongly (same)",
    "NMin": "smallest N in seqlen_growth",
    "NMax": "largest N in seqlen_growth",
    **{f"SlopeN{p}": f"exponent a of median error ~ N^a, {p} fa2 (seqlen_growth)"
       for p in ("BfSixteen", "FpSixteen", "FpThirtyTwo")},
    **{f"BoundOverErrN{p}": f"median bound / error over N, {p} fa2 (seqlen_growth)"
       for p in ("BfSixteen", "FpSixteen", "FpThirtyTwo")},
    "SlopeBlockN": "exponent a of median error ~ block_n^a, policy fa2 (block_size)",
    "BlockNRatio": "median error at the smallest block_n / at the largest, fa2 (block_size)",
    "BlockNMin": "smallest block_n (block_size)",
    "BlockNMax": "largest block_n (block_size)",
    "OrderWorst": "the order with the largest error ratio to forward (block_order)",
    "OrderWorstRatio": "that largest ratio (block_order)",
    "OrderWorstDist": "the distribution where it occurs (block_order)",
    "OrderBest": "the order with the smallest error ratio to forward (block_order)",
    "OrderBestRatio": "that smallest ratio (block_order)",
    "OrderBestDist": "the distribution where it occurs (block_order)",
    "SweepCases": "rows in bf16_sweep",
    "HeatWorstDist": "distribution with the largest fa2 error (bf16_sweep)",
    "HeatWorstRatio": "its fa2 error / gaussian's fa2 error (bf16_sweep)",
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
    "KernelCases": "cases run on both backends (kernel_vs_emulator)",
    "KernelEqualFrac": "fraction of them with equal max ulp error (kernel_vs_emulator)",
    "KernelMedianUlp": "median max ulp error of the kernel (kernel_vs_emulator)",
    "EmulatorMedianUlp": "median max ulp error of the emulator (kernel_vs_emulator)",
    "KernelMaxUlpDiff": "largest |kernel - emulator| max ulp error (kernel_vs_emulator)",
    "SlopeBits": "slope of log2(median error) against significand bits p (precision_bits)",
    "BitsMin": "smallest p (precision_bits)",
    "BitsMax": "largest p (precision_bits)",
    "WorstCaseDist": "the distribution with the largest error (worst_case)",
    "WorstCaseErr": "its error (worst_case)",
    "WorstCaseRatio": "its error / gaussian's under the same setting (worst_case)",
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
    "FaThreeText": "repro_fa3_table3: generated sentences (protocol, match, disagreements)",
    "FaThreeProtocol": "repro_fa3_table3: the best-matching fp16 protocol",
    "FaThreeN": "repro_fa3_table3: N of the best fp16 protocol",
    "FaThreeD": "repro_fa3_table3: head dim of the best fp16 protocol",
    "FaThreeStd": "repro_fa3_table3: our fp16 standard-attention RMSE (best protocol)",
    "FaThreeFlash": "repro_fa3_table3: our fp16 FlashAttention-2 RMSE (best protocol)",
    "FaThreeRatio": "repro_fa3_table3: their ratio (published 1.7)",
    "FaThreeMatch": "repro_fa3_table3: match factor of the best fp16 protocol",
    "FaThreeEightMatch": "repro_fa3_table3: match factor of the best fp8 protocol",
    "FaThreeJointMatch": "repro_fa3_table3: match factor of the best single protocol for all rows",
    "FaThreeProtocolText": "bench/results/fa3_protocol.json: the fp16 pair at the protocol "
                           "fixed in advance, over seeds (generated sentences)",
    "GoldenText": "repro_is_flash_stable: generated sentences",
    "GoldenRatioFa": "repro_is_flash_stable: median flash/standard max deviation, fa2",
    "GoldenRatioLowp": "repro_is_flash_stable: the same, lowp",
    "GoldenLenSlopeFa": "repro_is_flash_stable: exponent of deviation ~ N^a, fa2",
    "GoldenLenSlopeStd": "repro_is_flash_stable: exponent of deviation ~ N^a, standard",
    "GoldenSwapEffect": "repro_is_flash_stable: largest output change from block_m alone",
    "QiuYaoText": "repro_qiu_yao: generated sentences",
    "QiuYaoZ": "repro_qiu_yao: z over heads of the bias, ties, lowp, no fix",
    "QiuYaoZFixed": "repro_qiu_yao: the same with the max adjustment",
    "QiuYaoZGauss": "repro_qiu_yao: the same on gaussian inputs, no fix",
    "QiuYaoZFaTwo": "repro_qiu_yao: ties under the fa2 policy, no fix",
    "QiuYaoZBroken": "repro_qiu_yao: the control with the ties broken, lowp, no fix",
    "AuditCases": "kernel_audit: audited cases over every kernel and dtype",
    "AuditTorchWorst": "kernel_audit: torch CPU SDPA's largest error / flash-attn's bound",
    "AuditTorchModelMin": "kernel_audit: smallest % of elements where torch_cpu equals torch",
    "AuditTritonModelMean": "kernel_audit: mean % of elements where fa2 equals the Triton kernel",
    "AuditBfOverStd": "kernel_audit: median torch bf16 error / standard attention's in bf16",
    "AuditBfOverFa": "kernel_audit: median torch bf16 error / emulated fa2's",
    "AuditBfOverLowp": "kernel_audit: median torch bf16 error / emulated lowp's",
    "KernelTableKernels": "kernel_table: kernels that ran on this machine",
    "KernelTableRows": "kernel_table: (kernel, dtype) rows that ran",
    "KernelTableAllKept": "kernel_table: (kernel, dtype) rows where every case kept every rule",
    "KernelTableLowpModelMin": "kernel_table: smallest bf16/fp16 % where a kernel's model "
                               "equals it bit for bit",
    "QiuYaoReleasedErr": "repro_qiu_yao: mean signed error of their released fix, ties, lowp",
    "QiuYaoOnset": "repro_qiu_yao: derived max logit where the released clamp acts, ln(2/1e-10)",
    "QiuYaoOnsetMeasured": "repro_qiu_yao: first max logit of the sweep with out/ref < 0.99",
    "PcastText": "repro_fp8_pcast: generated sentences",
    "PcastRatio": "repro_fp8_pcast: median MSE gain of reverse + scale over forward",
    "PcastRatioMin": "repro_fp8_pcast: smallest such gain",
    "PcastRatioMax": "repro_fp8_pcast: largest such gain",
    "PcastReverseOnly": "repro_fp8_pcast: median gain of reverse order without a scale",
    "PcastUnderflowForward": "repro_fp8_pcast: median underflow fraction, forward, no scale",
    **TRAINED,
}


def exp_site(F) -> None:
    """Numbers of the exhaustive check of the exp site (bench/results/exp_exhaustive.json)."""
    path = F.experiments.parent / "bench" / "results" / "exp_exhaustive.json"
    if not path.exists():
        return
    r = json.loads(path.read_text())
    fns = [r[f] for f in ("exp", "exp2") if f in r]
    F.num("ExpInputs", f"{sum(x['inputs'] for x in fns) / 1e9:.1f}" + r"\times 10^9")
    F.num("ExpHard", sum(len(x["hard_inputs"]) for x in fns))
    F.num("ExpFloatMisses", sum(len(x["torch_float64_misses"]) for x in fns))


def fa3_protocol(F) -> None:
    """FA3's fp16 pair at the protocol fixed in advance, over seeds
    (bench/fa3_protocol.py, bench/results/fa3_protocol.json): means, their spread over
    seeds, the ratio of the means and its per-seed range, beside the published ratio."""
    path = F.experiments.parent / "bench" / "results" / "fa3_protocol.json"
    if not path.exists():
        return
    r = json.loads(path.read_text())
    s, p = r["summary"], r["protocol"]
    inside = s["ratio"]["min"] <= r["published_ratio"] <= s["ratio"]["max"]

    def rmse(key):
        return (f"${tex_num(s[key]['mean'], 2)}$ (relative standard deviation "
                f"{100 * s[key]['rel_sd']:.0f}\\%)")

    F.num("FaThreeProtocolText", (
        f"The best match over many protocols overstates the agreement, so the fp16 pair was "
        f"also measured at one protocol fixed in advance (\\code{{bench/fa3\\_protocol.py}}): "
        f"FA3's inputs and scale, the fp64 reference on the unrounded inputs, $N = "
        f"{tex_num(p['n'], 4)}$, $d = {p['d']}$, {p['heads']} heads of {p['rows']} query rows, "
        f"over {r['seeds']} seeds. Standard attention then has RMSE {rmse('naive')} and "
        f"FlashAttention-2 {rmse('fa2')}; the ratio of the means is "
        f"{s['ratio_of_means']:.2f} (per seed {s['ratio']['min']:.2f} to "
        f"{s['ratio']['max']:.2f}) against the published {r['published_ratio']:.2f}, which "
        f"lies {'inside' if inside else 'outside'} the per-seed range."))


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
    for name, what in NUMBERS.items():
        lines.append(f"\\newcommand{{\\{name}}}{{{F.numbers.get(name, chr(92) + 'nyr')}}}"
                     f" % {what}")
    for stem in plots:
        sel = F.selections.get(stem, chr(92) + "nyr")
        lines.append(f"\\newcommand{{\\Sel{tex_name(stem)}}}{{{sel}}}")
    (F.out / "numbers.tex").write_text("\n".join(lines) + "\n")
