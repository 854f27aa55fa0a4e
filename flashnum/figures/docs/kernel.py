"""What docs/benchmarks.md and docs/kernel.md show of the Triton kernel on the CPU
interpreter: its fidelity to the engine's arithmetic (experiments/triton_interpreter), as
tables (TABLES).
"""

from __future__ import annotations

from flashnum.figures.docs.views import view

FACTS = "kind == 'fact'"
TABLES = {"KernelInterpreter": view("triton_interpreter", "kind == 'fidelity'",
                                    ["elem_le0", "elem_le1", "elem_max", "scaled_le1",
                                     "scaled_max"], by=["precision"], digits=6),
          "KernelInterpreterFacts": view(
              "triton_interpreter", FACTS, ["name", "frac_not_correctly_rounded", "max_ulp",
                                            "numpy_eq_sequential"],
              never={f"{FACTS} and name.str.startswith('dot_d') and numpy_eq_sequential != 1":
                     "numpy sums the head dim sequentially"})}
