"""What README.md and docs/kernel.md quote about the Triton kernel on the CPU interpreter:
its fidelity to the engine's arithmetic (experiments/triton_interpreter), as passages.
"""

from __future__ import annotations

import pandas as pd

from flashnum.figures.docs.digits import pct_floor, sci
from flashnum.figures.docs.sources import table
from flashnum.figures.quoting import Passage, require


def _fidelity(F) -> pd.DataFrame:
    t = table(F, "triton_interpreter")
    return t[t.kind == "fidelity"]


def triton_readme(F):
    f = _fidelity(F)
    low = f[f.precision.isin(["fp16", "bf16"])].elem_le1.min()
    return [f"fp16/bf16 outputs are >= {pct_floor(low)} within 1 ulp"]


def _span(s, fmt):
    lo, hi = fmt(s.min()), fmt(s.max())
    return lo if lo == hi else f"{lo}-{hi}"


def _percent(digits):
    return lambda x: "100" if round(100 * x, digits) == 100 else f"{100 * x:.{digits}f}"


def _ulps(x):
    return f"{x:g}" if x < 1000 else sci(x, 2 if x >= 1e6 else 1).replace(".0e", "e")


def kernel_docs(F):
    """The interpreter's fidelity table."""
    t = table(F, "triton_interpreter")
    facts = t[t.kind == "fact"].set_index("name")
    out = [f"`tl.exp` / `tl.exp2` are numpy's float32 exp / exp2: "
           f"{100 * facts.frac_not_correctly_rounded['exp']:.0f}% / "
           f"{100 * facts.frac_not_correctly_rounded['exp2']:.0f}% of results differ from "
           f"the correctly rounded value, by at most {facts.max_ulp['exp']:.0f} / "
           f"{facts.max_ulp['exp2']:.0f} ulp"]
    dots = facts[facts.index.str.startswith("dot_d")]
    d = sorted(int(n[5:]) for n in dots.index)
    # fp16-valued inputs: every product is exact in fp32, so numpy's sequential sum is the
    # engine's FMA chain term for term
    require((dots.numpy_eq_sequential == 1).all(), "numpy sums the head dim sequentially")
    out.append(f"for d = {', '.join(map(str, d))}, and the engine's dot (one FMA chain per "
               "entry, flashnum.numerics.accumulate) gives its bits at every one of them")
    return out


def fidelity_table(F) -> pd.DataFrame:
    """The interpreter's outputs against the engine's, per dtype: the shares within 0 and
    1 ulp, elementwise and scaled by the output's largest entry, and the largest ulps."""
    f = _fidelity(F)
    digits = {"fp16": (2, 3, 0), "bf16": (2, 3, 0), "fp32": (1, 1, 2)}
    return pd.DataFrame([[p, f"{_span(x.elem_le0, _percent(d0))} %",
                          f"{_span(x.elem_le1, _percent(d1))} %", _span(x.elem_max, _ulps),
                          f"{_span(x.scaled_le1, _percent(ds))} %", _span(x.scaled_max, _ulps)]
                         for p, (d0, d1, ds) in digits.items()
                         for x in [f[f.precision == p]]],
                        columns=["output", "elem <= 0 ulp", "elem <= 1 ulp", "elem max",
                                 "scaled <= 1 ulp", "scaled max"])


PASSAGES = {
    "BenchInterpreter": Passage("docs/benchmarks.md: the interpreter's fp16/bf16 outputs "
                                "within 1 ulp", triton_readme),
    "KernelInterpreterText": Passage("docs/kernel.md: the interpreter's exp and dots",
                                     kernel_docs),
}
TABLES = {"KernelInterpreter": fidelity_table}
