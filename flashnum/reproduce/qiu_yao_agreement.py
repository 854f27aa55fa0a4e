"""Bitwise agreement of flashnum's lowp policy with Qiu & Yao's released attention.py: the
table of the experiment qiu_yao_agreement (conf/table/qiu_yao_agreement.yaml; docs/audit.md
and README quote it through flashnum.figures.docs, tests/test_quoted.py).

    FLASHNUM_QIU_YAO=PATH/attention.py python -m flashnum.run experiment=qiu_yao_agreement

Their code (github.com/ucker/why-low-precision-training-fails, attention.py at 02f0ab6; no
licence, so it never enters this repository) is imported from PATH and run unchanged on
CPU: its FlashAttentionFunction with 512 x 512 buckets, every tensor bf16. Its only import
outside torch, einops.rearrange, is used for padding masks, which are not passed here; a
stand-in module is provided when einops is not installed. Their fix is switched by the
environment variable STABLE (read at every block). Without the file the run stops with
one line and the stored table stays as it is (flashnum.harness.tables: `external`).

For each case it compares, element by element, their plain forward (STABLE=0) with
flashnum.attention(precision="bf16", policy="lowp", block_m=512, block_n=512), and their
fix (STABLE=1) with variant="qiu_yao_released" (the model of their code) and with the
idealised variant="qiu_yao" (how far the paper's fix is from their release). Cases:
d = 64 and 128, causal and not, gaussian, peaked ties (logit std 16), gaussian inputs
whose row maxima lie in [0.25, 0.5) (sigma 0.34; the median row max is recorded), and
ties at logit std 8, whose row maxima straddle the clamp onset (23.7). One row per
(case, STABLE, variant); `params` is canonical JSON.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import types

import pandas as pd
import torch

from flashnum.api import attention
from flashnum.inputs.distributions import make
from flashnum.numerics.accumulate import dot

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
    """Their FlashAttentionFunction, imported from the file at `path`."""
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


def ulp_diff(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """The largest |ours - ref| in bf16 ulps of the larger of the two (ulp(y) = 2^(e - 8)
    for y = m 2^e, m in [0.5, 1): bf16 keeps 8 significant bits)."""
    ours, ref = ours.double(), ref.double()
    _, e = torch.frexp(torch.maximum(ours.abs(), ref.abs()))
    ulp = torch.ldexp(torch.ones_like(ours), (e - 8).clamp(min=-133))  # bf16's least: 2^-133
    return float(((ours - ref).abs() / ulp).max())


def qiu_yao_agreement_table(path: str) -> pd.DataFrame:
    """One row per case and (STABLE, variant): the share of bitwise equal outputs, the
    largest difference (absolute and in bf16 ulps), the median row max of the logits."""
    fn = load(path)
    rows = []
    for name, params, n, d, causal in CASES:
        inp = make(name, batch=1, heads=4, seq_len_q=n, head_dim=d, seed=0, **params)
        q, k, v = (x.to(torch.bfloat16) for x in (inp.q, inp.k, inp.v))
        row_max = float((dot(q.double(), k.double().transpose(-1, -2), "fp64") / d**0.5)
                        .amax(-1).median())
        refs = {}
        for stable, variant in PAIRS:
            if stable not in refs:
                refs[stable] = theirs(fn, q, k, v, causal, stable)
            ref = refs[stable]
            ours = attention(q, k, v, precision="bf16", policy="lowp", block_m=512,
                             block_n=512, causal=causal, variant=variant).out
            same = float((ours.to(torch.bfloat16) == ref).double().mean())
            diff = (ours - ref.double()).abs().max().item()
            rows.append(dict(distribution=name, params=json.dumps(params, sort_keys=True),
                             n=n, d=d, causal=causal, stable=stable, variant=variant,
                             bitwise=same, max_diff=diff, max_ulp_diff=ulp_diff(ours, ref),
                             median_row_max=row_max))
            print(f"{name} {params} N={n} d={d} causal={causal} STABLE={int(stable)} vs "
                  f"{variant}: bitwise {100 * same:.2f}%, max |diff| {diff:.3g}", flush=True)
    return pd.DataFrame(rows)
