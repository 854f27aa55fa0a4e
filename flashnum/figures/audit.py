"""The paper's table of experiments/kernel_audit and the figure of Qiu & Yao's clamp.

    tab_kernel_audit(F)   one row per audited (kernel, precision): cases kept, the worst
                          error over flash-attn's bound, the median error of the kernel
                          beside standard attention in the same dtype and flashnum's
                          emulated fa2 and lowp on the same cases, and how often the
                          kernel's model (torch_cpu, fa2) equals the kernel bit for bit

    qiu_yao_clamp(F)      repro_qiu_yao's clamp_sweep: out / ref of their released fix vs
                          the max logit, the derived collapse 2 exp(-M) / 1e-10 beside

Reads the table `python -m flashnum.run experiment=kernel_audit` stores (one row per
target, precision and case; flashnum.audit.rules names the columns) and sets the numbers
the paper's section on it quotes (Audit* in flashnum.figures.numbers).
"""

from __future__ import annotations

import math

import pandas as pd

from flashnum.audit.targets import TARGETS
from flashnum.figures.context import Figures
from flashnum.figures.registry import figure
from flashnum.figures.tex import tabular, tex_num, tex_word

PRECISIONS = ("bf16", "fp16", "fp32")


def _median_ratio(a: pd.Series, b: pd.Series) -> float:
    r = (a / b).replace([math.inf, -math.inf], math.nan).dropna()
    return float(r.median()) if len(r) else math.nan


@figure("kernel_audit")
def tab_kernel_audit(F: Figures) -> None:
    df = F.table("kernel_audit")
    if df is None:
        return F.placeholder("tab_kernel_audit", "kernel_audit")
    df = df.assign(ratio=df.err_max / df.fa_bound)
    for col in ("fa2_err_max", "lowp_err_max"):
        if col not in df:
            df[col] = math.nan
    order = {p: i for i, p in enumerate(PRECISIONS)}
    groups = sorted(df.groupby(["target", "precision"]),
                    key=lambda kv: (kv[0][0] != "torch_sdpa", order.get(kv[0][1], 9)))
    rows = []
    for (target, prec), g in groups:
        bw = g.model_bitwise.dropna() if "model_bitwise" in g else pd.Series(dtype=float)
        rows.append([
            tex_word(target), tex_word(prec), f"{int(g.passed.sum())}/{len(g)}",
            tex_num(float(g.ratio.max())), tex_num(float(g.err_max.median())),
            tex_num(float(g.std_err_max.median())), tex_num(float(g.fa2_err_max.median())),
            tex_num(float(g.lowp_err_max.median())), tex_word(TARGETS[target].model or "--"),
            "--" if not len(bw) else f"{100 * bw.mean():.3f}\\% ({100 * bw.min():.3f}\\%)",
        ])
    cols = ["kernel", "dtype", "cases kept", "worst err / bound", "kernel err",
            "standard", "fa2", "lowp", "model", "model bitwise: mean (worst)"]
    F.write_table("tab_kernel_audit", tabular(cols, rows, "llrrrrrrll"))
    torch_rows = df[df.target == "torch_sdpa"]
    tri = df[df.target == "flashnum_triton"]
    F.num("AuditCases", str(len(df)))
    F.num("AuditTorchWorst", float(torch_rows.ratio.max()) if len(torch_rows) else math.nan)
    F.num("AuditTorchModelMin",
          100 * float(torch_rows.model_bitwise.min()) if len(torch_rows) else math.nan, 4)
    F.num("AuditTritonModelMean",
          100 * float(tri.model_bitwise.mean()) if len(tri) else math.nan, 4)
    bf = torch_rows[torch_rows.precision == "bf16"]
    F.num("AuditBfOverStd", _median_ratio(bf.err_max, bf.std_err_max))
    F.num("AuditBfOverFa", _median_ratio(bf.err_max, bf.fa2_err_max))
    F.num("AuditBfOverLowp", _median_ratio(bf.err_max, bf.lowp_err_max))


@figure("repro_qiu_yao")
def qiu_yao_clamp(F: Figures) -> None:
    """repro_qiu_yao's clamp_sweep rows: out / ref of Qiu & Yao's released fix against the
    row's max logit M (two tied maxima), the derived 2 exp(-M) / 1e-10 dashed, the onset
    ln(2 / 1e-10) marked; the idealised fix beside."""
    df = F.table("repro_qiu_yao")
    if df is None or "max_logit" not in df or not (df.distribution == "clamp_sweep").any():
        return F.placeholder("qiu_yao_clamp", "repro_qiu_yao")
    from flashnum.figures.plots import _style

    plt = _style()
    sw = df[(df.distribution == "clamp_sweep") & (df.policy == "lowp")].sort_values("max_logit")
    F.select("qiu_yao_clamp", ["clamp_sweep rows", "policy lowp"])
    fig, ax = plt.subplots(figsize=(5.5, 3.0))
    rel, ideal = sw[sw.variant == "qiu_yao_released"], sw[sw.variant == "qiu_yao"]
    ax.plot(rel.max_logit, rel.ours, "o", ms=3, color="C3", label="released fix (measured)")
    ax.plot(rel.max_logit, rel.predicted, "k--", lw=0.9, label=r"$2e^{-M}/10^{-10}$ (derived)")
    ax.plot(ideal.max_logit, ideal.ours, "-", color="C0", label="idealised fix (measured)")
    ax.axvline(float(rel.onset.iloc[0]), color="0.4", lw=0.8, ls=":")
    ax.set_yscale("log")
    ax.set_xlabel("max logit $M$ of the row (two tied maxima)")
    ax.set_ylabel("output / reference")
    ax.legend(loc="lower left")
    F.save(fig, "qiu_yao_clamp")


# -- experiments/kernel_table ------------------------------------------------------------

FWD_COLS = ["kernel", "dtype", "cases kept", "rules broken", "worst err / bound",
             "err / standard", "model", "bitwise", "within 1 ulp", "closest other",
             "ms per call"]
GRAD_COLS = ["kernel", "dtype", "worst grad err / bound", "grad err / standard",
              "gradient model", "bitwise", "within 1 ulp", "closest (dQ / dK / dV bitwise)",
              "ms fwd+bwd"]


def _pct(x) -> str:
    return "--" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.2f}%"


def _ms(seconds: float) -> str:
    ms = 1e3 * seconds
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.2g}"


def _ran(df: pd.DataFrame) -> pd.DataFrame:
    return df[df.status == "ran"]


# Targets that are another target's kernel reached by another door: torch_flash_cpu
# calls the op behind torch_sdpa on a CPU (ATen's cpu_flash_attention, the same tensor
# bit for bit). The table keeps both doors; a count of kernels counts the kernel once.
SAME_KERNEL = {"torch_flash_cpu": "torch_sdpa"}


def kernel_of(target: str) -> str:
    """The kernel a target runs (its own name unless SAME_KERNEL names another door)."""
    return SAME_KERNEL.get(target, target)


def kernel_counts(df: pd.DataFrame) -> dict:
    """Kernels, (kernel, dtype) pairs that ran and pairs that kept every rule, counting
    each kernel once however many targets reach it."""
    ran = _ran(df).assign(kernel=lambda d: d.target.map(kernel_of))
    pairs = ran.assign(all_kept=ran.kept == ran.cases).groupby(["kernel", "precision"])
    return dict(kernels=ran.kernel.nunique(), pairs=pairs.ngroups,
                all_kept=int(pairs.all_kept.all().sum()))


def _by_kernel(df: pd.DataFrame) -> pd.DataFrame:
    """Rows by kernel, then dtype ("target/precision" as text): the store sorts by case_id,
    a hash, which orders nothing a reader looks for."""
    key = df.target.astype(str) + "/" + df.precision.astype(str)
    return df.iloc[key.argsort(kind="stable")]


def kernel_table_rows(df: pd.DataFrame) -> list[list[str]]:
    """The forward table's rows (plain text cells), from experiments/kernel_table: one per
    kernel and dtype that ran or was refused, then the kernels that need a GPU
    (flashnum.audit.targets.TARGETS' gpu_only) with the command that adds them. "cases kept"
    counts every rule, the gradients' included; "closest other" is the best candidate
    when it is not the model (its bitwise share)."""
    rows = []
    for _, r in _by_kernel(df).iterrows():
        if r.status != "ran":
            if not str(r.status).startswith("needs a GPU"):
                rows.append([r.target, r.precision, str(r.status).split(":")[0]]
                            + ["--"] * (len(FWD_COLS) - 3))
            continue
        broken = ", ".join(f"{c[len('broken_'):]} {int(r[c])}" for c in r.index
                           if c.startswith("broken_") and r[c] > 0) or "none"
        other = "=" if r.closest == r.model else f"{r.closest} ({_pct(r.closest_bitwise)})"
        rows.append([r.target, r.precision, f"{int(r.kept)}/{int(r.cases)}", broken,
                     f"{r.worst_ratio:.2f}", f"{r.ratio_std_median:.2f}", str(r.model),
                     _pct(r.model_bitwise), _pct(r.model_ulp1), other,
                     _ms(r.time_s)])
    for t in TARGETS.values():
        if t.gpu_only:
            rows.append([t.name, "--", "needs a GPU", t.what, t.install]
                        + ["--"] * (len(FWD_COLS) - 5))
    return rows


def kernel_grad_rows(df: pd.DataFrame) -> list[list[str]]:
    """The gradient table's rows: every differentiable kernel and dtype that ran."""
    rows = []
    ran = _ran(_by_kernel(df))
    for _, r in ran[ran.backward.astype(bool)].iterrows():
        closest = (f"{r.grad_closest} ({_pct(r.grad_closest_dq_bitwise)} / "
                   f"{_pct(r.grad_closest_dk_bitwise)} / {_pct(r.grad_closest_dv_bitwise)})")
        rows.append([r.target, r.precision, f"{r.grad_worst_ratio:.2f} ({r.grad_worst})",
                     f"{r.grad_ratio_std_median:.2f}", str(r.grad_model),
                     _pct(r.grad_model_bitwise), _pct(r.grad_model_ulp1), closest,
                     _ms(r.time_fwd_bwd_s)])
    return rows


@figure("kernel_table")
def tab_kernel_table(F: Figures) -> None:
    df = F.table("kernel_table")
    if df is None:
        F.placeholder("tab_kernel_table_grad", "kernel_table")
        return F.placeholder("tab_kernel_table", "kernel_table")
    rows = [[tex_word(c) for c in row] for row in kernel_table_rows(df)]
    F.write_table("tab_kernel_table", tabular(FWD_COLS, rows, "llllrrlrrlr"))
    grows = [[tex_word(c) for c in row] for row in kernel_grad_rows(df)]
    F.write_table("tab_kernel_table_grad", tabular(GRAD_COLS, grows, "llrrlrrlr"))
    ran = _ran(df)
    counts = kernel_counts(df)
    F.num("KernelTableKernels", str(counts["kernels"]))
    F.num("KernelTableRows", str(counts["pairs"]))
    F.num("KernelTableAllKept", str(counts["all_kept"]))
    low = ran[ran.precision != "fp32"]
    F.num("KernelTableLowpModelMin",
          100 * float(low.model_bitwise.min()) if len(low) else math.nan, 4)
