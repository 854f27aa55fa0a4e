"""The results store: one tidy table per experiment, append-only and resumable.

    import flashnum.harness.store
    df = flashnum.harness.store.load("bf16_sweep")        # or a path to the folder
    flashnum.harness.store.compact("bf16_sweep")          # merge the parts into results.parquet
    python -m flashnum.store bf16_sweep           # print size and columns; compact=true
    flashnum.harness.store.replace("repro_x", df, record)  # a table recomputed whole

Layout of experiments/<name>/:

    results.parquet       the compacted table, one row per case, sorted by case_id
    parts/part-*.parquet  rows written since the last compaction (one per batch of
                          finished cases; every worker and every shard writes its own)
    manifest.json         one record per run that wrote rows: the command, the code (git
                          commit, dirty flag and diff hash), versions, machine, times,
                          counts (flashnum.harness.manifest; manifest.shard-i-of-n.json
                          for a shard of a sharded run)
    grid.json             the case_ids of the grid last run (every shard writes the same)

Why it never corrupts: every file is written whole to a temporary name in the same
folder, flushed to disk, then renamed over its final name (os.replace is atomic on
POSIX), so a reader sees either the old file or the new one. A killed run leaves
at most a stray `.tmp-*` file, which nothing reads. Rows are only ever added; a case
computed twice (recompute=true, or a compaction killed between its rename and its
clean-up) keeps its latest row: parts are named by the time they were written and
read in that order after results.parquet, and `load` keeps the last row per case_id.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from flashnum.harness import cli, manifest
from flashnum.harness.config import StoreConf
from flashnum.harness.files import atomic_write, write_json

RESULTS = "results.parquet"
PARTS = "parts"
MANIFEST = "manifest.json"
GRID = "grid.json"
LOCK = ".compact.lock"
REPO = Path(__file__).resolve().parents[2]


def experiment_dir(name_or_path, root=None) -> Path:
    """The folder of an experiment: a path to it, or a name under `root`.

    root defaults to ./experiments when that holds the name, else the repository's
    experiments/ folder (so that figures find the tables from anywhere).
    """
    p = Path(name_or_path)
    if p.is_dir() or p.is_absolute() or len(p.parts) > 1:
        return p
    if root is not None:
        return Path(root) / p
    here = Path("experiments") / p
    return here if here.is_dir() else REPO / "experiments" / p


def _write_table(df: pd.DataFrame, path: Path) -> None:
    table = pa.Table.from_pandas(df, preserve_index=False)
    atomic_write(path, lambda tmp: pq.write_table(table, tmp))


def write_part(exp_dir, rows: list[dict]) -> Path | None:
    """Append rows as one new part file (atomic). Returns its path (None for no rows)."""
    if not rows:
        return None
    parts = Path(exp_dir) / PARTS
    # the name orders parts by the time they were written: later rows win on load
    name = f"part-{time.time_ns():020d}-{os.getpid()}-{uuid.uuid4().hex[:8]}.parquet"
    path = parts / name
    _write_table(pd.DataFrame(rows), path)
    return path


def _part_files(exp_dir: Path) -> list[Path]:
    d = exp_dir / PARTS
    return sorted(d.glob("part-*.parquet")) if d.is_dir() else []


def _files(exp_dir: Path) -> list[Path]:
    """Every table file, oldest rows first."""
    res = exp_dir / RESULTS
    return ([res] if res.exists() else []) + _part_files(exp_dir)


def done_ids(name_or_path, root=None) -> set[str]:
    """The case_ids that already have a row (reads only that column)."""
    exp_dir = experiment_dir(name_or_path, root)
    for attempt in range(3):
        ids: set[str] = set()
        try:
            for f in _files(exp_dir):
                ids.update(pq.read_table(f, columns=["case_id"]).column("case_id").to_pylist())
            return ids
        except FileNotFoundError:
            # a compaction removed a part between listing and reading: list again
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _read(files: list[Path]) -> pd.DataFrame:
    frames = [pq.read_table(f).to_pandas() for f in files]
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    df = df.drop_duplicates("case_id", keep="last")
    return df.sort_values("case_id", kind="stable").reset_index(drop=True)


def write_grid(exp_dir, case_ids: list[str]) -> None:
    """Record the case_ids of the grid just run (what `load` shows by default)."""
    write_json(Path(exp_dir) / GRID, {"n": len(case_ids), "case_ids": sorted(case_ids)})


def grid_ids(name_or_path, root=None) -> set[str] | None:
    f = experiment_dir(name_or_path, root) / GRID
    return set(json.loads(f.read_text())["case_ids"]) if f.exists() else None


def load(name_or_path, root=None, all_rows: bool = False) -> pd.DataFrame:
    """The experiment's table: results.parquet and every part, one row per case_id.

    By default only the rows of the grid last run (grid.json): rows of cases that
    left the grid (a distribution's defaults changed, a smaller override) stay on
    disk, append-only, and come back with all_rows=True.
    Raises FileNotFoundError naming the folder when there is no table at all.
    """
    exp_dir = experiment_dir(name_or_path, root)
    for attempt in range(3):
        files = _files(exp_dir)
        if not files:
            raise FileNotFoundError(
                f"no results in {exp_dir} (run: python -m flashnum.run experiment={exp_dir.name})"
            )
        try:
            df = _read(files)
            ids = None if all_rows else grid_ids(exp_dir)
            if ids is not None and len(df):
                df = df[df["case_id"].isin(ids)].reset_index(drop=True)
            return df
        except FileNotFoundError:
            # a compaction removed a part between listing and reading: list again
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _take_lock(exp_dir: Path) -> bool:
    lock = exp_dir / LOCK
    me = f"{socket.gethostname()} {os.getpid()}"
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                host, pid = lock.read_text().split()
            except (OSError, ValueError):
                host, pid = "", "0"
            # a lock left by a killed compaction on this host is stale
            if host == socket.gethostname() and not _pid_alive(int(pid)):
                lock.unlink(missing_ok=True)
                continue
            return False
        with os.fdopen(fd, "w") as f:
            f.write(me)
        return True
    return False


def compact(name_or_path, root=None) -> int:
    """Merge results.parquet and the parts into a new results.parquet; returns its rows.

    Safe against a kill at any moment (see the module docstring) and against a
    second compaction at the same time (a lock file; the loser does nothing).
    Rows stay the same rows: compaction changes the files, never the table `load` gives.
    """
    exp_dir = experiment_dir(name_or_path, root)
    parts = _part_files(exp_dir)
    if not parts:
        res = exp_dir / RESULTS
        return pq.read_metadata(res).num_rows if res.exists() else 0
    if not _take_lock(exp_dir):
        return -1
    try:
        for stray in exp_dir.glob(".tmp-*"):
            stray.unlink(missing_ok=True)  # a compaction killed mid-write
        files = _files(exp_dir)
        parts = [f for f in files if f.parent.name == PARTS]
        df = _read(files)
        _write_table(df, exp_dir / RESULTS)
        for f in parts:  # a kill here leaves rows twice on disk, once in the table
            f.unlink(missing_ok=True)
        return len(df)
    finally:
        (exp_dir / LOCK).unlink(missing_ok=True)


def replace(name_or_path, df: pd.DataFrame, record: dict | None = None, root=None) -> Path:
    """Make df the experiment's whole table, and append `record` to its manifest.

    For tables recomputed whole (the reproductions, attribution): the rows are written
    as one part, then, under the compaction lock, results.parquet is rewritten from that
    part alone (sorted by case_id, as compact writes it) in one atomic rename, and only
    then are the earlier parts removed; a reader sees the old rows or the new ones.
    record: flashnum.harness.manifest.record(...) of the run. Returns the folder.
    """
    if "case_id" not in df.columns or df["case_id"].duplicated().any():
        raise ValueError("replace needs one row per case_id (a unique case_id column)")
    exp_dir = experiment_dir(name_or_path, root)
    exp_dir.mkdir(parents=True, exist_ok=True)
    new = write_part(exp_dir, df.to_dict("records"))
    if not _take_lock(exp_dir):
        if new is not None:
            new.unlink(missing_ok=True)
        raise RuntimeError(f"{exp_dir} is being compacted by another process; run again")
    try:
        _write_table(_read([new]) if new else pd.DataFrame(), exp_dir / RESULTS)
        for f in _part_files(exp_dir):
            f.unlink(missing_ok=True)
    finally:
        (exp_dir / LOCK).unlink(missing_ok=True)
    if record is not None:
        manifest.append(exp_dir / MANIFEST, exp_dir.name, record)
    return exp_dir


@dataclass
class Args:
    """python -m flashnum.store EXPERIMENT [compact=true] [store.root=DIR]"""

    experiment: str = ""  # a name under store.root, or a path to the folder
    compact: bool = False  # merge the parts into results.parquet first
    store: StoreConf = field(default_factory=StoreConf)


def _check(a) -> None:
    if not a.experiment:
        raise ValueError("which experiment? give its name: python -m flashnum.store bf16_sweep")


def _root(a):
    """store.root as given, or None (./experiments, else the repository's) by default."""
    return a.store.root if a.store.root != StoreConf.root else None


def _show(a) -> int:
    root = _root(a)
    if a.compact:
        n = compact(a.experiment, root)
        print(f"compacted: {n} rows" if n >= 0 else "another compaction holds the lock")
    try:
        df = load(a.experiment, root)
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        return 1
    print(f"{experiment_dir(a.experiment, root)}: {len(df)} rows, {len(df.columns)} columns")
    print(", ".join(df.columns))
    return 0


def main(argv=None) -> int:
    """python -m flashnum.store: a stored table's size and columns (compact=true first)."""
    return cli.main_of("flashnum.store", Args, _show, argv, positional="experiment",
                       check=_check, doc=Args.__doc__)


if __name__ == "__main__":
    sys.exit(main())
