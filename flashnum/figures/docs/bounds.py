"""What README.md, docs/bounds.md and docs/experiments.md quote about the a-priori bounds:
their accounting over every stored table, bound_tightness, the stress test
(experiments/bound_stress) and the ties bias (experiments/ties_bias), as passages.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from flashnum.analysis.bounds import accounting, tightness_summary
from flashnum.figures.docs.digits import thousands
from flashnum.figures.docs.sources import table
from flashnum.figures.docs.views import view
from flashnum.figures.quoting import Passage, require
from flashnum.studies.bounds import stress_summary


def bound_accounting(F):
    names = [p.parent.name for p in sorted(Path(F.experiments).glob("*/results.parquet"))]
    # the forward tables: bwd_attribution's "bound" is per-site terms, with no verdict
    names = [n for n in names if {"bound", "bound_holds"} <= set(table(F, n).columns)]
    frames = [table(F, n) for n in names]
    acc = accounting(pd.concat([f["bound"] for f in frames if "bound" in f]),
                     pd.concat([f["bound_holds"] for f in frames if "bound" in f]))
    where = {n: int(f["bound"].isna().sum()) for n, f in zip(names, frames, strict=True)
             if "bound" in f and f["bound"].isna().any()}
    which = " and ".join(f"{k} in {n}" for n, k in where.items())
    return [f"finite and held in {thousands(acc['held'])} of {thousands(acc['cases'])} rows",
            f"in {acc['vacuous']}, undefined (no bound) in {acc['undefined']} rows ({which})"]


def bf16_sweep_summary_line(F):
    df = table(F, "bf16_sweep")
    fin = np.isfinite(df["bound"])
    held = int((df["bound_holds"] == True).sum())  # noqa: E712
    return [f"a-priori bound finite and held in {held} of {len(df)}, vacuous (infinite) in "
            f"{int((~fin).sum())} rows"]


def tightness_readme(F):
    t = table(F, "bound_tightness")
    acc = accounting(t["bound"], t["holds"])
    fa = t[(t.policy == "fa2") & t.precision.isin(["bf16", "fp16"]) & np.isfinite(t.bound)]
    return [f"finite and held in {thousands(acc['held'])} of {thousands(acc['cases'])} "
            f"tightness cases (vacuous in {acc['vacuous']})",
            f"(tightest {fa.tightness.min():.2f}x on plateau inputs)"]


def tightness_table(F) -> pd.DataFrame:
    """bound_tightness per policy and precision (flashnum.analysis.bounds.tightness_summary):
    bound / measured of the deterministic and probabilistic bounds."""
    g = lambda x: f"{x:.3g}".replace("e+0", "e").replace("e+", "e")  # noqa: E731
    f = table(F, "bound_tightness").query("bound < inf")
    require(f.loc[f.tightness.idxmax(), "distribution"] == "flat", "flat gives the loosest bound")
    t = tightness_summary(table(F, "bound_tightness"))
    cols = ("det_median", "det_min", "det_max", "prob_median", "prob_min", "prob_max")
    return pd.concat([t[["policy", "precision", "cases", "held", "vacuous"]],
                      t[list(cols)].map(g), t[["held_prob"]]], axis=1).set_axis(
        ["policy", "precision", "cases", "finite and held", "vacuous", "det. median", "det. min",
         "det. max", "prob. median", "prob. min", "prob. max", "prob. held"], axis=1)


def stress(F, family):
    """experiments/bound_stress's accounting of one family (studies.bounds.stress_summary)."""
    return stress_summary(table(F, "bound_stress"), family)


def stress_readme(F):
    c, o = stress(F, "catalogue"), stress(F, "overflow")
    best = c["climb"][2]
    return [f"and in a {thousands(c['cases'])}-case random stress run (finite and held in "
            f"{thousands(c['held'])}, vacuous in {thousands(c['vacuous'])}, exceeded in "
            f"{c['exceeded']}",
            f"tightest cases came no closer than {best:.2f}x)",
            f"stress run of {thousands(o['cases'])} cases near the formats' largest numbers "
            f"(finite and held in {thousands(o['held'])}, vacuous in "
            f"{thousands(o['vacuous'])}, exceeded in {o['exceeded']};"]


TIES_NEVER = {
    "kind == 'attribution' and run in ['pv_acc', 'l_acc'] and abs(err_only) >= 1e-9":
    "pv_acc and l_acc in fp32 alone err by under 1e-9",
    "kind == 'bias' and run == 'lowp' and ((section == 'ties, V ~ N(-1.0, 0.5^2)' and z > -3) "
    "or (section == 'ties, V ~ N(1.0, 0.5^2)' and z < 3))":
    "the lowp bias is significant and flips sign with V"}
TIES = "kind == 'bias' and section == 'ties, V ~ N(-1.0, 0.5^2)'"
FA2_LOW = "policy == 'fa2' and precision in ['bf16', 'fp16']"
PASSAGES = {
    "BoundAccounting": Passage("docs/experiments.md: the bound's verdicts over every stored "
                               "forward table", bound_accounting),
    "BoundSweepLine": Passage("docs/experiments.md: bf16_sweep's summary line",
                              bf16_sweep_summary_line),
    "ReadmeTightness": Passage("README.md: bound_tightness in short", tightness_readme),
    "ReadmeStress": Passage("README.md: the stress test (bound_stress)", stress_readme),
}
TABLES = {"BoundTightness": tightness_table,
          "TiesAttribution": view("ties_bias", "kind == 'attribution'", ["run", "format",
                                  "err_only", "err_without"], never=TIES_NEVER),
          "BoundTightnessByInput": view("bound_tightness", FA2_LOW, ["tightness"],
                                        by=["distribution"]),
          "BoundStress": view("bound_stress", "kind == 'draw'", ["case_id", "held",
                              "bound_finite", "exceeded", "ratio"], by=["family"],
                              agg={"case_id": "count", "held": "sum", "bound_finite": "sum",
                                   "exceeded": "sum", "ratio": "min"}),
          "BoundStressClimb": view("bound_stress", "kind == 'climb'", ["inputs", "precision",
                                   "policy", "n", "d", "steps", "ratio", "exceeded"]),
          "TiesBiasRuns": view("ties_bias", TIES, ["run", "mean_signed_err", "z"]),
          "TiesBiasV": view("ties_bias", "kind == 'bias' and run == 'lowp'",
                            ["section", "mean_signed_err", "z"]),
          "TiesBiasUlp": view("ties_bias", "kind == 'ulp'", ["run", "value"], never={
              "kind == 'ulp' and run == 'tie' and value != 0": "none on a tie"})}
