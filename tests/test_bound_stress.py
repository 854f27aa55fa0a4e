"""The bound's stress test (experiment bound_stress) draws its cases by seed and count.

- the same seed and count give the same table, and a shorter run is the first rows of a
  longer one (so the stored table reproduces on any machine, at any load);
- a finite bound is exceeded when a row's error passes it or the output is not finite;
- the accounting counts every draw once: held + vacuous + exceeded = cases, and the
  hill-climbs start from the tightest held draws.
"""

import math

import pandas as pd
import torch

from flashnum.studies.bounds import bound_stress_table, exceeded, stress_summary

MEASURES = ["bound", "measured", "ratio", "output_finite", "bound_finite", "held", "exceeded"]


def test_the_draws_are_fixed_by_seed_and_count():
    short = bound_stress_table({"catalogue": {"cases": 6}, "overflow": {"cases": 6}})
    again = bound_stress_table({"catalogue": {"cases": 6}, "overflow": {"cases": 6}})
    longer = bound_stress_table({"catalogue": {"cases": 9}})
    pd.testing.assert_frame_equal(short, again)
    cat = short[short.family == "catalogue"].reset_index(drop=True)
    pd.testing.assert_frame_equal(cat, longer.iloc[:6].reset_index(drop=True),
                                  check_dtype=False)  # held: bool, or object beside a None
    other = bound_stress_table({"catalogue": {"cases": 6}}, seed=1)
    assert not cat.drop(columns=MEASURES).equals(other.drop(columns=MEASURES))


def test_a_bound_is_exceeded_by_a_larger_error_or_a_non_finite_output():
    rows = torch.tensor([1.0, 2.0])
    assert not exceeded(rows, torch.tensor([1.0, 2.0]), True)
    assert exceeded(rows, torch.tensor([0.5, 2.5]), True)
    assert exceeded(rows, torch.tensor([0.5, 0.5]), False)


def test_the_accounting_counts_every_draw_once_and_climbs_from_the_tightest():
    df = bound_stress_table({"catalogue": {"cases": 12, "climb": 2}})
    s = stress_summary(df, "catalogue")
    assert s["cases"] == 12 and s["held"] + s["vacuous"] + s["exceeded"] == 12
    draws = df[df.kind == "draw"]
    assert (draws.bound_finite == draws.bound.map(math.isfinite)).all()
    steps, starts, _, _ = s["climb"]
    held = draws[draws.held == True].sort_values("ratio", kind="stable")  # noqa: E712
    assert steps == 2 and starts == min(4, len(held))
    assert list(df[df.kind == "climb"].case) == list(held.case[:4])
