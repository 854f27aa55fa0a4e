"""Benchmarks of the emulated backward and the certified backward reference (numbers for docs).

    python bench/bench_backward.py            # all three parts
    python bench/bench_backward.py --quick    # smaller memory sizes, no certified run
    python bench/bench_backward.py --only memory   # one part, the others kept from the file
    python bench/bench_backward.py --only memory --sizes 65536   # these N; other N kept

1. Speed: emulated bf16 `fa2` backward (flashnum.attention_backward, the forward's O and
   LSE given; flashnum.engine.fused_backward's C loop runs it), batch x heads = 8,
   N = 4096, d = 64, 64 x 64 blocks, against torch's fp32 autograd of
   scaled_dot_product_attention on the same shapes in the same run (interleaved, best of
   10 each): torch's backward alone (the forward done outside the timing) and forward +
   backward. Goal: emulated backward <= 2x torch's backward. Also the torch loop (the
   fused loop off, the same output; interleaved with torch's backward, best of 2), and on
   one thread the process CPU time of torch's backward and the fused loop (interleaved,
   best of 3: what load from other jobs disturbs least). The command, the CPU model and
   its SIMD flags, the load average before and after, and torch are stored with them.
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
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import flashnum
from flashnum.engine import fused_backward
from flashnum.harness import timing

OUT = Path(__file__).parent / "results"


def timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def speed(runs=10):
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 8, 4096, 64, generator=g).bfloat16() for _ in range(4))
    fwd = flashnum.attention(q, k, v, precision="bf16", policy="fa2")
    emu = lambda: flashnum.attention_backward(q, k, v, do, out=fwd.out, lse=fwd.lse)  # noqa: E731
    qf, kf, vf, dof = (x.float() for x in (q, k, v, do))

    def torch_pass(backward_only, clock=time.perf_counter):
        a, b, c = (x.clone().requires_grad_() for x in (qf, kf, vf))
        t = clock()
        o = torch.nn.functional.scaled_dot_product_attention(a, b, c)
        t_fwd = clock() - t
        o.backward(dof)
        return clock() - t - (t_fwd if backward_only else 0.0)

    emu(), torch_pass(True)  # builds the kernel, checks the shapes, warms both
    # interleaved: noise on a shared machine only ever adds time, and alternating keeps a
    # slow spell from falling on one side only
    rows = [(torch_pass(True), torch_pass(False), timed(emu)) for _ in range(runs)]
    res = {"shape": "8 x 4096 x 64, 64x64 blocks", "goal_ratio": 2.0,
           "threads": torch.get_num_threads(), "runs": runs, "fused": fused_backward.status(),
           "torch_fp32_sdpa_backward_s": min(r[0] for r in rows),
           "torch_fp32_sdpa_forward_backward_s": min(r[1] for r in rows),
           "emulate_bf16_fa2_backward_s": min(r[2] for r in rows), "runs_s": rows}
    res["ratio_vs_backward"] = res["emulate_bf16_fa2_backward_s"] / res[
        "torch_fp32_sdpa_backward_s"]
    res["ratio_vs_forward_backward"] = res["emulate_bf16_fa2_backward_s"] / res[
        "torch_fp32_sdpa_forward_backward_s"]
    # the median over the interleaved pairs of their ratio: one lucky call on either side
    # moves it less than the ratio of the bests
    res["ratio_vs_backward_median_pair"] = statistics.median(r[2] / r[0] for r in rows)
    fused_backward.set_enabled(False)  # the torch loop: the same output
    try:
        alt = [(torch_pass(True), timed(emu)) for _ in range(2)]
    finally:
        fused_backward.set_enabled(True)
    res["emulate_torch_loop_s"] = min(b for _, b in alt)
    res["ratio_torch_loop"] = res["emulate_torch_loop_s"] / min(a for a, _ in alt)
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cpu = {"torch": [], "fused": []}
        for _ in range(3):
            cpu["torch"].append(torch_pass(True, time.process_time))
            c = time.process_time()
            emu()
            cpu["fused"].append(time.process_time() - c)
    finally:
        torch.set_num_threads(n)
    res["cpu_one_thread_s"] = {key: min(ts) for key, ts in cpu.items()}
    res["cpu_ratio_one_thread"] = res["cpu_one_thread_s"]["fused"] / res["cpu_one_thread_s"][
        "torch"]
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
    res.update(load_average=os.getloadavg()[0])
    if args.only in (None, "speed"):
        res.update(timing.facts(None if argv is None else ["bench/bench_backward.py", *argv]))
        res["speed"] = speed()
        res["load_average_after"] = os.getloadavg()
    if args.only in (None, "memory"):
        sizes = args.sizes or ([1024, 2048, 4096] if args.quick else [2048, 4096, 8192, 16384])
        new = memory(sizes)
        kept = [m for m in res.get("memory", []) if m["n"] not in sizes]
        res["memory"] = sorted(kept + new, key=lambda m: m["n"])
    if args.only in (None, "certified") and not args.quick:
        res["certified"] = certified()
    timing.write(path, res)
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
