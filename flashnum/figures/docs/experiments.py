"""What docs/experiments.md and docs/distributions.md show of the stored tables: one row per
stored table (its rows, the commit and wall time of the run that wrote it last, the a-priori
bound's verdicts where it has one), and the worst_case draw (TABLES). The sweeps' growth
exponents and invariants are named quantities (flashnum.figures.quantities).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from flashnum.analysis.bounds import accounting
from flashnum.figures.docs.sources import last_run
from flashnum.figures.docs.views import view
from flashnum.figures.quoting import require


def stored(F) -> pd.DataFrame:
    """Every stored table: rows, the last run's commit and wall time, and over its rows the
    deterministic bound's verdicts (a forward table with `bound` and `bound_holds`)."""
    rows = []
    for path in sorted(Path(F.experiments).glob("*/results.parquet")):
        name, t = path.parent.name, pd.read_parquet(path)
        run = last_run(F, name)
        require(run["git"]["dirty"] is False, "every stored table comes from a clean commit")
        row = {"table": name, "rows": len(t), "commit": run["git"]["commit"][:7],
               "wall s": f"{run['wall_s']:.0f}" if run.get("wall_s") else "-"}
        if {"bound", "bound_holds"} <= set(t.columns):
            a = accounting(t["bound"], t["bound_holds"])
            fin = np.isfinite(t["bound"].astype(float))
            exceeded = int((fin & ~t["bound_holds"].fillna(False).astype(bool)).sum())
            require(exceeded == 0, "no finite bound of a stored table was exceeded")
            row |= {"bound finite and held": str(a["held"]), "vacuous": str(a["vacuous"]),
                    "undefined": str(a["undefined"])}
        rows.append(row)
    return pd.DataFrame(rows).fillna("-")


# docs/distributions.md's one draw (seed 0) of the stored worst_case table
TABLES = {"StoredTables": stored, "DistributionsWorstCase": view(
    "worst_case", "seed == 0 and precision == 'bf16' and policy == 'fa2' and distribution in "
    "['gaussian', 'plateau']", ["distribution", "seq_len_q", "max_abs_err", "max_ulp_err"])}
