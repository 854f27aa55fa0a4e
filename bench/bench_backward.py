"""Benchmarks of the emulated backward and the certified backward reference (numbers for docs).

    python bench/bench_backward.py            # all three parts
    python bench/bench_backward.py --quick    # smaller memory sizes, no certified run
    python bench/bench_backward.py --only memory   # one part, the others kept from the file
    python bench/bench_backward.py --only memory --sizes 65536   # these N; other N kept

1. Speed: emulated bf16 `fa2` backward (flashnum.attention_backward, the forward's O and
   LSE given), batch x heads = 8, N = 4096, d = 64, 64 x 64 blocks, against torch's fp32
   autograd of scaled_dot_product_attention on the same shapes in the same run
   (interleaved, best of 3 each): torch's backward alone (the forward done outside the
   timing) and forward + backward. Goal: emulated backward <= 3x torch's backward.
2. Memory: one head, d = 64, bf16 fa2 backward at several N (--sizes; 2048 to 16384 by
   default), each in a fresh subprocess: the peak RSS of the backward call over the RSS
   before it (the peak reset through /proc/self/clear_refs, Linux), and the call's CPU
   time. O(N * block) means linear growth; an N x N fp32 matrix alone is 4 N^2 bytes.
   Entries for N not measured in this run are kept from the file.
3. The certified reference backward (flashnum.reference_backward) for one head,
   N = 1024, d = 64: wall time and the precision it needed. Goal: under a minute.
Writes bench/results/backward.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

import flashnum

OUT = Path(__file__).parent / "results"


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def speed(runs=3):
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 8, 4096, 64, generator=g).bfloat16() for _ in range(4))
    fwd = flashnum.attention(q, k, v, precision="bf16", policy="fa2")
    emu = lambda: flashnum.attention_backward(q, k, v, do, out=fwd.out, lse=fwd.lse)  # noqa: E731
    qf, kf, vf, dof = (x.float() for x in (q, k, v, do))

    def torch_pass(backward_only):
        a, b, c = (x.clone().requires_grad_() for x in (qf, kf, vf))
        t = time.perf_counter()
        o = torch.nn.functional.scaled_dot_product_attention(a, b, c)
        t_fwd = time.perf_counter() - t
        o.backward(dof)
        return time.perf_counter() - t - (t_fwd if backward_only else 0.0)

    rows = [(torch_pass(True), torch_pass(False), timed(emu)) for _ in range(runs)]
    res = {"shape": "8 x 4096 x 64, 64x64 blocks", "goal_ratio": 3.0,
           "threads": torch.get_num_threads(), "runs": runs,
           "torch_fp32_sdpa_backward_s": min(r[0] for r in rows),
           "torch_fp32_sdpa_forward_backward_s": min(r[1] for r in rows),
           "emulate_bf16_fa2_backward_s": min(r[2] for r in rows)}
    res["ratio_vs_backward"] = res["emulate_bf16_fa2_backward_s"] / res[
        "torch_fp32_sdpa_backward_s"]
    res["ratio_vs_forward_backward"] = res["emulate_bf16_fa2_backward_s"] / res[
        "torch_fp32_sdpa_forward_backward_s"]
    return res


_CHILD = """
import sys, torch, flashnum
torch.set_num_threads(1)
n = int(sys.argv[1])
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
g = torch.Generator().manual_seed(0)
q, k, v, do = (torch.randn(n, 64, generator=g).bfloat16() for _ in range(4))
fwd = flashnum.attention(q, k, v)
base = status("VmRSS:")
open("/proc/self/clear_refs", "w").write("5")  # reset the peak (VmHWM) to the current RSS
import time
c = time.process_time()
flashnum.attention_backward(q, k, v, do, out=fwd.out, lse=fwd.lse)
print(status("VmHWM:") - base, time.process_time() - c)
"""


def memory(sizes):
    out = []
    for n in sizes:
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
        t = time.perf_counter()
        r = subprocess.run([sys.executable, "-c", _CHILD, str(n)], capture_output=True,
                           text=True, env=env, check=True)
        peak, cpu = r.stdout.strip().splitlines()[-1].split()
        out.append({"n": n, "peak_rss_over_base_gib": int(peak) / 2**30,
                    "n_by_n_fp32_gib": 4 * n * n / 2**30, "backward_cpu_s": float(cpu),
                    "wall_s": time.perf_counter() - t, "load_average": os.getloadavg()[0]})
    return out


def certified(n=1024):
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, n, 64, generator=g).bfloat16().double() for _ in range(4))
    t, c = time.perf_counter(), time.process_time()
    ref = flashnum.reference_backward(q, k, v, do, cache=False)
    return {"n": n, "d": 64, "wall_s": time.perf_counter() - t,
            "cpu_s": time.process_time() - c, "goal_s": 60.0, **ref.info}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", choices=("speed", "memory", "certified"), default=None)
    ap.add_argument("--sizes", type=int, nargs="+", default=None,
                    help="N for the memory part (default 2048 4096 8192 16384)")
    args = ap.parse_args(argv)
    if args.sizes is not None and min(args.sizes) < 1:
        raise ValueError(f"--sizes must be positive integers, got {args.sizes}")
    path = OUT / "backward.json"
    res = json.loads(path.read_text()) if (args.only and path.exists()) else {}
    res.update(machine=platform.processor() or platform.machine(), torch=torch.__version__,
               load_average=os.getloadavg()[0])
    if args.only in (None, "speed"):
        res["speed"] = speed()
    if args.only in (None, "memory"):
        sizes = args.sizes or ([1024, 2048, 4096] if args.quick else [2048, 4096, 8192, 16384])
        new = memory(sizes)
        kept = [m for m in res.get("memory", []) if m["n"] not in sizes]
        res["memory"] = sorted(kept + new, key=lambda m: m["n"])
    if args.only in (None, "certified") and not args.quick:
        res["certified"] = certified()
    OUT.mkdir(exist_ok=True)
    path.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
