"""The context every figure function writes through: tables in, files and numbers out.

    F = Figures(experiments=Path("experiments"), out=Path("paper/figures"))
    df = F.table("bf16_sweep")          # the stored rows (flashnum.store), or None
    F.num("SweepCases", len(df))        # a number the text quotes (declared in NUMBERS)
    F.fact("QiuYaoTies", True)         # a fact the text branches on (declared in FACTS)
    F.save(fig, "heatmap", width=0.75)  # heatmap.pdf/.png without timestamps + heatmap.tex
    F.placeholder(stem, experiment)     # the paper's box for a table not yet computed

and the row selections the figures share (prefer, trusted, nonempty) and the power-law
fit (slope). A figure that cannot be drawn from the rows it finds raises Unplottable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from flashnum import store
from flashnum.figures.numbers import EXPERIMENTS, FACTS, NUMBERS
from flashnum.figures.tex import tex_escape, tex_num

SWEEPS = ("bf16_sweep", "fp16_sweep", "fp32_sweep")
PRECISIONS = ("bf16", "fp16", "fp32")  # the precisions the text quotes numbers for
ERR = "max_abs_err"


class Unplottable(ValueError):
    """The table exists but cannot make this figure (e.g. the swept axis does not vary)."""


@dataclass
class Figures:
    """What one generate() call has read and written (see the module docstring)."""

    experiments: Path
    out: Path
    numbers: dict = field(default_factory=dict)  # macro -> TeX text
    facts: dict = field(default_factory=dict)  # \\if name -> bool
    selections: dict = field(default_factory=dict)  # figure -> TeX text
    made: list = field(default_factory=list)
    placeholders: list = field(default_factory=list)  # (file stem, experiment)
    not_drawn: list = field(default_factory=list)  # (file stem, experiment, why)
    _tables: dict = field(default_factory=dict)

    def table(self, name: str) -> pd.DataFrame | None:
        """The experiment's rows, or None (reported) when it has not been run."""
        if name not in self._tables:
            self._tables[name] = load(self.experiments, name)
        return self._tables[name]

    def have(self, name: str) -> bool:
        return self.table(name) is not None

    def num(self, name: str, value, digits: int = 2) -> None:
        if name not in NUMBERS:
            raise ValueError(f"unknown number macro {name!r}; declare it in NUMBERS")
        self.numbers[name] = value if isinstance(value, str) else tex_num(value, digits)

    def fact(self, name: str, value: bool) -> None:
        """A yes/no the paper branches on (\\if<name>); unset, it is false."""
        if name not in FACTS:
            raise ValueError(f"unknown fact {name!r}; declare it in FACTS")
        self.facts[name] = bool(value)

    def select(self, stem: str, parts: list[str]) -> None:
        self.selections[stem] = tex_escape("; ".join(parts))

    def save(self, fig, stem: str, width: float = 1.0) -> None:
        """Write stem.pdf and stem.png without timestamps, and stem.tex including the PDF.

        width: the fraction of the text width the paper shows it at (the figure sizes
        below are chosen so that the 8 pt labels print at about 8 pt).
        """
        import matplotlib.pyplot as plt  # heavy optional dependency: only when drawing

        fig.savefig(self.out / f"{stem}.pdf", metadata={"CreationDate": None})
        fig.savefig(self.out / f"{stem}.png", dpi=150, metadata={"Software": None})
        plt.close(fig)
        write(self.out / f"{stem}.tex",
               f"\\includegraphics[width={width:g}\\linewidth]{{figures/{stem}.pdf}}\n")
        self.made.append(stem)

    def placeholder(self, stem: str, experiment: str) -> None:
        """The framed box the paper shows instead of a figure or table not yet computed."""
        for ext in ("pdf", "png"):
            (self.out / f"{stem}.{ext}").unlink(missing_ok=True)
        cmd = tex_escape(EXPERIMENTS[experiment])
        write(self.out / f"{stem}.tex", f"\\notyetrun{{{cmd}}}\n")
        self.placeholders.append((stem, experiment))

    def cannot_draw(self, stem: str, experiment: str, why: str) -> None:
        """A framed box saying why a table that exists does not give this figure."""
        for ext in ("pdf", "png"):
            (self.out / f"{stem}.{ext}").unlink(missing_ok=True)
        write(self.out / f"{stem}.tex",
               f"\\notdrawn{{{tex_escape(experiment)}: {tex_escape(why)}}}\n")
        self.not_drawn.append((stem, experiment, why))

    def write_table(self, stem: str, body: str) -> None:
        write(self.out / f"{stem}.tex", body)
        self.made.append(stem)


def load(root: Path, name: str) -> pd.DataFrame | None:
    """The rows of the experiment's grid (a figure shows the question its config asks,
    not cases an earlier grid left behind), or None when it has no (or an empty) table."""
    try:
        df = store.load(name, root=root, grid=True)
    except FileNotFoundError:
        return None
    return df if len(df) else None


def write(path: Path, text: str) -> None:
    """One generated file (text mode, as TeX reads it)."""
    path.write_text(text)


def prefer(df: pd.DataFrame, sel: list[str], **want) -> pd.DataFrame:
    """Keep the rows with col == value, for each col the table has and the value occurs in."""
    for col, val in want.items():
        if col in df.columns and (df[col] == val).any():
            df = df[df[col] == val]
            sel.append(f"{col} {val}")
    return df


def trusted(df: pd.DataFrame, sel: list[str]) -> pd.DataFrame:
    """Drop rows whose reference is not accurate enough to measure their error (ref_ok)."""
    if "ref_ok" in df.columns:
        bad = ~df["ref_ok"].astype(bool)
        if bad.any():
            sel.append(f"{int(bad.sum())} rows without a trusted reference left out")
            df = df[~bad]
    return nonempty(df, "trusted-reference")


def nonempty(df: pd.DataFrame, what: str) -> pd.DataFrame:
    """df, or Unplottable when the selection left no rows."""
    if df.empty:
        raise Unplottable(f"has no {what} rows")
    return df


def slope(x, y) -> float:
    """Least-squares exponent a of y ~ x^a (positive values only); nan with < 2 points."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = (x > 0) & (y > 0) & np.isfinite(y)
    if ok.sum() < 2 or len(np.unique(x[ok])) < 2:
        return math.nan
    return float(np.polyfit(np.log(x[ok]), np.log(y[ok]), 1)[0])
