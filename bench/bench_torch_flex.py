"""How often the torch_flex model equals compiled flex attention on CPU, bit for bit.

    python bench/bench_torch_flex.py                       # the default grid
    python bench/bench_torch_flex.py --n 128 200 --dtype bf16 --causal 1
    python bench/bench_torch_flex.py --ablations            # each modelled step undone
    python bench/bench_torch_flex.py --eager                # torch_flex_eager's candidates

Prints one row per (N, d, dtype, causal): the share of output elements the model
(flashnum.models.torch_flex) gives bit for bit, the kernel's and the model's time. Each
new shape compiles the kernel first (tens of seconds on 2 cores). --ablations repeats the
grid with one step of the model replaced by a plausible other (the share it falls to says
the kernel does what the model does there; "packing" off says whether this machine's
bf16 kernel takes the packed brgemm path). --eager: the share of the uncompiled
flex_attention's outputs each kernel-table candidate gives, over the audit's quick cases.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import time

import torch

from flashnum.audit.targets_torch import torch_flex, torch_flex_eager
from flashnum.models import torch_flex as model
from flashnum.models.torch_cpu_exp import exp64, expf
from flashnum.models.torch_flex import attention_torch_flex
from flashnum.numerics.accumulate import dot

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def share(n: int, d: int, precision: str, causal: bool, seed: int = 0, bh=(1, 2)):
    """(share of equal output elements, kernel seconds, model seconds: each a second call)
    on gaussian q, k, v."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*bh, n, d, generator=g).to(DTYPES[precision]) for _ in range(3))
    torch_flex(q, k, v, causal=causal)  # compile
    attention_torch_flex(q, k, v, precision=precision, causal=causal)  # warm, as the kernel
    t0 = time.perf_counter()
    out = torch_flex(q, k, v, causal=causal)
    t1 = time.perf_counter()
    res = attention_torch_flex(q, k, v, precision=precision, causal=causal)
    t2 = time.perf_counter()
    same = (res.out.to(out.dtype) == out).double().mean().item()
    return same, t1 - t0, t2 - t1


# each: (name, module attribute, its replacement)
ABLATIONS = (
    ("no packing (micro-GEMM S, unpacked brgemm P V)", "need_pack", lambda *a: False),
    ("tail exp by expf, not the double exp", "exp64", lambda x: expf(x).double()),
    ("tail P rounded to fp32 before the row sum adds it", "exp64",
     lambda x: exp64(x).float().double()),
    ("S as one FMA chain over d, not 16 lanes and the tree", "micro_gemm_qk",
     lambda q, k: dot(q.float(), k.float().transpose(-1, -2), "fp32")),
)


@contextlib.contextmanager
def replaced(attr, fn):
    old = getattr(model, attr)
    setattr(model, attr, fn)
    try:
        yield
    finally:
        setattr(model, attr, old)


def eager_candidates(precisions):
    """torch_flex_eager against every kernel-table candidate over the quick cases."""
    from flashnum.audit.cases import cases
    from flashnum.audit.kernel_table import CANDIDATES, _agreements, _share

    for p in precisions:
        agree = _agreements(torch_flex_eager, cases("quick"), p, "top_left", CANDIDATES)
        ranked = sorted(agree.items(), key=lambda kv: -_share(kv[1]))
        print(p, ", ".join(f"{s} {_share(t):.6f}" for s, t in ranked), flush=True)


def grid(a):
    print("N     d    dtype  causal  share      kernel_s  model_s")
    for n in a.n:
        for d in a.d:
            for p in a.dtype:
                for c in a.causal:
                    s, tk, tm = share(n, d, p, bool(c))
                    print(f"{n:<5} {d:<4} {p:<6} {c:<7} {s:.6f}   {tk:.4f}    {tm:.3f}",
                          flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[128, 200, 256])
    ap.add_argument("--d", type=int, nargs="+", default=[64])
    ap.add_argument("--dtype", nargs="+", default=["fp32", "bf16"], choices=list(DTYPES))
    ap.add_argument("--causal", type=int, nargs="+", default=[0, 1], choices=[0, 1])
    ap.add_argument("--ablations", action="store_true")
    ap.add_argument("--eager", action="store_true")
    a = ap.parse_args(argv)
    amx = "amx_bf16" in open("/proc/cpuinfo").read() if platform.system() == "Linux" else None
    print(f"# torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"AMX: {amx}, threads {torch.get_num_threads()}")
    if a.eager:
        eager_candidates(list(dict.fromkeys(a.dtype + ["fp16"])))
        return
    if not a.ablations:
        grid(a)
        return
    for name, attr, fn in ABLATIONS:
        print(f"# {name}")
        with replaced(attr, fn):
            grid(a)


if __name__ == "__main__":
    main()
