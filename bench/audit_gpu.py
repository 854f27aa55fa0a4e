"""Audit the GPU attention kernels, output and gradients, in one command (needs CUDA; not
yet run here).

    python bench/audit_gpu.py                     # default budget, fp16 and bf16, backward
    python bench/audit_gpu.py --budget quick --out bench/results/audit_gpu
    python bench/audit_gpu.py --no-backward       # the forward only
    python bench/audit_gpu.py --device cpu --backends FLASH_ATTENTION --max-cases 2  # smoke

Targets: torch SDPA restricted to each of its backends in turn (FLASH_ATTENTION,
EFFICIENT_ATTENTION, CUDNN_ATTENTION; torch.nn.attention.sdpa_kernel), and
flash_attn.flash_attn_func when flash-attn is installed (and flash_attn_interface's
FA3 in fp8 e4m3 when that is installed and the GPU supports it). Each runs
flashnum.audit on the CPU-made cases: inputs go to the GPU in the precision, the output
comes back; with backward (the default) the audit differentiates through the same call
(the moves to and from the GPU are differentiable, so dQ, dK, dV are the kernel's own
backward's; FA3's fp8 forward has no backward and is audited forward only). A failing
run is diagnosed (the closest flashnum model, its dominant site, the worst case).
torch's is_causal aligns top-left, flash-attn's bottom-right (>= 2.1). Writes
<out>/<target>-<precision>/ (the report) and <out>/audit_gpu.json (every verdict per
rule, the worst case, the closest model, and the device).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import pandas as pd
import torch

import flashnum.audit as fa
import flashnum.audit.diagnosis  # noqa: F401  (fa.diagnosis.worst_case)

BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION")


def sdpa_backend(name, device="cuda"):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, name)

    def fn(q, k, v, causal=False, scale=None):
        with sdpa_kernel(backend):
            out = torch.nn.functional.scaled_dot_product_attention(
                q.to(device), k.to(device), v.to(device), is_causal=causal, scale=scale)
        return out.cpu()

    fn.__qualname__ = f"torch_sdpa[{name}]"
    return fn


def flash_attn_fn(q, k, v, causal=False, scale=None):
    from flash_attn import flash_attn_func

    out = flash_attn_func(*(x.cuda().transpose(1, 2) for x in (q, k, v)), softmax_scale=scale,
                          causal=causal)
    return out.transpose(1, 2).cpu()


def fa3_fp8_fn(q, k, v, causal=False, scale=None):
    """FA3's fp8 forward: inputs cast to e4m3 on the GPU, output in bf16 (audited in bf16)."""
    from flash_attn_interface import flash_attn_func

    f8 = [x.cuda().transpose(1, 2).to(torch.float8_e4m3fn) for x in (q, k, v)]
    out = flash_attn_func(*f8, softmax_scale=scale, causal=causal)
    out = out[0] if isinstance(out, tuple) else out
    return out.transpose(1, 2).to(q.dtype).cpu()


def _verdict(rep, name, precision, backward) -> dict:
    d = rep.diagnosis or {}
    closest = d.get("closest")
    return dict(target=name, precision=precision, backward=backward, passed=rep.passed,
                broken={k: len(v) for k, v in rep.broken().items()},
                worst=fa.diagnosis.worst_case(rep.table),
                closest=None if closest is None else dict(
                    model=closest["model"], bitwise=closest["bitwise"]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", default="default", choices=fa.BUDGETS)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "audit_gpu"))
    ap.add_argument("--device", default="cuda", help="cuda (default), or cpu for a smoke run")
    ap.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    ap.add_argument("--precisions", nargs="+", default=["fp16", "bf16"],
                    choices=["fp16", "bf16", "fp32"])
    ap.add_argument("--no-backward", dest="backward", action="store_false",
                    help="audit the forward only")
    ap.add_argument("--max-cases", type=int, default=None, help="the budget's first N cases")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("audit_gpu: no CUDA device; nothing measured")
        return 2
    out = Path(args.out)
    runs = [(sdpa_backend(b, args.device), "top_left", p, args.backward)
            for b in args.backends for p in args.precisions]
    if args.device == "cuda" and importlib.util.find_spec("flash_attn") is not None:
        runs += [(flash_attn_fn, "bottom_right", p, args.backward) for p in args.precisions]
    if args.device == "cuda" and importlib.util.find_spec("flash_attn_interface") is not None:
        runs.append((fa3_fp8_fn, "bottom_right", "bf16", False))  # no fp8 backward
    case_list = fa.cases(args.budget)[: args.max_cases]
    verdicts = []
    for fn, alignment, precision, backward in runs:
        name = getattr(fn, "__qualname__", fn.__name__)
        try:
            rep = fa.audit(fn, precision=precision, alignment=alignment, case_list=case_list,
                           progress=True, backward=backward)
        except RuntimeError as e:  # a backend this GPU or build does not offer
            verdicts.append(dict(target=name, precision=precision, error=str(e)[:200]))
            continue
        msgs = rep.table["message"] if "message" in rep.table else pd.Series([], dtype=str)
        if len(rep.broken().get("crash", [])) == len(rep.table) and msgs.astype(str).str.startswith(
                "raised RuntimeError").all():  # every call refused: not offered here
            verdicts.append(dict(target=name, precision=precision, error=str(msgs.iloc[0])[:200]))
            continue
        rep.save(out / f"{name}-{precision}".replace("[", "_").replace("]", ""))
        print(rep.summary())
        verdicts.append(_verdict(rep, name, precision, backward))
    out.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    (out / "audit_gpu.json").write_text(json.dumps(dict(
        device=device, torch=torch.__version__, budget=args.budget,
        max_cases=args.max_cases, runs=verdicts), indent=1, default=str) + "\n")
    return 0 if all(v.get("passed") for v in verdicts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
