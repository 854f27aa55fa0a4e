"""Table blocks read straight from a stored table: which rows, which columns, no code.

    view("repro_splitkv_decode", "nq == 1", ["nk", "num_splits", "max_abs_err"])
    view("repro_fa3_table3", "section == 'fp16'", ["match"], by=["ref_inputs", "n"])

A view is a table function F -> DataFrame (flashnum.figures.docs TABLES): the rows that
`where` selects (a DataFrame.query string; "" keeps all), the `columns` in that order, each
number with three significant digits. With `by`, one row per group (in `by`'s order), each
column its smallest and largest value over the group ("1.18" when they agree, "1.18-1.30"
otherwise), "median (span)" ("4.0 (3.2-4.5)"), or the pandas aggregate `agg` names ("min",
"median"; a dict: one per column).
`never` maps a query
to the document's words: the query must select no row of the stored table (the claim,
e.g. "within the budget every row stays below half the bound", holds). The values are
the store's: nothing is computed but the range or the aggregate.
"""

from __future__ import annotations

import pandas as pd

from flashnum.figures.docs.sources import table
from flashnum.figures.quoting import require


def cell(x) -> str:
    """A stored value as a table block prints it: numbers to three significant digits."""
    if isinstance(x, bool) or not isinstance(x, float):
        return str(x)
    return f"{x:.3g}"


def span(values: pd.Series) -> str:
    """A group's values as their range: "1.18", "1.18-1.30" or "-1.3 to 1.7"."""
    lo, hi = cell(values.min()), cell(values.max())
    return lo if lo == hi else f"{lo} to {hi}" if lo.startswith("-") else f"{lo}-{hi}"


AGGS = {"span": span, "median (span)": lambda x: f"{cell(x.median())} ({span(x)})"}


def view(source: str, where: str, columns: list[str], by: list[str] | None = None,
         agg="span", never: dict[str, str] | None = None):
    """The table function that shows `columns` of the stored table `source` (see above)."""
    def make(F) -> pd.DataFrame:
        df = table(F, source)
        for query, says in (never or {}).items():
            require(df.query(query).empty, says)
        df = df.query(where) if where else df
        if by:
            g = df.groupby(by, sort=True)[columns]
            how = lambda a: AGGS.get(a, a)  # noqa: E731
            agg_ = {c: how(a) for c, a in agg.items()} if isinstance(agg, dict) else how(agg)
            return g.agg(agg_).reset_index().map(cell)
        return df[columns].reset_index(drop=True).map(cell)
    return make
