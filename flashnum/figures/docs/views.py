"""Table blocks read straight from a stored table: which rows, which columns, no code.

    view("repro_splitkv_decode", "nq == 1", ["nk", "num_splits", "max_abs_err"])
    view("repro_fa3_table3", "section == 'fp16'", ["match"], by=["ref_inputs", "n"])

A view is a table function F -> DataFrame (flashnum.figures.docs TABLES): the rows that
`where` selects (a DataFrame.query string; "" keeps all), the `columns` in that order (a
stored column, or an expression of them that DataFrame.eval reads: "err_dq / ref_dq"), each
number with `digits` (3) significant digits. With `by`, one row per group (in `by`'s
order), each column its smallest and largest value over the group ("1.18" when they agree,
"1.18-1.30" otherwise), or as `agg` names: "median (span)" ("4.0 (3.2-4.5)") or a pandas
aggregate ("min", "median"); a dict names one per column. `never` maps a query to the
document's words: the query must select no row of the stored table (the claim, e.g.
"within the budget every row stays below half the bound", holds). The values are the
store's: nothing is computed but the expressions, the range or the aggregate.
"""

from __future__ import annotations

import pandas as pd

from flashnum.figures.docs.sources import bench, table
from flashnum.figures.quoting import require


def cell(x, digits: int = 3) -> str:
    """A stored value as a table block prints it: numbers to `digits` significant digits."""
    if isinstance(x, bool) or not isinstance(x, float):
        return str(x)
    return "-" if x != x else f"{x:.{digits}g}"  # NaN: no value (none published, say)


def aggregates(digits: int) -> dict:
    """The aggregates a view names beyond pandas': a group's range, its median and range."""
    def span(values: pd.Series) -> str:  # "1.18", "1.18-1.30" or "-1.3 to 1.7"
        lo, hi = cell(values.min(), digits), cell(values.max(), digits)
        return lo if lo == hi else f"{lo} to {hi}" if lo.startswith("-") else f"{lo}-{hi}"
    return {"span": span,
            "median (span)": lambda x: f"{cell(x.median(), digits)} ({span(x)})"}


def view(source: str, where: str, columns: list[str], by: list[str] | None = None,
         agg="span", never: dict[str, str] | None = None, digits: int = 3):
    """The table function that shows `columns` of the stored table `source` (see above)."""
    def make(F) -> pd.DataFrame:
        df = table(F, source)
        for query, says in (never or {}).items():
            require(df.query(query).empty, says)
        df = df.query(where) if where else df
        # a column that is not stored is an expression of stored ones ("err_dq / ref_dq")
        df = df.assign(**{c: df.eval(c) for c in columns if c not in df.columns})
        fmt = lambda x: cell(x, digits)  # noqa: E731
        if by:
            how = lambda a: aggregates(digits).get(a, a)  # noqa: E731
            agg_ = {c: how(a) for c, a in agg.items()} if isinstance(agg, dict) else how(agg)
            g = df.groupby(by, sort=True, dropna=False)[columns]
            return g.agg(agg_).reset_index().map(fmt)
        return df[columns].reset_index(drop=True).map(fmt)
    return make


def record(name: str, rows: list[tuple], columns: list[str]):
    """The table function of a stored bench result (bench/results/NAME.json): one row per
    entry of `rows`, each cell a str.format template over the record ("{speed[ratio]:.2f}"),
    plain text, or a function of the record."""
    def make(F) -> pd.DataFrame:
        r = bench(F, name)
        fill = lambda c: c(r) if callable(c) else c.format(**r)  # noqa: E731
        return pd.DataFrame([[fill(c) for c in row] for row in rows], columns=columns)
    return make


def goal(text: str, met):
    """A record's goal cell: `text` and whether the record meets it, met(record) -> bool."""
    return lambda r: f"{text} ({'met' if met(r) else 'not met'})"
