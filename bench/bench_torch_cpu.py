"""How exactly, and how fast, policy torch_cpu reproduces torch's CPU SDPA.

    python bench/bench_torch_cpu.py            # writes bench/results/torch_cpu.json
    python bench/bench_torch_cpu.py --quick    # fewer shapes and seeds

For every precision (fp32, bf16, fp16), causal or not, and a set of shapes (ragged N,
decode shapes with a few query rows against thousands of keys, head dims 64, 80, 128), it
compares flashnum.attention(..., policy="torch_cpu") with
torch.nn.functional.scaled_dot_product_attention element by element: the fraction of
bitwise-equal outputs and LSEs, and the largest difference in units of the output's
ulp. It times both (best of 3, interleaved) on the bf16 shapes. The result records the
command and the machine (flashnum.harness.timing).
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


def ulp(x: torch.Tensor) -> torch.Tensor:
    """The spacing of the output format at |x| (its ulp), as float64."""
    info = torch.finfo(x.dtype)
    mag = x.double().abs().clamp_min(info.tiny)
    return torch.exp2(torch.floor(torch.log2(mag))) * info.eps


def compare(precision, shape, causal, seed):
    b, h, nq, nk, d = shape
    dtype = DTYPES[precision]
    g = torch.Generator().manual_seed(seed)
    q, k, v = [torch.randn(b, h, n, d, generator=g).to(dtype) for n in (nq, nk, nk)]
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, is_causal=causal)[:2]
    res = flashnum.attention(q, k, v, precision=precision, policy="torch_cpu",
                             causal="top_left" if causal else False)  # torch's is_causal
    mine = res.out.to(dtype)
    diff = (mine.double() - out.double()).abs()
    return dict(
        precision=precision, shape=list(shape), causal=causal, seed=seed,
        elements=out.numel(), bitwise=float((mine == out).double().mean()),
        lse_bitwise=float((res.lse.float() == lse).double().mean()),
        max_ulps=float((diff / ulp(out)).max()),
    )


def speed(shape, causal, reps=3):
    """Best of `reps`, interleaved, in wall time and in process CPU time (the CPU time is
    the robust one on a shared, loaded machine)."""
    b, h, nq, nk, d = shape
    g = torch.Generator().manual_seed(0)
    q, k, v = [torch.randn(b, h, n, d, generator=g).bfloat16() for n in (nq, nk, nk)]
    calls = {
        "torch": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
        "model": lambda: flashnum.attention(q, k, v, precision="bf16", policy="torch_cpu",
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
    shapes, seeds = (QUICK, (0,)) if args.quick else (SHAPES, (0,))
    facts = timing.facts()
    rows = []
    for precision in DTYPES:
        for shape in shapes:
            for causal in (False, True):
                for seed in seeds:
                    r = compare(precision, shape, causal, seed)
                    rows.append(r)
                    print(f"{precision} {shape} causal={causal} seed={seed}: bitwise "
                          f"{100 * r['bitwise']:.4f}% lse {100 * r['lse_bitwise']:.4f}% "
                          f"max {r['max_ulps']:.2f} ulp", flush=True)
    times = [speed(s, c) for s in shapes for c in (False, True)]
    for t in times:
        print(f"time {t['shape']} causal={t['causal']}: torch {t['torch_s']:.4f} s "
              f"(cpu {t['torch_cpu_s']:.4f}), model {t['model_s']:.4f} s (cpu "
              f"{t['model_cpu_s']:.4f}), ratio {t['ratio']:.1f} (cpu {t['cpu_ratio']:.1f})",
              flush=True)
    total = sum(r["elements"] for r in rows)
    summary = dict(
        bitwise=sum(r["bitwise"] * r["elements"] for r in rows) / total,
        worst_case_bitwise=min(r["bitwise"] for r in rows),
        max_ulps=max(r["max_ulps"] for r in rows),
        median_time_ratio=sorted(t["ratio"] for t in times)[len(times) // 2],
        median_cpu_time_ratio=sorted(t["cpu_ratio"] for t in times)[len(times) // 2],
    )
    print(json.dumps(summary))
    # load_average: at the end of the run, as load_average_after (docs/audit.md quotes it)
    timing.write(args.out, dict(**facts, load_average=os.getloadavg(), summary=summary,
                                cases=rows, timings=times))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
