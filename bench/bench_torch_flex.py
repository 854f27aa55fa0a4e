"""How often the torch_flex model equals compiled flex attention on CPU, bit for bit.

    python bench/bench_torch_flex.py                       # the default grid
    python bench/bench_torch_flex.py --n 128 200 --dtype bf16 --causal 1

Prints one row per (N, d, dtype, causal): the share of output elements the model
(flashnum.models.torch_flex) gives bit for bit, the kernel's and the model's time. Each
new shape compiles the kernel first (tens of seconds on 2 cores).
"""

from __future__ import annotations

import argparse
import platform
import time

import torch

from flashnum.audit.targets_torch import torch_flex
from flashnum.models.torch_flex import attention_torch_flex

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def share(n: int, d: int, precision: str, causal: bool, seed: int = 0, bh=(1, 2)):
    """(share of equal output elements, kernel seconds, model seconds) on gaussian q, k, v."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*bh, n, d, generator=g).to(DTYPES[precision]) for _ in range(3))
    torch_flex(q, k, v, causal=causal)  # compile
    t0 = time.perf_counter()
    out = torch_flex(q, k, v, causal=causal)
    t1 = time.perf_counter()
    res = attention_torch_flex(q, k, v, precision=precision, causal=causal)
    t2 = time.perf_counter()
    same = (res.out.to(out.dtype) == out).double().mean().item()
    return same, t1 - t0, t2 - t1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[128, 200, 256])
    ap.add_argument("--d", type=int, nargs="+", default=[64])
    ap.add_argument("--dtype", nargs="+", default=["fp32", "bf16"], choices=list(DTYPES))
    ap.add_argument("--causal", type=int, nargs="+", default=[0, 1], choices=[0, 1])
    a = ap.parse_args(argv)
    amx = "amx_bf16" in open("/proc/cpuinfo").read() if platform.system() == "Linux" else None
    print(f"# torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"AMX: {amx}, threads {torch.get_num_threads()}")
    print("N     d    dtype  causal  share      kernel_s  model_s")
    for n in a.n:
        for d in a.d:
            for p in a.dtype:
                for c in a.causal:
                    s, tk, tm = share(n, d, p, bool(c))
                    print(f"{n:<5} {d:<4} {p:<6} {c:<7} {s:.6f}   {tk:.4f}    {tm:.3f}",
                          flush=True)


if __name__ == "__main__":
    main()
