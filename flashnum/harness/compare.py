"""Compare rows computed now with a stored table: does a rerun reproduce the stored results?

    python -m flashnum.run experiment=bf16_sweep store.root=scratch compare_with=experiments

    from flashnum.harness.compare import differences, report
    diffs = differences(now, stored)     # [] when every column but the timings is identical
    print(report(now, stored, "experiments/bf16_sweep"))

Rows are matched by case_id. Every column is compared except the timings (names ending in
`_s`: wall_s, attention_s, search_s; and an audit's `seconds`), which measure the machine,
not the numerics. Floats must be equal as numbers (NaN equals NaN; no tolerance: the
engine is deterministic, so a rerun of the same code gives the same bits); other columns
as values. A real kernel's output (an audit table) is the machine's: torch's CPU kernels
take other paths on other CPUs (AMX, AVX-512 or AVX2), so its rows reproduce on a CPU of
the same kind.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from flashnum.harness import store


def timing_columns(columns) -> list[str]:
    # `seconds`: the audit tables' time per case (flashnum.audit.report)
    return sorted(c for c in columns if str(c).endswith("_s") or c == "seconds")


@dataclass
class Difference:
    column: str
    rows: int          # rows (of the matched ones) whose values differ; all of them if absent
    example: str       # a case_id where they differ
    now: object
    stored: object

    def line(self) -> str:
        if self.stored is _ABSENT:
            return f"  {self.column}: not in the stored table"
        return (f"  {self.column}: {self.rows} rows differ (e.g. {self.example}: "
                f"{self.now!r} now, {self.stored!r} stored)")


_ABSENT = object()


def _unequal(a: pd.Series, b: pd.Series) -> np.ndarray:
    if pd.api.types.is_numeric_dtype(a) and pd.api.types.is_numeric_dtype(b):
        x, y = a.to_numpy(np.float64, na_value=np.nan), b.to_numpy(np.float64, na_value=np.nan)
        return ~((x == y) | (np.isnan(x) & np.isnan(y)))
    x = a.astype(object).where(a.notna(), None).to_numpy()
    y = b.astype(object).where(b.notna(), None).to_numpy()
    return np.array([u != v for u, v in zip(x, y, strict=True)], dtype=bool)


def differences(now: pd.DataFrame, stored: pd.DataFrame) -> list[Difference]:
    """Columns in which the rows of `now` differ from the stored rows of the same case_id.

    Raises ValueError naming a case_id of `now` that the stored table lacks.
    """
    missing = sorted(set(now["case_id"]) - set(stored["case_id"]))
    if missing:
        raise ValueError(f"{len(missing)} case(s) computed now are not stored, e.g. {missing[0]}")
    a = now.set_index("case_id").sort_index()
    b = stored.drop_duplicates("case_id", keep="last").set_index("case_id").loc[a.index]
    out = []
    for col in a.columns:
        if col in timing_columns(a.columns):
            continue
        if col not in b.columns:
            out.append(Difference(col, len(a), str(a.index[0]) if len(a) else "", None, _ABSENT))
            continue
        bad = _unequal(a[col], b[col])
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            out.append(Difference(col, int(bad.sum()), str(a.index[i]), a[col].iloc[i],
                                  b[col].iloc[i]))
    return out


def report(now: pd.DataFrame, stored: pd.DataFrame, where: str) -> tuple[str, bool]:
    """(the lines to print, whether the rows computed now reproduce the stored ones)."""
    n = len(now)
    try:
        diffs = differences(now, stored)
    except ValueError as e:
        return f"{n} computed now; compared with {where}: {e}", False
    skipped = ", ".join(timing_columns(now.columns)) or "none"
    if not diffs:
        return (f"{n} computed now, identical to the stored results in every numeric column "
                f"and every other column but the timings ({where}; not compared: {skipped})"), True
    lines = [f"{n} computed now; compared with {where}, {len(diffs)} column(s) differ:"]
    return "\n".join(lines + [d.line() for d in diffs]), False


def against(now: pd.DataFrame | None, stored_dir) -> tuple[str, bool]:
    """report() of `now` against the table stored in stored_dir (every row, not only the grid)."""
    if now is None or not len(now):
        return f"0 computed now: nothing to compare with {stored_dir}", True
    try:
        stored = store.load(stored_dir)
    except FileNotFoundError:
        return f"{len(now)} computed now; {stored_dir} has no stored table to compare with", False
    return report(now, stored, str(stored_dir))
