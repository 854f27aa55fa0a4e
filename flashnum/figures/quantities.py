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
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

from flashnum.figures import quoting
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
from flashnum.figures.tex import tex_name
from flashnum.harness.exp_exhaustive import summary as exp_summary
from flashnum.harness.fa3_protocol import summary as fa3_summary
from flashnum.harness.summary import growth


def _bench(F, name: str) -> dict | None:
    """A stored bench result (bench/results/<name>.json), or None."""
    path = Path(F.experiments).parent / "bench" / "results" / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _job(name: str, key: Callable[[dict], object]) -> Callable[[object], object]:
    """A figure of one of the project's own jobs (python bench/bench_jobs.py): `name` is
    run (make run), test (make test) or test_slow (make test-slow)."""
    def value(F):
        r = _bench(F, "jobs")
        job = None if r is None else r["jobs"].get(name)
        return None if job is None else key(job)
    return value


JOBS = (("Run", "run", "the main job (make run)"), ("Test", "test", "the fast suite (make test)"),
        ("TestSlow", "test_slow", "the slow suite (make test-slow)"))
JOB_FIGURES = (("Wall", "wall s", lambda j: j["wall_s"], fixed(0)),
               ("Cpu", "CPU s of its processes", lambda j: j["cpu_s"], fixed(0)),
               ("Load", "1-minute load average before it", lambda j: j["load_average_before"][0],
                fixed(1)))


def _ref(key: Callable[[dict], object], bits: int | None = 256) -> Callable[[object], object]:
    """A figure of the reference benchmark (python bench/bench_reference.py): of its run at
    `bits`, or of the whole result (bits None)."""
    def value(F):
        r = _bench(F, "reference")
        if r is None:
            return None
        if bits is None:
            return key(r)
        run = next((x for x in r["runs"] if x["bits"] == bits), None)
        return None if run is None else key(run)
    return value


def _fa3(key: Callable[[dict], object]) -> Callable[[object], object]:
    """A number of the FA3 fp16 pair at the protocol fixed in advance (experiments/
    fa3_protocol, python -m flashnum.run experiment=fa3_protocol), from its summary."""
    def value(F):
        df = F.table("fa3_protocol")
        return None if df is None else key(fa3_summary(df))
    return value


def _exp(key: Callable[[dict], int]) -> Callable[[object], object]:
    """A count of the exhaustive check of the exp site (experiments/exp_exhaustive,
    python -m flashnum.run experiment=exp_exhaustive), summed over exp and exp2."""
    def value(F):
        df = F.table("exp_exhaustive")
        if df is None:
            return None
        r = exp_summary(df)
        return sum(key(r[f]) for f in ("exp", "exp2") if f in r)
    return value


def _qiu_yao_logit_std(F):
    """The largest logit std of Qiu & Yao's inputs (repro_qiu_yao, the clamp sweep aside)."""
    df = F.table("repro_qiu_yao")
    if df is None or "logit_std" not in df:
        return None
    std = df[df.distribution != "clamp_sweep"].logit_std
    return float(std.max()) if std.notna().any() else None


def _qiu_yao_z(variant: str) -> Callable[[object], object]:
    """z over heads of the mean signed error on tied maxima under lowp, at the largest
    logit std (repro_qiu_yao): `variant` fa2 (no fix) or qiu_yao (the max adjustment)."""
    def value(F):
        df = F.table("repro_qiu_yao")
        if df is None or "z_heads" not in df:
            return None
        d = df[(df.distribution == "ties") & (df.policy == "lowp") & (df.variant == variant)]
        if "logit_std" in d and d.logit_std.notna().any():
            d = d[d.logit_std == d.logit_std.max()]
        return float(d.z_heads.iloc[0]) if len(d) else math.nan
    return value


def _fa3_measured(F):
    """Whether the protocol fixed in advance was measured (None: it was not)."""
    return None if F.table("fa3_protocol") is None else True


def _fa3_inside(F):
    """Whether the published ratio lies inside the per-seed range of the protocol's ratio."""
    df = F.table("fa3_protocol")
    if df is None:
        return None
    r = fa3_summary(df)
    return r["summary"]["ratio"]["min"] <= r["published_ratio"] <= r["summary"]["ratio"]["max"]


def _fa3_published(row: str) -> Callable[[object], object]:
    """The published number of one row of FA3's Table 3 (repro_fa3_table3)."""
    def value(F):
        df = F.table("repro_fa3_table3")
        if df is None:
            return None
        d = df[(df.row == row) & df.published.notna()]
        return float(d.published.iloc[0]) if len(d) else math.nan
    return value


def _fa3_best(pick: Callable, col: str = "ours") -> Callable[[object], object]:
    """A column of FA3 Table 3's best-matching protocol (repro_fa3_table3, rows flagged
    `best`), on the row pick(best rows) selects (a boolean mask)."""
    def value(F):
        df = F.table("repro_fa3_table3")
        if df is None or "best" not in df or col not in df:
            return None
        b = df[df["best"].astype(bool)]
        d = b[pick(b)]
        return d[col].iloc[0].item() if len(d) else math.nan
    return value


def _fp16(policy: str) -> Callable:
    return lambda b: (b.section == "fp16") & (b.policy == policy)


def _fp8(row: str) -> Callable:
    return lambda b: b.row == row


def _fa3_ratio(F):
    std, fa = (_fa3_best(_fp16(p))(F) for p in ("naive", "fa2"))
    return None if std is None else std / fa


def _fa3_fp8_worst(F):
    """The largest |ours / published - 1| over the published fp8 rows, in whole % (up)."""
    df = F.table("repro_fa3_table3")
    if df is None or "best" not in df:
        return None
    b = df[df["best"].astype(bool) & (df.section == "fp8") & df.published.notna()]
    return math.ceil(100 * float((b.ours / b.published - 1).abs().max())) if len(b) else None


def _fa3_fp8_match(F):
    df = F.table("repro_fa3_table3")
    if df is None or "best" not in df or "match" not in df:
        return None
    m = df[df["best"].astype(bool) & (df.section == "fp8")]["match"].dropna()
    return float(m.iloc[0]) if len(m) else math.nan


def _golden_length(policy: str, how: Callable) -> Callable[[object], object]:
    """Golden et al.: the flash / standard deviation ratio over the length sweep
    (repro_is_flash_stable), reduced by how(Series indexed by N)."""
    def value(F):
        df = F.table("repro_is_flash_stable")
        if df is None or "ratio_to_standard" not in df:
            return None
        d = df[(df.sweep == "length") & (df.policy == policy)].set_index("n")
        return float(how(d.ratio_to_standard)) if len(d) else math.nan
    return value


def _at(n: int) -> Callable:
    return lambda r: r.get(n, math.nan)


def _pcast(order: str, col: str, how: Callable, height=None) -> Callable[[object], object]:
    """The fp8 P cast (repro_fp8_pcast): a gain at the largest static scale in `order`,
    reduced by how(), over every length and sink height or at one height."""
    def value(F):
        df = F.table("repro_fp8_pcast")
        if df is None or col not in df:
            return None
        d = df[(df.order == order) & (df.p_scale == df.p_scale.max())]
        if height is not None:
            d = d[d.height == height]
        return float(how(d[col])) if len(d) else math.nan
    return value


def _rows(name: str) -> Callable[[object], object]:
    """How many rows an experiment's stored table holds."""
    def value(F):
        df = F.table(name)
        return None if df is None else len(df)
    return value


# the sweeps whose sizes README quotes (each beside the time it took), and the other
# tables docs/experiments.md counts
SWEEPS = ("fp16_sweep", "fp32_sweep", "block_order", "block_size", "seqlen_growth",
          "precision_bits", "kernel_vs_emulator", "worst_case")
COUNTED = (*SWEEPS, "block_scaled", "splitkv_decode")
# the sweeps whose every row the invariants m_ok and l_ok are checked on
INVARIANT_SWEEPS = ("bf16_sweep", *SWEEPS)


def _growth(name: str, x: str, policy: str) -> Callable[[object], object]:
    """The exponent a of max error ~ x^a a sweep's summary fits for a policy
    (flashnum.harness.summary.growth: over the whole table; not the paper's SlopeN, the
    median over seeds of seqlen_growth)."""
    def value(F):
        df = F.table(name)
        if df is None:
            return None
        fit = growth(df, x, "max_abs_err").get(policy)
        return math.nan if fit is None else float(fit[0])
    return value


def _invariants_hold(F):
    """Whether m_ok and l_ok hold in every row of every sweep (None: a sweep is missing)."""
    tables = [F.table(n) for n in INVARIANT_SWEEPS]
    if any(t is None for t in tables):
        return None
    return all(bool(t[c].astype(bool).all()) for t in tables for c in ("m_ok", "l_ok"))

def _worst_case(col: str, precision: str = "bf16", how=None) -> Callable[[object], object]:
    """The searched worst case of worst_case at N = 1024, d = 64: a column of its row in
    `precision` (how=None) or reduced over both precisions."""
    def value(F):
        df = F.table("worst_case")
        if df is None or col not in df:
            return None
        w = df[(df.distribution == "worst_case") & (df.seq_len_q == 1024) & (df.head_dim == 64)]
        if how is not None:
            return how(w[col]) if len(w) else math.nan
        w = w[w.precision == precision]
        return float(w[col].iloc[0]) if len(w) else math.nan
    return value


def _tightness_median(F):
    """The median bound / error of fa2 in bf16 and fp16 where the bound is finite
    (experiments/bound_tightness, python -m flashnum.run experiment=bound_tightness)."""
    t = F.table("bound_tightness")
    if t is None:
        return None
    fa = t[(t.policy == "fa2") & t.precision.isin(["bf16", "fp16"]) & t.bound.map(math.isfinite)]
    return float(fa.tightness.median())


def _qiu_yao_released(F):
    """Mean signed error of Qiu & Yao's fix as released, ties, lowp, largest logit std."""
    df = F.table("repro_qiu_yao")
    if df is None:
        return None
    d = df[(df.distribution == "ties") & (df.policy == "lowp")
           & (df.variant == "qiu_yao_released")]
    if "logit_std" in d and d.logit_std.notna().any():
        d = d[d.logit_std == d.logit_std.max()]
    return float(d.ours.iloc[0]) if len(d) else math.nan


def _clamp(how: Callable) -> Callable[[object], object]:
    """The released fix's clamp sweep (repro_qiu_yao, lowp rows of clamp_sweep), reduced
    by how(rows); None without a sweep."""
    def value(F):
        df = F.table("repro_qiu_yao")
        if df is None or not {"max_logit", "onset"} <= set(df.columns):
            return None
        sw = df[(df.distribution == "clamp_sweep") & (df.variant == "qiu_yao_released")
                & (df.policy == "lowp")]
        return how(sw) if len(sw) else None
    return value


def _max_or_nan(s) -> float:
    return float(s.max()) if len(s) else math.nan


def _min_or_nan(s) -> float:
    return float(s.min()) if len(s) else math.nan


def _bwd_speed(key: Callable[[dict], object]) -> Callable[[object], object]:
    """A figure of the backward benchmark's speed part (bench/bench_backward.py)."""
    def value(F):
        r = _bench(F, "backward")
        return None if r is None or "cpu_model" not in r else key(r)
    return value


_BWD = "bench/results/backward.json"
_BWD_BENCH = {
    **{f"BwdBench{k}": Quantity(f"{_BWD}: {w}", _bwd_speed(f), md=fixed(2), paper=False)
       for k, w, f in (
           ("Seconds", "the fused bf16 fa2 backward, 8 x 4096 x 64, best wall s",
            lambda r: r["speed"]["emulate_bf16_fa2_backward_s"]),
           ("TorchSeconds", "torch's fp32 SDPA backward, best wall s",
            lambda r: r["speed"]["torch_fp32_sdpa_backward_s"]),
           ("Ratio", "the fused backward / torch's fp32 SDPA backward",
            lambda r: r["speed"]["ratio_vs_backward"]),
           ("RatioFwdBwd", "the fused backward / torch's fp32 SDPA forward + backward",
            lambda r: r["speed"]["ratio_vs_forward_backward"]),
           ("RatioMedian", "the median over the interleaved pairs of their ratio",
            lambda r: r["speed"]["ratio_vs_backward_median_pair"]),
           ("CpuRatio", "the same ratio in one-thread process CPU time",
            lambda r: r["speed"]["cpu_ratio_one_thread"]),
           ("LoopRatio", "the torch loop (fused off) / torch's fp32 SDPA backward",
            lambda r: r["speed"]["ratio_torch_loop"]))},
    **{f"BwdBenchLoad{k}": Quantity(f"{_BWD}: {w} load average before and after the speed part",
                                    _bwd_speed(lambda r, how=how: how(
                                        r["load_average_before"][0],
                                        r["load_average_after"][0])),
                                    md=fixed(1), paper=False)
       for k, w, how in (("Min", "the lower", min), ("Max", "the higher", max))},
    "BwdBenchCpu": Quantity(f"{_BWD}: the CPU model", _bwd_speed(lambda r: r["cpu_model"]),
                            md=str, paper=False),
}


_PROTOCOL = "experiments/fa3_protocol"
QUANTITIES = {
    "SweepCases": Quantity("rows in bf16_sweep", _rows("bf16_sweep"), md=count),
    **{f"Rows{tex_name(n)}": Quantity(f"rows in {n}", _rows(n), md=count, paper=False)
       for n in COUNTED},
    **{f"SweepGrowth{k}": Quantity(f"{n}: the fitted exponent a of max error ~ {x}^a, {p} "
                                   "(the sweep's summary)", _growth(n, x, p),
                                   md=lambda a: f"{a:+.2f}", paper=False)
       for k, n, x, p in (("NFa", "bf16_sweep", "seq_len_k", "fa2"),
                          ("NLowp", "bf16_sweep", "seq_len_k", "lowp"),
                          ("BlockNLowp", "bf16_sweep", "block_n", "lowp"),
                          ("NLowpFp", "fp16_sweep", "seq_len_k", "lowp"),
                          ("BlockNLowpFp", "fp16_sweep", "block_n", "lowp"))},
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
    **{f"RefCert{k}{b}": Quantity(f"bench_reference: certified, one head N = 4096, d = 64, "
                                  f"{bits} bits, {w}", _ref(lambda r, f=f: r[f], bits),
                                  md=fixed(1), paper=False)
       for b, bits in (("", 256), ("LowBits", 128))
       for k, w, f in (("Wall", "wall s", "certified_wall_s"),
                       ("Cpu", "CPU s", "certified_cpu_s"))},
    **{f"RefSpeedup{k}{b}": Quantity(f"bench_reference: certified's speedup over the mpmath "
                                     f"row loop, {bits} bits, {w}",
                                     _ref(lambda r, f=f: r[f], bits), md=fixed(0), paper=False)
       for b, bits in (("", 256), ("LowBits", 128))
       for k, w, f in (("Wall", "wall time", "speedup_wall"),
                       ("Cpu", "CPU time", "speedup_cpu"))},
    **{f"RefMpHead{k}{b}": Quantity(f"bench_reference: the mpmath row loop on the head, "
                                    f"extrapolated, {bits} bits, {w}",
                                    _ref(lambda r, f=f: r[f], bits), md=fixed(0), paper=False)
       for b, bits in (("", 256), ("LowBits", 128))
       for k, w, f in (("Wall", "wall s", "mpmath_head_wall_s_extrapolated"),
                       ("Cpu", "CPU s", "mpmath_head_cpu_s_extrapolated"))},
    **{f"RefMpRowCpu{b}": Quantity(f"bench_reference: mpmath row loop, CPU s per row, {bits} "
                                   "bits", _ref(lambda r: r["mpmath_per_row_cpu_s"], bits),
                                   md=fixed(3), paper=False)
       for b, bits in (("", 256), ("LowBits", 128))},
    "RefFastRows": Quantity("bench_reference: rows of the head settled by the fast path, 256 "
                            "bits", _ref(lambda r: r["certified_fast_rows"]), md=count,
                            paper=False),
    "RefTextbookRow": Quantity("bench_reference: a textbook mpmath row (Python sum of mpf "
                               "products), wall s", _ref(lambda r: r["textbook_row_wall_s"]),
                               md=fixed(1), paper=False),
    "RefFpWall": Quantity("bench_reference: method fp64 on the head, wall s",
                          _ref(lambda r: r["fp64_wall_s"], None), md=fixed(1), paper=False),
    **{f"RefFp{k}": Quantity(f"bench_reference: fp64's {w} on the head",
                             _ref(lambda r, f=f: r[f], None), md=sci(2), paper=False)
       for k, w, f in (("Err", "largest error", "fp64_max_err"),
                       ("Bound", "largest bound", "fp64_max_bound"))},
    **{f"RefLoad{k}": Quantity(f"bench_reference: 1-minute load average at the {w}",
                               _ref(lambda r, i=i: r["loadavg_1min_start_end"][i], None),
                               md=fixed(1), paper=False)
       for k, w, i in (("Start", "start", 0), ("End", "end", 1))},
    **{f"Job{J}{K}": Quantity(f"bench_jobs: {what}, {w}", _job(name, f), md=md, paper=False)
       for J, name, what in JOBS for K, w, f, md in JOB_FIGURES},
    "QiuYaoLogitStdMax": Quantity("repro_qiu_yao: the largest logit std", _qiu_yao_logit_std,
                                  md=lambda x: f"{x:g}"),
    "QiuYaoZ": Quantity("repro_qiu_yao: z over heads of the bias, ties, lowp, no fix",
                        _qiu_yao_z("fa2"), md=fixed(1)),
    "QiuYaoZFixed": Quantity("repro_qiu_yao: the same with the max adjustment",
                             _qiu_yao_z("qiu_yao"), md=fixed(1)),
    **{f"FaThreePublished{k}": Quantity(f"repro_fa3_table3: the published fp16 RMSE, {w}",
                                        _fa3_published(f"fp16 {w}"), md=sci(2))
       for k, w in (("Std", "standard"), ("Flash", "FlashAttention-2"))},
    **{f"WorstCaseSearch{k}": Quantity(f"worst_case: the searched inputs' max error / "
                                       f"gaussian's, {p}, N = 1024, d = 64",
                                       _worst_case("search_ratio", p), md=fixed(0), paper=False)
       for k, p in (("Bf", "bf16"), ("Fp", "fp16"))},
    "WorstCaseEvals": Quantity("worst_case: the most evaluations a search took (N = 1024, "
                               "d = 64)", _worst_case("search_n_evals", how=lambda c: int(c.max())),
                               paper=False),
    "WorstCaseUlp": Quantity("worst_case: the searched bf16 inputs' max error, ulps of the "
                             "output", _worst_case("max_ulp_err"), md=fixed(1), paper=False),
    "TightnessMedianFp": Quantity("bound_tightness: median bound / error, "
                                  "fa2, bf16 and fp16, finite bounds", _tightness_median,
                                  md=fixed(0), paper=False),
    "QiuYaoReleasedErr": Quantity("repro_qiu_yao: mean signed error of their released fix, "
                                  "ties, lowp", _qiu_yao_released, md=lambda x: f"{x:+.2f}"),
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
                                "ratio over N, fa2", _golden_length("fa2", how), md=two,
                                paper=False)
       for k, w, how in (("Min", "smallest", min), ("Max", "largest", max))},
    **{f"GoldenLowpAt{k}": Quantity(f"repro_is_flash_stable: flash / standard deviation "
                                    f"ratio at N = {n}, lowp", _golden_length("lowp", _at(n)),
                                    md=two, paper=False)
       for k, n in (("Quarter", 256), ("One", 1024), ("Four", 4096), ("Sixteen", 16384))},
    "PcastRatioMin": Quantity("repro_fp8_pcast: smallest MSE gain of reverse + scale over "
                              "forward", _pcast("reverse", "ratio_vs_forward", min), md=two),
    "PcastRatioMax": Quantity("repro_fp8_pcast: largest such gain",
                              _pcast("reverse", "ratio_vs_forward", max), md=two),
    **{f"PcastSame{k}": Quantity(f"repro_fp8_pcast: {w} gain of reverse + scale over forward "
                                 "with the same scale, sink height 12",
                                 _pcast("reverse", "ratio_vs_forward_same_scale", how, 12),
                                 md=two, paper=False)
       for k, w, how in (("Min", "smallest", min), ("Max", "largest", max))},
    "FaThreeProtocolMeasured": Fact("experiments/fa3_protocol exists", _fa3_measured,
                                    "measured", "not measured", paper=True),
    "FaThreeProtocolInside": Fact("the published ratio lies inside the per-seed range",
                                  _fa3_inside, "inside", "outside", paper=True),
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
    **_BWD_BENCH,
}


def misquoted(F, paths) -> list[str]:
    """Every marked quote in `paths` that does not say its quantity now (one line each)."""
    return quoting.misquoted(F, paths, QUANTITIES)
