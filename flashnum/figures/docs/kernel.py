"""What README.md and docs/kernel.md quote about the Triton kernel on the CPU interpreter:
its fidelity to the GPU's arithmetic (bench/results/triton_interpreter.json), as passages.
"""

from __future__ import annotations

import pandas as pd

from flashnum.figures.docs.digits import pct_floor, sci
from flashnum.figures.docs.sources import bench
from flashnum.figures.quoting import Passage


def triton_readme(F):
    f = bench(F, "triton_interpreter")["fidelity"]
    low = min(x["elem"]["le1"] for x in f if x["precision"] in ("fp16", "bf16"))
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
    r = bench(F, "triton_interpreter")
    f = pd.DataFrame([dict(precision=x["precision"],
                           **{f"e_{k}": v for k, v in x["elem"].items()},
                           **{f"s_{k}": v for k, v in x["scaled"].items()})
                      for x in r["fidelity"]])
    facts = r["facts"]
    out = [f"`tl.exp` / `tl.exp2` are numpy's float32 exp / exp2: "
           f"{100 * facts['exp']['frac_not_correctly_rounded']:.0f}% / "
           f"{100 * facts['exp2']['frac_not_correctly_rounded']:.0f}% of results differ from "
           f"the correctly rounded value, by at most {facts['exp']['max_ulp']:.0f} / "
           f"{facts['exp2']['max_ulp']:.0f} ulp"]
    digits = {"fp16": (2, 3, 0), "bf16": (2, 3, 0), "fp32": (1, 1, 2)}
    for prec, (d0, d1, ds) in digits.items():
        x = f[f.precision == prec]
        out.append(f"| {prec} | {_span(x.e_le0, _percent(d0))} % | "
                   f"{_span(x.e_le1, _percent(d1))} % | {_span(x.e_max, _ulps)} | "
                   f"{_span(x.s_le1, _percent(ds))} % | {_span(x.s_max, _ulps)} |")
    return out


PASSAGES = {
    "ReadmeInterpreter": Passage("README.md: the interpreter's fp16/bf16 outputs within 1 ulp",
                                 triton_readme),
    "KernelInterpreter": Passage("docs/kernel.md: the interpreter's fidelity table",
                                 kernel_docs),
}
