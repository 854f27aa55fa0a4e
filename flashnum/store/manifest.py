"""Manifests: which code, command and machine produced the rows of a stored table.

    from flashnum.store import manifest
    rec = manifest.record("flashnum.run", ["experiment=bf16_sweep"], config=cfg_dict)
    manifest.begin(path, "bf16_sweep", rec)            # a run about to write rows
    ...                                                # the rows are written
    manifest.finish(path, "bf16_sweep", rec, wrote_rows=n > 0)
    manifest.runs(path)[-1]["git"]                      # the latest run's code

experiments/<name>/manifest.json is {"experiment": name, "runs": [record, ...]}, oldest
first, one record per run that wrote rows. A record is appended when the run starts
(end_time null while it runs) and completed when it ends. A run that writes no row (every
case already stored, or every case failed) takes its own record out again, so a rerun on
another machine never claims rows it did not compute; the file is then byte for byte as
it was unless another run changed it meanwhile. Every change is a read-modify-write under
the store's lock (flashnum.store.owners.locked) that touches one record only: no run
removes or overwrites another's. A run killed before completing its record is reconciled
by the next one (flashnum.store.reconcile): counts.run becomes the rows its parts
hold, and "reconciled" says when and why. An unreadable manifest raises StoreError naming
the file and `python -m flashnum.stored repair`.

A record says how to rerun it and what ran:

    command      {"module": "flashnum.run", "overrides": [...]}: python -m MODULE OVERRIDES
                 (never the absolute argv of the machine that ran it)
    git          commit, dirty (the code paths flashnum/, conf/ and pyproject.toml differ from
                 the commit, untracked files there included), and when dirty diff_sha256
                 (sha256 of `git diff HEAD --binary` of those paths, then each untracked
                 file's path and bytes) and the changed paths; {commit: null} outside a checkout
    code_sha256  sha256 of the package's source (*.py, *.c) and its configs as imported:
                 names the code even without git (an installed wheel)
    machine, versions, config (composed), start_time, end_time, wall_s, counts, n_workers,
    shard, num_shards
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import uuid
from datetime import datetime, timezone
from pathlib import Path

from flashnum.store import owners
from flashnum.store.files import unreadable, write_json
from flashnum.store.paths import CONF

PACKAGE = Path(__file__).resolve().parents[1]
REPO = PACKAGE.parent
CODE_PATHS = ("flashnum", "conf", "pyproject.toml")  # what a stored row's numbers depend on


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def iso(t: float) -> str:
    """A POSIX time (a file's mtime) as now() writes times."""
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


def _git(*args: str, repo: Path) -> bytes | None:
    try:
        p = subprocess.run(["git", *args], cwd=repo, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout if p.returncode == 0 else None


def git_state(repo: Path = REPO) -> dict:
    """The checkout's commit, whether its code differs from it, and a hash of the difference.

    Only flashnum/, conf/ and pyproject.toml count: a modified results table or README
    does not change what a run computes. Outside a checkout (an installed wheel, whose
    site-packages may lie inside someone else's repository) the commit is None.
    """
    repo = Path(repo)
    commit = _git("rev-parse", "HEAD", repo=repo) if (repo / ".git").exists() else None
    if not commit:
        return dict(commit=None, dirty=None)
    status = _git("status", "--porcelain=v1", "-z", "--untracked-files=all", "--",
                  *CODE_PATHS, repo=repo) or b""
    entries = [e for e in status.decode().split("\0") if e]
    out = dict(commit=commit.decode().strip(), dirty=bool(entries))
    if entries:
        h = hashlib.sha256(_git("diff", "HEAD", "--binary", "--", *CODE_PATHS, repo=repo) or b"")
        changed = []
        for e in entries:
            code, path = e[:2], e[3:]
            changed.append(path)
            if code == "??":  # untracked: git diff does not see it
                h.update(path.encode() + b"\0")
                f = repo / path
                h.update(f.read_bytes() if f.is_file() else b"")
        out.update(diff_sha256=h.hexdigest(), changed=sorted(changed))
    return out


def code_sha256(package: Path = PACKAGE, conf: Path | None = None) -> str:
    """sha256 over the package's *.py and *.c files and the configs (*.yaml), by relative path."""
    h = hashlib.sha256()
    for base, patterns in ((package, ("*.py", "*.c")), (Path(conf or CONF), ("*.yaml",))):
        files = sorted({f for p in patterns for f in base.rglob(p)
                        if "__pycache__" not in f.parts})
        for f in files:
            h.update(f"{base.name}/{f.relative_to(base).as_posix()}".encode() + b"\0")
            h.update(f.read_bytes() + b"\0")
    return h.hexdigest()


def versions() -> dict:
    """Versions of python and the packages whose numerics a result depends on."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("flashnum", "torch", "triton", "mpmath", "python-flint", "numpy", "pandas",
                "pyarrow", "hydra-core", "omegaconf"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def cpu_class() -> str:
    """The CPU as the libraries' kernel choice sees it: vendor, machine, vector width and the
    extensions torch's CPU kernels (oneDNN, MKL) dispatch on, e.g. "GenuineIntel x86_64
    avx512 bf16 fp16 amx". A table that follows the machine (flashnum.store.compare)
    reproduces on a CPU of its class."""
    info = {}
    try:
        for line in open("/proc/cpuinfo").read().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("vendor_id", "flags", "Features") and key not in info:
                info[key] = value.split()
            if not line.strip() and info:
                break
    except OSError:
        pass
    flags = set(info.get("flags", info.get("Features", [])))
    width = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else (
        "sve" if "sve" in flags else "neon" if {"asimd", "neon"} & flags else "scalar")
    extra = [name for flag, name in (("avx512_bf16", "bf16"), ("avx512_fp16", "fp16"),
                                     ("amx_tile", "amx")) if flag in flags]
    vendor = " ".join(info.get("vendor_id", [platform.processor() or "unknown"]))
    return " ".join([vendor, platform.machine(), width, *extra])


def machine() -> dict:
    """The machine a result was computed on."""
    out = dict(node=platform.node(), platform=platform.platform(),
               processor=platform.processor() or platform.machine(), cpus=os.cpu_count(),
               cpu_class=cpu_class())
    try:
        import torch

        out["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:
        out["gpu"] = None
    return out


def record(module: str, overrides: list[str], **fields) -> dict:
    """A run record: the command to rerun it, the code, machine and versions, and `fields`
    (config, counts, shard, ...). start_time is now unless given; end_time stays None."""
    rec = dict(run_id=uuid.uuid4().hex[:16],
               command=dict(module=module, overrides=[str(o) for o in overrides]),
               git=git_state(), code_sha256=code_sha256(), versions=versions(),
               machine=machine(), start_time=now(), end_time=None)
    rec.update(fields)
    return rec


def _legacy(old: dict) -> dict:
    """A manifest of the earlier one-run layout (top level + "history") as {experiment, runs}."""
    def command(r: dict) -> dict:
        argv = list(r.get("argv") or [])
        module = None
        if argv:  # an absolute path to flashnum/<x>.py: the module `python -m` runs
            parts = Path(argv[0]).with_suffix("").parts
            module = ".".join(parts[parts.index("flashnum"):]) if "flashnum" in parts else None
        return dict(module=module, overrides=list(r.get("overrides") or argv[1:]))

    def code(g: dict | None) -> dict | None:
        if g and g.get("dirty") and "diff_sha256" not in g:  # not knowable any more
            return dict(g, diff_sha256=None,
                        note="dirty: the uncommitted diff was not recorded when this ran")
        return g

    last = {k: v for k, v in old.items() if k not in ("history", "experiment", "argv")}
    last.update(command=command(old), git=code(old.get("git")))
    runs = []
    for h in old.get("history", []):  # earlier runs of the same entry point
        cmd = command(h)
        runs.append(dict(h, git=code(h.get("git")),
                         command=dict(cmd, module=cmd["module"] or last["command"]["module"])))
    return dict(experiment=old.get("experiment"), runs=runs + [last])


LEGACY_KEYS = ("history", "argv", "git", "start_time")  # the earlier one-run layout's
RECORD_TYPES = dict(run_id=str, start_time=str, end_time=str, owner=str, counts=dict,
                    command=dict, git=dict, config=dict, reconciled=dict, argv=list,
                    overrides=list)


def _record_problem(r, where: str) -> str | None:
    if not isinstance(r, dict):
        return f"not a manifest: {where} is {json.dumps(r)[:30]}, not a record"
    for key, kind in RECORD_TYPES.items():
        if r.get(key) is not None and not isinstance(r[key], kind):
            return f"not a manifest: {where}'s {key} is not a {kind.__name__}"
    if not all(isinstance(a, str) for a in (r.get("argv") or []) + (r.get("overrides") or [])):
        return f"not a manifest: {where}'s argv or overrides hold more than strings"
    return None


def problem(man) -> str | None:
    """What keeps `man` (parsed JSON) from being a manifest of flashnum's, or None: an
    object with "runs", a list of run records (objects whose known fields have their
    types: run_id a string, counts an object, ...), or the earlier layout's object."""
    if not isinstance(man, dict):
        return f"not a manifest: a JSON {type(man).__name__}, not an object"
    if "runs" not in man and not any(k in man for k in LEGACY_KEYS):
        return "not a flashnum manifest: no runs"
    recs = man.get("runs", man.get("history", []))
    if not isinstance(recs, list):
        return f"not a manifest: runs is a {type(recs).__name__}, not a list"
    wheres = [f"run {i}" for i in range(len(recs))]
    if "runs" not in man:  # the earlier layout: the top level is the latest run's record
        recs, wheres = [*recs, man], [*wheres, "its top level"]
    for r, where in zip(recs, wheres, strict=True):
        why = _record_problem(r, where)
        if why:
            return why
    for key, kind in (("experiment", str), ("repairs", list)):
        if man.get(key) is not None and not isinstance(man[key], kind):
            return f"not a manifest: {key} is not a {kind.__name__}"
    return None


def load(path) -> dict:
    """The manifest at `path` as {experiment, runs}; {} when there is none.
    StoreError (one line naming the file and the repair) when it cannot be read or is not
    a manifest of flashnum's (problem)."""
    path = Path(path)
    try:
        man = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise unreadable(path, e) from None
    why = problem(man)
    if why:
        raise unreadable(path, why)
    return _legacy(man) if "runs" not in man else man


def runs(path) -> list[dict]:
    return load(path).get("runs", [])


def update(path, experiment: str, change) -> None:
    """change(runs) -> runs, read-modify-write under the store's lock; a manifest left with
    no run and nothing else is removed."""
    path = Path(path)
    with owners.locked(path.parent):
        man = load(path) or dict(experiment=experiment, runs=[])
        new = change(list(man["runs"]))
        if new == man["runs"] and path.exists():
            return
        man["runs"] = new
        if not new and set(man) <= {"experiment", "runs"}:
            path.unlink(missing_ok=True)
        else:
            write_json(path, man, point="manifest")


def append(path, experiment: str, rec: dict) -> None:
    """Add rec as the newest run, or replace the run with the same run_id in its place."""
    def change(rs):
        ids = [r.get("run_id") for r in rs]
        if rec.get("run_id") in ids:
            rs[ids.index(rec["run_id"])] = rec
            return rs
        return rs + [rec]

    update(path, experiment, change)


def begin(path, experiment: str, rec: dict) -> None:
    """Append rec (end_time None) before any row is written; it names its process
    (rec["owner"], flashnum.store.owners.me) so that the next run can tell it died."""
    rec.setdefault("owner", owners.me(rec["run_id"]))
    append(path, experiment, rec)


def finish(path, experiment: str, rec: dict, wrote_rows: bool) -> None:
    """Complete rec (end_time now) if the run wrote rows; else take rec out again."""
    if wrote_rows:
        rec["end_time"] = rec.get("end_time") or now()
        append(path, experiment, rec)
    else:
        update(path, experiment, lambda rs: [r for r in rs if r.get("run_id") != rec["run_id"]])
