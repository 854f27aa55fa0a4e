"""Rewrite the stored tables' bound verdicts from their own columns: an infinite bound is
vacuous, not "held".

    python bench/bound_accounting.py            # every experiments/*/results.parquet
    python bench/bound_accounting.py --check    # exit 1 if any table would change

For each table with a `bound` column it sets, per row, from `bound` and `max_abs_err`
alone (flashnum.analysis.bounds.verdict, the rule the runner applies to new rows):
bound_finite (None where no bound was computed) and bound_holds (True/False for a finite
bound, None for an infinite or missing one). Deterministic: rerunning changes nothing.
Prints, per table, "finite and held in X of Y, vacuous (infinite) in Z".
"""

import argparse
import sys
from pathlib import Path

import pandas as pd

from flashnum.analysis.bounds import accounting, accounting_phrase, verdict
from flashnum.harness import store

ROOT = Path(__file__).resolve().parent.parent / "experiments"


def rewritten(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    pairs = [verdict(b, e) for b, e in zip(df["bound"], df["max_abs_err"], strict=True)]
    out["bound_finite"] = pd.Series([p[0] for p in pairs], index=df.index, dtype=object)
    out["bound_holds"] = pd.Series([p[1] for p in pairs], index=df.index, dtype=object)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    ap.add_argument("--root", default=str(ROOT))
    a = ap.parse_args(argv)
    stale = 0
    for path in sorted(Path(a.root).glob("*/results.parquet")):
        df = pd.read_parquet(path)
        if "bound" not in df or "max_abs_err" not in df:
            continue  # no bound, or per-site bound terms without one error (bwd_attribution)
        new = rewritten(df)
        same = "bound_finite" in df and df[["bound_finite", "bound_holds"]].astype(object).equals(
            new[["bound_finite", "bound_holds"]])
        acc = accounting(new["bound"], new["bound_holds"])
        print(f"{path.parent.name}: bound {accounting_phrase(acc)}"
              f"{'' if same else ' (rewritten)' if not a.check else ' (STALE)'}")
        if not same:
            stale += 1
            if not a.check:
                store._write_table(new, path)
    return 1 if (a.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
