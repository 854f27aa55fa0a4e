"""Every native library of the engine, built (or loaded from the cache) at once.

    from flashnum.models import libraries
    libraries.build_all()     # {"native": "native C kernel", "fused_backward": "on ...", ...}

What `python -m flashnum.compile` does ahead, and what a run does before it starts its
workers (flashnum.harness.scheduler.execute), so that the workers load one build instead
of each compiling its own. Each library builds on first use anyway (flashnum.numerics.build:
once per machine, under a lock, announced on stderr); a library that cannot be built
(no compiler, say) leaves its fallback in plain torch, the same values, slower.
"""

from __future__ import annotations

import threading

from flashnum.engine import fused_backward, native
from flashnum.models import torch_cpu
from flashnum.numerics import accumulate


def _torch_cpu() -> str:
    why = torch_cpu.why()
    return "C loop" if why is None else f"Python loop ({why})"


STATUS = {"accumulate": accumulate.status, "native": native.status,
          "fused_backward": fused_backward.status,
          "torch_cpu": _torch_cpu}  # each builds its library on first call


def build_all() -> dict[str, str]:
    """Build every library (torch_cpu's beside native's and the fused backward's, which
    builds on native's: each compiler is its own process, so they share the cores); one
    status line per library."""
    out: dict[str, str] = {}

    def job(name, status):
        try:
            out[name] = status()
        except Exception as e:  # a build never stops a run: its fallback computes
            out[name] = f"not built: {type(e).__name__}: {e}".splitlines()[0]

    threads = [threading.Thread(target=job, args=item, name=f"flashnum-build-{item[0]}")
               for item in STATUS.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {name: out[name] for name in STATUS}


def in_use(status: dict[str, str]) -> bool:
    """Whether every library of build_all() is built and in use."""
    return all(s.startswith(("accumulate.c", "native C", "on ", "C loop"))
               for s in status.values())
