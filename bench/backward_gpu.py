"""The Triton backward on a GPU: against the emulator and against torch's SDPA backward.

    python bench/backward_gpu.py           # on a CUDA GPU: all three parts, writes
                                           # bench/results/backward_gpu.json
    python bench/backward_gpu.py --quick   # the speed part at N <= 4096 only

1. Fidelity: the kernels (flashnum.backends.triton_backward) against the emulated fa2
   backward (flashnum.attention_backward) with the same forward O and LSE given to both
   (compare_backward): 2 heads, N = 512, d = 64, 64 x 64 blocks, bf16 and fp16, the exp
   and exp2 forms, causal or not; the ulp table per gradient ("elem": ulps of the output
   format at the emulator's value; "scaled": at the gradient's largest entry).
2. Accuracy: the kernel's gradients and those of torch's SDPA (autograd of
   scaled_dot_product_attention on cuda bf16 tensors) against the float64 reference
   (flashnum.reference_backward, method fp64), 2 heads, N = 1024, d = 64, Gaussian bf16
   inputs: max |g - ref| per gradient and kernel / SDPA (flash-attn's rule: <= 2).
3. Speed: the backward alone, batch 4 x 16 heads, N in {1024, 4096, 8192}, d in {64,
   128}, bf16: the three kernel launches on prepared device tensors (backward_kernels;
   the forward's O and LSE from SDPA and torch.logsumexp, outside the timing) against
   SDPA's backward (torch.autograd.grad of its output, the forward outside the timing),
   both by triton.testing.do_bench (median ms). Blocks 64 x 64 (32 x 32 where the
   kernel does not fit in shared memory, reported).

The result records the command and the machine, the GPU included (flashnum.harness.timing).
Without a CUDA GPU it says so and exits 0, writing nothing: nothing here has been
measured on a GPU yet (README: not yet measured).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch

from flashnum.harness import timing

OUT = Path(__file__).parent / "results" / "backward_gpu.json"


def bf16_inputs(z, n, d, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(z, n, d, generator=g).bfloat16().to(device) for _ in range(4)]


def fidelity():
    from flashnum.backends.triton_backward import compare_backward

    rows = []
    for precision in ("bf16", "fp16"):
        for exp2 in (False, True):
            for causal in (False, True):
                q, k, v, do = (x.double() for x in bf16_inputs(2, 512, 64, seed=1))
                t = compare_backward(q, k, v, do, precision=precision, block_m=64,
                                     block_n=64, causal=causal, exp2=exp2)
                rows.append(dict(precision=precision, exp2=exp2, causal=causal, **t))
    return rows


def accuracy(n=1024):
    import flashnum
    from flashnum.backends.triton_backward import attention_backward_triton

    q, k, v, do = (x.double() for x in bf16_inputs(2, n, 64, seed=2))
    ref = flashnum.reference_backward(q, k, v, do, method="fp64")
    g = attention_backward_triton(q, k, v, do, block_m=64, block_n=64)
    qs, ks, vs = (x.bfloat16().cuda().requires_grad_() for x in (q, k, v))
    o = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs)
    sdpa = torch.autograd.grad(o, (qs, ks, vs), do.bfloat16().cuda())
    out = {"n": n, "d": 64, "heads": 2}
    for name, base in zip(("dq", "dk", "dv"), sdpa, strict=True):
        r = getattr(ref, name)
        e_k = float((getattr(g, name).cpu() - r).abs().max())
        e_t = float((base.double().cpu() - r).abs().max())
        out[name] = {"kernel_err": e_k, "sdpa_err": e_t, "ratio": e_k / e_t}
    return out


def _prepared(z, n, d):
    """Device tensors for backward_kernels and for SDPA's backward, from one input."""
    q, k, v, do = bf16_inputs(z, n, d, device="cuda")
    sc = 1 / math.sqrt(d)
    qs, ks, vs = (x.clone().requires_grad_() for x in (q, k, v))
    o = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs)
    lse = torch.stack([torch.logsumexp((q[i].float() @ k[i].float().T) * sc, -1)
                       for i in range(z)])  # one head at a time: N x N fp32 per head
    return q, k, v, do, o, lse, (qs, ks, vs), sc


def speed(sizes):
    rows = [_speed_one(n, d) for d in (64, 128) for n in sizes]
    return rows


def _speed_one(n, d, batch=4, heads=16):
    import triton

    from flashnum.backends.triton_backward import BackwardKernel, backward_kernels

    too_big = getattr(triton.runtime.errors, "OutOfResources", RuntimeError)
    q, k, v, do, o, lse, leaves, sc = _prepared(batch * heads, n, d)
    qk = float(torch.tensor(sc, dtype=torch.float32))
    o_stored = o.detach()
    row = dict(batch=batch, heads=heads, n=n, d=d)
    for bm, bn in ((64, 64), (32, 32)):
        kernel = BackwardKernel(block_m=bm, block_n=bn, causal=False, p_format="bf16",
                                ds_format="bf16", out_format="bf16")
        order = torch.arange(math.ceil(n / bn), dtype=torch.int32, device="cuda")

        def kernels(kernel=kernel, order=order):
            return backward_kernels(q, k, v, do, o_stored, lse, order, qk, qk, kernel)

        try:
            row["kernel_ms"] = triton.testing.do_bench(kernels)
            row["blocks"] = f"{bm}x{bn}"
            break
        except too_big as e:
            row[f"blocks_{bm}x{bn}"] = f"does not fit: {e}"
    row["sdpa_ms"] = triton.testing.do_bench(
        lambda: torch.autograd.grad(o, leaves, do, retain_graph=True))
    flops = 10 * batch * heads * n * n * d  # 5 GEMMs of 2 N^2 d flops per head
    got = "kernel_ms" in row
    row["kernel_tflops"] = flops / row["kernel_ms"] / 1e9 if got else None
    row["sdpa_tflops"] = flops / row["sdpa_ms"] / 1e9
    row["ratio_kernel_over_sdpa_time"] = row["kernel_ms"] / row["sdpa_ms"] if got else None
    torch.cuda.empty_cache()
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="speed at N <= 4096 only")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("backward_gpu: no CUDA GPU here; nothing measured, nothing written")
        return 0
    import triton

    res = dict(**timing.facts(), triton=triton.__version__)
    res.update(fidelity=fidelity(), accuracy=accuracy(),
               speed=speed([1024, 4096] if args.quick else [1024, 4096, 8192]))
    timing.write(OUT, res)
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
