"""The result of an audit: a table, a one-screen verdict, and a saved report with plots.

    report.passed          True when every case kept every rule
    report.table           pandas DataFrame, one row per case (flashnum.audit.rules)
    report.summary()       the verdict in one screen: the worst case (its ratio and its
                           error from the same, named case), the model's agreement, the
                           rules broken and by which cases, and the diagnosis
    report.diagnosis       None, or flashnum.audit.diagnosis.diagnose's dict: the closest
                           flashnum model (bit-for-bit shares of every candidate), the
                           dominant site of its error, the worst case
    report.save(path)      path/table.parquet, path/table.csv, path/report.md, audit.json,
                           diagnosis.csv (the candidates' shares) and plots: error vs N and
                           error against standard attention's with the 2x limit drawn (one
                           panel per output and gradient), error by distribution, the
                           kernel beside its model; failed cases marked in red
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from flashnum.audit.diagnosis import QUANTITIES, REPRODUCES, worst_case
from flashnum.audit.gradients import GRADS
from flashnum.audit.rules import RULES

MAX_LINES = 12  # failing cases listed in the summary


@dataclass
class Report:
    target: str
    precision: str
    alignment: str
    model: str | None
    budget: str
    table: pd.DataFrame
    info: dict = field(default_factory=dict)
    diagnosis: dict | None = None

    @property
    def passed(self) -> bool:
        return bool(len(self.table)) and bool(self.table["passed"].all())

    def broken(self) -> dict[str, list[str]]:
        """rule -> ids of the cases that broke it."""
        out: dict[str, list[str]] = {}
        for _, r in self.table.iterrows():
            for rule in filter(None, str(r["failed"]).split(",")):
                out.setdefault(rule, []).append(r["id"])
        return out

    def summary(self) -> str:
        t = self.table
        n, ok = len(t), int(t["passed"].sum()) if len(t) else 0
        verdict = "PASS" if self.passed else "FAIL"
        what = "output and gradients" if self.info.get("backward") else "output"
        lines = [f"audit of {self.target} ({self.precision}, causal mask {self.alignment}, "
                 f"budget {self.budget}, {what}): {verdict}, {ok}/{n} cases kept every rule"]
        worst = worst_case(t)
        if worst is not None:
            lines.append(f"  worst case {worst['id']}: {worst['quantity']} error "
                         f"{worst['err']:.3g} = {worst['ratio']:.3g} x its limit "
                         f"{worst['bound']:.3g} (rule: <= 2x standard attention's "
                         f"{worst['std_err']:.3g} in {self.precision} + fp32 noise)")
        if self.model and "model_bitwise" in t and t["model_bitwise"].notna().any():
            lines.append(f"  model {self.model}: equal to the kernel bit for bit on "
                         f"{100 * t['model_bitwise'].mean():.3f}% of the elements, mean over "
                         f"cases (worst case {100 * t['model_bitwise'].min():.3f}%)")
        for g in GRADS:
            col = f"model_{g}_bitwise"
            if self.model and col in t and t[col].notna().any():
                lines.append(f"  model {self.model} {g}: error {t[f'model_{g}_err_max'].max():.3g}"
                             f" (kernel {t[f'{g}_err_max'].max():.3g}), equal bit for bit on "
                             f"{100 * t[col].mean():.3f}% (worst case {100 * t[col].min():.3f}%)")
        for rule, ids in self.broken().items():
            lines.append(f"  rule {rule} broken by {len(ids)} case(s):")
            for i in ids[:MAX_LINES]:
                msg = t.loc[t["id"] == i, "message"].iloc[0] if "message" in t else None
                lines.append(f"    {i}" + (f"  ({msg})" if isinstance(msg, str) else ""))
            if len(ids) > MAX_LINES:
                lines.append(f"    ... and {len(ids) - MAX_LINES} more")
        lines += _diagnosis_lines(self.diagnosis)
        return "\n".join(lines)

    def save(self, path) -> Path:
        """Write the table, report.md and the plots under `path` (a directory)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.table.to_parquet(path / "table.parquet")
        self.table.to_csv(path / "table.csv", index=False)
        plots = _plots(self.table, path, self.model)
        meta = dict(target=self.target, precision=self.precision, alignment=self.alignment,
                    model=self.model, budget=self.budget, passed=self.passed, **self.info,
                    worst=worst_case(self.table))
        if self.diagnosis is not None:
            d = self.diagnosis
            d["shares"].to_csv(path / "diagnosis.csv", index=False)
            meta["diagnosis"] = dict(closest=d["closest"], reproduced=d.get("reproduced"),
                                     site=d["site"], candidates=d["candidates"],
                                     forward_only=d.get("forward_only"), cost=d.get("cost"))
        (path / "audit.json").write_text(json.dumps(meta, indent=1, default=str) + "\n")
        (path / "report.md").write_text(_markdown(self, plots))
        return path


def _diagnosis_lines(d) -> list[str]:
    if d is None:
        return []
    best = d["closest"]
    first = _alignment_lines(d.get("alignment"))  # the finding that changes the verdict
    if best is None:
        if d.get("answered") == 0:  # the models ran; the kernel gave nothing to compare
            return first + ["  diagnosis: the kernel answered none of the cases, so no "
                            "flashnum model could be compared with it"]
        return first + ["  diagnosis: no flashnum model could be run on these cases"]
    shares = d["shares"]
    qty = ", ".join(f"{q} {100 * best[f'{q}_bitwise']:.2f}%" for q in QUANTITIES
                    if f"{q}_bitwise" in best and best[f"{q}_bitwise"] == best[f"{q}_bitwise"])
    share = (f"bit for bit on {100 * best['bitwise']:.2f}% of the values ({qty}; "
             f"{best['cases']} cases)")
    if d.get("reproduced", True):
        lines = first + [f"  diagnosis: closest flashnum model {best['model']}: equal to the "
                         f"kernel {share}"]
    else:
        lines = first + [f"  diagnosis: no flashnum model reproduces the kernel (none equals "
                         f"it on {100 * REPRODUCES:.0f}% of the values); the closest, "
                         f"{best['model']}, equals it {share}; no site is attributed to it"]
    others = [f"{r.model} {100 * r.bitwise:.2f}%" for r in shares.itertuples()
              if r.model != best["model"] and r.bitwise == r.bitwise][:6]
    if others:
        lines.append("    next: " + ", ".join(others))
    if d.get("forward_only"):
        lines.append("    the kernel gave no gradient (no backward): its outputs alone are "
                     "compared")
    cost = d.get("cost")
    if cost:
        lines.append(f"    searched {cost['candidates']} candidates (presets, kernel models, "
                     f"tilings) on {cost['cases']} cases: {cost['model_runs']} model runs, "
                     f"{cost['reused']} reused, {cost['seconds']:.0f} s")
    site = d["site"]
    if site is not None:
        lines.append(f"    dominant site of {best['model']}'s {site['quantity']} error: "
                     f"{site['site']} ({site['format']}; alone {site['err_only']:.3g}, the "
                     f"model's {site['total']:.3g}, {site['err_without']:.3g} with this site "
                     f"exact; on {site['case']})")
        kernel = site.get("kernel_err")
        if kernel is not None and site["total"] > 0 and kernel > 2 * site["total"]:
            lines.append(f"    there the kernel errs by {kernel:.3g}, "
                         f"{kernel / site['total']:.3g}x the model: more than the model's "
                         "roundings explain")
    return lines


def _alignment_lines(a) -> list[str]:
    """What judging the failing causal cases under the other alignment said."""
    if not a or not a["passed"]:
        return []
    if a["passed"] == a["cases"]:
        return [f"  causal alignment: the {a['cases']} failing causal case(s) with Nq != Nk "
                f"all keep the rules under {a['alignment']}: the kernel's causal mask is "
                f"{a['alignment']}-aligned, not {a['given']}; audit it with "
                f"alignment=\"{a['alignment']}\""]
    return [f"  causal alignment: {a['passed']} of the {a['cases']} failing causal case(s) "
            f"with Nq != Nk keep the rules under {a['alignment']}"]


def _limit_panel(ax, t: pd.DataFrame, qty: str) -> None:
    """Kernel error against standard attention's, the 2x limit drawn, failures in red."""
    e, b, s = QUANTITIES[qty]
    d = t[[e, b, s, "failed"]].dropna(subset=[e, s])
    failed = d["failed"].astype(str).str.contains(
        "fa_rule" if qty == "out" else f"{qty}_rule", regex=False)
    ax.scatter(d.loc[~failed, s], d.loc[~failed, e], s=12, label="kept")
    ax.scatter(d.loc[failed, s], d.loc[failed, e], s=24, marker="x", color="red",
               label="failed")
    pos = d[s][d[s] > 0]
    if len(pos):
        xs = [float(pos.min()) / 1.5, float(pos.max()) * 1.5]
        ax.plot(xs, [2 * x for x in xs], lw=0.8, ls="--", color="k",
                label="limit 2x (+ fp32 noise)")
        ax.plot(xs, xs, lw=0.5, color="0.6", label="equal")
        ax.set(xscale="log", yscale="log")
    ax.set(xlabel=f"standard attention: max |{qty} - ref|", ylabel=f"kernel: max |{qty} - ref|")
    ax.legend(fontsize=6)


def _plots(t: pd.DataFrame, path: Path, model) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    if "err_max" not in t or not t["err_max"].notna().any():
        return names
    failed = t["failed"].astype(str) != ""
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.scatter(t["nk"], t["err_max"], s=12, label="kernel")
    ax.scatter(t["nk"], t["std_err_max"], s=12, marker="x", label="standard attention")
    ax.scatter(t["nk"], t["fa_bound"], s=14, marker="_", color="k",
               label="limit: 2x standard + fp32 noise")
    ax.scatter(t.loc[failed, "nk"], t.loc[failed, "err_max"], s=60, facecolors="none",
               edgecolors="red", label="failed case")
    ax.set(xscale="log", yscale="log", xlabel="Nk", ylabel="max |out - ref|")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path / "error_vs_n.png", dpi=120)
    plt.close(fig)
    names.append("error_vs_n.png")
    qtys = [q for q in QUANTITIES if QUANTITIES[q][0] in t and t[QUANTITIES[q][0]].notna().any()]
    fig, axes = plt.subplots(1, len(qtys), figsize=(3.6 * len(qtys), 3.4), squeeze=False)
    for ax, q in zip(axes[0], qtys, strict=True):
        _limit_panel(ax, t, q)
    fig.tight_layout()
    fig.savefig(path / "error_vs_limit.png", dpi=120)
    plt.close(fig)
    names.append("error_vs_limit.png")
    by = t.groupby("distribution")[["err_max", "std_err_max"]].max().sort_values("err_max")
    bad = t[failed].groupby("distribution").size()
    fig, ax = plt.subplots(figsize=(6, 0.25 * len(by) + 1.2))
    colors = ["red" if bad.get(n, 0) else "C0" for n in by.index]
    ax.barh(by.index, by["err_max"], color=colors, label="kernel (red: a case failed)")
    ax.scatter(by["std_err_max"], by.index, color="k", s=10, label="standard attention")
    ax.scatter(2 * by["std_err_max"], by.index, color="k", marker="|", s=40, label="2x limit")
    ax.set(xscale="log", xlabel="max |out - ref|")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path / "error_by_distribution.png", dpi=120)
    plt.close(fig)
    names.append("error_by_distribution.png")
    pairs = [(q, "model_err_max" if q == "out" else f"model_{q}_err_max", QUANTITIES[q][0])
             for q in QUANTITIES]
    pairs = [(q, m, e) for q, m, e in pairs if model and m in t and t[m].notna().any()]
    if pairs:  # the kernel's error beside its model's, per output and gradient
        fig, axes = plt.subplots(1, len(pairs), figsize=(3.6 * len(pairs), 3.6), squeeze=False)
        for ax, (q, m, e) in zip(axes[0], pairs, strict=True):
            d = t[[m, e]].assign(failed=failed).dropna()
            d = d[(d[m] > 0) & (d[e] > 0) & (d[m] < float("inf")) & (d[e] < float("inf"))]
            ax.scatter(d.loc[~d.failed, m], d.loc[~d.failed, e], s=12, label="kept")
            ax.scatter(d.loc[d.failed, m], d.loc[d.failed, e], s=24, marker="x", color="red",
                       label="failed case")
            if len(d):
                lo, hi = float(min(d[m].min(), d[e].min())), float(max(d[m].max(), d[e].max()))
                ax.plot([lo, hi], [lo, hi], lw=0.5, color="k", label="equal")
                ax.set(xscale="log", yscale="log")
            ax.set(xlabel=f"model {model}: max |{q} - ref|", ylabel=f"kernel: max |{q} - ref|")
            ax.legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(path / "kernel_vs_model.png", dpi=120)
        plt.close(fig)
        names.append("kernel_vs_model.png")
    return names


def _markdown(rep: Report, plots: list[str]) -> str:
    cols = [c for c in ("id", "err_max", "fa_bound", "std_err_max", "model_err_max",
                        "model_bitwise", "lse_err_max", "dq_err_max", "dq_bound", "dk_err_max",
                        "dk_bound", "dv_err_max", "dv_bound", "failed") if c in rep.table]
    body = rep.table[cols].to_markdown(index=False, floatfmt=".3g") if _has_tabulate() else (
        rep.table[cols].to_csv(index=False))
    rules = "\n".join(f"- `{r}`" for r in RULES)
    pics = "\n".join(f"![{p}]({p})" for p in plots)
    diag = ""
    if rep.diagnosis is not None and len(rep.diagnosis["shares"]):
        sh = rep.diagnosis["shares"]
        diag = ("## Diagnosis: every candidate model, bit-for-bit shares\n\n" + (
            sh.to_markdown(index=False, floatfmt=".4f") if _has_tabulate() else sh.to_csv(
                index=False)) + "\n\n")
    return (f"# Audit of {rep.target}\n\n```\n{rep.summary()}\n```\n\n"
            f"Rules checked on every case:\n{rules}\n\n(see flashnum/audit/rules.py and "
            f"flashnum/audit/gradients.py)\n\n{pics}\n\n{diag}## Cases\n\n{body}\n")


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True
