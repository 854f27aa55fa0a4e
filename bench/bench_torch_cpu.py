"""How fast policy torch_cpu reproduces torch's CPU SDPA (bf16), against torch itself.

    python bench/bench_torch_cpu.py            # writes bench/results/torch_cpu.json
    python bench/bench_torch_cpu.py --quick    # fewer shapes

It times flashnum.attention(..., model="torch_cpu") and
torch.nn.functional.scaled_dot_product_attention (best of 3, interleaved, wall and process
CPU time) on a set of bf16 shapes, causal or not. How exactly the two agree is the
experiment torch_cpu_forward (python -m flashnum.run experiment=torch_cpu_forward). The
result records the command and the machine (flashnum.harness.timing).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.nn.functional as F

import flashnum
from flashnum.harness import timing

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SHAPES = [  # (B, H, Nq, Nk, d)
    (1, 4, 256, 256, 64), (1, 4, 1024, 1024, 64), (2, 2, 600, 600, 80),
    (1, 4, 77, 1000, 128), (1, 8, 4, 4096, 128), (1, 8, 1, 3000, 64), (1, 2, 1500, 1500, 128),
]
QUICK = [(1, 2, 300, 300, 64), (1, 2, 4, 2000, 128), (1, 2, 100, 777, 80)]


def speed(shape, causal, reps=3):
    """Best of `reps`, interleaved, in wall time and in process CPU time (the CPU time is
    the robust one on a shared, loaded machine)."""
    b, h, nq, nk, d = shape
    g = torch.Generator().manual_seed(0)
    q, k, v = [torch.randn(b, h, n, d, generator=g).bfloat16() for n in (nq, nk, nk)]
    calls = {
        "torch": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
        "model": lambda: flashnum.attention(q, k, v, precision="bf16", model="torch_cpu",
                                            causal="top_left" if causal else False),
    }
    t = timing.interleaved(calls, reps)
    best = {}
    for n in calls:
        best[f"{n}_s"], best[f"{n}_cpu_s"] = t[n]["wall_s"], t[n]["cpu_s"]
    return dict(shape=list(shape), causal=causal, **best,
                ratio=best["model_s"] / best["torch_s"],
                cpu_ratio=best["model_cpu_s"] / best["torch_cpu_s"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "torch_cpu.json"))
    args = ap.parse_args(argv)
    shapes = QUICK if args.quick else SHAPES
    facts = timing.facts()
    times = [speed(s, c) for s in shapes for c in (False, True)]
    for t in times:
        print(f"time {t['shape']} causal={t['causal']}: torch {t['torch_s']:.4f} s "
              f"(cpu {t['torch_cpu_s']:.4f}), model {t['model_s']:.4f} s (cpu "
              f"{t['model_cpu_s']:.4f}), ratio {t['ratio']:.1f} (cpu {t['cpu_ratio']:.1f})",
              flush=True)
    summary = dict(
        median_time_ratio=sorted(t["ratio"] for t in times)[len(times) // 2],
        median_cpu_time_ratio=sorted(t["cpu_ratio"] for t in times)[len(times) // 2],
    )
    print(json.dumps(summary))
    # load_average: at the end of the run, as load_average_after (docs/audit.md quotes it)
    timing.write(args.out, dict(**facts, load_average=os.getloadavg(), summary=summary,
                                timings=times))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
