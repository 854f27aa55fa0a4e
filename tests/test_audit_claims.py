"""Every number docs/audit.md quotes about the audit of gradients and the diagnosis is the
number in its stored result: experiments/kernel_audit_backward (rows, each report's
audit.json, manifest.json) and bench/results/audit_ports.json. Each claim is the exact
text the document carries, rebuilt here from the stored data with the document's rounding.
"""

import json
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent
EXP = ROOT / "experiments" / "kernel_audit_backward"
RULES = ("dq_rule", "dk_rule", "dv_rule", "grad_nonfinite")


def doc() -> str:
    return " ".join((ROOT / "docs" / "audit.md").read_text().split())


def rows() -> pd.DataFrame:
    return pd.read_parquet(EXP / "results.parquet")


def report(target, precision) -> dict:
    return json.loads((EXP / f"{target}-{precision}" / "audit.json").read_text())


def backward_table() -> list[str]:
    out = ["| target | precision | budget | cases | kept every rule | dq_rule | dk_rule | "
           "dv_rule | grad_nonfinite | fa_rule | worst case: gradient, error / limit |"]
    for (target, precision), g in rows().groupby(["target", "precision"], sort=False):
        broken = [int(g.failed.str.split(",").map(lambda f, r=r: r in f).sum())
                  for r in (*RULES, "fa_rule")]
        w = report(target, precision)["worst"]
        budget = "quick" if len(g) == 8 else "default"
        out.append(f"| {target} | {precision} | {budget} | {len(g)} | {int(g.passed.sum())} | "
                   + " | ".join(map(str, broken))
                   + f" | `{w['id']}`: {w['quantity']}, {w['ratio']:.2f} |")
    return out


def backward_findings() -> list[str]:
    t = rows()
    sdpa = t[t.target == "torch_sdpa"]
    assert (sdpa.failed.str.contains("fa_rule") == False).all()  # noqa: E712
    assert not sdpa.passed.all()
    closest = {p: report("torch_sdpa", p)["diagnosis"]["closest"] for p in ("bf16", "fp16",
                                                                          "fp32")}
    assert all(c["policy"] == "torch_cpu" for c in closest.values())
    shares = pd.read_csv(EXP / "torch_sdpa-fp32" / "diagnosis.csv")
    preset = shares[shares.policy != "torch_cpu"].iloc[0]
    over = t[(t.target == "torch_sdpa") & (t.distribution == "near_overflow")
             & (t.precision == "fp16")].iloc[0]
    assert "grad_nonfinite" in over.failed and over.dk_std_err_max == float("inf")
    tri = t[(t.target == "flashnum_triton")]
    ties = tri[tri.distribution == "ties"].iloc[0]
    assert ties.dq_err_max == ties.model_dq_err_max and "dq_rule" in ties.failed
    wall = json.loads((EXP / "manifest.json").read_text())["runs"][-1]["wall_s"]
    share = ", ".join(f"{100 * closest[p]['bitwise']:.2f}% ({p})" for p in closest)
    bf16 = t[(t.target == "torch_sdpa") & (t.precision == "bf16")]
    grad_broken = bf16.failed.str.contains("_rule|grad_", regex=True).sum()
    return [f"backward=true` exits 1 ({grad_broken} of {len(bf16)} cases break a gradient rule)",
            f"the torch_cpu model of its backward equals its values bit for bit ({share} "
            f"of every output and gradient value)",
            f"no preset comes closer than {100 * preset.bitwise:.1f}% ({preset.model})",
            f"its dQ errs by {ties.dq_err_max / ties.dq_bound:.2f} of the limit",
            f"(equal bit for bit on {100 * ties.model_dq_bitwise:.1f}% of that case's dQ)",
            f"The experiment took {wall:.0f} s wall"]


def ports() -> list[str]:
    res = json.loads((ROOT / "bench" / "results" / "audit_ports.json").read_text())
    out = []
    for name, r in res["runs"].items():
        c, s, w = r["closest"], r["site"], r["worst"]
        nxt = ", ".join(f"{x['model']} {100 * x['bitwise']:.1f}%" for x in r["next"][:2])
        out.append(
            f"- `{name}`: {r['cases'] - r['kept']} of {r['cases']} cases break "
            f"{', '.join(sorted(r['broken']))}; the worst is `{w['id']}` ({w['quantity']} "
            f"error {w['err']:.3g}, {w['ratio']:.3g}x its limit). Closest model: {c['model']}, "
            f"equal bit for bit on {100 * c['bitwise']:.2f}% of the outputs of the "
            f"{c['cases']} cases it can take (next: {nxt}). Dominant site: {s['site']} "
            f"({s['format']}; alone {s['err_only']:.3g}, the model's {s['total']:.3g}).")
        if s["kernel_err"] > 2 * s["total"]:
            out.append(f"There the kernel errs {s['kernel_err'] / s['total']:.3g}x as much as "
                       "the model: more than the model's roundings explain.")
    return out


def torch_diagnosis() -> list[str]:
    parts = []
    for p in ("bf16", "fp16", "fp32"):
        c = report("torch_sdpa", p)["diagnosis"]["closest"]
        parts.append(f"{p}: {c['model']}, {100 * c['bitwise']:.2f}% of {c['cases']} cases")
    return ["closest model " + "; ".join(parts)]


@pytest.mark.parametrize("build", [backward_table, backward_findings, ports, torch_diagnosis])
def test_every_quoted_number_is_the_number_in_its_result(build):
    text = doc()
    missing = [c for c in build() if " ".join(c.split()) not in text]
    assert not missing, f"docs/audit.md does not say (from its result): {missing}"


def test_the_stored_experiment_ran_from_a_clean_commit():
    run = json.loads((EXP / "manifest.json").read_text())["runs"][-1]
    assert run["git"]["dirty"] is False
