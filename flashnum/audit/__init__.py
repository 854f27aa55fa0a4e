"""Audit any attention kernel: its error against the certified reference, FlashAttention's
acceptance rule, NaN/Inf, masked rows and the LSE, beside an emulated model of it.

    import flashnum
    report = flashnum.audit(fn, precision="bf16", model="torch_cpu")  # fn(q, k, v, causal, scale)
    report = flashnum.audit(fn, precision="bf16", backward=True)      # dQ, dK, dV too
    report.passed, report.table, print(report.summary()), report.save("out/")
    report.diagnosis     # a failing kernel: its closest flashnum model, dominant site, worst case

    python -m flashnum.audit target=torch_sdpa precision=bf16      # exit 0 pass, 1 fail, 2 bad args
    python -m flashnum.audit target=torch_sdpa precision=bf16 backward=true

flashnum.audit is this module, and calling it calls audit(): flashnum.audit(fn, ...) is
flashnum.audit.audit(fn, ...).

audit(fn, *, precision, model, alignment, budget, reference, progress, inputs, backward,
      diagnose, report_dir):
  fn          a callable fn(q, k, v, causal=False, scale=None) -> out, or (out, lse); q, k, v
              of one dtype, shape (B, H, N, d); or a target name (flashnum.audit.targets)
  precision   fp32 bf16 fp16: the dtype of the inputs
  model       a flashnum policy the kernel claims to follow ("torch_cpu", "fa2", ...) or None
  alignment   the target's causal mask: "top_left" (torch's is_causal) or "bottom_right"
              (flash-attn >= 2.1, flashnum); a named target knows its own
  budget      quick, default (~2 minutes for a CPU kernel on 2 cores), full
  reference   auto (default: fp64 where its proven bound cannot move a verdict, else
              certified), certified, or fp64 (flashnum.reference methods)
  inputs      a flashnum.capture file: one case per recorded call instead of the budget's
  backward    also differentiate fn through autograd (dO drawn per case, seeded) and judge
              dQ, dK, dV (flashnum.audit.gradients)
  diagnose    None (default: when the audit fails), True or False: find the flashnum model
              closest to the kernel bit for bit, its dominant site of error and the worst
              case (flashnum.audit.diagnosis; report.diagnosis, the summary, report.save)
  report_dir  a folder: a failing audit writes there, per broken rule, its worst case
              shrunk to a standalone reproducer (no flashnum needed) and a README.md
              (flashnum.audit.bug_report; at most flashnum.audit.shrink.MAX_CALLS kernel
              calls per shrink)

Cases come from flashnum.audit.cases, rules from flashnum.audit.rules and
flashnum.audit.gradients, models from flashnum.audit.models, the report from
flashnum.audit.report. A case whose call raises or returns garbage fails; the audit goes on.
"""

from __future__ import annotations

import sys
import types

from flashnum.audit.cases import BUDGETS, Case, captured_cases, cases
from flashnum.audit.report import Report
from flashnum.audit.rules import ALIGNMENTS, DTYPES, REFERENCES, evaluate
from flashnum.audit.targets import resolve


def audit(fn, *, precision: str = "bf16", model: str | None = None,
          alignment: str | None = None, budget: str = "default",
          reference: str = "auto", progress: bool = False,
          case_list: list[Case] | None = None, isolate: bool = False,
          compare: tuple[str, ...] = (), inputs=None, backward: bool = False,
          diagnose: bool | None = None, report_dir=None) -> Report:
    """Run every case of `budget` (or `case_list`) through fn; see the module docstring.
    isolate=True calls fn in a forked child per case, so that a target that corrupts
    memory or aborts fails its cases instead of ending the audit. compare: flashnum
    policies whose emulated error is recorded beside the kernel's (<policy>_err_max).
    inputs: a flashnum.capture file: its calls are the cases (a model's real Q, K, V).
    report_dir: where a failing audit writes its bug report (flashnum.audit.bug_report:
    per broken rule a shrunk standalone reproducer, at most shrink.MAX_CALLS kernel
    calls each, and a README.md); report.info["bug_report"] lists them."""
    import pandas as pd

    name = fn if isinstance(fn, str) else getattr(fn, "__qualname__", repr(fn))
    target = fn
    if isinstance(fn, str):
        fn, align0, model0 = resolve(fn)
        alignment = alignment or align0
        model = model if model is not None else model0
    if not callable(fn):
        raise TypeError(f"fn must be callable or a target name, got {type(fn).__name__}")
    alignment = alignment or "top_left"
    if precision not in DTYPES:
        raise ValueError(f"unknown precision {precision!r}; valid: {', '.join(DTYPES)}")
    if alignment not in ALIGNMENTS:
        raise ValueError(f"unknown alignment {alignment!r}; valid: {', '.join(ALIGNMENTS)}")
    if reference not in REFERENCES:
        raise ValueError(f"unknown reference {reference!r}; valid: {', '.join(REFERENCES)}")
    if inputs is not None:
        if case_list is not None:
            raise ValueError("give inputs= (a capture file) or case_list=, not both")
        case_list = captured_cases(inputs)
    for flag, x in (("backward", backward), ("diagnose", diagnose)):
        if not (isinstance(x, bool) or (flag == "diagnose" and x is None)):
            raise TypeError(f"{flag} must be True or False, got {x!r}")
    todo = case_list if case_list is not None else cases(budget)
    it = todo
    if progress:
        from tqdm import tqdm

        it = tqdm(todo, desc=f"audit {name}", unit="case")
    kept: dict = {}
    rows = [evaluate(fn, c, precision=precision, alignment=alignment, model=model,
                     reference_method=reference, isolate=isolate, compare=tuple(compare),
                     backward=backward, keep=kept)
            for c in it]
    table = pd.DataFrame(rows)
    found = None
    if diagnose or (diagnose is None and not bool(table["passed"].all())):
        from flashnum.audit.diagnosis import diagnose as run_diagnosis

        found = run_diagnosis(kept, table, todo, precision=precision, alignment=alignment,
                              backward=backward, progress=progress)
    report = Report(target=name, precision=precision, alignment=alignment, model=model,
                    budget=budget if case_list is None else "custom", table=table,
                    info=dict(reference=reference, backward=backward), diagnosis=found)
    if report_dir is not None and not report.passed:
        from flashnum.audit import bug_report

        report.info["bug_report"] = bug_report.write(
            report, target, fn, todo, report_dir, alignment=alignment, reference=reference,
            isolate=isolate)
    return report


class _CallableModule(types.ModuleType):
    """flashnum.audit(fn, ...) calls audit(fn, ...), as the docs write it."""

    def __call__(self, fn, **kw) -> Report:
        return audit(fn, **kw)


sys.modules[__name__].__class__ = _CallableModule


__all__ = ["audit", "Report", "Case", "cases", "BUDGETS", "ALIGNMENTS"]
