"""Audit the GPU attention kernels in one command (needs CUDA; not yet run here).

    python bench/audit_gpu.py                     # default budget, fp16 and bf16
    python bench/audit_gpu.py --budget quick --out bench/results/audit_gpu

Targets: torch SDPA restricted to each of its backends in turn (FLASH_ATTENTION,
EFFICIENT_ATTENTION, CUDNN_ATTENTION; torch.nn.attention.sdpa_kernel), and
flash_attn.flash_attn_func when flash-attn is installed (and flash_attn_interface's
FA3 in fp8 e4m3 when that is installed and the GPU supports it). Each runs
flashnum.audit on the CPU-made cases: inputs go to the GPU in the precision, the output
comes back. torch's is_causal aligns top-left, flash-attn's bottom-right (>= 2.1).
Writes <out>/<target>-<precision>/ (the report) and <out>/audit_gpu.json (every verdict
and the device).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import torch

import flashnum.audit as fa


def sdpa_backend(name):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, name)

    def fn(q, k, v, causal=False, scale=None):
        with sdpa_kernel(backend):
            out = torch.nn.functional.scaled_dot_product_attention(
                q.cuda(), k.cuda(), v.cuda(), is_causal=causal, scale=scale)
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", default="default", choices=fa.BUDGETS)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "audit_gpu"))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("audit_gpu: no CUDA device; nothing measured")
        return 2
    out = Path(args.out)
    runs = [(sdpa_backend(b), "top_left", p) for b in
            ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION") for p in ("fp16", "bf16")]
    if importlib.util.find_spec("flash_attn") is not None:
        runs += [(flash_attn_fn, "bottom_right", p) for p in ("fp16", "bf16")]
    if importlib.util.find_spec("flash_attn_interface") is not None:
        runs.append((fa3_fp8_fn, "bottom_right", "bf16"))
    verdicts = []
    for fn, alignment, precision in runs:
        name = getattr(fn, "__qualname__", fn.__name__)
        try:
            rep = fa.audit(fn, precision=precision, alignment=alignment, budget=args.budget,
                           model="fa2", progress=True)
        except RuntimeError as e:  # a backend this GPU or build does not offer
            verdicts.append(dict(target=name, precision=precision, error=str(e)[:200]))
            continue
        rep.save(out / f"{name}-{precision}".replace("[", "_").replace("]", ""))
        print(rep.summary())
        verdicts.append(dict(target=name, precision=precision, passed=rep.passed,
                             broken={k: len(v) for k, v in rep.broken().items()},
                             worst_err=float(rep.table["err_max"].max())))
    out.mkdir(parents=True, exist_ok=True)
    (out / "audit_gpu.json").write_text(json.dumps(dict(
        device=torch.cuda.get_device_name(), torch=torch.__version__, budget=args.budget,
        runs=verdicts), indent=1) + "\n")
    return 0 if all(v.get("passed") for v in verdicts) else 1


if __name__ == "__main__":
    raise SystemExit(main())
