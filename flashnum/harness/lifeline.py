"""A worker's tie to its runner, made the moment the worker's interpreter imports flashnum.

The runner (flashnum.harness.scheduler.execute) spawns its workers with FLASHNUM_WORKER_OF
set to its pid. A spawned worker's first import is flashnum (it unpickles the runner's
main module and task functions), and flashnum/__init__.py imports this module before
anything else, so the tie is made within milliseconds of the worker's start, not after
torch's import (seconds on a loaded machine): the worker asks the kernel for SIGKILL
when its parent dies (prctl PR_SET_PDEATHSIG, Linux) and kills itself at once if the
runner is already gone. A runner killed while its workers start leaves none running.
Only the standard library here: nothing slow may come before the tie.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

ENV = "FLASHNUM_WORKER_OF"
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with(parent: int) -> None:
    """SIGKILL this process when `parent` dies (the kernel's parent-death signal), and now
    if it is not this process's parent any more (it died before the prctl)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)  # no clean-up: nothing may be written now


def tie() -> None:
    """die_with the runner named in FLASHNUM_WORKER_OF, if this is one of its workers. The
    variable is taken out of the environment: a worker's own children are not workers."""
    parent = os.environ.pop(ENV, "")
    if parent.isdigit():
        die_with(int(parent))


tie()
