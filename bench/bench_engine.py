"""Benchmarks of the emulated engine (not tests: numbers for README).

    python bench/bench_engine.py            # speed vs torch SDPA, memory at N = 65536, mp cost
    python bench/bench_engine.py --quick    # smaller memory case
    python bench/bench_engine.py --simd avx2    # the speed alone, on accumulate.c's AVX2
                                                # (or scalar) path: engine_simd_avx2.json

1. Speed: emulated bf16 `fa2` (and `lowp`), batch x heads = 8, N = 4096, d = 64, 64 x 64 blocks,
   against torch.nn.functional.scaled_dot_product_attention in fp32 on the same
   shapes, in the same run (interleaved, best of 10 each; flashnum.engine.fused's C loop
   runs it). Goal: ratio <= 2. Also, interleaved with the same SDPA calls: the in-place
   path (the fused loop off), the torch path (no native kernel; the same output), on one
   thread, the fixed cost of one step (one key block, one chunk of heads), and the
   time of the two fp32 GEMMs per key block alone. The machine (CPU model, flags, load
   average before and after, torch) and the command are stored with the figures
   (flashnum.harness.timing): on a shared machine only ratios measured in one run mean
   something.
2. Memory: N = 65536, d = 64, one head, bf16 fa2, in a fresh subprocess; peak RSS
   (ru_maxrss; the interpreter's own is stored beside it). Goal: <= 1 GiB (an N x N fp32 matrix
   alone would be 16 GiB).
3. Cost of the mp backend: one head, N = 64, d = 16, 256 bits.
Writes bench/results/engine.json.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import torch

import flashnum
from flashnum.engine import fused, native
from flashnum.harness import timing

OUT = Path(__file__).parent / "results"


def best_of(fn, n=3):
    return timing.best(fn, n)


def pairs_with(sdpa, emu, n):
    """(SDPA, emulator) wall seconds of n interleaved rounds (flashnum.harness.timing)."""
    t = timing.interleaved({"sdpa": sdpa, "emu": emu}, n)
    return list(zip(t["sdpa"]["wall_runs_s"], t["emu"]["wall_runs_s"], strict=True))


def speed():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, 4096, 64, generator=g) for _ in range(3))
    sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)
    emu = lambda: flashnum.attention(q, k, v, precision="bf16", policy="fa2")
    res = {"shape": "8 x 4096 x 64, 64x64 blocks", "goal_ratio": 2.0,
           "threads": torch.get_num_threads(), "exp_site": native.status()}
    fused.set_enabled(False)
    emu(), sdpa()  # builds the kernel and warms both paths
    fused.set_enabled(True)
    # interleaved, the best of 10 each: noise on a shared machine only ever adds time,
    # and alternating keeps a slow spell from falling on one side only
    emu(), sdpa()
    pairs = pairs_with(sdpa, emu, 10)
    res["sdpa_fp32_s"] = min(a for a, _ in pairs)
    res["emulate_bf16_fa2_s"] = min(b for _, b in pairs)
    res["ratio"] = res["emulate_bf16_fa2_s"] / res["sdpa_fp32_s"]
    res["pairs_s"] = pairs
    # lowp (every softmax site bf16), also the fused loop's, interleaved with the same SDPA
    lowp = lambda: flashnum.attention(q, k, v, precision="bf16", policy="lowp")  # noqa: E731
    lowp()
    alt = pairs_with(sdpa, lowp, 3)
    res["emulate_bf16_lowp_s"] = min(b for _, b in alt)
    res["ratio_lowp"] = res["emulate_bf16_lowp_s"] / min(a for a, _ in alt)
    # the in-place path (the fused loop off) and the torch path (no native kernel):
    # the same output; each interleaved with SDPA, its ratio to the best SDPA of its pairs
    for key, off in (("in_place", fused), ("torch_path", native)):
        off.set_enabled(False)
        try:
            alt = pairs_with(sdpa, emu, 3)
        finally:
            off.set_enabled(True)
        res[f"emulate_{key}_s"] = min(b for _, b in alt)
        res[f"ratio_{key}"] = res[f"emulate_{key}_s"] / min(a for a, _ in alt)
    # the floor under any emulation of this model: the two fp32 GEMMs of every key block
    # (Q K_j^T and P_j V_j, each (4096 x 64) @ (64 x 64) per head), nothing else
    kb, vb = k.reshape(8, 64, 64, 64), v.reshape(8, 64, 64, 64)
    q3, out = q.reshape(8, 4096, 64), torch.empty(8, 4096, 64)
    def gemms():
        for j in range(64):
            torch.bmm(q3, kb[:, j].transpose(-1, -2), out=out)
            torch.bmm(out, vb[:, j], out=out)
    res["gemms_s"] = best_of(gemms, 5)
    # fixed cost per step (one key block for one chunk of heads): 64 queries, 4096 keys,
    # where the arithmetic is negligible; the benchmark above takes 256 such steps
    qs, ks, vs = (torch.randn(1, 2, n, 64, generator=g) for n in (64, 4096, 4096))
    step = best_of(lambda: flashnum.attention(qs, ks, vs, precision="bf16", policy="fa2"), 10)
    res["step_overhead_us"] = step / 64 * 1e6
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        res["ratio_one_thread"] = best_of(emu, 2) / best_of(sdpa, 2)
        # one thread, process CPU time (what load on other cores disturbs least):
        # SDPA, the fused loop and the in-place path interleaved, best of 3 each
        def in_place():
            fused.set_enabled(False)
            try:
                emu()
            finally:
                fused.set_enabled(True)

        t = timing.interleaved({"sdpa": sdpa, "fused": emu, "in_place": in_place}, 3)
        best = {k: v["cpu_s"] for k, v in t.items()}
        res["cpu_one_thread_s"] = best
        res["cpu_ratio_one_thread"] = best["fused"] / best["sdpa"]
        res["cpu_ratio_one_thread_in_place"] = best["in_place"] / best["sdpa"]
    finally:
        fused.set_enabled(True)
        torch.set_num_threads(n)
    return res


MEM_CHILD = """
import resource, sys, time, torch, flashnum
n = int(sys.argv[1])
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 1, n, 64, generator=g) for _ in range(3))
t = time.perf_counter()
res = flashnum.attention(q, k, v, precision="bf16", policy="fa2")
dt = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(base, peak, dt)
"""


def memory(n):
    r = subprocess.run([sys.executable, "-c", MEM_CHILD, str(n)], capture_output=True, text=True,
                       check=True)
    base, peak, dt = r.stdout.split()
    kib = 1024
    return {"N": n, "peak_rss_gib": int(peak) / kib**2, "import_rss_gib": int(base) / kib**2,
            "wall_s": float(dt), "goal_gib": 1.0, "dense_fp32_gib": n * n * 4 / 2**30}


def mp_cost():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 64, 16, generator=g, dtype=torch.float64) for _ in range(3))
    t = best_of(lambda: flashnum.attention(q, k, v, precision="mp", mp_bits=256, block_n=16), 1)
    return {"shape": "1 x 64 x 16, 256 bits", "wall_s": t}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N = 16384 for the memory case")
    ap.add_argument("--simd", choices=("avx512", "avx2", "scalar"),
                    help="the speed part alone, with FLASHNUM_SIMD set: what a CPU without "
                         "AVX-512 runs (the same bits); writes engine_simd_<isa>.json")
    args = ap.parse_args()
    if args.simd:
        os.environ["FLASHNUM_SIMD"] = args.simd  # read by accumulate.isa() at each call
    res = {**timing.facts(), "fused": fused.status(), "simd": args.simd}
    res["speed"] = speed()
    res["load_average_after"] = os.getloadavg()
    sp = res["speed"]
    print(f"speed: SDPA fp32 {sp['sdpa_fp32_s']:.3f} s, emulated bf16 fa2 "
          f"{sp['emulate_bf16_fa2_s']:.3f} s, ratio {sp['ratio']:.2f} (goal <= 2; exp site: "
          f"{sp['exp_site']}); in-place path {sp['emulate_in_place_s']:.3f} s, ratio "
          f"{sp['ratio_in_place']:.2f}; torch path {sp['emulate_torch_path_s']:.3f} s, ratio "
          f"{sp['ratio_torch_path']:.2f}; lowp ratio {sp['ratio_lowp']:.2f}; one thread: "
          f"ratio {sp['ratio_one_thread']:.2f}, in "
          f"CPU time {sp['cpu_ratio_one_thread']:.2f} (in-place path "
          f"{sp['cpu_ratio_one_thread_in_place']:.2f}); "
          f"{sp['step_overhead_us']:.0f} us fixed cost per step; "
          f"the GEMMs alone {sp['gemms_s']:.3f} s")
    if args.simd:
        timing.write(OUT / f"engine_simd_{args.simd}.json", res)
        return
    res["memory"] = memory(16384 if args.quick else 65536)
    mem = res["memory"]
    print(f"memory: N={mem['N']} peak RSS {mem['peak_rss_gib']:.2f} GiB (goal <= 1), "
          f"{mem['wall_s']:.1f} s")
    res["mp"] = mp_cost()
    print(f"mp: {res['mp']['shape']}: {res['mp']['wall_s']:.2f} s")
    timing.write(OUT / "engine.json", res)


if __name__ == "__main__":
    main()
