"""The memory guard's estimate (flashnum.engine.checks.peak_bytes) against what a call adds
to the process's peak RSS, one fresh process per call.

    OMP_NUM_THREADS=1 python bench/memory_estimate.py [--n 2048] [--block 2048]

Prints, per (direction, policy), the estimate and the growth of ru_maxrss during the call
(B H = 2, d = 64, bf16): the estimate should be the larger.
"""

import argparse
import json
import subprocess
import sys

CHILD = """
import json, resource, sys, torch, flashnum
from flashnum.engine.checks import peak_bytes
direction, policy, n, block = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
q = torch.randn(1, 2, n, 64, generator=torch.Generator().manual_seed(0))
bm = bn = min(block, n)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
if direction == "forward":
    flashnum.attention(q, q, q, precision="bf16", policy=policy, block_m=bm, block_n=bn)
else:
    flashnum.attention_backward(q, q, q, q, precision="bf16", policy=policy, block_m=bm,
                                block_n=bn)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
est = peak_bytes(q, q, q, block_m=bm, block_n=bn, backward=direction == "backward",
                 standard=policy == "naive")
print(json.dumps(dict(direction=direction, policy=policy, estimate=est, growth=after - before)))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--block", type=int, default=2048)
    a = ap.parse_args(argv)
    for direction in ("forward", "backward"):
        for policy in ("fa2", "lowp", "exact", "naive"):
            out = subprocess.run([sys.executable, "-c", CHILD, direction, policy, str(a.n),
                                  str(a.block)], capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{direction:8s} {policy:6s} estimate {r['estimate'] / 2**20:7.0f} MB  "
                  f"RSS growth {r['growth'] / 2**20:7.0f} MB  "
                  f"ratio {r['estimate'] / max(r['growth'], 1):5.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
