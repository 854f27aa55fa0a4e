"""Every experiment whose YAML lies in conf/, by its name: what kind it is, where it lies.

    from flashnum.harness import experiments
    experiments.find("bwd_order")            # Experiment(name, kind="backward", path=...)
    experiments.find("my_sweep", ["myconf"])  # a YAML of the user's: myconf/experiment/
    experiments.names()                       # every name found here

Every YAML says its kind (`kind:`, one of YAML_KINDS), which picks its runner; the one
router is flashnum/run.py (`python -m flashnum.run experiment=NAME`), which adds the kinds
that have no YAML here (the reproductions and the attribution table, whose runners sit
above the harness). The kinds with a YAML:

    forward       conf/experiment/NAME.yaml (flashnum.harness.run: the Config schema)
    backward      conf/experiment/NAME.yaml, a `base` case and a grid
                  (flashnum.harness.backward)
    audit         conf/audit/NAME.yaml (flashnum.audit: a list of runs, or kernel_table)
    table         conf/table/NAME.yaml, a table one function computes whole
                  (flashnum.harness.tables: the bound tightness, ...)
    head_stats    NAME_stats, the logit statistics of forward experiment NAME's inputs
                  (flashnum.studies.head_stats NAME; its YAML is NAME's)

A user's folder (`--config-dir DIR` or `hydra.searchpath=[file://DIR]`) holds its own
experiments as DIR/experiment/NAME.yaml, Hydra's layout; they are found first, so a copy
of a shipped experiment under a new name runs by that name, into a table of that name.
A user's YAML without `kind:` is backward when it has a `base` case, else forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from flashnum.store.paths import CONF

YAML_KINDS = ("forward", "backward", "audit", "table")
FOLDERS = {"experiment": ("forward", "backward"), "audit": ("audit",), "table": ("table",)}


@dataclass(frozen=True)
class Experiment:
    name: str
    kind: str
    path: Path | None = None  # its YAML (none for a reproduction or the attribution table)


def kind_of(path: Path) -> str:
    """The YAML's `kind:`; without one (a user's YAML), backward when it has a `base`
    case, else forward. A kind its folder does not hold is a ValueError (one line)."""
    try:
        body = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return "forward"  # composing it says what is wrong, in one line
    body = body if isinstance(body, dict) else {}
    kind = body.get("kind", "backward" if "base" in body else path.parent.name)
    kind = "forward" if kind == "experiment" else kind
    valid = FOLDERS.get(path.parent.name, YAML_KINDS)
    if kind not in valid:
        raise ValueError(f"{path}: kind {kind!r}; valid in {path.parent.name}/: "
                         f"{', '.join(valid)}")
    return kind


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
    if path is None:
        path = next((p for p in (CONF / "table" / f"{name}.yaml",
                                 CONF / "audit" / f"{name}.yaml") if p.is_file()), None)
    if path is not None:
        return Experiment(name, kind_of(path), path)
    base = find(name.removesuffix("_stats"), dirs) if name.endswith("_stats") else None
    if base is not None and base.kind == "forward":
        return Experiment(name, "head_stats", base.path)
    return None


def names(dirs=()) -> list[str]:
    """Every name with a YAML here (flashnum/run.py adds the kinds without one)."""
    audit = [p.stem for p in (CONF / "audit").glob("*.yaml")]
    table = [p.stem for p in (CONF / "table").glob("*.yaml")]
    return sorted({*_yamls(dirs), *audit, *table})


def unknown(name: str, valid) -> str:
    """The one line for a name that is no experiment."""
    return f"unknown experiment {name!r}; valid: {', '.join(sorted(valid))}"
