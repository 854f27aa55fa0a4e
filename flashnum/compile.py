"""Compile flashnum's C kernels into the cache now: `python -m flashnum.compile`.

    python -m flashnum.compile      # once per machine (about 2 minutes on 2 cores)

flashnum computes its dots and sums (flashnum.numerics.accumulate), its fp32 exponentials,
its fused fa2 loops and its model of torch's CPU kernel in C (flashnum.engine.native,
fused_backward, torch_cpu), compiled on first use
into $FLASHNUM_CACHE (else ~/.cache/flashnum) and shared by every virtual environment,
process and worker on the machine (flashnum.numerics.build). A run that finds them missing
compiles them before it starts its workers and says so; this command does it ahead
(`make setup` runs it after installing). Prints one line per library: in use, or why
not (no compiler, say; flashnum then computes the same values in torch, slower).
Exit status 0 when every library is in use, 1 when one is not.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from flashnum.harness import cli
from flashnum.models import libraries
from flashnum.numerics import build


@dataclass
class Args:
    """python -m flashnum.compile: build every C kernel of flashnum into the cache."""


def _run(a) -> int:
    t0 = time.perf_counter()
    status = libraries.build_all()
    for name, line in status.items():
        print(f"{name}: {line}")
    print(f"cache {build.cache_dir()}: {time.perf_counter() - t0:.0f} s")
    return 0 if libraries.in_use(status) else 1


def main(argv=None) -> int:
    return cli.main_of("flashnum.compile", Args, _run, argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
