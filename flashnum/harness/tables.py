"""Experiments computed whole by one function: a table that is not a grid of cases.

    # conf/table/bound_tightness.yaml
    experiment: bound_tightness
    description: how tight the a-priori bounds are, over the input catalogue
    table: flashnum.studies.bounds:tightness_table  # module:function -> DataFrame
    args: {seq_len: 256, seeds: [0, 1]}                # its keyword arguments
    measures: [measured, bound, ...]                   # measured columns; the rest key a row
    external: {env: VAR, arg: path, what: "..."}       # optional: a file from outside the
                                                       # repository, named by $VAR

    python -m flashnum.run experiment=bound_tightness [store.root=DIR]

The function returns one row per case. Each row's case_id is the one case-id function
(flashnum.harness.grid.hash_id) of the experiment's name and the row's columns that are
not measures, and the table replaces the stored one (flashnum.store.replace) with
a manifest record of the code and the config. `python -m flashnum.harness.tables NAME` is
the same command. An experiment that runs a file that never enters this repository
(`external`: a third party's code) takes its path from the environment variable `env`,
passes it as the argument `arg` and records its sha256 in the manifest; without it the
run stops with one line naming the file and the variable, and the stored table stays.
"""

from __future__ import annotations

import hashlib
import importlib
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from flashnum import store
from flashnum.harness.cli import main_of
from flashnum.harness.config import StoreConf
from flashnum.harness.grid import hash_id
from flashnum.store import manifest
from flashnum.store.paths import CONF

TABLES = CONF / "table"


@dataclass
class Args:
    experiment: str = ""  # a name of conf/table/, or a path to such a YAML
    store: StoreConf = field(default_factory=StoreConf)


def load_conf(name: str) -> dict:
    """conf/table/<name>.yaml (or the YAML file `name`); its table is named after the file."""
    path = Path(name) if name.endswith(".yaml") else TABLES / f"{name}.yaml"
    if not path.is_file():
        valid = sorted(p.stem for p in TABLES.glob("*.yaml"))
        raise ValueError(f"unknown table experiment {name!r}; valid: {', '.join(valid)}")
    conf = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    missing = [k for k in ("table", "measures") if k not in conf]
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}; valid: table: module:function, "
                         f"args: {{...}}, measures: [columns]")
    return {**conf, "experiment": path.stem}


def function(spec: str):
    """The function a `module:function` spec names."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def row_ids(name: str, df: pd.DataFrame, measures) -> list[str]:
    """hash_id of [name, the row's columns that are not measures] (NaN as null)."""
    key = [c for c in df.columns if c not in set(measures) and c != "case_id"]
    ids = [hash_id([name, {k: None if isinstance(x, float) and math.isnan(x) else x
                           for k, x in rec.items()}])
           for rec in df[key].to_dict("records")]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{name}: two rows share every column that is not a measure")
    return ids


def external_path(conf: dict) -> Path | None:
    """The file an `external` experiment runs ($env), or None when it needs none; a
    ValueError (one line) when the variable is unset or names no file."""
    ext = conf.get("external")
    if not ext:
        return None
    path = os.environ.get(ext["env"], "")
    if not path or not Path(path).is_file():
        got = f" ({ext['env']}={path!r} is no file)" if path else ""
        raise ValueError(f"{conf['experiment']} runs {ext['what']}, which is not in this "
                         f"repository: set {ext['env']}=PATH{got}; the stored table stays "
                         f"as it is")
    return Path(path)


def _check(cfg) -> None:
    external_path(load_conf(cfg.experiment))


def _run(cfg) -> int:
    conf = load_conf(cfg.experiment)
    name = conf["experiment"]
    args = dict(conf.get("args", {}))
    path = external_path(conf)
    if path is not None:  # the third party's file: its path for the run, its hash recorded
        args[conf["external"]["arg"]] = str(path)
        conf["external"] = {**conf["external"],
                            "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    t0, started = time.perf_counter(), manifest.now()
    df = function(conf["table"])(**args)
    df.insert(0, "case_id", row_ids(name, df, conf["measures"]))
    rec = manifest.record("flashnum.run", [f"experiment={name}"], config=conf, shard=0,
                          num_shards=1, n_workers=1, start_time=started,
                          end_time=manifest.now(), wall_s=time.perf_counter() - t0,
                          counts=dict(grid=len(df), run=len(df), failed=0))
    path = store.replace(name, df, rec, root=cfg.store.root)
    print(f"{name}: stored {len(df)} rows in {path} ({time.perf_counter() - t0:.0f} s)")
    return 0


def main(argv=None) -> int:
    return main_of("flashnum.harness.tables", Args, _run, argv, positional="experiment",
                   check=_check, doc=__doc__)


if __name__ == "__main__":  # an alias: python -m flashnum.run experiment=NAME
    from flashnum.harness.cli import alias, named

    alias(named())
