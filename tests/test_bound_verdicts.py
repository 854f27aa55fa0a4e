"""Every stored table's bound verdicts follow from its own columns.

A row's bound_finite says whether its deterministic bound is finite (empty where no bound
was computed) and bound_holds whether max_abs_err <= bound for a finite bound (empty for
an infinite one, which is vacuous: neither held nor failed). The runner sets both for
every new row; here each stored table is checked against that rule, written out anew.
"""

import math
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parent.parent
VERDICT = {"bound", "max_abs_err", "bound_finite", "bound_holds"}
# every stored table whose rows carry a bound verdict (read from the parquet schema alone)
TABLES = sorted(p.parent.name for p in (ROOT / "experiments").glob("*/results.parquet")
                if VERDICT <= set(pq.read_schema(p).names))


def expected(bound, err):
    if bound is None or bound != bound:
        return None, None
    if math.isinf(bound):
        return False, None
    return True, bool(err <= bound)


def stored(x):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else bool(x)


def test_the_tables_with_verdicts_include_the_sweeps():
    assert {"bf16_sweep", "fp16_sweep", "fp32_sweep", "seqlen_growth", "worst_case"} <= set(TABLES)


@pytest.mark.parametrize("name", TABLES)
def test_bound_finite_and_bound_holds_follow_from_bound_and_the_error(name):
    df = pd.read_parquet(ROOT / "experiments" / name / "results.parquet")
    bad = [(cid, b, e, f, h) for cid, b, e, f, h in zip(
        df.case_id, df.bound, df.max_abs_err, df.bound_finite, df.bound_holds, strict=True)
        if (stored(f), stored(h)) != expected(b, e)]
    assert bad == []
