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

Without a CUDA GPU it says so, runs a small interpreter run instead (the interpreter's
exp accuracy and dot summation order, and the fidelity table of tests/test_triton.py's
case: 2 x 2 heads, Nq = 96, Nk = 110, d = 64, 32 x 32 blocks, seeds 0, 1, 2; ~20-40 s),
writes bench/results/triton_interpreter.json, and exits 0.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from functools import partial
from pathlib import Path

import torch

# first: on a CPU this sets TRITON_INTERPRET=1 before triton is imported
from flashnum.backends import triton as tf  # isort: skip
from flashnum.harness import timing  # isort: skip

OUT = Path(__file__).parent / "results"
CONFIGS = [  # (block_m, block_n, num_warps, num_stages): reported each, never tuned away
    (64, 64, 4, 3),
    (128, 64, 4, 3),
    (128, 64, 8, 3),
    (128, 128, 8, 2),
]


def fidelity_rows(lead, nq, nk, ds, precisions, variants, block, seeds=(0,), fusion=(False,)):
    rows = []
    for seed in seeds:
        for d in ds:
            g = torch.Generator().manual_seed(seed)
            q = torch.randn(*lead, nq, d, generator=g)
            k, v = (torch.randn(*lead, nk, d, generator=g) for _ in range(2))
            for precision in precisions:
                for variant in variants:
                    for fp_fusion in fusion if precision == "bf16" else (False,):
                        t = time.perf_counter()
                        c = tf.compare_with_engine(
                            q, k, v, precision=precision, block_m=block, block_n=block,
                            variant=variant, fp_fusion=fp_fusion,
                        )
                        rows.append(dict(
                            lead=list(lead), nq=nq, nk=nk, d=d, block=block, seed=seed,
                            precision=precision, variant=variant, fp_fusion=fp_fusion,
                            seconds=round(time.perf_counter() - t, 2), **c,
                        ))
                        e, s = c["elem"], c["scaled"]
                        print(f"  seed {seed} d={d:3d} {precision:5s} {variant:4s} "
                              f"fusion={int(fp_fusion)}  elem <=0 {e['le0']:.5f} "
                              f"<=1 {e['le1']:.5f} <=2 {e['le2']:.5f} max {e['max']:9.1f} | "
                              f"scaled <=1 {s['le1']:.5f} <=2 {s['le2']:.5f} max {s['max']:5.2f}"
                              f"  m equal {c['m_equal']}", flush=True)
    return rows


def interpreter_facts():
    """What the interpreter computes differently from the engine, measured (docs/kernel.md).

    exp/exp2: numpy float32 (what tl.exp/tl.exp2 run on the interpreter) vs the
    correctly rounded value, over 2e6 arguments uniform in [-30, 0]. Dots: numpy fp32
    matmul (the interpreter's tl.dot) vs torch's (the engine's) and vs a sequential sum
    over the head dim, for fp16-valued operands of shape (64, d) x (d, 64).
    """
    import numpy as np

    rng = np.random.default_rng(0)
    x = (-rng.random(2_000_000) * 30).astype(np.float32)
    facts = {}
    for name, fn in (("exp", np.exp), ("exp2", np.exp2)):
        cr = fn(x.astype(np.float64)).astype(np.float32)
        ulps = np.abs(fn(x).astype(np.float64) - cr) / np.spacing(cr)
        facts[name] = dict(frac_not_correctly_rounded=float(np.mean(ulps > 0)),
                           max_ulp=float(ulps.max()))
    for d in (64, 128, 192, 256):
        a = rng.standard_normal((64, d)).astype(np.float16).astype(np.float32)
        b = rng.standard_normal((d, 64)).astype(np.float16).astype(np.float32)
        seq = np.zeros((64, 64), np.float32)
        for i in range(d):
            seq += a[:, i : i + 1] * b[i : i + 1, :]
        n = np.matmul(a, b)
        t = (torch.from_numpy(a) @ torch.from_numpy(b)).numpy()
        facts[f"dot_d{d}"] = dict(numpy_eq_sequential=float(np.mean(n == seq)),
                                  numpy_eq_torch=float(np.mean(n == t)))
    for key, val in facts.items():
        print(f"  {key}: {val}")
    return facts


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
        run = partial(
            tf.fa2_forward, q3, k3, v3, None, qk_scale=float(torch.tensor(d**-0.5).float()),
            block_m=bm, block_n=bn, causal=False, base2=False, l_from_cast=False,
            qk_precision="ieee", pv_precision="ieee", p_format=dtype_name,
            out_format=dtype_name, num_warps=warps, num_stages=stages,
        )
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
        print("bench_triton_gpu: needs a CUDA GPU; none here. Running a small interpreter run "
              "instead (the figures docs/kernel.md and tests/test_triton.py quote).")
        print("interpreter facts (fractions of elements):")
        facts = interpreter_facts()
        print("fidelity: kernel vs engine, ulps of the output format")
        # tests/test_triton.py::test_ulp_distribution_vs_engine's case (seed 0), seeds 1, 2
        rows = fidelity_rows((2, 2), 96, 110, (64,), ("fp16", "bf16", "fp32"),
                             ("fa2", "exp2"), block=32, seeds=(0, 1, 2))
        path = timing.write(OUT / "triton_interpreter.json",
                            dict(meta=meta(), facts=facts, fidelity=rows))
        print(f"wrote {path}")
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
