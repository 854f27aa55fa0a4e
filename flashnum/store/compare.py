"""Compare rows computed now with a stored table: does a rerun reproduce the stored results?

    python -m flashnum.run experiment=bf16_sweep store.root=scratch compare_with=experiments

    from flashnum.store.compare import differences, report
    diffs = differences(now, stored)     # [] when every column but the timings is identical
    print(report(now, stored, "experiments/bf16_sweep"))

Rows are matched by case_id. Every column is compared except the timings (names ending in
`_s`: wall_s, attention_s, search_s; and an audit's `seconds`), which measure the machine,
not the numerics. Floats must be equal as numbers (NaN equals NaN; no tolerance: every
emulated result, reference, metric and bound is a function of its inputs alone, the same
bits on every machine: docs/engine.md); other columns as values.

What measures a real kernel follows the machine instead: torch's CPU kernels, numpy's
matmul and the Triton interpreter take other paths on other CPUs (AMX, AVX-512, AVX2;
Intel or AMD). Those tables (MACHINE_TABLES), the backward sweeps' columns of torch's own
autograd (MACHINE_COLUMNS) and the Triton backend's rows are compared only where the table
was stored on this CPU class (flashnum.store.manifest.cpu_class); elsewhere one line says
so and the rest is compared.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from flashnum import store
from flashnum.store.manifest import cpu_class

# tables of a real kernel's output (torch's CPU kernels, numpy's matmul, the Triton
# interpreter): they reproduce on a CPU of the class that stored them
MACHINE_TABLES = ("kernel_table", "kernel_audit", "kernel_audit_backward", "audit_ports",
                  "torch_cpu_forward", "torch_cpu_backward", "triton_interpreter",
                  "triton_tutorial_forward", "triton_tutorial_backward", "qiu_yao_agreement")
# the backward sweeps' torch autograd in the dtype (flash-attn's rule: err <= 2 torch_err)
MACHINE_COLUMNS = re.compile(r"^(torch_err|rule)_")


def machine_rows(df: pd.DataFrame) -> pd.Series:
    """Rows computed by a real kernel: the Triton backend (its interpreter on a CPU)."""
    if "backend" not in df.columns:
        return pd.Series(False, index=df.index)
    return df["backend"].astype(str) == "triton"


def stored_class(stored_dir) -> str | None:
    """The CPU class of the last run recorded in a stored table's manifest (None: none)."""
    try:
        runs = json.loads((Path(stored_dir) / store.MANIFEST).read_text()).get("runs", [])
    except (OSError, ValueError, AttributeError):
        return None
    for rec in reversed(runs if isinstance(runs, list) else []):
        machine = rec.get("machine") if isinstance(rec, dict) else None
        if isinstance(machine, dict) and machine.get("cpu_class"):
            return str(machine["cpu_class"])
    return None


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


def differences(now: pd.DataFrame, stored: pd.DataFrame,
                same_machine: bool = True) -> list[Difference]:
    """Columns in which the rows of `now` differ from the stored rows of the same case_id;
    with same_machine False, not the machine's columns and rows (MACHINE_COLUMNS,
    machine_rows).

    Raises ValueError naming a case_id of `now` that the stored table lacks.
    """
    missing = sorted(set(now["case_id"]) - set(stored["case_id"]))
    if missing:
        raise ValueError(f"{len(missing)} case(s) computed now are not stored, e.g. {missing[0]}")
    a = now.set_index("case_id").sort_index()
    b = stored.drop_duplicates("case_id", keep="last").set_index("case_id").loc[a.index]
    if not same_machine:
        keep = ~machine_rows(a).to_numpy()
        a, b = a[keep], b[keep]
    out = []
    for col in a.columns:
        if col in timing_columns(a.columns):
            continue
        if not same_machine and MACHINE_COLUMNS.match(str(col)):
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


def report(now: pd.DataFrame, stored: pd.DataFrame, where: str,
           same_machine: bool = True) -> tuple[str, bool]:
    """(the lines to print, whether the rows computed now reproduce the stored ones)."""
    n = len(now)
    try:
        diffs = differences(now, stored, same_machine)
    except ValueError as e:
        return f"{n} computed now; compared with {where}: {e}", False
    skipped = ", ".join(timing_columns(now.columns)) or "none"
    if not same_machine:
        follows = [str(c) for c in now.columns if MACHINE_COLUMNS.match(str(c))]
        rows = int(machine_rows(now).sum())
        if follows or rows:
            skipped += (f"; stored on another CPU class, so not what follows the machine: "
                        f"{', '.join(follows) or 'no column'}, {rows} Triton row(s)")
    if not diffs:
        return (f"{n} computed now, identical to the stored results in every numeric column "
                f"and every other column but the timings ({where}; not compared: {skipped})"), True
    lines = [f"{n} computed now; compared with {where}, {len(diffs)} column(s) differ:"]
    return "\n".join(lines + [d.line() for d in diffs]), False


def against(now: pd.DataFrame | None, stored_dir) -> tuple[str, bool]:
    """report() of `now` against the table stored in stored_dir (every row, not only the grid);
    a table that follows the machine only where it was stored on this CPU class."""
    if now is None or not len(now):
        return f"0 computed now: nothing to compare with {stored_dir}", True
    try:
        stored = store.load(stored_dir)
    except FileNotFoundError:
        return f"{len(now)} computed now; {stored_dir} has no stored table to compare with", False
    here, there = cpu_class(), stored_class(stored_dir)
    same = there == here
    if Path(stored_dir).name in MACHINE_TABLES and not same:
        return (f"{len(now)} computed now; {stored_dir} measures a real kernel, stored on "
                f"{there or 'an unrecorded CPU class'}, this machine is {here}: compared only "
                f"on its CPU class"), True
    return report(now, stored, str(stored_dir), same)
