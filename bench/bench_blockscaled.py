"""Block-scaled quantization of one 8 x 4096 x 64 tensor against one emulated attention.

    python bench/bench_blockscaled.py [--repeat 3] [--out bench/results/blockscaled.json]

Times (best of `repeat`, wall) flashnum.numerics.blockscaled.quantize for every block
format, and flashnum.attention (fa2, bf16, 64 x 64 tiles) on q, k, v of that shape; prints
each quantization's cost as a fraction of the attention's. The result records the command
and the machine (flashnum.harness.timing).
"""

import argparse

import torch

import flashnum
from flashnum.harness import timing
from flashnum.numerics.blockscaled import BLOCK_FORMATS, quantize


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    rows = timing.facts()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(8, 4096, 64, generator=g) for _ in range(3))
    t_att = timing.best(lambda: flashnum.attention(q, k, v, precision="bf16"), a.repeat)
    rows["attention_fa2_bf16_s"] = t_att
    print(f"attention fa2 bf16 8x4096x64: {t_att:.3f} s")
    for name in BLOCK_FORMATS:
        t = timing.best(lambda n=name: quantize(q, n), a.repeat)
        rows[f"quantize_{name}_s"] = t
        print(f"quantize {name:16s} {t * 1e3:8.1f} ms  = {t / t_att:.3f} x attention")
    if a.out:
        timing.write(a.out, rows)


if __name__ == "__main__":
    main()
