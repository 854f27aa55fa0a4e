"""What README.md and docs/audit.md quote about the audited kernels: their tables, generated
whole from the store (TABLES), and the one number a sentence states (QUOTED).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from flashnum.figures.audit import FWD_COLS, GRAD_COLS, kernel_grad_rows, kernel_table_rows
from flashnum.figures.docs.digits import pct, pct_floor
from flashnum.figures.docs.sources import bench, last_run, table
from flashnum.figures.docs.views import view
from flashnum.figures.quoting import Quantity, require
from flashnum.studies.kernel_agreement import torch_cpu_backward_summary as torch_cpu_summary

BACKWARD = "kernel_audit_backward"  # the gradient audit: its rows, each report's audit.json
GRADS = ("dq", "dk", "dv")
DTYPES = ("fp32", "bf16", "fp16")
yes = lambda b: "yes" if b else "no"  # noqa: E731
pcts = lambda xs, d: " / ".join(f"{100 * x:.{d}f}" for x in xs)  # noqa: E731


def report(F, target, precision) -> dict:
    return json.loads((Path(F.experiments) / BACKWARD / f"{target}-{precision}"
                       / "audit.json").read_text())


def backward_table(F) -> pd.DataFrame:
    rows = []
    for (target, precision), g in table(F, BACKWARD).groupby(["target", "precision"], sort=False):
        w = report(F, target, precision)["worst"]
        rows.append({"target": target, "precision": precision,
                     "budget": "quick" if len(g) == 8 else "default", "cases": len(g),
                     "kept every rule": int(g.passed.sum())}
                    | {r: int(g.failed.str.split(",").map(lambda f, r=r: r in f).sum())
                       for r in ("dq_rule", "dk_rule", "dv_rule", "grad_nonfinite", "fa_rule")}
                    | {"worst case: gradient, error / limit":
                       f"`{w['id']}`: {w['quantity']}, {w['ratio']:.2f}"})
    return pd.DataFrame(rows)


def backward_closest(F) -> pd.DataFrame:
    """torch_sdpa's closest model per dtype (the diagnosis of its gradient audit)."""
    t = table(F, BACKWARD)
    sdpa = t[t.target == "torch_sdpa"]
    require(not sdpa.failed.str.contains("fa_rule").any() and not sdpa.passed.all(),
            "torch_sdpa never breaks flash-attn's rule, and breaks some gradient rule")
    over = sdpa[(sdpa.distribution == "near_overflow") & (sdpa.precision == "fp16")].iloc[0]
    require("grad_nonfinite" in over.failed and over.dk_std_err_max == float("inf"),
            "fp16 near_overflow: standard attention's dK overflows")
    ties = t[(t.target == "flashnum_triton") & (t.distribution == "ties")].iloc[0]
    require(ties.dq_err_max == ties.model_dq_err_max and "dq_rule" in ties.failed,
            "the Triton kernel's dQ on ties errs as its model's does and breaks dq_rule")
    rows = []
    for p in ("bf16", "fp16", "fp32"):
        c = report(F, "torch_sdpa", p)["diagnosis"]["closest"]
        shares = pd.read_csv(Path(F.experiments) / BACKWARD / f"torch_sdpa-{p}" / "diagnosis.csv")
        preset = shares[shares.policy != c["policy"]].iloc[0]
        rows.append({"precision": p, "closest model": c["model"], "cases": c["cases"],
                     "bitwise (every output and gradient value)": pct(c["bitwise"], 2),
                     "closest preset": f"{preset.model} ({pct(preset.bitwise, 1)})"})
    return pd.DataFrame(rows)


def ports(F) -> pd.DataFrame:
    rows = []
    for r in table(F, "audit_ports").sort_values("port").itertuples():
        nxt = ", ".join(f"{x['model']} {100 * x['bitwise']:.1f}%" for x in json.loads(r.next)[:2])
        require(not r.reproduced or r.site_kernel_err <= 2 * r.site_total,
                f"{r.port}: the model's roundings explain the kernel's error at its site")
        rows.append({"port": f"`{r.port}`", "cases breaking a rule": f"{r.cases - r.kept} of "
                     f"{r.cases}", "rules broken": ", ".join(sorted(json.loads(r.broken))),
                     "worst case (error, x its limit)": f"`{r.worst_id}` ({r.worst_quantity} "
                     f"{r.worst_err:.3g}, {r.worst_ratio:.3g}x)",
                     "closest model (bitwise, cases)": f"{r.closest_model} "
                     f"({pct(r.closest_bitwise, 2)}, {r.closest_cases})", "next": nxt,
                     "dominant site (alone, the model's)": f"{r.site} ({r.site_format}; "
                     f"{r.site_err_only:.3g}, {r.site_total:.3g})" if r.reproduced else
                     "none: no model reaches 99%"})
    return pd.DataFrame(rows)


def torch_cpu_speed(F) -> pd.DataFrame:
    """bench/results/torch_cpu.json: the model's CPU time over torch's bf16 SDPA."""
    t = bench(F, "torch_cpu")
    tm, s, la = pd.DataFrame(t["timings"]), t["summary"], t["load_average"]
    big, small = tm[tm.torch_cpu_s >= 2e-3], tm[tm.torch_cpu_s < 2e-3]
    require(s["median_cpu_time_ratio"] < 3, "the goal of 3x is met on the median")
    require(s["bitwise"] == 1.0 and s["worst_case_bitwise"] == 1.0,
            "the torch_cpu model equals torch's CPU kernel on every element")
    return pd.DataFrame([{
        "bf16 timings": len(tm), "median CPU ratio": f"{s['median_cpu_time_ratio']:.1f}x",
        "median wall ratio": f"{s['median_time_ratio']:.1f}x",
        "load average at the end (1, 5, 15 min)": f"{min(la):.1f}-{max(la):.1f}",
        "torch's call >= 2 ms of CPU": f"{len(big)} timings, {big.cpu_ratio.min():.1f}-"
                                       f"{big.cpu_ratio.max():.1f}x",
        "torch's call < 2 ms": f"{len(small)} timings ({1e3 * small.torch_cpu_s.min():.1f}-"
                               f"{1e3 * small.torch_cpu_s.max():.1f} ms), up to "
                               f"{small.cpu_ratio.max():.1f}x"}])


def tutorial_backward(F) -> pd.DataFrame:
    return table(F, "triton_tutorial_backward").sort_values(["n", "causal", "sm_scale"])


def tutorial_backward_table(F) -> pd.DataFrame:
    c = tutorial_backward(F)
    require((c[[f"engine_{g}" for g in ("out", *GRADS)]] == 1.0).all().all(),
            "the engine's model equals the kernel on out, dQ, dK, dV in every case")
    big = c[c.sm_scale == 1.3]
    require(c[[f"max_diff_ulps_of_max_{g}" for g in GRADS]].max().max() < 1,
            "every difference is under one fp16 ulp of the gradient's largest entry")
    require((big.exp2_dq == big.interpreter_dq).all(),
            "at sm_scale 1.3 the exp2 alone does not change dQ's agreement")
    cols = [f"{a}_{g}" for a in ("interpreter", "exp2", "sum", "engine", "fa2") for g in GRADS]
    return view("triton_tutorial_backward", "", ["n", "causal", "sm_scale", *cols],
                digits=4)(F)


KERNEL_AUDIT = {"case_id": "count", "err_max / fa_bound": "max",
                "err_max / fa2_err_max": "median", "err_max / std_err_max": "median",
                "err_max / lowp_err_max": "median", "model_bitwise": "min"}


def _kernel_table(F):
    k = table(F, "kernel_table")
    return k, k[k.status == "ran"].set_index(["target", "precision"])


def kernel_table(F) -> pd.DataFrame:
    """experiments/kernel_table's forward table (flashnum.figures.audit), the words of the
    findings below it checked against the store."""
    k, r = _kernel_table(F)
    fp32 = r.xs("fp32", level="precision")
    require((fp32.loc[["torch_sdpa", "torch_flash_cpu", "torch_math"]].model_bitwise == 1).all(),
            "in fp32 torch_sdpa, torch_flash_cpu and torch_math equal their models bit for bit")
    require(r.loc[["jax_xla", "hf_eager"]].grad_closest_bitwise.max() < 0.75,
            "jax_xla's and hf_eager's gradients equal their closest model on under 75%")
    mha, eager, f32 = r.loc["ort_mha"], r.loc["hf_eager"], r.loc[("torch_math", "fp32")]
    require((mha.worst_case == "gaussian/B1H2/Nq100Nk300/d64/causal/s0").all(),
            "ort_mha's worst case is gaussian/B1H2/Nq100Nk300/d64/causal/s0")
    require((eager.broken_masked == 2).all() and (eager.broken_grad_masked == 2).all(),
            "hf_eager breaks the masked-row rule in 2 cases, forward and gradients")
    require(f32.worst_case == f32.grad_worst_case == "late_max/B2H1/Nq77Nk77/d128/causal/s0",
            "torch_math's fp32 worst case is late_max/B2H1/Nq77Nk77/d128/causal/s0")
    unsupported = k[k.status.str.startswith("unsupported")]
    require(set(zip(unsupported.target, unsupported.precision, strict=True)) == {
        ("ort_attention", "bf16"), ("ort_mha", "bf16"), ("jax_xla", "fp16")},
            "exactly ort_attention bf16, ort_mha bf16 and jax_xla fp16 are unsupported")
    return pd.DataFrame(kernel_table_rows(k), columns=FWD_COLS)


def torch_cpu_backward(F) -> tuple[pd.DataFrame, dict, dict]:
    """experiments/torch_cpu_backward: its rows, their summary, the manifest's last run."""
    df = table(F, "torch_cpu_backward")
    return df, torch_cpu_summary(df), last_run(F, "torch_cpu_backward")


def torch_cpu_backward_table(F) -> pd.DataFrame:
    df, s, _ = torch_cpu_backward(F)
    require({s[p][w][n]["share"] for p in DTYPES for n in GRADS
             for w in ("backward", "end_to_end")} == {1.0},
            "the model equals torch's backward on every entry, in every dtype")
    dims = ["batch", "heads", "seq_len_q", "seq_len_k", "head_dim"]
    require((df.groupby(dims).causal.sum() == 3).all(),
            "each shape runs causal and not in each of the three dtypes")
    share = lambda p, w, d: " / ".join(pct(s[p][w][n]["share"], d) for n in GRADS)  # noqa: E731
    return pd.DataFrame([
        {"precision": p, "comparisons": s[p]["backward"]["dq"]["comparisons"]}
        | {f"d{n[1].upper()}": pct(s[p]["backward"][n]["share"], 4) for n in GRADS}
        | {"worst comparison": pct(min(s[p]["backward"][n]["worst"] for n in GRADS), 4),
           "end to end (dQ / dK / dV)": share(p, "end_to_end", 3),
           "fa2 (dQ / dK / dV)": share(p, "fa2", 1), "naive (dQ / dK / dV)": share(p, "naive", 1)}
        for p in DTYPES])


TABLES = {
    "AuditBackward": backward_table, "AuditBackwardClosest": backward_closest,
    "AuditPorts": ports, "AuditTorchCpuSpeed": torch_cpu_speed,
    "AuditTorchCpu": view("torch_cpu_forward", "", ["case_id", "elements", "bitwise",
                          "lse_bitwise", "max_ulps"], by=["precision"], digits=6, never={
        "seed != 0": "every case is seed 0"}, agg={"case_id": "count", "elements": "sum",
                                                  "bitwise": "min", "lse_bitwise": "min",
                                                  "max_ulps": "max"}),
    "AuditTorchCpuBackward": torch_cpu_backward_table,
    "AuditQiuYao": view("qiu_yao_agreement", "", ["median_row_max", "bitwise", "max_diff"],
                        by=["distribution", "params", "d", "causal", "variant"], digits=6,
                        never={"variant != 'qiu_yao' and bitwise < 0.999": "lowp and the "
                               "released fix equal their code on all but a few in 10^4"}),
    "AuditTutorial": view("triton_tutorial_forward", "", ["n", "causal", "sm_scale",
                          "bitwise_twice", "bitwise_once"], digits=6, never={
        "bitwise_twice < 0.999": "fa2 with exp2 equals it on all but a few in 10^4"}),
    "AuditTutorialBackward": tutorial_backward_table,
    "AuditKernels": view("kernel_audit", "", list(KERNEL_AUDIT), by=["target", "precision"],
                         agg=KERNEL_AUDIT, digits=4, never={
        "not passed": "every case of every run keeps every rule",
        "target == 'torch_sdpa' and model_bitwise != 1":
        "the torch_cpu model equals torch's SDPA bit for bit in every case"}),
    "AuditKernelTable": kernel_table,
    "AuditKernelGrad": lambda F: pd.DataFrame(kernel_grad_rows(table(F, "kernel_table")),
                                              columns=GRAD_COLS),
}

# the one number README and docs/audit.md quote in a sentence (floored: a ">=" claim)
QUOTED = {"KernelTableLowBitwise": Quantity(
    "kernel_table: the least share of outputs a model equals its kernel on, bf16 and fp16",
    lambda F: _kernel_table(F)[1].query("precision != 'fp32'").model_bitwise.min(),
    md=pct_floor, paper=False)}
