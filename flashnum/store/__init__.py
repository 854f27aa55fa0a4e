"""The results store: one tidy table per experiment, append-only and resumable.

    import flashnum.store
    df = flashnum.store.load("bf16_sweep")        # or a path to the folder
    flashnum.store.compact("bf16_sweep")          # merge the parts into results.parquet
    python -m flashnum.stored bf16_sweep          # print size and columns; compact=true
    python -m flashnum.stored check bf16_sweep    # read every file; exit status 1 if one fails
    python -m flashnum.stored repair bf16_sweep   # unreadable files to quarantine/, recount
    flashnum.store.replace("repro_x", df, record)  # a table recomputed whole

Layout of experiments/<name>/:

    results.parquet       the compacted table, one row per case, sorted by case_id
    parts/part-*.parquet  rows written since the last compaction (one per batch of
                          finished cases; every worker and every shard writes its own;
                          part-<time>-<pid>-<run_id>-<random>: the run that wrote it)
    manifest.json         one record per run that wrote rows: the command, the code (git
                          commit, dirty flag and diff hash), versions, machine, times,
                          counts (flashnum.store.manifest; manifest.shard-i-of-n.json
                          for a shard of a sharded run)
    grid.json             the case_ids of the grid last run (every shard writes the same;
                          load(name, grid=True) shows only its rows)
    .lock, .runs/, claims/  who writes now (flashnum.store.owners)
    quarantine/           files `repair` found unreadable, moved aside, never deleted

What it guarantees (each measured by tests/test_faults*.py and tests/test_store.py):

- Kill: a run killed at any moment (SIGKILL, SIGTERM, SIGINT, the OOM killer) loses at
  most the cases in flight. Every file is written whole to a temporary name in the same
  folder, flushed, then renamed over its final name (os.replace is atomic on POSIX), so a
  reader sees the old file or the new one. Rows are only ever added; a case computed
  twice (recompute=true, or a compaction killed between its rename and its clean-up)
  keeps its latest row: parts are read in the order they were written, after
  results.parquet, and `load` keeps the last row per case_id. Workers die with their
  runner (flashnum.harness.scheduler). The next run removes the temporary files, claims
  and marks of dead processes and reconciles a dead run's manifest record (`reconcile`).
- Concurrency: any number of runs and shards may write one store at once. Case claims
  keep a case from being computed twice while it is in flight; manifest changes and
  compactions hold the store's lock; a compaction merges no part of a run still in
  flight, and a reader that loses a race against a compaction reads again.
- Full disk: a write that fails leaves the files as they were. A compaction that finds
  no space keeps the parts (the table stays whole) and says so in one line; a part that
  cannot be written stops the run with one line, its finished cases stored.
- Corruption: an unreadable file raises StoreError, one line naming it and the command
  that repairs it (exit status 2 from a command), and so does a file flashnum never
  writes there (a table without a string case_id, a part that is another table, a
  manifest or grid.json not of flashnum's layout, the owners' files of owners.foreign);
  a run checks every table's footer before it computes (tidy). `problems` lists them all,
  flashnum.store.repair moves them to quarantine/ and recounts, deleting nothing
  readable, merging no foreign table, and refuses a folder that is not a store
  (check_store). Reading needs no write access.
"""

from __future__ import annotations

import errno
import json
import os
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from flashnum.store import faults, manifest, owners
from flashnum.store.files import (  # noqa: F401  (check_root: the store's, kept here)
    MANIFEST,
    PARTS,
    RESULTS,
    StoreError,
    atomic_write,
    check_root,
    unreadable,
    write_json,
)

GRID = "grid.json"
QUARANTINE = "quarantine"
LOCK = owners.LOCK
FULL = (errno.ENOSPC, errno.EDQUOT)


class StoreFull(StoreError):
    """No space left on the store's device; what is stored stays whole."""


def experiment_dir(name_or_path, root=None) -> Path:
    """The folder of an experiment: a path to it, or a name under `root`.

    root defaults to ./experiments, relative to the working folder like every
    command's store.root (an installed package never reads inside site-packages).
    """
    p = Path(name_or_path)
    if p.is_dir() or p.is_absolute() or len(p.parts) > 1:
        return p
    if root is not None:
        return Path(root) / p
    return Path("experiments") / p


def _write_table(df: pd.DataFrame, path: Path, point: str | None = None) -> None:
    table = pa.Table.from_pandas(df, preserve_index=False)
    atomic_write(path, lambda tmp: pq.write_table(table, tmp), point)


def write_part(exp_dir, rows: list[dict], run_id: str | None = None) -> Path | None:
    """Append rows as one new part file (atomic). Returns its path (None for no rows).
    StoreFull (one line) when the device is full: the part is not written."""
    if not rows:
        return None
    parts = Path(exp_dir) / PARTS
    # the name orders parts by the time they were written (later rows win on load) and
    # names the run that wrote them (reconcile counts a dead run's rows by it)
    name = (f"part-{time.time_ns():020d}-{os.getpid()}-{run_id or 'x'}-"
            f"{uuid.uuid4().hex[:8]}.parquet")
    path = parts / name
    try:
        _write_table(pd.DataFrame(rows), path, "part")
    except OSError as e:
        if e.errno in FULL:
            raise StoreFull(f"no space left on the device of {exp_dir} for a part of "
                            f"{len(rows)} rows: the finished cases are stored; free space "
                            f"and run the same command to resume") from None
        raise
    return path


def _run_of(part: Path) -> str | None:
    bits = part.name.split("-")
    return bits[3] if len(bits) == 5 and bits[3] != "x" else None


def _part_files(exp_dir: Path) -> list[Path]:
    d = exp_dir / PARTS
    return sorted(d.glob("part-*.parquet")) if d.is_dir() else []


def _files(exp_dir: Path) -> list[Path]:
    """Every table file, oldest rows first."""
    res = exp_dir / RESULTS
    return ([res] if res.exists() else []) + _part_files(exp_dir)


def _table(f: Path, columns=None) -> pa.Table:
    """One table file; StoreError naming it and the repair when it cannot be read or is
    not a table of flashnum's (foreign)."""
    why = _not_a_file(f)
    if why:
        raise unreadable(f, why)
    try:
        schema = pq.read_schema(f)
        why = foreign(schema)
        t = None if why else pq.read_table(f, columns=columns if schema.names else None)
    except FileNotFoundError:
        raise
    except (pa.ArrowException, OSError, ValueError) as e:
        raise unreadable(f, e) from None
    if not why and schema.names and t.column("case_id").null_count:
        why = f"not a flashnum table: {t.column('case_id').null_count} rows have no case_id"
    if why:
        raise unreadable(f, why)
    return t


def _not_a_file(f: Path) -> str | None:
    """Why a table's path is not a file to read (pyarrow would read a folder whole as a
    dataset), or None; a path gone meanwhile (a compaction's) is the reader's business."""
    if f.is_symlink() and not f.exists():
        return "not a table file: a link to nothing"
    if f.exists() and not f.is_file():
        return "not a table file: a folder or a device"
    return None


def foreign(schema: pa.Schema) -> str | None:
    """Why a parquet file is not a table of flashnum's (every row names its case by a
    string case_id; a table of no rows may have no column at all), or None."""
    if not schema.names:
        return None
    if "case_id" not in schema.names:
        return "not a flashnum table: no case_id column"
    kind = schema.field("case_id").type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        return f"not a flashnum table: its case_id column holds {kind}, not strings"
    return None


def _again(read, attempts: int = 60):
    """read() until it does not lose a race with a compaction (which removes the parts it
    merged, after renaming the new table): a FileNotFoundError means list the files again."""
    for attempt in range(attempts):
        try:
            return read()
        except NoResults:
            raise  # no table at all: nothing a retry can find
        except FileNotFoundError:
            if attempt == attempts - 1:
                raise
            time.sleep(min(0.2, 0.002 * 2 ** attempt))
    raise AssertionError("unreachable")


class NoResults(FileNotFoundError):
    """The experiment has no table at all (not a race: never read again)."""


_IDS: dict = {}  # (path, mtime_ns, size) -> its case_ids: a file is read once per process


def done_ids(name_or_path, root=None) -> set[str]:
    """The case_ids that already have a row (reads only that column, of the files not
    read before: every task of a run asks again, see flashnum.harness.run.claimed)."""
    exp_dir = experiment_dir(name_or_path, root)

    def read():
        ids: set[str] = set()
        for f in _files(exp_dir):
            st = f.stat()
            key = (str(f), st.st_mtime_ns, st.st_size)
            if key not in _IDS:
                if len(_IDS) > 10_000:
                    _IDS.clear()
                t = _table(f, ["case_id"])
                _IDS[key] = t.column("case_id").to_pylist() if t.num_columns else []
            ids.update(_IDS[key])
        return ids

    return _again(read)


def _strangers(files: list[Path], schemas: list[pa.Schema]) -> list[tuple[Path, str]]:
    """The parts that share no column but case_id with the store's other table files: a
    table of something else dropped into parts/, never merged into this one."""
    cols = [set(sc.names) - {"case_id"} for sc in schemas]
    out = []
    for i, f in enumerate(files):
        others = set().union(*(c for j, c in enumerate(cols) if j != i))
        if f.parent.name == PARTS and cols[i] and others and not cols[i] & others:
            out.append((f, "not a table of this store: no column but case_id in common "
                           "with its other tables"))
    return out


def _read(files: list[Path]) -> pd.DataFrame:
    tables = [_table(f) for f in files]
    bad = _strangers(files, [t.schema for t in tables]) if len(files) > 1 else []
    if bad:
        raise unreadable(*bad[0])
    frames = [t.to_pandas() for t in tables]
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    df = df.drop_duplicates("case_id", keep="last")
    return df.sort_values("case_id", kind="stable").reset_index(drop=True)


def write_grid(exp_dir, case_ids: list[str]) -> None:
    """Record the case_ids of the grid just run (what `load` shows by default); a grid
    already recorded is not written again (a finished store may be read-only)."""
    obj = {"n": len(case_ids), "case_ids": sorted(case_ids)}
    path = Path(exp_dir) / GRID
    try:
        if json.loads(path.read_text()) == obj:
            return
    except (OSError, ValueError):
        pass
    write_json(path, obj, point="grid")


def grid_ids(name_or_path, root=None) -> set[str] | None:
    """The case_ids of grid.json; None without one; StoreError when it is not flashnum's
    ({"n": count, "case_ids": [strings]})."""
    f = experiment_dir(name_or_path, root) / GRID
    try:
        obj = json.loads(f.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as e:
        raise unreadable(f, e) from None
    ids = obj.get("case_ids") if isinstance(obj, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids) or \
            obj.get("n") != len(ids):
        raise unreadable(f, "not a grid.json: no n and list of case_ids")
    return set(ids)


def load(name_or_path, root=None, grid: bool = False,
         all_rows: bool | None = None) -> pd.DataFrame:
    """The experiment's table: every row any run of it wrote, one row per case_id.

    Every run counts: a single run, each job of a multirun, each shard, a resumed run;
    results.parquet and every part, the latest row of a case winning.
    grid=True: only the rows of the grid last run (grid.json; a multirun's last job),
    e.g. to leave out cases that left the grid when a distribution's defaults changed.
    (all_rows=False is the old spelling of grid=True.)
    Raises FileNotFoundError naming the folder when there is no table at all, StoreError
    (one line: the file and the repair) when a file cannot be read.
    """
    grid = grid or all_rows is False
    exp_dir = experiment_dir(name_or_path, root)

    def read():
        files = _files(exp_dir)
        if not files:
            raise NoResults(
                f"no results in {exp_dir} (run: python -m flashnum.run experiment={exp_dir.name})"
            )
        df = _read(files)
        ids = grid_ids(exp_dir) if grid else None
        if ids is not None and len(df):
            df = df[df["case_id"].isin(ids)].reset_index(drop=True)
        return df

    try:
        return _again(read)
    except NoResults as e:
        raise FileNotFoundError(str(e)) from None


# ---------------------------------------------------------------------------
# the manifest's truth, compaction


def _manifests(exp_dir: Path) -> list[Path]:
    return sorted(exp_dir.glob("manifest*.json"))


@contextmanager
def running(exp_dir, run_id: str | None):
    """A run's life in the store: registered (with a heartbeat, so that other runs leave its
    claims alone) while it computes; stopped by anything (Ctrl-C, SIGTERM, an error, a full
    disk), its manifest record is reconciled with the rows it stored before the stop goes on.
    run_id None: a run that computes nothing and holds no record."""
    if run_id is None:
        yield
        return
    heartbeat = owners.register(exp_dir, run_id)
    try:
        yield
    except BaseException:
        try:
            reconcile(exp_dir, run_ids={run_id},
                      why="stopped before the end (interrupted, or an error)")
        except Exception:
            pass  # the next run reconciles it
        raise
    finally:
        owners.unregister(exp_dir, run_id, heartbeat)


def reconcile(exp_dir, run_ids=None, why: str = "its process ended before the run "
              "completed its record (killed, or crashed)", by: str | None = None) -> list[dict]:
    """Complete the manifest records of runs that ended without completing them.

    A record with end_time null whose run is no longer alive (or one of run_ids: a run
    reconciling itself as it stops) gets counts.run = the rows its parts hold,
    end_time = the time of its last part (its start when it wrote none) and
    reconciled = {time, by, why, rows_on_disk}. A record of the earlier layout, written
    before parts named their run, gets rows_on_disk null: its rows cannot be told apart.
    Touches nothing (a read-only store stays readable) when no record needs it.
    Returns the records completed.
    """
    exp_dir = Path(exp_dir)
    wanted = set(run_ids or ())

    def open_dead(r: dict) -> bool:
        if r.get("end_time") is not None or "reconciled" in r or not r.get("run_id"):
            return False
        if run_ids is not None:
            return r["run_id"] in wanted
        return not owners.run_alive(exp_dir, r["run_id"])

    if not any(open_dead(r) for m in _manifests(exp_dir) for r in manifest.runs(m)):
        return []
    done: list[dict] = []
    with owners.locked(exp_dir):
        rows: dict = {}
        for p in _part_files(exp_dir):
            run = _run_of(p)
            if run:
                try:
                    n, t = pq.read_metadata(p).num_rows, p.stat().st_mtime
                except FileNotFoundError:
                    continue
                except (pa.ArrowException, OSError, ValueError) as e:
                    raise unreadable(p, e) from None
                k, last = rows.get(run, (0, 0.0))
                rows[run] = (k + n, max(last, t))

        def change(rs):
            out = []
            for r in rs:
                if open_dead(r):
                    r = dict(r)
                    n, last = rows.get(r["run_id"], (0, None))
                    known = "owner" in r  # parts name their run since records name an owner
                    r["counts"] = {**(r.get("counts") or {}), "run": n if known else None}
                    r["end_time"] = (manifest.iso(last) if last else r.get("start_time"))
                    r["reconciled"] = dict(time=manifest.now(), by=by or owners.me(),
                                           why=why, rows_on_disk=n if known else None)
                    done.append(r)
                out.append(r)
            return out

        for m in _manifests(exp_dir):
            manifest.update(m, exp_dir.name, change)
    return done


def tidy(exp_dir) -> list[str]:
    """Before a run: remove what dead processes left (owners.tidy) and reconcile their
    records. Returns one line per record reconciled (nothing on a clean store)."""
    exp_dir = Path(exp_dir)
    if not exp_dir.is_dir():
        return []
    owners.tidy(exp_dir)
    _check_schemas(exp_dir)
    return [f"{exp_dir.name}: run {r['run_id']} ({r.get('start_time')}) ended without "
            f"completing its record; reconciled: {r['reconciled']['rows_on_disk']} rows on disk"
            for r in reconcile(exp_dir)]


def _check_schemas(exp_dir: Path) -> None:
    """Before a run computes anything: StoreError (one line, the repair) for a table file
    that is not flashnum's or not this store's, from the files' footers alone."""
    files, schemas = [], []
    for f in _files(exp_dir):
        why = _not_a_file(f)
        if why:
            raise unreadable(f, why)
        try:
            sc = pq.read_schema(f)
        except FileNotFoundError:
            continue
        except (pa.ArrowException, OSError, ValueError) as e:
            raise unreadable(f, e) from None
        why = foreign(sc)
        if why:
            raise unreadable(f, why)
        files.append(f)
        schemas.append(sc)
    bad = _strangers(files, schemas)
    if bad:
        raise unreadable(*bad[0])


def _rows(res: Path) -> int:
    if not res.exists():
        return 0
    try:
        return pq.read_metadata(res).num_rows
    except (pa.ArrowException, OSError, ValueError) as e:
        raise unreadable(res, e) from None


def compact(name_or_path, root=None) -> int:
    """Merge results.parquet and the parts into a new results.parquet; returns its rows.

    Safe against a kill at any moment (see the module docstring) and against other
    writers: under the store's lock, after reconciling dead runs, it merges the parts in
    the order they were written up to the first part of a run still in flight (so that
    later rows still win and a run's rows stay countable while it runs). Rows stay the
    same rows: compaction changes the files, never the table `load` gives.
    StoreFull (one line) when the device has no space: the parts are kept.
    """
    exp_dir = experiment_dir(name_or_path, root)
    res = exp_dir / RESULTS
    if not _part_files(exp_dir):
        return _rows(res)
    with owners.locked(exp_dir):
        owners.tidy(exp_dir)
        reconcile(exp_dir)
        live = owners.live_runs(exp_dir)
        merge = []
        for p in _part_files(exp_dir):
            if _run_of(p) in live:
                break
            merge.append(p)
        if not merge:
            return _rows(res)
        df = _read(([res] if res.exists() else []) + merge)
        try:
            _write_table(df, res, "compact")
        except OSError as e:
            if e.errno in FULL:
                raise StoreFull(
                    f"no space left on the device of {exp_dir} to compact it: its rows stay "
                    f"in parts/ and the table is whole; after freeing space: python -m "
                    f"flashnum.stored {exp_dir.name} compact=true store.root={exp_dir.parent}"
                ) from None
            raise
        faults.reached("cleanup")
        for f in merge:  # a kill here leaves rows twice on disk, once in the table
            f.unlink(missing_ok=True)
        return len(df)


def replace(name_or_path, df: pd.DataFrame, record: dict | None = None, root=None) -> Path:
    """Make df the experiment's whole table, and append `record` to its manifest.

    For tables recomputed whole (the reproductions, attribution): the rows are written
    as one part, then, under the store's lock, results.parquet is rewritten from that
    part alone (sorted by case_id, as compact writes it) in one atomic rename, and only
    then are the earlier parts removed; a reader sees the old rows or the new ones.
    record: flashnum.store.manifest.record(...) of the run. Returns the folder.
    """
    if "case_id" not in df.columns or df["case_id"].duplicated().any():
        raise ValueError("replace needs one row per case_id (a unique case_id column)")
    exp_dir = experiment_dir(name_or_path, root)
    exp_dir.mkdir(parents=True, exist_ok=True)
    new = write_part(exp_dir, df.to_dict("records"))
    with owners.locked(exp_dir):
        _write_table(_read([new]) if new else pd.DataFrame(), exp_dir / RESULTS, "compact")
        for f in _part_files(exp_dir):
            f.unlink(missing_ok=True)
    if record is not None:
        manifest.append(exp_dir / MANIFEST, exp_dir.name, record)
    return exp_dir


# ---------------------------------------------------------------------------
# check and repair


def problems(exp_dir) -> list[tuple[Path, str]]:
    """Every store file a run, `load` or `repair` would trip on, with the reason (reads
    every byte): tables that cannot be read or are not flashnum's (no case_id; a part with
    no column in common with the rest), manifests and grid.json that are not flashnum's,
    the owners' files flashnum never writes (owners.foreign)."""
    exp_dir = Path(exp_dir)
    out = list(owners.foreign(exp_dir))
    if (exp_dir / PARTS).exists() and not (exp_dir / PARTS).is_dir():
        out.append((exp_dir / PARTS, "not a folder"))
    good, schemas = [], []
    for f in _files(exp_dir):
        try:
            schemas.append(_table(f).schema)
            good.append(f)
        except FileNotFoundError:
            continue
        except StoreError as e:
            out.append((f, e.why))
    out += _strangers(good, schemas) if len(good) > 1 else []
    for f in _manifests(exp_dir):
        try:
            manifest.load(f)
        except StoreError as e:
            out.append((f, e.why))
    try:
        grid_ids(exp_dir)
    except StoreError as e:
        out.append((exp_dir / GRID, e.why))
    return out
