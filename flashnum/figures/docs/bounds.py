"""What docs/bounds.md shows of the a-priori bounds: bound_tightness, the stress test
(experiments/bound_stress) and the ties bias (experiments/ties_bias), as tables generated
whole; README's claims about them in words are checked where the tables are made.
"""

from __future__ import annotations

import pandas as pd

from flashnum.analysis.bounds import tightness_summary
from flashnum.figures.docs.sources import table
from flashnum.figures.docs.views import view
from flashnum.figures.quoting import require


def tightness_table(F) -> pd.DataFrame:
    """bound_tightness per policy and precision (flashnum.analysis.bounds.tightness_summary):
    bound / measured of the deterministic and probabilistic bounds."""
    g = lambda x: f"{x:.3g}".replace("e+0", "e").replace("e+", "e")  # noqa: E731
    f = table(F, "bound_tightness").query("bound < inf")
    require(f.loc[f.tightness.idxmax(), "distribution"] == "flat", "flat gives the loosest bound")
    require(f.holds.astype(bool).all(), "no finite bound of bound_tightness was exceeded")
    t = tightness_summary(table(F, "bound_tightness"))
    cols = ("det_median", "det_min", "det_max", "prob_median", "prob_min", "prob_max")
    return pd.concat([t[["policy", "precision", "cases", "held", "vacuous"]],
                      t[list(cols)].map(g), t[["held_prob"]]], axis=1).set_axis(
        ["policy", "precision", "cases", "finite and held", "vacuous", "det. median", "det. min",
         "det. max", "prob. median", "prob. min", "prob. max", "prob. held"], axis=1)


TIES_NEVER = {
    "kind == 'attribution' and run in ['pv_acc', 'l_acc'] and abs(err_only) >= 1e-9":
    "pv_acc and l_acc in fp32 alone err by under 1e-9",
    "kind == 'bias' and run == 'lowp' and ((section == 'ties, V ~ N(-1.0, 0.5^2)' and z > -3) "
    "or (section == 'ties, V ~ N(1.0, 0.5^2)' and z < 3))":
    "the lowp bias is significant and flips sign with V"}
TIES = "kind == 'bias' and section == 'ties, V ~ N(-1.0, 0.5^2)'"
FA2_LOW = "policy == 'fa2' and precision in ['bf16', 'fp16']"
TABLES = {"BoundTightness": tightness_table,
          "TiesAttribution": view("ties_bias", "kind == 'attribution'", ["run", "format",
                                  "err_only", "err_without"], never=TIES_NEVER),
          "BoundTightnessByInput": view("bound_tightness", FA2_LOW, ["tightness"],
                                        by=["distribution"]),
          "BoundStress": view("bound_stress", "kind == 'draw'", ["case_id", "held",
                              "bound_finite", "exceeded", "ratio"], by=["family"],
                              never={"exceeded > 0": "no finite bound was exceeded"},
                              agg={"case_id": "count", "held": "sum", "bound_finite": "sum",
                                   "exceeded": "sum", "ratio": "min"}),
          "BoundStressClimb": view("bound_stress", "kind == 'climb'", ["inputs", "precision",
                                   "policy", "n", "d", "steps", "ratio", "exceeded"]),
          "TiesBiasRuns": view("ties_bias", TIES, ["run", "mean_signed_err", "z"]),
          "TiesBiasV": view("ties_bias", "kind == 'bias' and run == 'lowp'",
                            ["section", "mean_signed_err", "z"]),
          "TiesBiasUlp": view("ties_bias", "kind == 'ulp'", ["run", "value"], never={
              "kind == 'ulp' and run == 'tie' and value != 0": "none on a tie"})}
