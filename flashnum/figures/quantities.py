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

import numpy as np
import pandas as pd

from flashnum.figures import quoting
from flashnum.figures.pooling import pcast_by_config, qiu_yao_pooled, worst_case_ratios
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
from flashnum.reproduce.qiu_yao_bias import QY_SIZES


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


def _fa3(key: Callable[[dict], object], name: str = "fa3_protocol"
         ) -> Callable[[object], object]:
    """A number of the FA3 fp16 pair at the protocol N = 8192, d = 128, from its summary:
    over seeds 0-7 (experiments/fa3_protocol, chosen after the search) or over the
    held-out seeds fixed before their run (name fa3_protocol_heldout)."""
    def value(F):
        df = F.table(name)
        return None if df is None else key(fa3_summary(df))
    return value


def _fa3_seeds(how: Callable, name: str) -> Callable[[object], object]:
    """The first or last seed of an fa3_protocol table."""
    def value(F):
        df = F.table(name)
        return None if df is None else int(how(df.seed))
    return value


def _run_commit(name: str) -> Callable[[object], object]:
    """The short commit of a table's last run (its manifest), for the text that dates it."""
    def value(F):
        path = Path(F.experiments) / name / "manifest.json"
        if not path.exists():
            return None
        return json.loads(path.read_text())["runs"][-1]["git"]["commit"][:7]
    return value


def _exp(key: Callable[[dict], int]) -> Callable[[object], object]:
    """A count of the exhaustive check of the exp site (experiments/exp_exhaustive,
    python -m flashnum.run experiment=exp_exhaustive), summed over exp and exp2."""
    def value(F):
        df = F.table("exp_exhaustive")
        if df is None:
            return None
        r = exp_summary(df)
        try:
            return sum(key(r[f]) for f in ("exp", "exp2") if f in r)
        except KeyError:  # a table stored before the check had this column: not measured
            return None
    return value


QY_STDS = QY_SIZES["full"]["logit_stds"]  # the logit spreads repro_qiu_yao measures


def _qy_row(F, dist: str, policy: str, variant: str, std: float | None):
    """One row of repro_qiu_yao pooled over its seeds (flashnum.figures.pooling), or None."""
    df = F.table("repro_qiu_yao")
    if df is None or "z_heads" not in df:
        return None
    p = qiu_yao_pooled(df)
    d = p[(p.distribution == dist) & (p.policy == policy) & (p.variant == variant)]
    d = d[d.logit_std == std] if std is not None else d
    return d.iloc[0] if len(d) else math.nan


def _qy(dist: str, policy: str, variant: str, col: str, std: float | None,
        how: Callable = float) -> Callable[[object], object]:
    """A column of one pooled row of repro_qiu_yao (NaN when the row is not there)."""
    def value(F):
        r = _qy_row(F, dist, policy, variant, std)
        return r if r is None or not isinstance(r, pd.Series) else how(r[col])
    return value


def _qy_fact(test: Callable[[dict], bool], **cols) -> Callable[[object], object]:
    """A yes/no of pooled repro_qiu_yao numbers: test({name: value}) over cols, each
    name -> (dist, policy, variant, col, std)."""
    def value(F):
        vals = {k: _qy(*spec)(F) for k, spec in cols.items()}
        if any(v is None for v in vals.values()):
            return None
        return bool(test(vals))
    return value


def _qy_quantities() -> dict:
    """Qiu & Yao's pooled numbers and the facts the sentences branch on, per logit std:
    QiuYaoZ<Std> (ties, lowp, no fix), ZMin/ZMax (its seeds' range), ZFixed (the
    idealised fix), ZFix (the fix's paired z, > 0: it shrinks |bias|), ZBroken (ties
    broken), ZFaTwo (fa2 state); NaN where not measured."""
    out = {}
    for std in QY_STDS:
        S, at = tex_name(str(int(std))), f"logit std {std:g}"
        tie, fix = ("ties", "lowp", "fa2"), ("ties", "lowp", "qiu_yao")
        for k, spec, w in (
                ("Z", (*tie, "z"), "z of the bias pooled over seeds, ties, lowp, no fix"),
                ("ZMin", (*tie, "z_min"), "the smallest z of one seed, ties, lowp, no fix"),
                ("ZMax", (*tie, "z_max"), "the largest z of one seed, ties, lowp, no fix"),
                ("ZFixed", (*fix, "z"), "pooled z with the idealised fix, ties, lowp"),
                ("ZFix", (*fix, "z_fix"), "pooled paired z of the fix's shrinkage of "
                                            "|bias| (> 0: smaller), ties, lowp"),
                ("ZFixMin", (*fix, "z_fix_min"), "the smallest z_fix of one seed"),
                ("ZFixMax", (*fix, "z_fix_max"), "the largest z_fix of one seed"),
                ("ZBroken", ("ties_broken", "lowp", "fa2", "z"), "pooled z, ties broken, "
                                                                 "lowp, no fix"),
                ("ZFaTwo", ("ties", "fa2", "fa2", "z"), "pooled z, ties, fa2, no fix")):
            out[f"QiuYao{k}{S}"] = Quantity(f"repro_qiu_yao, {at}: {w}",
                                            _qy(*spec[:3], spec[3], std), md=two)
        # how many seeds are significant alone: without the fix at every spread, with it
        # where the text says what it leaves (the peaked rows)
        counted = [("SeedsBiased", tie, "ties, lowp, no fix")] + (
            [("SeedsBiasedFixed", fix, "ties, lowp, the idealised fix")]
            if std == QY_STDS[-1] else [])
        for k, spec, w in counted:
            out[f"QiuYao{k}{S}"] = Quantity(
                f"repro_qiu_yao, {at}: seeds whose own z has the pooled sign and |z| >= 3, {w}",
                _qy(*spec, "seeds_significant", std, int), tex=str)
        z, zf, zb = ((*tie, "z", std), (*fix, "z_fix", std),
                     ("ties_broken", "lowp", "fa2", "z", std))
        for k, test, cols, w, yes, no in (
                ("Negative", lambda v: v["z"] <= -3, dict(z=z),
                 "pooled z <= -3 on ties, lowp (the published negative bias)",
                 "a negative bias", "no negative bias"),
                ("FixHelps", lambda v: v["zf"] >= 3, dict(zf=zf),
                 "the idealised fix shrinks |bias| by >= 3 paired standard errors",
                 "shrinks it", "does not shrink it"),
                ("FixHurts", lambda v: v["zf"] <= -3, dict(zf=zf),
                 "the idealised fix grows |bias| by >= 3 paired standard errors",
                 "makes it larger", "does not make it larger"),
                ("BrokenBiased", lambda v: abs(v["zb"]) >= 3, dict(zb=zb),
                 "|pooled z| >= 3 with the ties broken", "biased", "not biased"),
                ("BrokenSameSign", lambda v: v["zb"] * v["z"] > 0, dict(z=z, zb=zb),
                 "the control's pooled z has the sign of the ties'", "same sign",
                 "opposite sign")):
            out[f"QiuYao{k}{S}"] = Fact(f"repro_qiu_yao, {at}: {w}", _qy_fact(test, **cols),
                                        yes, no, paper=True)
    top, others = tex_name(str(int(QY_STDS[-1]))), [tex_name(str(int(x))) for x in QY_STDS[:-1]]

    def only_peaked(F):
        helps = {S: out[f"QiuYaoFixHelps{S}"].value(F) for S in (top, *others)}
        if any(v is None for v in helps.values()):
            return None
        return bool(helps[top] and not any(helps[S] for S in others))

    out["QiuYaoFixHelpsOnlyPeaked"] = Fact(
        f"repro_qiu_yao: the idealised fix shrinks |bias| at logit std {QY_STDS[-1]:g} and at "
        "no smaller spread", only_peaked, "only on the peaked rows", "not only there",
        paper=True)
    out["QiuYaoSeeds"] = Quantity("repro_qiu_yao: seeds pooled per cell",
                                  _qy("ties", "lowp", "fa2", "seeds", QY_STDS[-1], int),
                                  tex=str)
    out["QiuYaoZGauss"] = Quantity("repro_qiu_yao: pooled z on gaussian inputs, lowp, no fix",
                                   _qy("gaussian", "lowp", "fa2", "z", None), md=fixed(1))
    return out


def _fa3_measured(F):
    """Whether the protocol fixed in advance was measured (None: it was not)."""
    return None if F.table("fa3_protocol") is None else True


def _fa3_inside(name: str = "fa3_protocol") -> Callable[[object], object]:
    """Whether the published ratio lies inside the per-seed range of the protocol's ratio."""
    def value(F):
        df = F.table(name)
        if df is None:
            return None
        r = fa3_summary(df)
        return (r["summary"]["ratio"]["min"] <= r["published_ratio"]
                <= r["summary"]["ratio"]["max"])
    return value


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


def _golden_length(policy: str, how: Callable, per: str = "median"
                   ) -> Callable[[object], object]:
    """Golden et al.: the flash / standard deviation ratio over the length sweep
    (repro_is_flash_stable), per N its `per` (median, min or max) over the seeds, reduced
    by how(Series indexed by N)."""
    def value(F):
        df = F.table("repro_is_flash_stable")
        if df is None or "ratio_to_standard" not in df:
            return None
        d = df[(df.sweep == "length") & (df.policy == policy)]
        r = d.groupby("n").ratio_to_standard.agg(per)
        return float(how(r)) if len(r) else math.nan
    return value


def _at(n: int) -> Callable:
    return lambda r: r.get(n, math.nan)


def _pcast(order: str, col: str, how: Callable, height=None) -> Callable[[object], object]:
    """The fp8 P cast (repro_fp8_pcast): a gain at the largest static scale in `order`,
    each configuration's median over its seeds, reduced by how() over every length and
    sink height or at one height (col ratio_min / ratio_max: the seeds' extremes)."""
    def value(F):
        df = F.table("repro_fp8_pcast")
        if df is None or "ratio_vs_forward" not in df:
            return None
        c = pcast_by_config(df)
        if col not in c:
            return None
        d = c[(c.order == order) & (c.p_scale == c.p_scale.max())]
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


def _slope(x, y) -> float:
    """Least-squares exponent a of y ~ x^a over the positive points (as the figures fit)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = (x > 0) & (y > 0) & np.isfinite(y)
    if len(np.unique(x[ok])) < 2:
        return math.nan
    return float(np.polyfit(np.log(x[ok]), np.log(y[ok]), 1)[0])


def _exponents(F, name: str, x: str, policy: str, precision: str,
               col: str = "normwise_rel_err") -> dict | None:
    """{distribution: the exponent a of col ~ x^a} of one policy and precision of a sweep,
    each fitted to the median over the seeds at each x (block_size: at its largest N and
    block_m 64, the swapped slice aside); None without the table."""
    df = F.table(name)
    if df is None:
        return None
    d = df[(df.policy == policy) & (df.precision == precision)]
    if name == "block_size":
        d = d[(d.block_m == 64) & (d.seq_len_k == d.seq_len_k.max())]
    out = {}
    for dist, g in d.groupby("distribution"):
        med = g.groupby(x)[col].median().sort_index()
        out[dist] = _slope(med.index.to_numpy(float), med.to_numpy(float))
    return out


def _growth(name: str, x: str, policy: str, precisions: tuple, how: Callable
            ) -> Callable[[object], object]:
    """how(the exponents of every distribution and precision in `precisions`)."""
    def value(F):
        per = [_exponents(F, name, x, policy, p) for p in precisions]
        if any(e is None for e in per):
            return None
        vals = [a for e in per for a in e.values()]
        return how(vals) if vals else math.nan
    return value


def _seeds(name: str) -> Callable[[object], object]:
    """How many seeds a table's rows were drawn at."""
    def value(F):
        df = F.table(name)
        return None if df is None else int(df.seed.nunique())
    return value


def _growth_quantities() -> dict:
    """How the normwise relative error grows with N (seqlen_growth) and with block_n
    (block_size) per distribution: the range of the exponents of fa2 and lowp, and
    whether lowp's has one sign on every distribution."""
    out = {}
    quoted = (("N", "seqlen_growth", "seq_len_k", "fa2", ("bf16", "fp16")),
              ("NLowpBf", "seqlen_growth", "seq_len_k", "lowp", ("bf16",)),
              ("NLowpFp", "seqlen_growth", "seq_len_k", "lowp", ("fp16",)),
              ("BlockN", "block_size", "block_n", "fa2", ("bf16",)),
              ("BlockNLowp", "block_size", "block_n", "lowp", ("bf16",)))
    for key, name, x, pol, precs in quoted:
        for m, mw, how in (("Lo", "smallest", min), ("Hi", "largest", max)):
            out[f"Growth{key}{m}"] = Quantity(
                f"{name}: the {mw} exponent a of normwise relative error ~ {x}^a over its "
                f"distributions, {pol}, {'/'.join(precs)} (median over seeds per point)",
                _growth(name, x, pol, precs, how), md=lambda a: f"{a:+.2f}", paper=False)
    for key, name in (("SeqlenGrowth", "seqlen_growth"), ("BlockSize", "block_size"),
                      ("Attribution", "attribution")):
        out[f"{key}Seeds"] = Quantity(f"{name}: seeds", _seeds(name), paper=False)
    out["GrowthNLowpAllGrow"] = Fact(
        "seqlen_growth: lowp's normwise relative error grows with N on every distribution, "
        "bf16 and fp16", _growth("seqlen_growth", "seq_len_k", "lowp", ("bf16", "fp16"),
                                 lambda v: all(a > 0 for a in v)),
        "on every one", "not on every one")
    out["GrowthBlockNLowpAllFall"] = Fact(
        "block_size: lowp's normwise relative error falls with block_n on every distribution",
        _growth("block_size", "block_n", "lowp", ("bf16",), lambda v: all(a < 0 for a in v)),
        "on every one", "not on every one")
    return out


def _invariants_hold(F):
    """Whether m_ok and l_ok hold in every row of every sweep (None: a sweep is missing)."""
    tables = [F.table(n) for n in INVARIANT_SWEEPS]
    if any(t is None for t in tables):
        return None
    return all(bool(t[c].astype(bool).all()) for t in tables for c in ("m_ok", "l_ok"))

def _worst_case(col: str, precision: str = "bf16", how=None) -> Callable[[object], object]:
    """A column of worst_case's searched rows (distribution worst_case) at d = 64 and the
    largest N: reduced by how over precisions and seeds, or (how None) the median over the
    seeds of `precision`."""
    def value(F):
        df = F.table("worst_case")
        if df is None or col not in df:
            return None
        w = df[(df.distribution == "worst_case") & (df.head_dim == 64)]
        w = w[w.seq_len_k == w.seq_len_k.max()]
        if how is not None:
            return how(w[col]) if len(w) else math.nan
        w = w[w.precision == precision]
        return float(w[col].median()) if len(w) else math.nan
    return value


def _worst(dist: str, col: str, how: Callable, precision: str | None = "bf16",
           n: str | None = "max") -> Callable[[object], object]:
    """A measure of worst_case's `dist` rows beside gaussian's (flashnum.figures.pooling.
    worst_case_ratios: abs, rel, ulp, gauss_ulp, err), reduced over the seeds by how, at
    `precision` (None: every precision) and the largest N (None: every N)."""
    def value(F):
        df = F.table("worst_case")
        if df is None or "normwise_rel_err" not in df:
            return None
        r = worst_case_ratios(df, dist)
        if precision is not None:
            r = r[r.precision == precision]
        if n is not None:
            r = r[r.seq_len_k == r.seq_len_k.max()]
        return float(how(r[col])) if len(r) else math.nan
    return value


def _near_overflow_v(F):
    """The level of near_overflow's V (its dist_params' v_level)."""
    df = F.table("worst_case")
    if df is None:
        return None
    d = df[df.distribution == "near_overflow"]
    return float(json.loads(d.dist_params.iloc[0])["v_level"]) if len(d) else math.nan


def _worst_quantities() -> dict:
    """The worst-case search and the catalogue's largest absolute error (near_overflow),
    each beside gaussian inputs in absolute, normwise relative and ulp terms."""
    med, lo, hi = (lambda s: s.median()), min, max
    w = "worst_case: the searched inputs'"
    out = {
        "WorstCaseSeeds": Quantity("worst_case: searches per precision and N (seeds)",
                                   _worst_case("seed", how=lambda c: c.nunique()), tex=str),
        "WorstCaseN": Quantity("worst_case: the largest N searched",
                               _worst("worst_case", "seq_len_k", max), tex=lambda x: str(int(x)),
                               md=lambda x: str(int(x))),
        **{f"WorstCaseSearch{k}{m}": Quantity(f"{w} max error / gaussian's (|V| in the same "
                                              f"range), {p}, largest N, {mw} over the seeds",
                                              _worst("worst_case", "abs", how, p), md=fixed(0))
           for k, p in (("Bf", "bf16"), ("Fp", "fp16"))
           for m, mw, how in (("", "median", med), ("Min", "smallest", lo),
                              ("Max", "largest", hi))},
        **{f"WorstCaseSearch{k}": Quantity(f"{w} max error / gaussian's, {mw} over every "
                                           "precision, N and seed",
                                           _worst("worst_case", "abs", how, None, None),
                                           md=fixed(0))
           for k, mw, how in (("Lo", "smallest", lo), ("Hi", "largest", hi))},
        "WorstCaseRelBf": Quantity(f"{w} normwise relative error / gaussian's, bf16, largest "
                                   "N, median over the seeds", _worst("worst_case", "rel", med),
                                   md=fixed(2)),
        **{f"WorstCaseRel{k}": Quantity(f"{w} normwise relative error / gaussian's, {mw} over "
                                        "every precision, N and seed",
                                        _worst("worst_case", "rel", how, None, None),
                                        md=fixed(2))
           for k, mw, how in (("Lo", "smallest", lo), ("Hi", "largest", hi))},
        "WorstCaseUlp": Quantity(f"{w} max error in ulps of the output, bf16, largest N, "
                                 "median over the seeds", _worst("worst_case", "ulp", med),
                                 md=fixed(1)),
        "WorstCaseUlpHi": Quantity(f"{w} largest max ulp error over every precision, N and "
                                   "seed", _worst("worst_case", "ulp", hi, None, None),
                                   md=fixed(1)),
        "WorstCaseGaussUlp": Quantity("worst_case: gaussian inputs' max ulp error, bf16, "
                                      "largest N, median over the seeds",
                                      _worst("worst_case", "gauss_ulp", med), md=sci(2)),
        "WorstCaseRelBelow": Fact(f"{w} normwise relative error is below gaussian's at "
                                  "every precision, N and seed",
                                  lambda F: (lambda x: None if x is None else x < 1)(
                                      _worst("worst_case", "rel", hi, None, None)(F)),
                                  "below", "not below", paper=True),
        "NearOverflowV": Quantity("worst_case: the level of near_overflow's V",
                                  _near_overflow_v, md=lambda x: f"{x:.0e}".replace("e+0", "e")),
        "NearOverflowErr": Quantity("worst_case: near_overflow's max error, bf16, largest N, "
                                    "median over the seeds", _worst("near_overflow", "err", med),
                                    md=fixed(0)),
        "NearOverflowAbsBf": Quantity("worst_case: near_overflow's max error / gaussian's, "
                                      "bf16, largest N, median over the seeds",
                                      _worst("near_overflow", "abs", med), md=sci(2)),
        "NearOverflowRelBf": Quantity("worst_case: near_overflow's normwise relative error / "
                                      "gaussian's, bf16, largest N, median over the seeds",
                                      _worst("near_overflow", "rel", med), md=fixed(2)),
        "NearOverflowRelHi": Quantity("worst_case: near_overflow's largest normwise relative "
                                      "error / gaussian's over every precision, N and seed",
                                      _worst("near_overflow", "rel", hi, None, None),
                                      md=fixed(2)),
        "NearOverflowUlpHi": Quantity("worst_case: near_overflow's largest max ulp error over "
                                      "every precision, N and seed",
                                      _worst("near_overflow", "ulp", hi, None, None),
                                      md=fixed(2)),
    }
    return out


def _tightness_median(F):
    """The median bound / error of fa2 in bf16 and fp16 where the bound is finite
    (experiments/bound_tightness, python -m flashnum.run experiment=bound_tightness)."""
    t = F.table("bound_tightness")
    if t is None:
        return None
    fa = t[(t.policy == "fa2") & t.precision.isin(["bf16", "fp16"]) & t.bound.map(math.isfinite)]
    return float(fa.tightness.median())


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
_HELD = "fa3_protocol_heldout"
# the same protocol on seeds fixed before their run (conf/table/fa3_protocol_heldout.yaml)
_FA3_HELDOUT = {
    "FaThreeHeldoutMeasured": Fact(f"experiments/{_HELD} exists",
                                   lambda F: None if F.table(_HELD) is None else True,
                                   "measured", "not measured", paper=True),
    "FaThreeHeldoutInside": Fact(f"{_HELD}: the published ratio lies inside the per-seed "
                                 "range", _fa3_inside(_HELD), "inside", "outside", paper=True),
    "FaThreeHeldoutSeeds": Quantity(f"{_HELD}: seeds", _fa3(lambda r: r["seeds"], _HELD),
                                    tex=str),
    **{f"FaThreeHeldoutSeed{k}": Quantity(f"{_HELD}: the {w} seed", _fa3_seeds(how, _HELD),
                                          tex=str)
       for k, w, how in (("First", "first", min), ("Last", "last", max))},
    "FaThreeHeldoutCommit": Quantity(f"{_HELD}: the commit its run ran at",
                                     _run_commit(_HELD), tex=str),
    "FaThreeProtocolCommit": Quantity("fa3_protocol: the commit its last run ran at",
                                      _run_commit("fa3_protocol"), tex=str),
    **{f"FaThreeHeldout{k}": Quantity(f"{_HELD}: {w}'s mean RMSE",
                                      _fa3(lambda r, p=p: r["summary"][p]["mean"], _HELD),
                                      md=sci(2))
       for k, w, p in (("Std", "standard attention", "naive"),
                       ("Flash", "FlashAttention-2", "fa2"))},
    **{f"FaThreeHeldout{k}Sd": Quantity(f"{_HELD}: {w}'s relative standard deviation over "
                                        "seeds",
                                        _fa3(lambda r, p=p: r["summary"][p]["rel_sd"], _HELD),
                                        tex=lambda x: f"{100 * x:.0f}", md=percent)
       for k, w, p in (("Std", "standard attention", "naive"),
                       ("Flash", "FlashAttention-2", "fa2"))},
    **{f"FaThreeHeldout{k}": Quantity(f"{_HELD}: {w}", _fa3(f, _HELD), tex=fixed(2),
                                      md=fixed(2))
       for k, w, f in (("Ratio", "ratio of the means",
                        lambda r: r["summary"]["ratio_of_means"]),
                       ("RatioMin", "smallest per-seed ratio",
                        lambda r: r["summary"]["ratio"]["min"]),
                       ("RatioMax", "largest per-seed ratio",
                        lambda r: r["summary"]["ratio"]["max"]))},
}
QUANTITIES = {
    "SweepCases": Quantity("rows in bf16_sweep", _rows("bf16_sweep"), md=count),
    **{f"Rows{tex_name(n)}": Quantity(f"rows in {n}", _rows(n), md=count, paper=False)
       for n in COUNTED},
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
    **_BWD_BENCH,
}


def misquoted(F, paths) -> list[str]:
    """Every marked quote in `paths` that does not say its quantity now (one line each)."""
    return quoting.misquoted(F, paths, QUANTITIES)
