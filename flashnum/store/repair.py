"""Check and repair a store's folder: is it flashnum's, and its bad files moved aside.

    from flashnum.store.repair import check_store, repair
    check_store("experiments/bf16_sweep")   # StoreError (one line) unless it is a store
    repair("experiments/bf16_sweep")        # what flashnum.store.problems finds,
                                            # to quarantine/; dead runs reconciled; compact
    python -m flashnum.stored repair bf16_sweep   # the same from the shell

Nothing readable is deleted: a file `problems` names is moved byte for byte into
quarantine/ (a new quarantine-<time>/ when that name is taken by a file), and the move is
recorded in the manifest's `repairs`. A folder holding no file that only flashnum writes
is refused before any file in it is judged (check_store).
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from flashnum.store import (
    LOCK,
    QUARANTINE,
    _files,
    _manifests,
    compact,
    done_ids,
    foreign,
    grid_ids,
    manifest,
    owners,
    problems,
    reconcile,
)
from flashnum.store.files import MANIFEST, PARTS, StoreError, write_json

PART_NAME = re.compile(r"part-\d{20}-\d+-[^-/]+-[0-9a-f]{8}\.parquet")


def _recognised(exp_dir: Path) -> bool:
    """Whether the folder holds a file only flashnum writes: a manifest, grid.json, a table
    with its case_id column (its footer alone read), a part by its name, a run mark."""
    for m in _manifests(exp_dir):
        try:
            if manifest.load(m):
                return True
        except StoreError:
            pass
    for f in _files(exp_dir):
        if f.parent.name == PARTS and PART_NAME.fullmatch(f.name):
            return True
        try:
            if f.is_file() and foreign(pq.read_schema(f)) is None:
                return True
        except (pa.ArrowException, OSError, ValueError):
            pass
    try:
        if grid_ids(exp_dir) is not None:
            return True
    except StoreError:
        pass
    runs = exp_dir / owners.RUNS
    return runs.is_dir() and any(_owner_ok(f) for f in runs.iterdir())


def _owner_ok(f: Path) -> bool:
    try:
        return owners.read_owner(f) is not None
    except StoreError:
        return False


def check_store(exp_dir) -> None:
    """StoreError (one line) unless exp_dir is a flashnum store (_recognised): `check` and
    `repair` never judge, move or rewrite the files of a folder that is not one."""
    exp_dir = Path(exp_dir)
    if not exp_dir.is_dir():
        raise StoreError(f"no store at {exp_dir} (valid: the name of a folder under "
                         f"store.root, or a path to one)", exp_dir)
    if not _recognised(exp_dir):
        raise StoreError(f"{exp_dir} is not a flashnum store: it holds no table, manifest, "
                         f"grid.json or run mark that flashnum wrote, so nothing in it is "
                         f"checked or moved (valid: an experiment's folder)", exp_dir)


def _quarantine(exp_dir: Path, f: Path, why: str) -> dict:
    """Move f (a file, a folder, a link) into quarantine/, byte for byte; its record."""
    q = exp_dir / QUARANTINE
    if q.exists() and not q.is_dir():
        q = exp_dir / f"{QUARANTINE}-{time.time_ns()}"
    q.mkdir(exist_ok=True)
    rel = f.relative_to(exp_dir)
    name = f.name if len(rel.parts) == 1 or rel.parts[0] == PARTS else \
        f"{rel.parts[0].lstrip('.')}-{f.name}"
    dest = q / name
    if dest.exists() or dest.is_symlink():
        dest = q / f"{name}.{time.time_ns()}"
    shutil.move(str(f), dest)
    return dict(file=str(rel), to=str(dest.relative_to(exp_dir)), why=why)


def repair(exp_dir) -> dict:
    """Move every file `problems` finds to quarantine/ (deleting nothing), then remove what
    dead processes left, reconcile their records and compact the readable rows.
    StoreError (one line) for a folder that is not a flashnum store (check_store).
    Returns {quarantined: [paths], rows, grid, missing}: missing = cases of the grid
    with no row (the next run computes them)."""
    exp_dir = Path(exp_dir)
    check_store(exp_dir)
    # a lock that is not a plain file cannot be taken: aside first (no one can hold it)
    moved = [_quarantine(exp_dir, f, why) for f, why in owners.foreign(exp_dir)
             if f.name in (LOCK, owners.OLD_LOCK)]
    with owners.locked(exp_dir):
        moved += [_quarantine(exp_dir, f, why) for f, why in problems(exp_dir)]
        if moved:
            path = exp_dir / MANIFEST
            man = manifest.load(path) or dict(experiment=exp_dir.name, runs=[])
            man.setdefault("repairs", []).append(dict(time=manifest.now(), quarantined=moved))
            write_json(path, man, point="manifest")
        owners.tidy(exp_dir)
        reconcile(exp_dir, by="python -m flashnum.stored repair")
        rows = compact(exp_dir) if _files(exp_dir) else 0
    ids = grid_ids(exp_dir)
    have = done_ids(exp_dir) if _files(exp_dir) else set()
    return dict(quarantined=moved, rows=rows, grid=None if ids is None else len(ids),
                missing=None if ids is None else len(ids - have))
