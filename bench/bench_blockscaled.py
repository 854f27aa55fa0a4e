"""Block-scaled quantization of one 8 x 4096 x 64 tensor against one emulated attention.

    python bench/bench_blockscaled.py [--repeat 3] [--out bench/results/blockscaled.json]

Times (best of `repeat`) flashnum.numerics.blockscaled.quantize for every block format,
and flashnum.attention (fa2, bf16, 64 x 64 tiles) on q, k, v of that shape; prints
each quantization's cost as a fraction of the attention's.
"""

import argparse
import json
import platform
import time

import torch

import flashnum
from flashnum.numerics.blockscaled import BLOCK_FORMATS, quantize


def best(f, repeat):
    t = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        t.append(time.perf_counter() - t0)
    return min(t)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(8, 4096, 64, generator=g) for _ in range(3))
    t_att = best(lambda: flashnum.attention(q, k, v, precision="bf16"), a.repeat)
    rows = {"attention_fa2_bf16_s": t_att, "threads": torch.get_num_threads(),
            "machine": platform.processor() or platform.machine()}
    print(f"attention fa2 bf16 8x4096x64: {t_att:.3f} s")
    for name in BLOCK_FORMATS:
        t = best(lambda n=name: quantize(q, n), a.repeat)
        rows[f"quantize_{name}_s"] = t
        print(f"quantize {name:16s} {t * 1e3:8.1f} ms  = {t / t_att:.3f} x attention")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
