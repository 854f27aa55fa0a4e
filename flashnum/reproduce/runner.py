"""Runs and stores the reproductions: the registry, case ids, the store, the command line.

    python -m flashnum.run experiment=repro_<name> [quick=true] [seed=N] [save=false]
    python -m flashnum.reproduce <name>          # the same (an alias)

REPRODUCTIONS lists every published result, one module each (flashnum.reproduce.fa3,
golden, ...) exporting its Reproduction; a new one is its module and a line here. Each
table is stored whole under experiments/repro_<name>/ (flashnum.store.replace,
with a manifest record); a row's case_id hashes the reproduction's name and its protocol
columns (every column not in MEASURES).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import pandas as pd

from flashnum import store
from flashnum.harness.cli import main_of
from flashnum.harness.config import StoreConf
from flashnum.harness.grid import hash_id
from flashnum.reproduce import (
    fa3,
    fa4_offset,
    golden,
    mx_formats,
    pcast_collapse,
    pcast_order,
    qiu_yao_bias,
    splitkv,
)
from flashnum.store import manifest

REGISTRY = {m.REPRODUCTION.name: m.REPRODUCTION for m in (
    fa3, golden, qiu_yao_bias, pcast_order, fa4_offset, pcast_collapse, mx_formats, splitkv)}
REPRODUCTIONS = tuple(REGISTRY)

# measured columns; every other column is protocol and goes into the case_id
MEASURES = {
    "ours", "ours_se", "ours_over_published", "match", "best", "ratio_std_over_flash",
    "match_joint", "best_joint",
    "max_abs_err", "rmse", "rmse_se", "mse", "mse_se", "ratio_to_standard",
    "rmse_ratio_to_standard", "block_m_effect", "z_heads", "z_entries", "z_fix", "fix_diff_se",
    "v_negative_fraction", "underflow_fraction", "ratio_vs_forward",
    "ratio_vs_forward_same_scale", "realised_height",
    "err_over_u_vmax", "rescaled", "predicted_saturation", "budget_ok", "rel_err",
    "flushed_fraction", "delta_c", "delta_all", "cpu_s", "predicted", "onset",
}


def case_ids(name: str, df: pd.DataFrame) -> list[str]:
    """A stable id per row: a hash of the reproduction name and the protocol columns."""
    proto = [c for c in df.columns if c not in MEASURES and c != "case_id"]
    ids = []
    for rec in df[proto].to_dict("records"):
        clean = {k: (None if isinstance(x, float) and math.isnan(x) else x)
                 for k, x in rec.items()}
        ids.append(hash_id([name, clean], spaced=True))
    if len(set(ids)) != len(ids):
        raise ValueError(f"{name}: two rows share their protocol columns; add a column")
    return ids


def save(name: str, df: pd.DataFrame, config: dict, root=None):
    """Store df as experiments/<name>/ (flashnum.store.replace) with a manifest record.

    A reproduction is one table: earlier rows of `name` are replaced, not appended to
    (the manifest appends a record of this run to the earlier ones). Each row gets a
    case_id from its protocol columns (case_ids). Returns the folder.
    """
    started = config.get("start_time") or manifest.now()
    df = df.copy()
    df.insert(0, "case_id", case_ids(name, df))
    args = [f"experiment=repro_{config.get('reproduction') or name.removeprefix('repro_')}"]
    args += (["quick=true"] if config.get("quick") else []) + (
        [f"seed={config['seed']}"] if config.get("seed") else [])
    rec = manifest.record("flashnum.run", args, config=config,
                          shard=0, num_shards=1, n_workers=1, start_time=started,
                          end_time=manifest.now(), wall_s=config.get("wall_s"),
                          counts=dict(grid=len(df), run=len(df), failed=0))
    return store.replace(name, df, rec, root=root)


@dataclass
class Args:
    """python -m flashnum.reproduce WHAT [quick=true] [seed=N] [save=false] [store.root=DIR]

    WHAT: fa3_table3, is_flash_stable, qiu_yao, fp8_pcast, fp8_offset, pcast_threshold,
    block_scaled, splitkv_decode, or all. quick=true runs tiny sizes (seconds) and stores
    only with an explicit store.root=.
    """

    what: str = ""
    quick: bool = False
    seed: int = 0
    save: bool = True  # false: print only
    store: StoreConf = field(default_factory=StoreConf)


def _check(a) -> None:
    if a.what not in (*REPRODUCTIONS, "all"):
        raise ValueError(f"unknown reproduction {a.what!r}; valid: "
                         f"{', '.join(REPRODUCTIONS)}, all")


def _run(a) -> int:
    root = a.store.root if a.store.root != StoreConf.root else None
    names = REPRODUCTIONS if a.what == "all" else (a.what,)
    for name in names:
        t0 = time.perf_counter()
        started = manifest.now()
        df = REGISTRY[name].run(quick=a.quick, seed=a.seed)
        wall = time.perf_counter() - t0
        with pd.option_context("display.width", 200, "display.max_columns", 20,
                               "display.max_rows", 500, "display.float_format", "{:.3g}".format):
            print(f"== {name} ({wall:.0f} s)")
            print(df[REGISTRY[name].display].to_string(index=False))
        if not a.save or (a.quick and root is None):
            continue
        size = "quick" if a.quick else "full"
        config = dict(reproduction=name, quick=a.quick, seed=a.seed,
                      sizes=REGISTRY[name].sizes[size], start_time=started, wall_s=wall,
                      command=f"python -m flashnum.run experiment=repro_{name}"
                      + (" quick=true" if a.quick else ""))
        path = save(f"repro_{name}", df, config, root=root)
        print(f"stored {len(df)} rows in {path}")
    return 0


def main(argv=None) -> int:
    """python -m flashnum.reproduce (see Args)."""
    return main_of("flashnum.reproduce", Args, _run, argv, positional="what", check=_check,
                   doc=Args.__doc__)

