"""The one cache of references, forward and backward: an in-memory LRU per kind and, when
a folder is set (reference_cache_dir(path), else the environment variable FLASHNUM_CACHE),
one file per entry: <folder>/<hash>.pt for attention, <folder>/bwd-<hash>.pt for its
gradients (torch.save of the fields, read back with weights_only=True).

A file is written under a temporary name and renamed into place (parallel sweeps may
race); an unreadable one (truncated, garbage, another format) is recomputed with a
warning naming it, and rewritten whole. Callers get copies: the cache never changes
through what it returned.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections import OrderedDict

import torch

from flashnum.reference.result import Reference, ReferenceGradients

_CACHE_DIR: str | None = None


def reference_cache_dir(path: str | os.PathLike | None) -> str | None:
    """Persist references under `path` (None: only the env var FLASHNUM_CACHE, if set).
    Returns the previous setting."""
    global _CACHE_DIR
    old, _CACHE_DIR = _CACHE_DIR, (None if path is None else os.fspath(path))
    return old


def cache_dir() -> str | None:
    return _CACHE_DIR or os.environ.get("FLASHNUM_CACHE") or None


def _copy(obj):
    return dataclasses.replace(obj, **{
        f.name: v.clone() if isinstance(v, torch.Tensor) else dict(v) if isinstance(v, dict)
        else v for f in dataclasses.fields(obj) for v in [getattr(obj, f.name)]})


class Cache:
    """The cache of one kind of reference: files named <prefix><hash>.pt, `size` in memory."""

    def __init__(self, prefix: str, size: int, kind: type):
        self.prefix, self.size, self.kind = prefix, size, kind
        self.lru: OrderedDict = OrderedDict()
        self.stats = {"computed": 0, "memory_hits": 0, "disk_hits": 0}

    def path(self, key: str) -> str | None:
        d = cache_dir()
        return None if d is None else os.path.join(d, f"{self.prefix}{key}.pt")

    def get(self, key: str):
        """A copy of the entry from memory, else from its file, else None."""
        if key in self.lru:
            self.lru.move_to_end(key)
            self.stats["memory_hits"] += 1
            return _copy(self.lru[key])
        path = self.path(key)
        if path is None or not os.path.exists(path):
            return None
        try:
            obj = self.kind(**torch.load(path, weights_only=True))
        except Exception as e:  # truncated, garbage, another format: compute it again
            warnings.warn(f"reference cache entry {path} is unreadable "
                          f"({type(e).__name__}); recomputing it", stacklevel=3)
            return None
        self.stats["disk_hits"] += 1
        self._remember(key, obj)
        return _copy(obj)

    def put(self, key: str, obj):
        """Keep obj in memory and in its file; returns a copy for the caller."""
        self._remember(key, obj)
        path = self.path(key)
        if path is not None:
            d, name = os.path.split(path)
            os.makedirs(d, exist_ok=True)
            tmp = os.path.join(d, f".{name}.{os.getpid()}.tmp")
            torch.save(dataclasses.asdict(obj), tmp)
            os.replace(tmp, path)  # atomic: parallel sweeps may race
        return _copy(obj)

    def _remember(self, key: str, obj) -> None:
        self.lru[key] = obj
        self.lru.move_to_end(key)
        while len(self.lru) > self.size:
            self.lru.popitem(last=False)

    def info(self) -> dict:
        return dict(self.stats, size=len(self.lru))


FORWARD = Cache("", 32, Reference)
BACKWARD = Cache("bwd-", 16, ReferenceGradients)


def cache_info() -> dict:
    """How many references were computed, and served from memory or disk."""
    return FORWARD.info()


def clear_cache() -> None:
    """Empty the in-memory caches (the files are left alone)."""
    FORWARD.lru.clear()
    BACKWARD.lru.clear()
