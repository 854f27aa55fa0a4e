"""Deterministic fault injection at the store's write points (for the fault-injection tests).

    FLASHNUM_FAULT=part:2:SIGKILL python -m flashnum.run experiment=smoke ...

FLASHNUM_FAULT=POINT[:N]:ACTION makes the N-th (default first) write at POINT in a process
do ACTION there, with the new file written to its temporary name but not yet renamed:

    POINT   part      a part of finished cases (parts/part-*.parquet)
            compact   results.parquet, written by a compaction
            cleanup   a compaction after its rename, before it removes the merged parts
            manifest  a manifest (the run's record: 1 at the start, 2 at the end)
            grid      grid.json
    ACTION  SIGKILL, SIGTERM, SIGINT: the signal goes to the runner (this process, or the
            parent of a worker process), as `kill`, the OOM killer or Ctrl-C would send it;
            a worker then waits there to be stopped with it.
            ENOSPC: the write fails with OSError(ENOSPC), as on a full disk.

Unset (always, outside the tests) it costs one dictionary look-up per file written.
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import signal
import time

ENV = "FLASHNUM_FAULT"
_seen: dict = {}  # (spec, point) -> writes at the point so far, in this process


def reached(point: str) -> None:
    """Called by every write at `point`; does the injected fault when it is this one."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    where, _, action = spec.rpartition(":")
    name, _, nth = where.partition(":")
    if name != point:
        return
    key = (spec, point)
    _seen[key] = _seen.get(key, 0) + 1
    if _seen[key] != int(nth or 1):
        return
    if action == "ENOSPC":
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f"(injected at {point})")
    sig = getattr(signal, action)
    worker = multiprocessing.parent_process() is not None
    try:
        os.kill(os.getppid() if worker else os.getpid(), sig)
    except ProcessLookupError:
        pass
    # the runner's handler raises here; a worker waits for what its parent's death does
    deadline = time.monotonic() + (60 if worker else 5)
    while time.monotonic() < deadline:
        time.sleep(0.05)
