"""CPU time of Format.round's two nearest-even paths, and of split-KV decoding at 131072 keys.

    python bench/bench_rounding.py [--repeat 3] [--out bench/results/rounding.json]

1. One 2 x 131072 x 64 float64 tensor (K of the splitkv_decode reproduction) rounded
   into bf16 and fp16 by the scaled-integer path (`Format._round_general`) and by the
   bit path `Format.round` takes for normal values (fp16's subnormal-range values go to
   the general path), on one thread and on the default count; both give the same bits.
2. flashnum.attention for one decoding configuration of `python -m flashnum.reproduce
   splitkv_decode` (Nk = 131072, 8 query heads on 2 K/V heads, S = 64, fp32 partials),
   on one torch thread and on torch's default thread count: the reproduction runs on one
   (its GEMMs are 16 x 256 tiles; intra-op threads spin on them).
CPU time is time.process_time, best of `repeat` (the two rounding paths interleaved):
comparable within one run on a busy machine, where wall-clock times are not. The result
records the command and the machine (flashnum.harness.timing).
"""

import argparse

import torch

import flashnum
from flashnum.harness import timing
from flashnum.numerics.formats import FORMATS
from flashnum.numerics.policy import make_policy


def decode():
    """One configuration of the splitkv_decode reproduction, as a call to time."""
    g = torch.Generator().manual_seed(0)
    bf16 = FORMATS["bf16"]
    k = bf16.round(torch.randn(1, 2, 131072, 64, generator=g, dtype=torch.float64) * 0.4)
    v = bf16.round(torch.randn(1, 2, 131072, 64, generator=g, dtype=torch.float64))
    q = bf16.round(torch.randn(1, 8, 1, 64, generator=g, dtype=torch.float64) * 0.8)
    pol = make_policy("fa2", "bf16").with_sites(out="fp32")
    return lambda: flashnum.attention(q, k, v, precision="bf16", policy=pol, num_splits=64,
                                      block_m=16, block_n=256)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    x = torch.randn(2, 131072, 64, generator=torch.Generator().manual_seed(1),
                    dtype=torch.float64)
    rows = {**timing.facts(), "default_threads": torch.get_num_threads()}
    default = rows["default_threads"]
    for threads in sorted({1, default}):
        torch.set_num_threads(threads)
        for name in ("bf16", "fp16"):
            f = FORMATS[name]
            assert torch.equal(f.round(x), f._round_general(x, "nearest", None))  # |x| < 7
            t = timing.interleaved({"general": lambda f=f: f._round_general(x, "nearest", None),
                                    "bit": lambda f=f: f.round(x)}, a.repeat)
            gen, bit = t["general"]["cpu_s"], t["bit"]["cpu_s"]
            key = f"round_{name}_threads{threads}"
            rows[f"{key}_general_cpu_s"], rows[f"{key}_bit_cpu_s"] = gen, bit
            print(f"{name}, {threads} thread(s): general {gen:.3f} s, bit path {bit:.3f} s "
                  f"of CPU ({gen / bit:.1f}x)")
    torch.set_num_threads(default)
    run = decode()
    for threads in sorted({1, default}):
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            t = timing.best(run, a.repeat, clock="cpu")
        finally:
            torch.set_num_threads(before)
        rows[f"splitkv_131072_s64_threads{threads}_cpu_s"] = t
        print(f"split-KV decode Nk 131072, S 64, {threads} thread(s): {t:.2f} s of CPU")
    if a.out:
        timing.write(a.out, rows)


if __name__ == "__main__":
    main()
