"""The reference's memory guard (flashnum.reference.forward.peak_bytes) against what a
reference adds to the process's peak RSS, one fresh process per call.

    OMP_NUM_THREADS=1 python bench/reference_memory.py

Prints, per (method, shape), the estimate and the growth of ru_maxrss during the call
(float32 inputs, d = 64; a decode shape, a square one and an expanded view of one row):
the estimate should be the larger.
"""

import argparse
import json
import subprocess
import sys

CHILD = """
import json, resource, sys, torch
from flashnum.reference import reference
from flashnum.reference.forward import peak_bytes
method, b, nq, nk, view = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), \\
    sys.argv[5] == "view"
g = torch.Generator().manual_seed(0)
if view:  # one row expanded: no memory until the reference copies it
    q = torch.randn(b, 1, 1, 64, generator=g).expand(b, 1, nq, 64)
    k = torch.randn(b, 1, 1, 64, generator=g).expand(b, 1, nk, 64)
else:
    q, k = torch.randn(b, 1, nq, 64, generator=g), torch.randn(b, 1, nk, 64, generator=g)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
reference(q, k, k, method=method, workers=1)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps(dict(estimate=peak_bytes(q, k, k), growth=after - before)))
"""

CASES = [("fp64", 1, 4, 1 << 20, "dense"), ("fp64", 1, 2048, 2048, "dense"),
         ("fp64", 1, 8, 1 << 21, "view"), ("certified", 1, 4, 1 << 18, "dense"),
         ("certified", 1, 512, 512, "dense"), ("certified", 1, 4, 1 << 19, "view")]


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    for method, b, nq, nk, view in CASES:
        out = subprocess.run([sys.executable, "-c", CHILD, method, str(b), str(nq), str(nk),
                              view], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{method:9s} Nq {nq:5d} Nk {nk:8d} {view:5s}  estimate "
              f"{r['estimate'] / 2**20:7.0f} MB  RSS growth {r['growth'] / 2**20:7.0f} MB  "
              f"ratio {r['estimate'] / max(r['growth'], 1):5.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
