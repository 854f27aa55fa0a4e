"""What docs/benchmarks.md and docs/kernel.md show of the Triton kernel on the CPU
interpreter: its fidelity to the engine's arithmetic (experiments/triton_interpreter), as
tables (TABLES) and one passage.
"""

from __future__ import annotations

import pandas as pd

from flashnum.figures.docs.digits import pct_floor
from flashnum.figures.docs.sources import table
from flashnum.figures.docs.views import view
from flashnum.figures.quoting import Passage


def _fidelity(F) -> pd.DataFrame:
    t = table(F, "triton_interpreter")
    return t[t.kind == "fidelity"]


def triton_readme(F):
    f = _fidelity(F)
    low = f[f.precision.isin(["fp16", "bf16"])].elem_le1.min()
    return [f"fp16/bf16 outputs are >= {pct_floor(low)} within 1 ulp"]


FACTS = "kind == 'fact'"
PASSAGES = {"BenchInterpreter": Passage("docs/benchmarks.md: the interpreter's fp16/bf16 outputs "
                                        "within 1 ulp", triton_readme)}
TABLES = {"KernelInterpreter": view("triton_interpreter", "kind == 'fidelity'",
                                    ["elem_le0", "elem_le1", "elem_max", "scaled_le1",
                                     "scaled_max"], by=["precision"], digits=6),
          "KernelInterpreterFacts": view(
              "triton_interpreter", FACTS, ["name", "frac_not_correctly_rounded", "max_ulp",
                                            "numpy_eq_sequential"],
              never={f"{FACTS} and name.str.startswith('dot_d') and numpy_eq_sequential != 1":
                     "numpy sums the head dim sequentially"})}
