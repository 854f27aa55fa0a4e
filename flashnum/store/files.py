"""Atomic file writes: a reader sees the old file or the new one, never half of one.

    atomic_write(path, lambda tmp: write_something(tmp))
    write_json(path, {"a": 1})

The content goes to a temporary name in the same folder, is flushed to disk, then
renamed over `path` (os.replace is atomic on POSIX). A killed writer leaves at most a
stray `.tmp-*` file, which nothing reads; its name says which process wrote it
(flashnum.store.owners.tag), so the store removes it once that process is dead and never
one still being written. The store and the manifests write through here.

StoreError is the one exception of a store that cannot be read or written: its text is
the one line a command prints (the file, what is wrong, the command that repairs it);
check_root raises it for a store.root that cannot be a store (every command checks it).
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

from flashnum.store import faults, owners
from flashnum.store.errors import StoreError, unreadable  # noqa: F401  (named here too)

# a store's files (flashnum.store): the table, its parts, the manifest
RESULTS = "results.parquet"
PARTS = "parts"
MANIFEST = "manifest.json"


def make_dir(d: Path) -> None:
    """mkdir -p d; a folder that cannot be made for any reason but a read-only or full
    device (which the commands' own line reports) is a StoreError naming it."""
    try:
        Path(d).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT):
            raise
        raise StoreError(f"cannot make the folder {d} ({e.strerror or e}); valid: a folder "
                         f"that can hold a store, e.g. store.root=experiments", Path(d)) from None


def atomic_write(path: Path, write, point: str | None = None) -> None:
    """write(tmp_path), fsync, then rename over `path`. point: its name for
    flashnum.store.faults (the tests stop a process there)."""
    path = Path(path)
    make_dir(path.parent)
    tmp = path.parent / f".tmp-{owners.tag()}-{path.name}"
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        if point:
            faults.reached(point)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_json(path: Path, obj: dict, point: str | None = None) -> None:
    """obj as indented JSON (keys in their order; str() for what JSON lacks), atomically."""
    text = json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n"
    atomic_write(Path(path), lambda tmp: Path(tmp).write_text(text), point)


def check_root(root) -> None:
    """StoreError (one line) when `root` cannot be a store: a file, or one experiment's own
    folder given where the folder of experiments is meant. A missing folder is made."""
    p = Path(root)
    if p.exists() and not p.is_dir():
        raise StoreError(f"store.root={root} is a file, not a store; valid: a folder of "
                         f"experiments (made if missing), e.g. store.root=experiments", p)
    if (p / RESULTS).is_file() or (p / PARTS).is_dir() or (p / MANIFEST).is_file():
        raise StoreError(f"store.root={root} is one experiment's folder, not a store; valid: "
                         f"the folder that holds it, store.root={p.resolve().parent}", p)
