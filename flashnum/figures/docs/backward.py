"""What docs/backward.md shows of the backward pass: its tables, generated from
experiments/bwd_bf16_sweep, bwd_order, bwd_delta_site and bwd_seqlen_growth (TABLES, the
claims of its findings checked where they are made), and the backward's benchmark
(bench/results/backward.json, python bench/bench_backward.py).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from flashnum.figures.docs.sources import table
from flashnum.figures.docs.views import goal, record, view
from flashnum.figures.quoting import require

GRADS = ("dq", "dk", "dv")


def bwd_sweep_table(F) -> pd.DataFrame:
    """bwd_bf16_sweep per slice, policy and forward: flash-attn's rule kept (share of cases),
    the median relative error and the largest error over the bound, per gradient."""
    t = table(F, "bwd_bf16_sweep")
    require(int(t.ref_uncertain.sum()) == 0, "the certified reference was certain in every case")
    fl = t[t.slice == "flash"]
    fa, lp = fl[fl.policy == "fa2"], fl[fl.policy == "lowp"]
    worse = [(lp[f"err_{g}"] / lp[f"ref_{g}"]).median() / (fa[f"err_{g}"] / fa[f"ref_{g}"]).median()
             for g in GRADS]
    require(4 <= min(worse) and max(worse) < 5, "lowp's median errors are 4-5x fa2's")
    cols = {"case_id": "count"} | {f"rule_{g}": "mean" for g in GRADS} | {
        f"err_{g} / ref_{g}": "median" for g in GRADS} | {f"err_{g} / bound_{g}": "max"
                                                           for g in GRADS}
    return view("bwd_bf16_sweep", "", list(cols), by=["slice", "policy", "forward_variant"],
                agg=cols, digits=2)(F)


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
    t, p = table(F, "bwd_seqlen_growth"), growth_pairs(F)
    require(not (np.isfinite(p.bound) & ~p.held).any(), "no finite bound was exceeded")
    require(t[t.policy == "fa2"][[f"rule_{g}" for g in GRADS]].astype(bool).all().all(),
            "fa2 met flash-attn's rule in every case")
    require({tuple(r[:4]) for r in rows if r[6] != "-"} == {("fp16", "lowp", "late_max", "dk")},
            "the computed gradient overflowed only in fp16 lowp's dK on late_max")
    return pd.DataFrame(rows, columns=["precision", "policy", "distribution", "gradient",
                                       "vacuous pairs", "vacuous from N", "overflowed at N"])


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


# the benchmark's table: (what, measured, goal), read from bench/results/backward.json
BENCH = [
    ("machine", "{cpu_model}, {cpus} CPUs, torch {torch}", ""),
    ("load average before, after the speed part (1 min)",
     "{load_average_before[0]:.1f}, {load_average_after[0]:.1f}", ""),
    ("emulated bf16 fa2 backward (the fused C loop), 8 heads x N=4096 x d=64, 64x64 blocks, "
     "vs torch fp32 autograd of SDPA", "{speed[emulate_bf16_fa2_backward_s]:.2f} s vs "
     "{speed[torch_fp32_sdpa_backward_s]:.2f} s (backward alone): ratio "
     "{speed[ratio_vs_backward]:.2f} (the median pair's {speed[ratio_vs_backward_median_pair]:.2f}"
     "); vs forward + backward: {speed[ratio_vs_forward_backward]:.2f}; one thread, process CPU "
     "time: {speed[cpu_ratio_one_thread]:.2f}",
     goal("<= 2", lambda r: r["speed"]["ratio_vs_backward"] <= 2)),
    ("the same through the torch loop (the fused loop off, identical output)",
     "ratio {speed[ratio_torch_loop]:.2f}", ""),
    ("peak memory of the backward call over the RSS before it, one head, d = 64",
     lambda r: ", ".join(f"{1024 * m['peak_rss_over_base_gib']:.0f} MB (N={m['n']}, "
                         f"{m['backward_cpu_s']:.2g} s CPU)" for m in r["memory"]),
     goal("O(N d), < 1 GiB", lambda r: max(m["peak_rss_over_base_gib"] for m in r["memory"]) < 1)),
    ("certified reference backward, one head, N = 1024, d = 64",
     "{certified[wall_s]:.1f} s wall ({certified[cpu_s]:.1f} s CPU) at {certified[max_prec]} "
     "bits, {certified[uncertain]} values uncertain",
     goal("< 60 s, none uncertain",
          lambda r: r["certified"]["wall_s"] < 60 and r["certified"]["uncertain"] == 0)),
]


ALL = "held_dq and held_dk and held_dv"
FA2_RULE = "slice == 'flash' and policy == 'fa2'"
TABLES = {"BwdSweepRule": view("bwd_bf16_sweep", FA2_RULE, [f"rule_{g}" for g in GRADS],
                               by=["distribution"], agg="mean", never={
              f"{FA2_RULE} and distribution in ['gaussian', 'late_max'] and not (rule_dq and "
              "rule_dk and rule_dv)": "every fa2 case on gaussian and late_max keeps the rule",
              f"not ({ALL})": "the a-priori bound held for every entry of every case"}),
          "BwdDeltaSite": view("bwd_delta_site", "grad == 'dq'", ["variant", "err"]),
          "BwdQiuYao": view("bwd_bf16_sweep", "slice == 'qiu_yao'", ["err_dq"],
                            by=["forward_variant"], agg="median"),
          "BwdDsRowsum": view("bwd_bf16_sweep", "", ["ds_rowsum"], by=["policy"], agg="median"),
          "BwdOrder": view("bwd_order", "", ["err_dq", "dq_spread", "err_dk", "torch_err_dk"],
                           by=["distribution", "precision"], agg="max", never={
              "dq_spread > 2 * err_dq": "the spread is at most of the order of the error",
              f"not ({ALL})": "every bound held"}),
          "BwdSweep": bwd_sweep_table, "BwdGrowthBound": bwd_growth_bound,
          "BwdGrowthBf16": lambda F: bwd_growth_table(F, "bf16"),
          "BwdGrowthFp16": lambda F: bwd_growth_table(F, "fp16"),
          "BwdBench": record("backward", BENCH, ["what", "measured", "goal"])}

