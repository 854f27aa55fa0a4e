"""Named quantities: a number the paper, README.md and docs/ quote, defined once.

    QUANTITIES  name -> Quantity(what, value, tex, md): value(F) computes it from the
                stored tables (F.table) or bench results (bench/results/), None when
                they are missing; tex renders it for numbers.tex, md for Markdown
    quotes(text)          the places a Markdown text quotes one: 2.23<!--q:Name-->
    misquoted(F, paths)   the quotes whose text is not the value rendered now

The paper quotes \\Name (numbers.tex writes one macro per quantity, beside the figures'
numbers); README.md and docs/*.md carry the rendered value followed by the invisible
marker <!--q:Name-->, and tests/test_quoted.py recomputes every quantity and checks every
marked place. The same value therefore has one definition wherever it is quoted, and
only its rendering (LaTeX or Markdown, the digits a sentence wants) differs.

A new quoted number: a Quantity here; then \\Name in paper.tex or value<!--q:Name--> in
a document.

The registry is here, in the order numbers.tex writes it; the functions that compute the
values live by topic: quantities_sweeps (sizes, growth, invariants, exp, tightness),
quantities_worst_case, quantities_qiu_yao, quantities_fa3, quantities_reproductions
(Golden et al., the fp8 P cast) and quantities_bench (bench/results).
"""

from __future__ import annotations

import pandas as pd

from flashnum.figures import quoting
from flashnum.figures.quantities_bench import JOB_FIGURES, JOBS, _job
from flashnum.figures.quantities_fa3 import (
    _FA3_HELDOUT,
    _PROTOCOL,
    _fa3,
    _fa3_best,
    _fa3_fp8_match,
    _fa3_fp8_worst,
    _fa3_inside,
    _fa3_measured,
    _fa3_published,
    _fa3_ratio,
    _fp8,
    _fp16,
)
from flashnum.figures.quantities_qiu_yao import (
    QY_STDS,
    _clamp,
    _max_or_nan,
    _min_or_nan,
    _qy,
    _qy_quantities,
)
from flashnum.figures.quantities_reproductions import _at, _golden_length, _pcast
from flashnum.figures.quantities_sweeps import (
    _exp,
    _growth_quantities,
    _invariants_hold,
    _rows,
    _tightness_median,
)
from flashnum.figures.quantities_worst_case import _worst_case, _worst_quantities
from flashnum.figures.quoting import (  # noqa: F401  (the renderers, also for the tests)
    Fact,
    Quantity,
    count,
    fixed,
    percent,
    quoted_as,
    quotes,
    sci,
    sig,
    two,
)

QUANTITIES = {
    "SweepCases": Quantity("rows in bf16_sweep", _rows("bf16_sweep"), md=count),
    **_growth_quantities(),
    "SweepInvariantsHold": Fact("m_ok and l_ok hold in every row of every sweep",
                                _invariants_hold,
                                "In every row of every sweep m_ok and l_ok hold",
                                "m_ok or l_ok fails in a stored sweep"),
    "ExpInputs": Quantity(
        "float32 arguments of exp and exp2 checked (experiments/exp_exhaustive)",
        _exp(lambda x: x["inputs"]), tex=lambda n: f"{n / 1e9:.1f}" + r"\times 10^9",
        md=lambda n: f"{n / 1e9:.1f}e9"),
    "ExpHard": Quantity(
        "arguments whose float64 value lies within 4 float64 ulps of an fp32 rounding "
        "boundary (same)", _exp(lambda x: len(x["hard_inputs"]))),
    "ExpFloatMisses": Quantity(
        "arguments a float64 evaluation alone rounds wrongly (same)",
        _exp(lambda x: len(x["float64_misses"]))),
    **{f"Job{J}{K}": Quantity(f"bench_jobs: {what}, {w}", _job(name, f), md=md, paper=False)
       for J, name, what in JOBS for K, w, f, md in JOB_FIGURES},
    **_qy_quantities(),
    **{f"FaThreePublished{k}": Quantity(f"repro_fa3_table3: the published fp16 RMSE, {w}",
                                        _fa3_published(f"fp16 {w}"), md=sci(2))
       for k, w in (("Std", "standard"), ("Flash", "FlashAttention-2"))},
    **_worst_quantities(),
    "WorstCaseEvals": Quantity("worst_case: the most evaluations a search took (largest N, "
                               "d = 64)", _worst_case("search_n_evals", how=lambda c: int(c.max())),
                               paper=False),
    "TightnessMedianFp": Quantity("bound_tightness: median bound / error, "
                                  "fa2, bf16 and fp16, finite bounds", _tightness_median,
                                  md=fixed(0), paper=False),
    "QiuYaoReleasedErr": Quantity(f"repro_qiu_yao: mean signed error of their released fix, "
                                  f"ties, lowp, logit std {QY_STDS[-1]:g}, pooled over seeds",
                                  _qy("ties", "lowp", "qiu_yao_released", "ours", QY_STDS[-1]),
                                  md=lambda x: f"{x:+.2f}"),
    "QiuYaoOnset": Quantity("repro_qiu_yao: derived max logit where the released clamp acts, "
                            "ln(2/1e-10)", _clamp(lambda sw: float(sw.onset.iloc[0])),
                            tex=sig(4), md=fixed(2)),
    # the output is "exact" while out / ref >= 0.99
    "QiuYaoOnsetMeasured": Quantity("repro_qiu_yao: first max logit of the sweep with "
                                    "out/ref < 0.99",
                                    _clamp(lambda sw: _min_or_nan(sw[sw.ours < 0.99].max_logit)),
                                    tex=sig(4), md=lambda x: f"{x:g}"),
    "QiuYaoExactUpTo": Quantity("repro_qiu_yao: the last max logit of the sweep with "
                                "out/ref >= 0.99",
                                _clamp(lambda sw: _max_or_nan(sw[sw.ours >= 0.99].max_logit)),
                                tex=sig(4), md=lambda x: f"{x:g}"),
    "FaThreeN": Quantity("repro_fa3_table3: N of the best fp16 protocol",
                         _fa3_best(_fp16("naive"), "n")),
    "FaThreeD": Quantity("repro_fa3_table3: head dim of the best fp16 protocol",
                         _fa3_best(_fp16("naive"), "d")),
    "FaThreeStd": Quantity("repro_fa3_table3: our fp16 standard-attention RMSE (best protocol)",
                           _fa3_best(_fp16("naive")), md=sci(2)),
    "FaThreeFlash": Quantity("repro_fa3_table3: our fp16 FlashAttention-2 RMSE (best protocol)",
                             _fa3_best(_fp16("fa2")), md=sci(2)),
    "FaThreeRatio": Quantity("repro_fa3_table3: their ratio (published 1.7)", _fa3_ratio),
    "FaThreeMatch": Quantity("repro_fa3_table3: match factor of the best fp16 protocol",
                             _fa3_best(_fp16("naive"), "match"), md=fixed(1)),
    "FaThreeEightMatch": Quantity("repro_fa3_table3: match factor of the best fp8 protocol",
                                  _fa3_fp8_match, md=fixed(2)),
    # as the protocol prints them: 8192, not 8,192
    "FaThreeEightN": Quantity("repro_fa3_table3: N of the best fp8 protocol",
                              _fa3_best(_fp8("fp8 standard (per-tensor)"), "n"), tex=str),
    "FaThreeEightD": Quantity("repro_fa3_table3: head dim of the best fp8 protocol",
                              _fa3_best(_fp8("fp8 standard (per-tensor)"), "d"), tex=str),
    **{f"FaThreeEight{k}": Quantity(f"repro_fa3_table3: our RMSE, {row} (best protocol)",
                                    _fa3_best(_fp8(row)), md=sci(2), paper=False)
       for k, row in (("Std", "fp8 standard (per-tensor)"),
                      ("Fa", "fp8 FA3 (block quant + Hadamard)"),
                      ("NoBlock", "fp8 FA3 without block quantization"),
                      ("NoHadamard", "fp8 FA3 without incoherent processing"))},
    "FaThreeEightWorst": Quantity("repro_fa3_table3: largest |ours / published - 1| of the fp8 "
                                  "rows, % (rounded up)", _fa3_fp8_worst,
                                  md=lambda x: f"{x}%", paper=False),
    **{f"GoldenFa{k}": Quantity(f"repro_is_flash_stable: {w} flash / standard deviation "
                                "ratio over N (median over the seeds), fa2",
                                _golden_length("fa2", how), md=two, paper=False)
       for k, w, how in (("Min", "smallest", min), ("Max", "largest", max))},
    **{f"GoldenLowpAt{k}{m}": Quantity(f"repro_is_flash_stable: flash / standard deviation "
                                       f"ratio at N = {n}, lowp, {per} over the seeds",
                                       _golden_length("lowp", _at(n), per), md=two,
                                       paper=False)
       for k, n in (("Quarter", 256), ("One", 1024), ("Four", 4096), ("Sixteen", 16384))
       # the seeds' range where README quotes it: the shortest and the longest N
       for m, per in (("", "median"), ("Min", "min"), ("Max", "max"))
       if m == "" or k in ("Quarter", "Sixteen")},
    "GoldenFaSeedMax": Quantity("repro_is_flash_stable: the largest flash / standard ratio of "
                                "fa2 over every N and seed", _golden_length("fa2", max, "max"),
                                md=two),
    "GoldenSeeds": Quantity("repro_is_flash_stable: seeds per cell",
                             lambda F: None if F.table("repro_is_flash_stable") is None
                             else int(F.table("repro_is_flash_stable").get(
                                 "seed", pd.Series([0])).nunique()), tex=str),
    "PcastRatioMin": Quantity("repro_fp8_pcast: smallest MSE gain of reverse + scale over "
                              "forward", _pcast("reverse", "ratio_vs_forward", min), md=two),
    "PcastRatioMax": Quantity("repro_fp8_pcast: largest such gain",
                              _pcast("reverse", "ratio_vs_forward", max), md=two),
    **{f"PcastRatioSeed{k}": Quantity(f"repro_fp8_pcast: the {w} gain of reverse + scale "
                                      "over forward of one seed, any length and height",
                                      _pcast("reverse", col, how), md=two)
       for k, w, col, how in (("Min", "smallest", "ratio_min", min),
                              ("Max", "largest", "ratio_max", max))},
    "PcastSeeds": Quantity("repro_fp8_pcast: seeds per configuration",
                           _pcast("reverse", "seeds", lambda s: int(s.max())),
                           tex=lambda x: str(int(x)), md=lambda x: str(int(x))),
    **{f"PcastSame{k}": Quantity(f"repro_fp8_pcast: {w} gain of reverse + scale over forward "
                                 "with the same scale, sink height 12",
                                 _pcast("reverse", "ratio_vs_forward_same_scale", how, 12),
                                 md=two, paper=False)
       for k, w, how in (("Min", "smallest", min), ("Max", "largest", max))},
    "FaThreeProtocolMeasured": Fact("experiments/fa3_protocol exists", _fa3_measured,
                                    "measured", "not measured", paper=True),
    "FaThreeProtocolInside": Fact("the published ratio lies inside the per-seed range",
                                  _fa3_inside(), "inside", "outside", paper=True),
    **_FA3_HELDOUT,
    "FaThreeProtocolN": Quantity(f"{_PROTOCOL}: N", _fa3(lambda r: r["protocol"]["n"]),
                                 tex=sig(4)),
    **{f"FaThreeProtocol{k}": Quantity(f"{_PROTOCOL}: {w}", _fa3(f), tex=str)
       for k, w, f in (("D", "head dim", lambda r: r["protocol"]["d"]),
                       ("Heads", "heads", lambda r: r["protocol"]["heads"]),
                       ("Rows", "query rows per head", lambda r: r["protocol"]["rows"]),
                       ("Seeds", "seeds", lambda r: r["seeds"]))},
    **{f"FaThreeProtocol{k}": Quantity(f"{_PROTOCOL}: {w}'s mean RMSE",
                                       _fa3(lambda r, p=p: r["summary"][p]["mean"]),
                                       md=sci(2))
       for k, w, p in (("Std", "standard attention", "naive"),
                       ("Flash", "FlashAttention-2", "fa2"))},
    **{f"FaThreeProtocol{k}Sd": Quantity(f"{_PROTOCOL}: {w}'s relative standard deviation "
                                         "over seeds",
                                         _fa3(lambda r, p=p: r["summary"][p]["rel_sd"]),
                                         tex=lambda x: f"{100 * x:.0f}", md=percent)
       for k, w, p in (("Std", "standard attention", "naive"),
                       ("Flash", "FlashAttention-2", "fa2"))},
    **{f"FaThreeProtocol{k}": Quantity(f"{_PROTOCOL}: {w}", _fa3(f), tex=fixed(2), md=fixed(2))
       for k, w, f in (("Ratio", "ratio of the means", lambda r: r["summary"]["ratio_of_means"]),
                       ("RatioMin", "smallest per-seed ratio",
                        lambda r: r["summary"]["ratio"]["min"]),
                       ("RatioMax", "largest per-seed ratio",
                        lambda r: r["summary"]["ratio"]["max"]),
                       ("Published", "the published ratio", lambda r: r["published_ratio"]))},
}


def misquoted(F, paths) -> list[str]:
    """Every marked quote in `paths` that does not say its quantity now (one line each)."""
    return quoting.misquoted(F, paths, QUANTITIES)
