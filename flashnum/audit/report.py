"""The result of an audit: a table, a one-screen verdict, and a saved report with plots.

    report.passed          True when every case kept every rule
    report.table           pandas DataFrame, one row per case (flashnum.audit.rules)
    report.summary()       the verdict in one screen: rules broken, by which cases
    report.save(path)      path/table.parquet, path/table.csv, path/report.md and plots
                           (error vs N, error by distribution, the kernel beside its model)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

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
        lines = [f"audit of {self.target} ({self.precision}, causal mask {self.alignment}, "
                 f"budget {self.budget}): {verdict}, {ok}/{n} cases kept every rule"]
        if "err_max" in t and t["err_max"].notna().any():
            ratio = (t["err_max"] / t["fa_bound"].where(t["fa_bound"] > 0)).max()
            lines.append(f"  worst error / flash-attn bound: {ratio:.3g} "
                         f"(max error {t['err_max'].max():.3g}, rule: <= 2x standard "
                         f"attention in {self.precision} + fp32 noise)")
        if self.model and "model_bitwise" in t and t["model_bitwise"].notna().any():
            lines.append(f"  model {self.model}: equal to the kernel bit for bit on "
                         f"{100 * t['model_bitwise'].mean():.3f}% of the elements, mean over "
                         f"cases (worst case {100 * t['model_bitwise'].min():.3f}%)")
        for rule, ids in self.broken().items():
            lines.append(f"  rule {rule} broken by {len(ids)} case(s):")
            for i in ids[:MAX_LINES]:
                msg = t.loc[t["id"] == i, "message"].iloc[0] if "message" in t else None
                lines.append(f"    {i}" + (f"  ({msg})" if isinstance(msg, str) else ""))
            if len(ids) > MAX_LINES:
                lines.append(f"    ... and {len(ids) - MAX_LINES} more")
        return "\n".join(lines)

    def save(self, path) -> Path:
        """Write the table, report.md and the plots under `path` (a directory)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.table.to_parquet(path / "table.parquet")
        self.table.to_csv(path / "table.csv", index=False)
        plots = _plots(self.table, path, self.model)
        meta = dict(target=self.target, precision=self.precision, alignment=self.alignment,
                    model=self.model, budget=self.budget, passed=self.passed, **self.info)
        (path / "audit.json").write_text(json.dumps(meta, indent=1, default=str) + "\n")
        (path / "report.md").write_text(_markdown(self, plots))
        return path


def _plots(t: pd.DataFrame, path: Path, model) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    if "err_max" not in t or not t["err_max"].notna().any():
        return names
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.scatter(t["nk"], t["err_max"], s=12, label="kernel")
    ax.scatter(t["nk"], t["std_err_max"], s=12, marker="x", label="standard attention")
    ax.set(xscale="log", yscale="log", xlabel="Nk", ylabel="max |out - ref|")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path / "error_vs_n.png", dpi=120)
    plt.close(fig)
    names.append("error_vs_n.png")
    by = t.groupby("distribution")[["err_max", "std_err_max"]].max().sort_values("err_max")
    fig, ax = plt.subplots(figsize=(6, 0.25 * len(by) + 1.2))
    ax.barh(by.index, by["err_max"], label="kernel")
    ax.scatter(by["std_err_max"], by.index, color="k", s=10, label="standard attention")
    ax.set(xscale="log", xlabel="max |out - ref|")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path / "error_by_distribution.png", dpi=120)
    plt.close(fig)
    names.append("error_by_distribution.png")
    if model and "model_err_max" in t and t["model_err_max"].notna().any():
        fig, ax = plt.subplots(figsize=(4, 4))
        ax.scatter(t["model_err_max"], t["err_max"], s=12)
        lo = min(t["err_max"].min(), t["model_err_max"].min())
        hi = max(t["err_max"].max(), t["model_err_max"].max())
        if lo > 0:
            ax.plot([lo, hi], [lo, hi], lw=0.5, color="k")
            ax.set(xscale="log", yscale="log")
        ax.set(xlabel=f"model {model}: max error", ylabel="kernel: max error")
        fig.tight_layout()
        fig.savefig(path / "kernel_vs_model.png", dpi=120)
        plt.close(fig)
        names.append("kernel_vs_model.png")
    return names


def _markdown(rep: Report, plots: list[str]) -> str:
    cols = [c for c in ("id", "err_max", "fa_bound", "std_err_max", "model_err_max",
                        "model_bitwise", "lse_err_max", "failed") if c in rep.table]
    body = rep.table[cols].to_markdown(index=False, floatfmt=".3g") if _has_tabulate() else (
        rep.table[cols].to_csv(index=False))
    rules = "\n".join(f"- `{r}`" for r in RULES)
    pics = "\n".join(f"![{p}]({p})" for p in plots)
    return (f"# Audit of {rep.target}\n\n```\n{rep.summary()}\n```\n\n"
            f"Rules checked on every case:\n{rules}\n\n(see flashnum/audit/rules.py)\n\n"
            f"{pics}\n\n## Cases\n\n{body}\n")


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True
