"""How exactly attention(model="torch_cpu") reproduces torch's CPU SDPA forward: the table
of the experiment torch_cpu_forward (conf/table/torch_cpu_forward.yaml; docs/audit.md
quotes it through flashnum.figures.docs, tests/test_quoted.py).

    python -m flashnum.run experiment=torch_cpu_forward

For fp32, bf16 and fp16, causal (torch's is_causal: top-left) or not, and a set of shapes
(ragged N, decode shapes with a few query rows against thousands of keys, head dims 64, 80,
128), it compares flashnum.attention(..., model="torch_cpu") with ATen's
_scaled_dot_product_flash_attention_for_cpu (what scaled_dot_product_attention runs on a
CPU) element by element. One row per (precision, shape, causal, seed): the share of output
elements and of LSEs equal bit for bit, the largest difference in units of the output's
ulp, and the machine it ran on (threads, cpu, cpu_count, cpu_capability: the kernel's
vector code and its split over threads are the CPU's). Run it as a fresh process without
OMP_NUM_THREADS, as torch_cpu_backward. bench/bench_torch_cpu.py times the two.
"""

from __future__ import annotations

import os

import pandas as pd
import torch

from flashnum.api import attention
from flashnum.studies.torch_cpu_backward_agreement import DTYPES, SHAPE, cpu_name


def ulp(x: torch.Tensor) -> torch.Tensor:
    """The spacing of the output format at |x| (its ulp), as float64."""
    info = torch.finfo(x.dtype)
    mag = x.double().abs().clamp_min(info.tiny)
    return torch.exp2(torch.floor(torch.log2(mag))) * info.eps


def compare(precision: str, shape, causal: bool, seed: int) -> dict:
    """One row: torch's CPU kernel against the model, output and LSE."""
    b, h, nq, nk, d = shape
    dtype = DTYPES[precision]
    g = torch.Generator().manual_seed(seed)
    q, k, v = [torch.randn(b, h, n, d, generator=g).to(dtype) for n in (nq, nk, nk)]
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, is_causal=causal)[:2]
    res = attention(q, k, v, precision=precision, model="torch_cpu",
                    causal="top_left" if causal else False)  # torch's is_causal
    mine = res.out.to(dtype)
    diff = (mine.double() - out.double()).abs()
    return dict(precision=precision, **dict(zip(SHAPE, shape, strict=True)), causal=causal,
                seed=seed, elements=out.numel(),
                bitwise=float((mine == out).double().mean()),
                lse_bitwise=float((res.lse.float() == lse).double().mean()),
                max_ulps=float((diff / ulp(out)).max()))


def torch_cpu_forward_table(shapes, precisions=tuple(DTYPES), seed: int = 0) -> pd.DataFrame:
    """One row per precision x shape (B, H, Nq, Nk, d) x causal or not."""
    rows = []
    for precision in precisions:
        for shape in shapes:
            for causal in (False, True):
                r = compare(precision, tuple(shape), causal, seed)
                rows.append(r)
                print(f"{precision} {tuple(shape)} causal={causal}: bitwise "
                      f"{100 * r['bitwise']:.4f}% lse {100 * r['lse_bitwise']:.4f}% max "
                      f"{r['max_ulps']:.2f} ulp", flush=True)
    return pd.DataFrame(rows).assign(
        threads=torch.get_num_threads(), cpu=cpu_name(), cpu_count=os.cpu_count(),
        cpu_capability=torch.backends.cpu.get_cpu_capability())
