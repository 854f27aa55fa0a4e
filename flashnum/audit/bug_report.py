"""The bug report of a failing audit: per broken rule, its worst case shrunk and written as
a standalone reproducer, and a README.md that lists them.

    report = flashnum.audit(fn, precision="bf16", backward=True, report_dir="bug/")
    python -m flashnum.audit target=torch_sdpa backward=true report_dir=bug/

For every rule some case broke (crash and grad_crash aside: a call that raises needs no
numbers to show), the case that broke it by the largest ratio is shrunk
(flashnum.audit.shrink, at most max_calls kernel calls) and written to
<report_dir>/<rule>.py (flashnum.audit.reproducer). Each reproducer is then run once in
a fresh interpreter, and its printed verdict goes to the README beside the audit's own
ratio on the shrunk input and the float64 reference's distance from the certified one.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import torch

from flashnum.audit import gradients, reproducer
from flashnum.audit.rules import aligned_reference
from flashnum.audit.shrink import GRAD_RULES, MAX_CALLS, SHRINKABLE, Instance, ratio_of, shrink
from flashnum.audit.standalone import standalone

RUN_TIMEOUT = 900  # seconds a reproducer may take when the writer runs it


def kernel_source(target, fn):
    """The Standalone of what was audited: a named target's function, 'pkg.mod:func' as
    its import line, or the function object itself."""
    from flashnum.audit.targets import TARGETS

    if isinstance(target, str) and target in TARGETS:
        return standalone(TARGETS[target].function())
    if isinstance(target, str):
        return standalone(target)
    return standalone(fn)


def ref_gap(inst: Instance, rule: str, alignment: str, bound: float) -> float | None:
    """max|float64 reference - certified reference| / the rule's limit on inst (None for
    a rule whose limit is 0: masked and non-finite values need no reference digits)."""
    if rule not in ("fa_rule", "dq_rule", "dk_rule", "dv_rule") or not bound > 0:
        return None
    q, k, v = inst.q.double(), inst.k.double(), inst.v.double()
    kw = dict(causal=inst.causal, alignment=alignment, scale=inst.scale)
    if rule == "fa_rule":
        a = aligned_reference(q, k, v, method="fp64", **kw).out
        b = aligned_reference(q, k, v, method="certified", **kw).out
    else:
        i = gradients.GRADS.index(rule[:2])
        a = gradients.reference_gradients(q, k, v, inst.do.double(), method="fp64", **kw)[i]
        b = gradients.reference_gradients(q, k, v, inst.do.double(), method="certified",
                                          **kw)[i]
    keep = torch.isfinite(b)
    return float((a - b).abs()[keep].max()) / bound if keep.any() else 0.0


def forward_limit(inst: Instance, alignment: str) -> float:
    """fa_rule's limit on inst without calling the kernel: 2 max|std - ref| + fp32 noise
    (flashnum.audit.rules), with the certified reference."""
    from flashnum.audit.standard import standard_attention

    q, k, v = inst.q.double(), inst.k.double(), inst.v.double()
    kw = dict(causal=inst.causal, alignment=alignment, scale=inst.scale)
    ref = aligned_reference(q, k, v, method="certified", **kw)
    dead = ~torch.isfinite(ref.row_max)
    keep = torch.isfinite(ref.out) & ~dead[..., None].expand_as(ref.out)
    std = standard_attention(inst.q, inst.k, inst.v, **kw).double()
    r32 = ref.out.float()
    noise = ((r32 + 0.3 - 0.3).double() - r32.double()).abs()[keep]
    std_err = (std - ref.out).abs()[keep & torch.isfinite(std)]
    return 2 * float(std_err.max()) + 2 * float(noise.max())


def run(path: Path, timeout: int = RUN_TIMEOUT) -> tuple[int, str]:
    """(exit status, printed verdict) of a reproducer run in a fresh interpreter."""
    try:
        p = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                           timeout=timeout, cwd=path.parent)
    except subprocess.TimeoutExpired:
        return -1, f"did not finish in {timeout} s"
    lines = [x for x in p.stdout.splitlines() if x.strip()]
    tail = lines[-2:] if lines else (p.stderr.strip().splitlines() or ["(nothing printed)"])[-1:]
    return p.returncode, " / ".join(tail)


def _worst(report, rule):
    rows = [r for _, r in report.table.iterrows() if rule in str(r["failed"]).split(",")]
    return max(rows, key=lambda r: ratio_of(r, rule))


def write(report, target, fn, case_list, report_dir, *, alignment: str,
          reference: str = "auto", isolate: bool = False, max_calls: int = MAX_CALLS,
          run_each: bool = True, title: str | None = None,
          rules: tuple[str, ...] | None = None) -> list[dict]:
    """Shrink, write and run one reproducer per broken rule (module docstring; rules: only
    these of them); writes README.md; returns one dict per reproducer."""
    out = Path(report_dir)
    out.mkdir(parents=True, exist_ok=True)
    kernel = kernel_source(target, fn)
    versions = kernel.versions()
    title = title or f"{report.target} ({', '.join(f'{p} {v}' for p, v in versions.items())})"
    by_id = {c.id: c for c in case_list}
    entries = []
    for rule in report.broken():
        if rule not in SHRINKABLE or (rules is not None and rule not in rules):
            continue
        row = _worst(report, rule)
        inst = Instance.of_case(by_id[row["id"]], report.precision)
        small = shrink(fn, inst, rule, alignment=alignment, max_calls=max_calls,
                       reference=reference, isolate=isolate)
        bound_col = {"fa_rule": "fa_bound"}.get(rule, f"{rule[:2]}_bound")
        gap = ref_gap(small.instance, rule, alignment, float(small.row.get(bound_col, 0.0)))
        header = (f"\nKernel: {title}\nRule: {rule}; the audit's case {row['id']} broke it "
                  f"by {times(ratio_of(row, rule))};\nshrunk in {small.calls} kernel calls to "
                  f"{shape_text(small.instance)}, where the audit measures "
                  f"{times(small.ratio)}.\n")
        if gap is not None:
            header += (f"The float64 reference is within {gap:.2g} of the limit of flashnum's "
                       "certified one here.\n")
        path = reproducer.write(out / f"{rule}.py", small.instance, rule, kernel,
                                alignment=alignment, title=title, header=header)
        status, printed = run(path) if run_each else (None, "not run")
        entries.append(dict(rule=rule, file=path.name, case=row["id"],
                            case_ratio=ratio_of(row, rule), shape=small.instance.shape,
                            dv=int(small.instance.v.shape[-1]),
                            causal=small.instance.causal, scale=small.instance.scale,
                            ratio=small.ratio, calls=small.calls, steps=small.steps,
                            ref_gap=gap, status=status, printed=printed,
                            grad=rule in GRAD_RULES))
    (out / "README.md").write_text(readme(report, title, alignment, entries))
    return entries


def readme(report, title: str, alignment: str, entries: list[dict]) -> str:
    lines = [f"# Bug report: {report.target}", "",
             f"Kernel: {title}; {report.precision}, causal mask {alignment}; audit budget "
             f"{report.budget}.", ""]
    if not entries:
        lines.append("No broken rule that a reproducer can show (crash-only or passing).")
    for e in entries:
        mask = "causal" if e["causal"] else "no mask"
        lines += [f"## {e['rule']}: `{e['file']}`", "",
                  f"- rule: {e['rule']} (flashnum.audit.rules)",
                  f"- minimal input: {shape_text(e)}, {mask}, scale "
                  f"{e['scale'] if e['scale'] is not None else '1/sqrt(d)'}; steps kept: "
                  f"{', '.join(e['steps']) or 'none'} ({e['calls']} kernel calls)",
                  f"- from the audit's case `{e['case']}` ({times(e['case_ratio'])} the limit)",
                  f"- measured ratio on the minimal input: {times(e['ratio'])} (the audit's rule)",
                  f"- the reproducer, run here: exit {e['status']}, `{e['printed']}`"]
        if e["ref_gap"] is not None:
            lines.append(f"- float64 reference vs certified: {e['ref_gap']:.2g} of the limit")
        lines.append("")
    return "\n".join(lines) + "\n"


def shape_text(x) -> str:
    """B, H, Nq, Nk, d (and dv where it differs) of an Instance or a README entry."""
    if isinstance(x, dict):
        (b, h, nq, nk, d), dv = x["shape"], x.get("dv", x["shape"][-1])
    else:
        (b, h, nq, nk, d), dv = x.shape, x.v.shape[-1]
    return f"B={b} H={h} Nq={nq} Nk={nk} d={d}" + (f" dv={dv}" if dv != d else "")


def times(r: float) -> str:
    """A ratio to the limit as the README writes it."""
    return f"{r:.4g}x" if math.isfinite(r) else "inf (the limit is 0: any value breaks it)"


def printed_ratio(text: str) -> float | None:
    """The ratio a reproducer printed ("... ratio 1.89"), or None."""
    m = re.search(r"ratio (\S+)", text)
    return float(m.group(1)) if m else None
