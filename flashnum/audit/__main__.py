"""Audit a kernel from the shell; the report is written under the store.

    python -m flashnum.audit target=torch_sdpa precision=bf16
    python -m flashnum.audit target=torch_sdpa precision=bf16 backward=true   # dQ, dK, dV too
    python -m flashnum.audit target=flashnum_triton precision=fp16 budget=quick
    python -m flashnum.audit target=my_pkg.attn:forward alignment=bottom_right model=fa2
    python -m flashnum.audit target=torch_sdpa budget=full store.root=/tmp/audits
    python -m flashnum.audit target=my_pkg.attn:forward isolate=true  # one child per case
    python -m flashnum.audit target=ort_mha precision=fp32 report_dir=bug/  # reproducers
    python -m flashnum.run experiment=kernel_audit      # the runs of conf/audit/kernel_audit.yaml
    python -m flashnum.run experiment=kernel_table      # every kernel (audit.kernel_table)

Exit status: 0 every case kept every rule, 1 some case broke one (the summary says
which; a failing audit also names the flashnum model closest to the kernel, the
dominant site of its error and the worst case, unless diagnose=false), 2 bad arguments
(one line on stderr). The report (table, report.md, plots) goes
to <store.root>/audit/<target>-<precision>-<budget>/ (flashnum.audit.report). An
experiment (conf/audit/<name>.yaml: a list of runs, each a target, precision and budget)
writes <store.root>/<name>/: each report, results.parquet (every row, with its target
and precision) and summary.md; it exits 1 if any run fails.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from flashnum.audit import BUDGETS, audit
from flashnum.audit.rules import ALIGNMENTS, DTYPES, REFERENCES
from flashnum.audit.targets import resolve
from flashnum.harness.cli import alias, main_of, named
from flashnum.harness.config import StoreConf
from flashnum.harness.grid import hash_id
from flashnum.store.paths import CONF


@dataclass
class Args:
    target: str = "torch_sdpa"
    precision: str = "bf16"
    budget: str = "default"
    model: str = ""          # "" keeps the target's own (torch_sdpa: torch_cpu), "none" for
    #                          none, or policy[:variant[:block_n]] (fa2:exp2:128)
    alignment: str = ""      # "" keeps the target's own
    reference: str = "auto"
    isolate: bool = False    # the target in a forked child per case (memory errors fail it)
    compare: str = ""        # policies whose emulated error is recorded too, e.g. "fa2,lowp"
    backward: bool = False   # also dQ, dK, dV through autograd (flashnum.audit.gradients)
    diagnose: bool = True    # a failing audit: the closest model, its dominant site
    report_dir: str = ""     # a failing audit's bug report: shrunk reproducers, README.md
    experiment: str = ""     # a run list in conf/audit/<name>.yaml (target etc. then unused)
    store: StoreConf = field(default_factory=StoreConf)


def _runs(name: str) -> list[dict]:
    path = CONF / "audit" / f"{name}.yaml"
    if not path.is_file():
        valid = sorted(p.stem for p in (CONF / "audit").glob("*.yaml"))
        raise ValueError(f"unknown experiment {name!r}; valid: {', '.join(valid)}")
    return list(OmegaConf.to_container(OmegaConf.load(path))["runs"])


def _is_table(name: str) -> bool:
    """A table experiment (conf/audit/<name>.yaml lists targets and precisions:
    flashnum.audit.kernel_table) rather than a list of runs."""
    path = CONF / "audit" / f"{name}.yaml"
    return path.is_file() and "targets" in OmegaConf.load(path)


def _check(cfg) -> None:
    if cfg.experiment and _is_table(cfg.experiment):
        from flashnum.audit import kernel_table

        return kernel_table.check(cfg)
    if cfg.experiment:
        for r in _runs(cfg.experiment):
            _check(OmegaConf.merge(cfg, {**r, "experiment": ""}))
        return
    resolve(cfg.target)  # a ValueError names the valid targets
    if cfg.precision not in DTYPES:
        raise ValueError(f"unknown precision {cfg.precision!r}; valid: {', '.join(DTYPES)}")
    if cfg.budget not in BUDGETS:
        raise ValueError(f"unknown budget {cfg.budget!r}; valid: {', '.join(BUDGETS)}")
    if cfg.alignment and cfg.alignment not in ALIGNMENTS:
        raise ValueError(f"unknown alignment {cfg.alignment!r}; valid: {', '.join(ALIGNMENTS)}")
    if cfg.reference not in REFERENCES:
        raise ValueError(f"unknown reference {cfg.reference!r}; valid: {', '.join(REFERENCES)}")


def _experiment(cfg) -> int:
    import time

    import pandas as pd

    from flashnum import store
    from flashnum.store import manifest

    root = Path(cfg.store.root) / cfg.experiment
    started, t0 = manifest.now(), time.perf_counter()
    tables, lines, status = [], [], 0
    for r in _runs(cfg.experiment):
        run = OmegaConf.merge(cfg, {**r, "experiment": ""})
        model = None if run.model == "none" else (run.model or resolve(run.target)[2])
        report = audit(run.target, precision=run.precision, model=model,
                       alignment=run.alignment or None, budget=run.budget,
                       reference=run.reference, progress=True,
                       compare=tuple(x for x in run.compare.split(",") if x),
                       backward=run.backward, diagnose=None if run.diagnose else False)
        report.save(root / f"{run.target}-{run.precision}")
        tables.append(report.table.assign(target=run.target))
        lines.append(report.summary())
        status = status or (0 if report.passed else 1)
    df = pd.concat(tables, ignore_index=True)
    # one row per (target, precision, case): the store's table, replaced whole, keyed by
    # the one case-id function (the readable key stays in target, precision and id)
    df.insert(0, "case_id", [hash_id([cfg.experiment, t, p, i]) for t, p, i in
                             zip(df["target"], df["precision"], df["id"], strict=True)])
    rec = manifest.record("flashnum.run", [f"experiment={cfg.experiment}"],
                          config=dict(runs=_runs(cfg.experiment)), shard=0, num_shards=1,
                          n_workers=1, start_time=started, end_time=manifest.now(),
                          wall_s=time.perf_counter() - t0,
                          counts=dict(grid=len(df), run=len(df), failed=0))
    store.replace(cfg.experiment, df, rec, root=cfg.store.root)
    text = "\n\n".join(lines)
    (root / "summary.md").write_text(f"# {cfg.experiment}\n\n```\n{text}\n```\n")
    print(text)
    return status


def _run(cfg) -> int:
    if cfg.experiment and _is_table(cfg.experiment):
        from flashnum.audit import kernel_table

        return kernel_table.run(cfg)
    if cfg.experiment:
        return _experiment(cfg)
    model = None if cfg.model == "none" else (cfg.model or resolve(cfg.target)[2])
    report = audit(cfg.target, precision=cfg.precision, model=model,
                   alignment=cfg.alignment or None, budget=cfg.budget,
                   reference=cfg.reference, progress=True, isolate=cfg.isolate,
                   compare=tuple(x for x in cfg.compare.split(",") if x),
                   backward=cfg.backward, diagnose=None if cfg.diagnose else False,
                   report_dir=cfg.report_dir or None)
    tail = "-backward" if cfg.backward else ""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_",
                  f"{cfg.target}-{cfg.precision}-{cfg.budget}{tail}")
    out = report.save(Path(cfg.store.root) / "audit" / name)
    print(report.summary())
    print(f"report: {out / 'report.md'}")
    return 0 if report.passed else 1


def main(argv=None) -> int:
    return main_of("flashnum.audit", Args, _run, argv, check=_check, doc=__doc__)


if __name__ == "__main__":
    if any(a.startswith("experiment=") for a in sys.argv[1:]):  # an alias of the one runner
        alias(named())
    raise SystemExit(main())
