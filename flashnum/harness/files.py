"""Atomic file writes: a reader sees the old file or the new one, never half of one.

    atomic_write(path, lambda tmp: write_something(tmp))
    write_json(path, {"a": 1})

The content goes to a temporary name in the same folder, is flushed to disk, then
renamed over `path` (os.replace is atomic on POSIX). A killed writer leaves at most a
stray `.tmp-*` file, which nothing reads. The store and the manifests write through here.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path


def atomic_write(path: Path, write) -> None:
    """write(tmp_path), fsync, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".tmp-{uuid.uuid4().hex}-{path.name}"
    try:
        write(tmp)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_json(path: Path, obj: dict) -> None:
    """obj as indented JSON (keys in their order; str() for what JSON lacks), atomically."""
    text = json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n"
    atomic_write(Path(path), lambda tmp: Path(tmp).write_text(text))
