"""How exactly attention_backward(policy="torch_cpu") reproduces torch's CPU SDPA backward.

    python bench/torch_cpu_backward_agreement.py          # bench/results/torch_cpu_backward.json
    python bench/torch_cpu_backward_agreement.py --quick  # three small shapes

For fp32, bf16 and fp16, causal (torch's is_causal: top-left) or not, and a set of shapes
(ragged N, Nq != Nk both ways, decode rows, d = 64, 80, 128), it runs autograd through
torch.nn.functional.scaled_dot_product_attention (ATen's cpu_flash_attention_backward) and
counts, for dQ, dK and dV each, the entries that flashnum gives bit for bit:

  backward   policy torch_cpu given torch's forward O and LSE: the backward model alone
  end_to_end policy torch_cpu with flashnum's own torch_cpu forward (what
             attention_backward(..., policy="torch_cpu") returns by default)
  fa2, naive the emulator's presets (their own forward; block_m = block_n = 64), where
             their causal mask is torch's (non-causal, or Nq = Nk): the baseline

Run it as a fresh process: the script never calls torch.set_num_threads, which would
switch MKL's dynamic threading off and change torch's own fp32 gradients (see
flashnum/engine/torch_cpu_backward.py). It records torch's version, the thread count, the
CPU and the command.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import flashnum
from flashnum.engine.torch_cpu_backward import attention_backward_torch_cpu

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
GRADS = ("dq", "dk", "dv")
SHAPES = [  # (B, H, Nq, Nk, d)
    (1, 4, 256, 256, 64), (1, 2, 600, 600, 64), (1, 4, 1024, 1024, 64), (2, 2, 600, 600, 80),
    (1, 4, 77, 1000, 128), (1, 4, 700, 300, 80), (1, 8, 4, 4096, 128), (1, 8, 1, 3000, 64),
    (1, 2, 1500, 1500, 128),
]
QUICK = [(1, 2, 300, 300, 64), (1, 2, 4, 2000, 128), (1, 2, 100, 777, 80)]
BASELINES = ("fa2", "naive")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def cpu_flags() -> list[str]:
    """The vector extensions that decide which code the libraries run."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines()
                  if ln.startswith("flags")), [])
    return sorted(f for f in flags if f.startswith(("avx512", "amx")) or f in ("avx2", "fma"))


def shares(g, want) -> dict:
    return {n: float((getattr(g, n).to(want[n].dtype) == want[n]).double().mean())
            for n in GRADS}


def compare(precision, shape, causal, seed, baselines=True):
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
    row = dict(precision=precision, shape=list(shape), causal=causal, seed=seed,
               elements={"dq": q.numel(), "dk": k.numel(), "dv": v.numel()},
               backward=shares(g, want), torch_s=torch_s, model_s=model_s)
    e2e = flashnum.attention_backward(q, k, v, do, precision=precision, policy="torch_cpu",
                                      causal=mask)
    row["end_to_end"] = shares(e2e, want)
    row["forward_bitwise"] = float((e2e.out.to(dtype) == out).double().mean())
    for name in BASELINES:  # flashnum's causal=True is bottom-right: torch's when Nq = Nk
        if baselines and (not causal or nq == nk):
            gb = flashnum.attention_backward(q, k, v, do, precision=precision, policy=name,
                                             causal=causal, block_m=64, block_n=64)
            row[name] = shares(gb, want)
        else:
            row[name] = None
    return row


def summarise(rows) -> dict:
    """Per precision and way of running: each gradient's share over all its entries, and the
    worst single comparison."""
    out = {}
    for prec in DTYPES:
        mine = [r for r in rows if r["precision"] == prec]
        out[prec] = {}
        for way in ("backward", "end_to_end", *BASELINES):
            have = [r for r in mine if r[way] is not None]
            if not have:
                continue
            out[prec][way] = {
                n: dict(share=sum(r[way][n] * r["elements"][n] for r in have)
                        / sum(r["elements"][n] for r in have),
                        worst=min(r[way][n] for r in have), comparisons=len(have))
                for n in GRADS}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-baselines", action="store_true", help="skip fa2 and naive")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"
                                         / "torch_cpu_backward.json"))
    args = ap.parse_args(argv)
    rows = []
    for precision in DTYPES:
        for shape in (QUICK if args.quick else SHAPES):
            for causal in (False, True):
                r = compare(precision, shape, causal, 0, not args.no_baselines)
                rows.append(r)
                line = " ".join(f"{n} {100 * r['backward'][n]:.4f}%" for n in GRADS)
                e2e = " ".join(f"{100 * r['end_to_end'][n]:.2f}" for n in GRADS)
                base = "" if r["fa2"] is None else " fa2 " + " ".join(
                    f"{100 * r['fa2'][n]:.1f}" for n in GRADS)
                print(f"{precision} {shape} causal={causal}: {line} | end-to-end {e2e} "
                      f"(forward {100 * r['forward_bitwise']:.3f}%){base}", flush=True)
    summary = summarise(rows)
    print(json.dumps(summary, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(dict(
        command=" ".join(["python bench/torch_cpu_backward_agreement.py", *(
            sys.argv[1:] if argv is None else argv)]),
        torch=torch.__version__, torch_git=torch.version.git_version,
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        threads=torch.get_num_threads(), machine=cpu_name(), cpu_count=os.cpu_count(),
        cpu_flags=cpu_flags(), load_average=os.getloadavg(), summary=summary, cases=rows),
        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
