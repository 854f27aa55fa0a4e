"""The defects the kernel table found, each written as a shrunk standalone reproducer.

    python -m flashnum.audit.findings            # rewrites findings/ at the repository root
    python -m flashnum.audit.findings only=ort_mha

One Finding per defect: the kernel (a named target or a wrapper below), the dtype, the
audit case that shows it, and what in the kernel causes it. Each is audited on its case
with report_dir=findings/<name>/ (flashnum.audit.bug_report: the broken rules shrunk,
one reproducer each, run once here), and findings/README.md gathers them. A kernel that
cannot run here is written unshrunk from its case, and the README says why.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from flashnum.audit.cases import Case
from flashnum.audit.shrink import MAX_CALLS
from flashnum.audit.targets_jax import _call, to_jax, to_torch  # noqa: F401 (the wrappers')


def pallas_mha_unpadded(q, k, v, causal=False, scale=None):
    """Pallas's mha called as a user calls it: no padding to its blocks (the jax_pallas
    target pads N to a multiple of 32 to keep the backward's blocks whole)."""
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.gpu.attention import mha

    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)

    def f(q, k, v):
        q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))
        o = mha(q, k, v, None, sm_scale=s, causal=causal, interpret=True)
        return jnp.swapaxes(o, 1, 2)

    return _call(f, q, k, v)


def tinygrad_sdpa(q, k, v, causal=False, scale=None):
    """tinygrad's Tensor.scaled_dot_product_attention on its default device (CPU here);
    (B, H, N, d) torch in and out. tinygrad scales by 1/sqrt(d) itself: another scale
    is folded into q."""
    from tinygrad import Tensor

    d = q.shape[-1]
    qn = q.detach().float().numpy()
    if scale is not None and scale != 1.0 / math.sqrt(d):
        qn = qn * (scale * math.sqrt(d))
    try:
        t = [Tensor(x) for x in (qn, k.detach().float().numpy(), v.detach().float().numpy())]
        out = t[0].scaled_dot_product_attention(t[1], t[2], is_causal=causal).numpy()
    except (RuntimeError, NotImplementedError, FileNotFoundError) as e:
        raise RuntimeError(f"tinygrad's CPU device does not run here ({type(e).__name__}: "
                           f"{str(e)[:80]}): " + TINYGRAD_CPU) from None
    return torch.from_numpy(out.copy()).to(q.dtype)


TINYGRAD_CPU = ("its CPU device compiles each kernel with clang >= 19: install one, or "
                "`pip install ziglang` (flashnum's tinygrad target then puts zig's clang "
                "on PATH)")


def _tinygrad_toolchain() -> None:
    from flashnum.audit.targets_tinygrad import use_toolchain

    use_toolchain()  # where none can be had, the finding says why it could not run


@dataclass(frozen=True)
class Finding:
    name: str
    target: object          # a target name or a wrapper function
    precision: str
    case: Case
    backward: bool
    alignment: str
    cause: str
    rules: tuple[str, ...] | None = None  # the broken rules to write (None: every one)
    max_calls: int = MAX_CALLS            # kernel calls per shrink
    more: tuple[Case, ...] = ()           # further cases, written where it cannot run
    prepare: object = None                # called first: the kernel's toolchain on PATH


FINDINGS = (
    Finding("torch_sdpa_bf16_dk", "torch_sdpa", "bf16",
            Case("plateau", 77, 77, 128, True, 2, 1), True, "top_left",
            "ATen's CPU flash backward forms D = rowsum(dO * O) from the output O "
            "rounded to bf16, as FlashAttention-2 does; where dP - D cancels (the minimal "
            "input: a query that weighs two near-equal values by 1/2 each) O's rounding "
            "dominates dS = P (dP - D). flashnum's fa2 emulation breaks the rule there by "
            "the same ratio, and keeps it once the forward's output rounding is exact "
            "(tests/test_findings.py).", rules=("dk_rule",)),
    Finding("ort_mha_causal", "ort_mha", "fp32",
            Case("gaussian", 100, 300, 64, True, 1, 2), False, "top_left",
            "com.microsoft.MultiHeadAttention with unidirectional=1 and Nq < Nk masks "
            "rows 0..Nq-2 top-left but lets the last query row see every key."),
    Finding("hf_eager_masked_row", "hf_eager", "bf16",
            Case("masked", 96, 64, 64, True, 1, 1), False, "bottom_right",
            "the additive causal mask is finfo(dtype).min, not -inf: every logit of a row "
            "that sees no key becomes the same number, so softmax gives that row uniform "
            "weights and it returns the mean of V instead of 0."),
    Finding("jax_pallas_ragged_backward", pallas_mha_unpadded, "bf16",
            Case("gaussian", 77, 77, 64, False, 1, 2), True, "top_left",
            "Pallas's mha backward kernels run over N // 32 whole blocks of 32 rows and do "
            "not check or mask a ragged N: the rows past the last whole block are read "
            "unmasked, and the gradients hold inf and NaN (measured in interpret mode on "
            "a CPU).", rules=("grad_nonfinite",), max_calls=60),
    Finding("torch_math_fp32_split_scale", "torch_math", "fp32",
            Case("late_max", 77, 77, 128, True, 2, 1), False, "top_left",
            "ATen's _scaled_dot_product_attention_math multiplies Q and K each by "
            "fl32(sqrt(scale)): at d = 128 sqrt(128^-1/2) is not a power of two, so each "
            "logit takes two more fp32 roundings than S = fl(Q K^T) scale, and large "
            "logits carry them into the softmax."),
    Finding("tinygrad_fp32_sums", tinygrad_sdpa, "fp32",
            Case("underflow", 600, 600, 64, False, 1, 2), False, "top_left",
            "tinygrad's fp32 scaled_dot_product_attention (its CPU kernels as DEBUG=4 prints "
            "them; model tinygrad equals them bit for bit, docs/audit.md) forms each dot as "
            "one FMA chain and sums exp(s - m) and P V over all N keys one after another in "
            "fp32, dividing after the P V sum: no blocking or pairwise order that would "
            "keep the sums' error near standard attention's. Its CPU device compiles with "
            "clang >= 19 (a reproducer skips without one; `pip install ziglang` gives one "
            "to flashnum's tinygrad target).",
            more=(Case("sink", 256, 256, 64, True, 2, 1),
                  Case("plateau", 77, 77, 128, True, 2, 1)),
            prepare=_tinygrad_toolchain),
)


def _available(f: Finding) -> str | None:
    """None when the kernel runs here, else why not (one line)."""
    try:
        fn = f.target
        if isinstance(fn, str):
            from flashnum.audit.targets import resolve

            fn = resolve(fn)[0]
        x = torch.zeros(1, 1, 2, 4, dtype=torch.float32)
        fn(x, x, x, causal=False, scale=None)
    except Exception as e:  # the kernel cannot run here: the README says so
        lines = str(e).strip().splitlines()
        return f"{type(e).__name__}: {lines[-1] if lines else ''}"[:500]
    return None


def _unrun(f: Finding, out: Path, why: str) -> list[dict]:
    """The reproducers of a kernel that cannot run here: each case as it is, unshrunk."""
    from flashnum.audit import bug_report, reproducer
    from flashnum.audit.shrink import Instance
    from flashnum.audit.standalone import standalone

    kernel = standalone(f.target)
    entries = []
    for case in (f.case, *f.more):
        inst = Instance.of_case(case, f.precision)
        limit = bug_report.forward_limit(inst, f.alignment)
        gap = bug_report.ref_gap(inst, "fa_rule", f.alignment, limit)
        name = f"fa_rule_{case.distribution}.py"
        header = (f"\nNot shrunk and not run here: the kernel could not run on this machine "
                  f"({why}).\nWritten unshrunk from the audit's case {case.id}; the float64 "
                  f"reference is within {gap:.2g} of the limit of flashnum's certified one.\n")
        reproducer.write(out / name, inst, "fa_rule", kernel, alignment=f.alignment,
                         title=f"{f.name} ({_versions(kernel)})", header=header)
        entries.append(dict(rule="fa_rule", file=name, case=case.id, shape=inst.shape,
                            causal=inst.causal, ref_gap=gap, status=None))
    (out / "README.md").write_text(f"# {f.name}\n\nNot shrunk, not measured here: {why}\n")
    return entries


def write_one(f: Finding, root: Path) -> dict:
    """Audit f's case and write its bug report to root/f.name (or its cases unshrunk where
    the kernel cannot run); the entry of findings/README.md, also root/f.name/finding.json."""
    from flashnum.audit import audit, bug_report
    from flashnum.audit.standalone import standalone

    out = root / f.name
    if f.prepare is not None:
        f.prepare()
    why = _available(f)
    kernel = bug_report.kernel_source(f.target, f.target) if why is None else standalone(
        f.target)
    if why is not None:
        entries = _unrun(f, out, why)
    else:
        rep = audit(f.target, precision=f.precision, case_list=[f.case], backward=f.backward,
                    alignment=f.alignment, diagnose=False)
        fn = f.target if callable(f.target) else None
        if fn is None:
            from flashnum.audit.targets import resolve

            fn = resolve(f.target)[0]
        entries = bug_report.write(rep, f.target, fn, [f.case], out, alignment=f.alignment,
                                   max_calls=f.max_calls, rules=f.rules)
    got = dict(entries=entries, why=why, kernel=_versions(kernel))
    (out / "finding.json").write_text(json.dumps(got, indent=1, default=str) + "\n")
    return got


def _versions(kernel) -> str:
    return ", ".join(f"{p} {v}" for p, v in kernel.versions().items())


def readme(results: list[tuple]) -> str:
    from flashnum.audit.bug_report import shape_text, times

    lines = ["# Findings", "",
             "Every defect the kernel table found (docs/audit.md, experiments/kernel_table), "
             "each as a shrunk standalone reproducer written by the audit's bug report "
             "(`python -m flashnum.audit.findings`; flashnum.audit.bug_report). A reproducer "
             "imports only its kernel's library, torch and numpy, computes the float64 "
             "reference, standard attention in the dtype and the rule itself, and exits 1 "
             "while the defect is present (0 once fixed, 2 when the kernel cannot run). "
             "tests/test_findings.py runs each where its kernel is installed.", ""]
    for f, r in results:
        lines += [f"## {f.name}", "", f"- kernel: {_what(f)}; {r['kernel']}",
                  f"- dtype {f.precision}, causal mask {f.alignment}; the audit's case "
                  f"`{f.case.id}`{' (with gradients)' if f.backward else ''}",
                  f"- cause: {f.cause}"]
        if r["why"] is not None:
            lines.append(f"- not shrunk and not measured here: the kernel could not run on "
                         f"this machine ({r['why']}); each reproducer holds its case unshrunk "
                         "and skips (exit 2) where the kernel cannot run:")
            lines += [f"  - `{f.name}/{e['file']}`: the case `{e['case']}`, float64 reference "
                      f"within {e['ref_gap']:.2g} of the limit of the certified one"
                      for e in r["entries"]]
            lines.append("")
            continue
        for e in r["entries"]:
            lines += [f"- `{f.name}/{e['file']}`: rule {e['rule']}; minimal input "
                      f"{shape_text(e)}{', causal' if e['causal'] else ''} "
                      f"({e['calls']} kernel calls to shrink); the case's ratio "
                      f"{times(e['case_ratio'])}, the minimal input's {times(e['ratio'])}; the "
                      f"reproducer, run here: exit {e['status']}, `{e['printed']}`"]
        lines.append("")
    return "\n".join(lines) + "\n"


def _what(f: Finding) -> str:
    return f"target `{f.target}`" if isinstance(f.target, str) else (
        f"`{f.target.__name__}` (flashnum.audit.findings)")


def main(argv=None) -> int:
    args = dict(a.split("=", 1) for a in (sys.argv[1:] if argv is None else argv))
    names = [f.name for f in FINDINGS]
    only = [x for x in args.get("only", "").split(",") if x]
    for x in only:
        if x not in names:
            raise SystemExit(f"unknown finding {x!r}; valid: {', '.join(names)}")
    root = Path(args.get("root", Path(__file__).resolve().parents[2] / "findings"))
    for f in FINDINGS:
        if only and f.name not in only:
            continue
        got = write_one(f, root)
        print(f"{f.name}: {[(e['rule'], e['status']) for e in got['entries']]}", flush=True)
    results = [(f, json.loads((root / f.name / "finding.json").read_text()))
               for f in FINDINGS if (root / f.name / "finding.json").is_file()]
    (root / "README.md").write_text(readme(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
