"""The Triton kernel on a GPU: fidelity to the engine and speed against torch's SDPA.

    python bench/bench_triton_gpu.py           # on a CUDA GPU: both parts, writes
                                               # bench/results/triton_gpu.json
    python bench/bench_triton_gpu.py --quick   # fewer sizes (N <= 4096)

1. Fidelity: kernel vs engine (flashnum.attention, backend emulate, same policy,
   tiling and order), one batch of 4 heads, N = 1024, d in {64, 128}, 64 x 64 blocks,
   fa2 and exp2, fp16 / bf16 / fp32 (ieee dots) / tf32, fp_fusion off (and on, for
   bf16): the ulp table of flashnum.backends.triton.compare_with_engine ("elem":
   ulps at |out|, "scaled": ulps at softmax(S) @ |V|).
2. Speed: forward, non-causal, batch 4 x 32 heads, N in {1024, 4096, 8192, 16384},
   d in {64, 128}, fp16 and bf16: the kernel (fa2_forward, forward order, trace off,
   the launch only: inputs prepared once) at a few fixed (block_m, block_n, warps,
   stages), each reported (no autotuning), against
   torch.nn.functional.scaled_dot_product_attention restricted to the flash backend,
   both timed by triton.testing.do_bench (median ms). TFLOP/s = 4 B H N^2 d / time.
   Goal: best kernel >= 0.8 x SDPA at N = 8192, d = 128, bf16.

Without a CUDA GPU it says so and exits 0: the interpreter's figures (its exp accuracy and
dot summation order, and the fidelity table of tests/test_triton.py's case) are the
experiment triton_interpreter (python -m flashnum.run experiment=triton_interpreter).
"""

from __future__ import annotations

import argparse
import math
import sys
from functools import partial
from pathlib import Path

import torch

# first: on a CPU this sets TRITON_INTERPRET=1 before triton is imported
from flashnum.backends import triton as tf  # isort: skip
from flashnum.harness import timing  # isort: skip
from flashnum.studies.kernel_agreement import fidelity_rows  # isort: skip

OUT = Path(__file__).parent / "results"
CONFIGS = [  # (block_m, block_n, num_warps, num_stages): reported each, never tuned away
    (64, 64, 4, 3),
    (128, 64, 4, 3),
    (128, 64, 8, 3),
    (128, 128, 8, 2),
]


def sdpa_flash(q, k, v):
    backend = torch.nn.attention.SDPBackend.FLASH_ATTENTION
    with torch.nn.attention.sdpa_kernel(backend):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def speed_row(dtype_name, n, d, batch=4, heads=32):
    from triton.testing import do_bench

    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=dtype, generator=g)
               for _ in range(3))
    flops = 4.0 * batch * heads * n * n * d
    ms_sdpa = do_bench(partial(sdpa_flash, q, k, v), warmup=25, rep=100, return_mode="median")
    ref = sdpa_flash(q, k, v).reshape(batch * heads, n, d).float()
    q3, k3, v3 = (x.reshape(batch * heads, n, d) for x in (q, k, v))
    row = dict(dtype=dtype_name, n=n, d=d, batch=batch, heads=heads, sdpa_ms=ms_sdpa,
               sdpa_tflops=flops / ms_sdpa * 1e-9, triton=[])
    for bm, bn, warps, stages in CONFIGS:
        kernel = tf.Kernel(qk_scale=float(torch.tensor(d**-0.5).float()), block_m=bm,
                           block_n=bn, causal=False, base2=False, l_from_cast=False,
                           qk_precision="ieee", pv_precision="ieee", p_format=dtype_name,
                           out_format=dtype_name)
        run = partial(tf.fa2_forward, q3, k3, v3, None, kernel,
                      tf.Launch(num_warps=warps, num_stages=stages))
        cfg = dict(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages)
        try:
            err = float((run()["o"].float() - ref).abs().max())
            ms = do_bench(run, warmup=25, rep=100, return_mode="median")
            cfg.update(ms=ms, tflops=flops / ms * 1e-9, ratio=ms_sdpa / ms,
                       max_abs_diff_vs_sdpa=err)
        except Exception as exc:  # e.g. out of shared memory for this config
            cfg.update(error=f"{type(exc).__name__}: {str(exc)[:200]}")
        row["triton"].append(cfg)
    ok = [c for c in row["triton"] if "ms" in c]
    row["best_ratio"] = max((c["ratio"] for c in ok), default=None)
    print(f"  {dtype_name} d={d:3d} N={n:5d}  sdpa {ms_sdpa:8.3f} ms "
          f"({row['sdpa_tflops']:6.1f} TFLOP/s)  triton best x{row['best_ratio'] or math.nan:.3f}  "
          + "  ".join(f"{c['block_m']}x{c['block_n']}/w{c['num_warps']}s{c['num_stages']}: "
                      f"{c.get('tflops', math.nan):.1f}" for c in row["triton"]), flush=True)
    return row


def speed_rows(ns, ds, dtypes):
    rows = []
    for dtype_name in dtypes:
        for d in ds:
            for n in ns:
                rows.append(speed_row(dtype_name, n, d))
                torch.cuda.empty_cache()
    return rows


def meta():
    """The command and the machine (flashnum.harness.timing), triton and the device."""
    import triton

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return dict(**timing.facts(), triton=triton.__version__, interpreter=tf.INTERPRET,
                device=device)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="N <= 4096 for the speed part")
    args = ap.parse_args(argv)
    OUT.mkdir(exist_ok=True)

    if not torch.cuda.is_available():
        print("bench_triton_gpu: needs a CUDA GPU; none here. The interpreter's figures: "
              "python -m flashnum.run experiment=triton_interpreter")
        return 0

    result = dict(meta=meta())
    print("fidelity: kernel vs engine, ulps of the output format")
    result["fidelity"] = fidelity_rows(
        (1, 4), 1024, 1024, (64, 128), ("fp16", "bf16", "fp32", "tf32"), ("fa2", "exp2"),
        block=64, fusion=(False, True),
    )
    print("speed: forward, non-causal, 4 x 32 heads")
    ns = (1024, 4096) if args.quick else (1024, 4096, 8192, 16384)
    result["speed"] = speed_rows(ns, (64, 128), ("fp16", "bf16"))
    goal = [r for r in result["speed"] if (r["dtype"], r["n"], r["d"]) == ("bf16", 8192, 128)]
    if goal:
        result["goal"] = dict(n=8192, d=128, dtype="bf16", want_ratio=0.8,
                              best_ratio=goal[0]["best_ratio"],
                              met=(goal[0]["best_ratio"] or 0) >= 0.8)
        print(f"goal (bf16, N=8192, d=128, >= 0.8 x SDPA): {result['goal']}")
    path = timing.write(OUT / "triton_gpu.json", result)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
