"""Every experiment by its name, what kind it is, and where its YAML lies.

    from flashnum.harness import experiments
    experiments.find("bwd_order")            # Experiment(name, kind="backward", path=...)
    experiments.find("my_sweep", ["myconf"])  # a YAML of the user's: myconf/experiment/
    experiments.names()                       # every valid name, for the one-line error

`python -m flashnum.run experiment=NAME` runs any of them: it looks the name up here and
hands a kind other than "forward" to its runner. The kinds:

    forward       conf/experiment/NAME.yaml (flashnum.harness.run: the Config schema)
    backward      conf/experiment/NAME.yaml with a `base` case (flashnum.harness.backward)
    audit         conf/audit/NAME.yaml (flashnum.audit: a list of runs, or kernel_table)
    reproduction  repro_WHAT, a published result (flashnum.reproduce WHAT)
    attribution   attribution, the per-site table (flashnum.attribute experiment=true)
    table         conf/table/NAME.yaml, a table one function computes whole
                  (flashnum.harness.tables: the bound tightness, ...)
    head_stats    NAME_stats, the logit statistics of forward experiment NAME's inputs
                  (flashnum.harness.head_stats NAME)

A user's folder (`--config-dir DIR` or `hydra.searchpath=[file://DIR]`) holds its own
experiments as DIR/experiment/NAME.yaml, Hydra's layout; they are found first, so a copy
of a shipped experiment under a new name runs by that name, into a table of that name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from flashnum.harness.paths import CONF

REPRODUCTIONS = ("fa3_table3", "is_flash_stable", "qiu_yao", "fp8_pcast", "fp8_offset",
                 "pcast_threshold", "block_scaled", "splitkv_decode")


@dataclass(frozen=True)
class Experiment:
    name: str
    kind: str
    path: Path | None = None  # its YAML (none for a reproduction or the attribution table)


def _kind_of(path: Path) -> str:
    """backward when the YAML has a `base` case (the backward's schema), else forward."""
    try:
        body = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return "forward"  # composing it says what is wrong, in one line
    return "backward" if isinstance(body, dict) and "base" in body else "forward"


def _yamls(dirs) -> dict[str, Path]:
    """name -> YAML of the experiment folders: the user's first, then conf/experiment."""
    out: dict[str, Path] = {}
    for d in [*map(Path, dirs), CONF]:
        for p in sorted((d / "experiment").glob("*.yaml")) if (d / "experiment").is_dir() \
                else []:
            out.setdefault(p.stem, p)
    return out


def find(name: str, dirs=()) -> Experiment | None:
    """The experiment called `name` (None when there is none); `dirs`: the user's folders."""
    path = _yamls(dirs).get(name)
    if path is not None:
        return Experiment(name, _kind_of(path), path)
    table = CONF / "table" / f"{name}.yaml"
    if table.is_file():
        return Experiment(name, "table", table)
    audit = CONF / "audit" / f"{name}.yaml"
    if audit.is_file():
        return Experiment(name, "audit", audit)
    if name.startswith("repro_") and name.removeprefix("repro_") in REPRODUCTIONS:
        return Experiment(name, "reproduction")
    if name == "attribution":
        return Experiment(name, "attribution")
    base = find(name.removesuffix("_stats"), dirs) if name.endswith("_stats") else None
    if base is not None and base.kind == "forward":
        return Experiment(name, "head_stats", base.path)
    return None


def names(dirs=()) -> list[str]:
    """Every name `experiment=` takes."""
    audit = [p.stem for p in (CONF / "audit").glob("*.yaml")]
    table = [p.stem for p in (CONF / "table").glob("*.yaml")]
    return sorted({*_yamls(dirs), *audit, *table, *(f"repro_{r}" for r in REPRODUCTIONS),
                   "attribution"})


def unknown(name: str, dirs=()) -> str:
    """The one line for a name that is no experiment."""
    return f"unknown experiment {name!r}; valid: {', '.join(names(dirs))}"
