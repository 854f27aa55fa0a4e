"""How exactly attention_backward(model="torch_cpu") reproduces torch's CPU SDPA backward:
the table of the experiment torch_cpu_backward (conf/table/torch_cpu_backward.yaml;
docs/audit.md and README quote it through flashnum.figures.docs, tests/test_quoted.py).

    python -m flashnum.run experiment=torch_cpu_backward

For fp32, bf16 and fp16, causal (torch's is_causal: top-left) or not, and a set of shapes
(ragged N, Nq != Nk both ways, decode rows, d = 64, 80, 128), it runs autograd through
torch.nn.functional.scaled_dot_product_attention (ATen's cpu_flash_attention_backward) and
counts, for dQ, dK and dV each, the entries that flashnum gives bit for bit:

  backward   policy torch_cpu given torch's forward O and LSE: the backward model alone
  end_to_end policy torch_cpu with flashnum's own torch_cpu forward (what
             attention_backward(..., model="torch_cpu") returns by default)
  fa2, naive the emulator's presets (their own forward; block_m = block_n = 64), where
             their causal mask is torch's (non-causal, or Nq = Nk): the baseline (else NaN)

One row per (precision, shape, causal, seed): the shares WAY_GRAD (backward_dq, ...), the
entries of each gradient (elements_dq, ...), the forward's share (forward_bitwise), the
timings, and the machine it ran on (threads, cpu, cpu_count, cpu_capability). Run it as a
fresh process (`python -m flashnum.run` is one) without OMP_NUM_THREADS: nothing here
calls torch.set_num_threads, which would switch MKL's dynamic threading off and change
torch's own fp32 gradients (see flashnum/models/torch_cpu_backward.py). `summary(df)` gives
each gradient's share over all its entries per precision and way.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F

from flashnum.api import attention_backward
from flashnum.models.torch_cpu_backward import attention_backward_torch_cpu

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
GRADS = ("dq", "dk", "dv")
WAYS = ("backward", "end_to_end", "fa2", "naive")
SHAPE = ("batch", "heads", "seq_len_q", "seq_len_k", "head_dim")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _shares(g, want) -> dict:
    return {n: float((getattr(g, n).to(want[n].dtype) == want[n]).double().mean())
            for n in GRADS}


def compare(precision: str, shape, causal: bool, seed: int) -> dict:
    """One row: torch's autograd against the model, end to end and the two presets."""
    b, h, nq, nk, d = shape
    dtype = DTYPES[precision]
    gen = torch.Generator().manual_seed(seed)
    q, k, v = [torch.randn(b, h, n, d, generator=gen).to(dtype) for n in (nq, nk, nk)]
    do = torch.randn(b, h, nq, d, generator=gen).to(dtype)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    t0 = time.perf_counter()
    F.scaled_dot_product_attention(*leaves, is_causal=causal).backward(do)
    torch_s = time.perf_counter() - t0
    want = dict(zip(GRADS, (x.grad for x in leaves), strict=True))
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, is_causal=causal)[:2]
    mask = "top_left" if causal else False
    t0 = time.perf_counter()
    g = attention_backward_torch_cpu(q, k, v, do, precision=precision, causal=mask,
                                     out=out, lse=lse)
    model_s = time.perf_counter() - t0
    ways = {"backward": _shares(g, want)}
    e2e = attention_backward(q, k, v, do, precision=precision, model="torch_cpu", causal=mask)
    ways["end_to_end"] = _shares(e2e, want)
    for name in ("fa2", "naive"):  # flashnum's causal=True is bottom-right: torch's if Nq = Nk
        if not causal or nq == nk:
            ways[name] = _shares(attention_backward(q, k, v, do, precision=precision,
                                                    policy=name, causal=causal, block_m=64,
                                                    block_n=64), want)
        else:
            ways[name] = dict.fromkeys(GRADS, float("nan"))
    return dict(precision=precision, **dict(zip(SHAPE, shape, strict=True)), causal=causal,
                seed=seed, **{f"elements_{n}": x.numel() for n, x in zip(GRADS, (q, k, v),
                                                                         strict=True)},
                **{f"{w}_{n}": ways[w][n] for w in WAYS for n in GRADS},
                forward_bitwise=float((e2e.out.to(dtype) == out).double().mean()),
                torch_s=torch_s, model_s=model_s)


def torch_cpu_backward_table(shapes, precisions=tuple(DTYPES), seed: int = 0) -> pd.DataFrame:
    """One row per precision x shape (B, H, Nq, Nk, d) x causal or not."""
    rows = []
    for precision in precisions:
        for shape in shapes:
            for causal in (False, True):
                r = compare(precision, tuple(shape), causal, seed)
                rows.append(r)
                print(f"{precision} {tuple(shape)} causal={causal}: " + " ".join(
                    f"{n} {100 * r[f'backward_{n}']:.4f}%" for n in GRADS), flush=True)
    return pd.DataFrame(rows).assign(
        threads=torch.get_num_threads(), cpu=cpu_name(), cpu_count=os.cpu_count(),
        cpu_capability=torch.backends.cpu.get_cpu_capability())


def summary(df: pd.DataFrame) -> dict:
    """{precision: {way: {grad: {share (over all entries), worst, comparisons}}}}, the ways
    without a value (a preset under a mask that is not torch's) left out."""
    out = {}
    for prec in DTYPES:
        mine = df[df.precision == prec]
        out[prec] = {}
        for way in WAYS:
            have = mine[mine[f"{way}_dq"].notna()]
            if len(have):
                out[prec][way] = {
                    n: dict(share=float((have[f"{way}_{n}"] * have[f"elements_{n}"]).sum()
                                        / have[f"elements_{n}"].sum()),
                            worst=float(have[f"{way}_{n}"].min()), comparisons=len(have))
                    for n in GRADS}
    return out
