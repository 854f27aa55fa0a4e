"""What docs/backward.md quotes about the backward pass: its tables and findings as passages
rebuilt from experiments/bwd_bf16_sweep, bwd_order, bwd_delta_site and bwd_seqlen_growth,
and the backward's benchmark (bench/results/backward.json, python bench/bench_backward.py).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from flashnum.figures.docs.digits import g2, sci
from flashnum.figures.docs.sources import bench, table
from flashnum.figures.quoting import Passage, require

GRADS = ("dq", "dk", "dv")


def bwd_sweep_table(F) -> pd.DataFrame:
    """bwd_bf16_sweep per slice and policy: the bound, flash-attn's rule, the median relative
    error and the largest error over the bound, per gradient."""
    t = table(F, "bwd_bf16_sweep")
    require(int(t.ref_uncertain.sum()) == 0, "the certified reference was certain in every case")
    fl, qy = t[t.slice == "flash"], t[t.slice == "qiu_yao"]
    g3 = lambda xs: ", ".join(f"{x:.2g}" for x in xs)  # noqa: E731
    rows = []
    for label, grp in [("flash, fa2", fl[fl.policy == "fa2"]),
                       ("flash, lowp", fl[fl.policy == "lowp"]),
                       ("naive", t[t.slice == "naive"]),
                       ("qiu_yao slice, fa2 forward", qy[qy.forward_variant == "fa2"]),
                       ("qiu_yao slice, qiu_yao forward", qy[qy.forward_variant == "qiu_yao"])]:
        held = all(bool(grp[f"held_{g}"].all()) for g in GRADS)
        rule = " / ".join(str(int(grp[f"rule_{g}"].astype(bool).sum())) for g in GRADS)
        rows.append([label, len(grp), "all" if held else "not all",
                     rule + (f" of {len(grp)}" if label.startswith("flash") else ""),
                     g3((grp[f"err_{g}"] / grp[f"ref_{g}"]).median() for g in GRADS),
                     "" if label.startswith("qiu_yao") else
                     g3((grp[f"err_{g}"] / grp[f"bound_{g}"]).max() for g in GRADS)])
    return pd.DataFrame(rows, columns=["slice, policy", "cases", "bound held (dQ, dK, dV)",
                                       "flash-attn rule dQ / dK / dV",
                                       "median err / max\\|g\\| dQ, dK, dV",
                                       "largest err / bound dQ, dK, dV"])


def bwd_sweep_docs(F):
    t = table(F, "bwd_bf16_sweep")
    fl = t[t.slice == "flash"]
    qy = t[t.slice == "qiu_yao"]
    fa = fl[fl.policy == "fa2"]
    ok = fa.rule_dq.astype(bool) & fa.rule_dk.astype(bool) & fa.rule_dv.astype(bool)
    share = ok.groupby(fa.distribution).mean()
    require(share["gaussian"] == 1 and share["late_max"] == 1,
            "every fa2 case on gaussian and late_max keeps the rule")
    lp = fl[fl.policy == "lowp"]
    worse = [(lp[f"err_{g}"] / lp[f"ref_{g}"]).median() / (fa[f"err_{g}"] / fa[f"ref_{g}"]).median()
             for g in GRADS]
    require(4 <= min(worse) and max(worse) < 5, "lowp's median errors are 4-5x fa2's")
    med = qy.groupby("forward_variant").err_dq.median()
    ds = t.groupby("policy").ds_rowsum.median()
    held = all(bool(t[f"held_{g}"].all()) for g in GRADS)
    d = {v: dict(zip(g.grad, g.err, strict=True))
         for v, g in table(F, "bwd_delta_site").groupby("variant")}
    return [
        f"`bwd_bf16_sweep` (`conf/experiment/bwd_bf16_sweep.yaml`, {len(t)} cases",
        f"The a-priori bound held for every entry of every gradient in all {len(t)} cases"
        if held else "a bound failed",
        f"in {int(ok.sum())} of {len(fa)} cases; every miss is on sink "
        f"({100 * share['sink']:.0f}% of its cases pass), ties ({100 * share['ties']:.0f}%) or "
        f"fa3_outliers ({100 * share['fa3_outliers']:.0f}%)",
        f"the fa2 dQ error is {d['fa2']['dq']:.2g} against torch's "
        f"{d['torch bf16 autograd']['dq']:.2g}, and {d['O stored in fp32']['dq']:.2g} with O kept "
        f"in fp32",
        f"moves the backward's median errors by about "
        f"{100 * abs(med['qiu_yao'] / med['fa2'] - 1):.0f}% on tied maxima",
        f"median err dQ {g2(med['qiu_yao'])} vs {g2(med['fa2'])} with the fa2 forward",
        f"{ds['fa2']:.3g} (fa2), {ds['lowp']:.3g} (lowp), {ds['naive']:.2g} (naive)"]


def bwd_order_docs(F):
    o = table(F, "bwd_order")
    b = o[o.precision == "bf16"]
    sink, gauss = b[b.distribution == "sink"], o[o.distribution == "gaussian"]
    spread = (o.dq_spread / o.err_dq).groupby(o.precision).max()
    held = all(bool(o[f"held_{g}"].all()) for g in GRADS)
    return [f"(bwd_order: up to {sink.err_dk.max():.0f} for fa2, {sink.torch_err_dk.max():.0f} for "
            f"torch, against ~{gauss.torch_err_dk.median():.1g} on gaussian)",
            f"({len(o)} cases): the dQ accumulation order did not change dQ at all in "
            f"{100 * (o.dq_spread == 0).mean():.0f}% of the cases",
            f"the largest spread over the 6 orders was {spread['bf16']:.2f}x dQ's error in bf16 "
            f"({spread['fp16']:.2f}x in fp16)",
            "Every bound held." if held else "a bound failed"]


def growth_pairs(F) -> pd.DataFrame:
    """bwd_seqlen_growth's bound per (row, gradient), its verdict checked against the stored
    maxima: held on a finite bound means err <= bound."""
    t = table(F, "bwd_seqlen_growth")
    pairs = pd.concat([pd.DataFrame({"precision": t.precision, "policy": t.policy,
                                     "distribution": t.distribution, "seq_len": t.seq_len,
                                     "grad": g, "bound": t[f"bound_{g}"], "err": t[f"err_{g}"],
                                     "held": t[f"held_{g}"].astype(bool)}) for g in GRADS])
    require(pairs.bound.notna().all(), "every row has its bound")
    fin = np.isfinite(pairs.bound)
    require(((pairs.err <= pairs.bound) == pairs.held)[fin].all(),
            "held on a finite bound agrees with the stored maxima")
    return pairs


def bwd_growth_bound(F) -> pd.DataFrame:
    """The (precision, policy, distribution, gradient) groups whose bound is vacuous
    (infinite) somewhere, and where the computed gradient overflowed (an inf or NaN)."""
    rows = []
    for key, g in growth_pairs(F).groupby(["precision", "policy", "distribution", "grad"]):
        vac, over = g[~np.isfinite(g.bound)], g[~np.isfinite(g.err)]
        if len(vac) or len(over):
            rows.append([*key, len(vac), vac.seq_len.min() if len(vac) else "-",
                         ", ".join(map(str, sorted(set(over.seq_len)))) or "-"])
    require({tuple(r[:4]) for r in rows if r[6] != "-"} == {("fp16", "lowp", "late_max", "dk")},
            "the computed gradient overflowed only in fp16 lowp's dK on late_max")
    return pd.DataFrame(rows, columns=["precision", "policy", "distribution", "gradient",
                                       "vacuous pairs", "vacuous from N", "overflowed at N"])


def bwd_growth_docs(F):
    t, pairs = table(F, "bwd_seqlen_growth"), growth_pairs(F)
    fit = lambda s, y: np.polyfit(np.log(s.seq_len.to_numpy(float)), np.log(y), 1)[0]  # noqa: E731
    r64 = max((t[f"ref64_err_{g}"] / t[f"ref_{g}"]).max() for g in GRADS)
    r64e = max((t[f"ref64_err_{g}"] / t[f"err_{g}"]).max() for g in GRADS)
    fin = np.isfinite(pairs.bound)
    fa = t[t.policy == "fa2"]
    ok = fa.rule_dq.astype(bool) & fa.rule_dk.astype(bool) & fa.rule_dv.astype(bool)
    sel = lambda p, d, prec="bf16": t[(t.policy == p) & (t.distribution == d)  # noqa: E731
                                     & (t.precision == prec)]
    fg = sel("fa2", "gaussian")
    rel = (fg.err_dq / fg.ref_dq).groupby(fg.seq_len).median()
    absa = np.mean([np.median([fit(s, s[f"err_{g}"]) for _, s in fg.groupby("seed")])
                    for g in GRADS])
    lo = sel("lowp", "fa3_outliers")
    lrel = (lo.err_dq / lo.ref_dq).groupby(lo.seq_len).median()
    return [f"{len(t)} cases: Nq = Nk = N from {t.seq_len.min()} to {t.seq_len.max()}",
            f"at most {sci(r64)} of max|g| and {r64e:.0g} of the error measured",
            f"Of the {len(pairs)} (case, gradient) pairs the bound was finite and held for "
            f"every entry in {int((fin & pairs.held).sum())}, finite and exceeded in "
            f"{int((fin & ~pairs.held).sum())}, and vacuous (infinite somewhere) in "
            f"{int((~fin).sum())}",
            f"in {int(ok.sum())} of {len(fa)} cases",
            f"fall as about N^{absa:.2f}",
            f"(dQ on gaussian: {g2(rel[rel.index.min()])} of max|dQ| at N = {rel.index.min()}, "
            f"{g2(rel[rel.index.max()])} at {rel.index.max()})",
            f"its dQ error reaches {lrel[8192]:.2f} of max|dQ| at N = 8192"]


def bwd_growth_table(F, precision: str) -> pd.DataFrame:
    """docs/backward.md's growth table of one dtype: alpha of max|g^ - g| / max|g| ~ N^alpha
    fitted here by least squares in log-log per seed, median [min, max] over the seeds."""
    t = table(F, "bwd_seqlen_growth")
    rows = []
    for pol in ("fa2", "naive", "lowp"):
        for dist in ("gaussian", "late_max", "fa3_outliers"):
            grp = t[(t.precision == precision) & (t.policy == pol) & (t.distribution == dist)]
            cells = []
            for g in GRADS:
                a = []
                for _, s in grp.groupby("seed"):
                    # an exact gradient has no log; an overflowed one (inf) no error
                    s = s[(s[f"err_{g}"] > 0) & np.isfinite(s[f"err_{g}"])]
                    rel = (s[f"err_{g}"] / s[f"ref_{g}"]).to_numpy(float)
                    a.append(np.polyfit(np.log(s.seq_len.to_numpy(float)), np.log(rel), 1)[0])
                cells.append(f"{np.median(a):.2f} [{min(a):.2f}, {max(a):.2f}]")
            rows.append([pol, dist, f"{grp.seq_len.min()}-{grp.seq_len.max()}", *cells])
    return pd.DataFrame(rows, columns=["policy", "distribution", "N", "dQ", "dK", "dV"])


def bwd_bench_docs(F):
    # the speed rows are named quantities (flashnum.figures.quantities: BwdBench*)
    b = bench(F, "backward")
    c = b["certified"]
    mem = {m["n"]: m for m in b["memory"]}
    mb = lambda n: f"{mem[n]['peak_rss_over_base_gib'] * 1024:.0f} MB"  # noqa: E731
    require(c["uncertain"] == 0 and c["max_prec"] == 128,
            "the certified backward was certain everywhere at 128 bits")
    require(mem[65536]["peak_rss_over_base_gib"] < 1.0,
            "the backward call's peak memory at N = 65536 is under 1 GiB")
    return [f"| {mb(2048)} (N=2048), {mb(4096)} (4096), {mb(8192)} (8192), {mb(16384)} (16384), "
            f"{mb(65536)} (65536: {mem[65536]['backward_cpu_s']:.0f} s of CPU for the call); "
            f"an N x N fp32 matrix is {mem[16384]['n_by_n_fp32_gib']:.0f} GiB at 16384, "
            f"{mem[65536]['n_by_n_fp32_gib']:.0f} GiB at 65536",
            f"| {c['wall_s']:.1f} s wall ({c['cpu_s']:.1f} s CPU); 128 bits sufficed"]


TABLES = {"BwdSweep": bwd_sweep_table, "BwdGrowthBound": bwd_growth_bound,
          "BwdGrowthBf16": lambda F: bwd_growth_table(F, "bf16"),
          "BwdGrowthFp16": lambda F: bwd_growth_table(F, "fp16")}

PASSAGES = {
    "BwdSweep": Passage("docs/backward.md: bwd_bf16_sweep's findings, bwd_delta_site's dQ "
                        "errors", bwd_sweep_docs),
    "BwdOrder": Passage("docs/backward.md: bwd_order", bwd_order_docs),
    "BwdGrowth": Passage("docs/backward.md: bwd_seqlen_growth's findings", bwd_growth_docs),
    "BwdBench": Passage("docs/backward.md: the backward's speed, memory and certified "
                        "reference (bench/results/backward.json)", bwd_bench_docs),
}
