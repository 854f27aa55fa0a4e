"""Bitwise agreement of flashnum's lowp policy with Qiu & Yao's released attention.py.

    python bench/qiu_yao_agreement.py PATH/TO/attention.py     # their repository's file
    python bench/qiu_yao_agreement.py PATH --out bench/results/qiu_yao_agreement.json

Their code (github.com/ucker/why-low-precision-training-fails, attention.py; no licence,
so it never enters this repository) is imported from PATH and run unchanged on CPU: its
FlashAttentionFunction with 512 x 512 buckets, every tensor bf16. Its only import
outside torch, einops.rearrange, is used for padding masks, which are not passed here; a
stand-in module is provided when einops is not installed. Their fix is switched by the
environment variable STABLE (read at every block).

For each case it compares, element by element, their plain forward (STABLE=0) with
flashnum.attention(precision="bf16", policy="lowp", block_m=512, block_n=512), and their
fix (STABLE=1) with variant="qiu_yao_released" (the model of their code) and with the
idealised variant="qiu_yao" (how far the paper's fix is from their release). Cases:
d = 64 and 128, causal and not, gaussian, peaked ties (logit std 16), gaussian inputs
whose row maxima lie in [0.25, 0.5) (sigma 0.34; the median row max is recorded), and
ties at logit std 8, whose row maxima straddle the clamp onset (23.7).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import types
from pathlib import Path

import torch

import flashnum
from flashnum.inputs.distributions import make

CASES = [  # (distribution, params, N, d, causal)
    ("gaussian", {}, 1024, 64, False),
    ("gaussian", {}, 1024, 128, False),
    ("gaussian", {}, 1024, 64, True),
    ("gaussian", {}, 1024, 128, True),
    ("ties", {"logit_std": 16.0}, 1024, 64, False),
    ("ties", {"logit_std": 16.0}, 1024, 128, True),
    ("gaussian", {"sigma": 0.34}, 1024, 64, False),  # median row max of the logits ~0.37
    ("ties", {"logit_std": 8.0}, 1024, 64, True),  # median row max ~24: the clamp onset
]
PAIRS = ((False, "fa2"), (True, "qiu_yao_released"), (True, "qiu_yao"))  # (STABLE, variant)


def load(path: str):
    if importlib.util.find_spec("einops") is None:
        stub = types.ModuleType("einops")

        def rearrange(*a, **k):
            raise NotImplementedError("einops stand-in: padding masks are not supported")

        stub.rearrange = rearrange
        sys.modules["einops"] = stub
    spec = importlib.util.spec_from_file_location("qiu_yao_attention", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.FlashAttentionFunction


def theirs(fn, q, k, v, causal, stable):
    os.environ["STABLE"] = "1" if stable else "0"
    with torch.no_grad():
        return fn.apply(q, k, v, None, causal, 512, 512)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", help="their attention.py")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" /
                                         "qiu_yao_agreement.json"))
    args = ap.parse_args(argv)
    fn = load(args.path)
    rows = []
    for name, params, n, d, causal in CASES:
        inp = make(name, batch=1, heads=4, seq_len_q=n, head_dim=d, seed=0, **params)
        q, k, v = (x.to(torch.bfloat16) for x in (inp.q, inp.k, inp.v))
        row_max = float((q.double() @ k.double().transpose(-1, -2) / d**0.5).amax(-1).median())
        refs = {}
        for stable, variant in PAIRS:
            if stable not in refs:
                refs[stable] = theirs(fn, q, k, v, causal, stable)
            ref = refs[stable]
            ours = flashnum.attention(q, k, v, precision="bf16", policy="lowp", block_m=512,
                                      block_n=512, causal=causal, variant=variant).out
            same = float((ours.to(torch.bfloat16) == ref).double().mean())
            diff = (ours - ref.double()).abs().max().item()
            rows.append(dict(distribution=name, params=params, n=n, d=d, causal=causal,
                             stable=stable, variant=variant, bitwise=same, max_diff=diff,
                             median_row_max=row_max))
            print(f"{name} {params} N={n} d={d} causal={causal} STABLE={int(stable)} vs "
                  f"{variant}: bitwise {100 * same:.2f}%, max |diff| {diff:.3g}", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(dict(torch=torch.__version__, cases=rows), indent=1)
                              + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
