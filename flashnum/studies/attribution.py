"""Where the error comes from, site by site: the stored attribution grid of the forward, and
the fa2 backward's dQ error on outlier inputs with one site at a time made wider. Each
section below describes one table.

-- attribution --

The stored attribution experiment: flashnum.analysis.attribution.attribute over a grid of
inputs x policies x precisions, one tidy table (experiments/attribution, written by
`python -m flashnum.attribute experiment=true`).

    from flashnum.studies.attribution import EXPERIMENT, experiment
    t = experiment(seeds=(0, 1))

-- bwd_delta_site --

Where does the fa2 backward's dQ error come from on outlier inputs? The table of the
experiment bwd_delta_site (conf/table/bwd_delta_site.yaml; docs/backward.md quotes it).

    python -m flashnum.run experiment=bwd_delta_site

The bwd_order case where the emulated fa2 backward breaks flash-attn's 2x rule on dQ
(fa3_outliers, seed 1, bf16, N = 64, d = 32, 16 x 16 blocks) rerun with one site at a
time made wider: O stored in fp32 (D = rowsum(dO * O) then reads an unrounded O), dS cast
in fp32, P cast in fp32. One row per (variant, gradient): its max error against the
certified reference (variant "torch bf16 autograd": torch's autograd of standard
attention in bf16), and the a-priori bound's dominant site of the fa2 policy.
"""

from __future__ import annotations

import json

import pandas as pd
import torch

from flashnum.analysis.attribution import attribute
from flashnum.analysis.bounds_backward import bound_backward
from flashnum.api import attention_backward
from flashnum.harness import backward as hb
from flashnum.inputs.distributions import make
from flashnum.numerics.policy import make_backward_policy, make_policy
from flashnum.reference import reference, reference_backward

# -- attribution --


EXPERIMENT = dict(
    distributions=("gaussian", "ties", "fa3_outliers", "plateau", "sink", "late_max"),
    # five independent draws per input: a site's share is reported over them, not one draw
    policies=("fa2", "lowp", "naive"), precisions=("bf16", "fp16"), seeds=(0, 1, 2, 3, 4),
    seq_len=256, head_dim=64, heads=2, block_n=64,
)


def experiment(**overrides) -> pd.DataFrame:
    """The stored attribution experiment: `attribute` over a grid of inputs x policies x
    precisions (EXPERIMENT, overridable), one tidy table with the case's columns."""
    g = {**EXPERIMENT, **overrides}
    frames = []
    for dist in g["distributions"]:
        for seed in g["seeds"]:
            inp = make(dist, heads=g["heads"], seq_len_q=g["seq_len"], head_dim=g["head_dim"],
                       seed=seed, block_n=g["block_n"])
            for precision in g["precisions"]:
                # the inputs as stored in the format: the error is the algorithm's own
                fin = make_policy("fa2", precision).fmt("inputs")
                q, k, v = fin.round(inp.q), fin.round(inp.k), fin.round(inp.v)
                ref = reference(q, k, v, causal=inp.causal, scale=inp.scale).out
                for policy in g["policies"]:
                    t = attribute(q, k, v, precision=precision, policy=policy, ref_out=ref,
                                  block_n=g["block_n"], causal=inp.causal, scale=inp.scale)
                    t.insert(0, "distribution", dist)
                    t.insert(1, "precision", precision)
                    t.insert(2, "policy", policy)
                    t.insert(3, "seed", seed)
                    t.insert(4, "seq_len_k", g["seq_len"])
                    t.insert(5, "block_n", g["block_n"])
                    frames.append(t)
    return pd.concat(frames, ignore_index=True)


# -- bwd_delta_site --


GRADS = ("dq", "dk", "dv")


def delta_site_table(distribution: str = "fa3_outliers", seed: int = 1) -> pd.DataFrame:
    torch.set_num_threads(1)
    case = dict(hb.DEFAULT, policy="fa2", precision="bf16", seq_len=64, head_dim=32, block=16,
                distribution=distribution, seed=seed)
    inp, do = hb.inputs(case)
    q, k, v = inp.q, inp.k, inp.v
    ref = reference_backward(q, k, v, do)
    base = hb._torch_autograd(q, k, v, do, False, None, "bf16")
    pol = make_backward_policy("fa2", "bf16")
    variants = {
        "fa2": pol,
        "O stored in fp32": pol.with_sites(forward=pol.forward.with_sites(out="fp32")),
        "dS cast in fp32": pol.with_sites(ds_cast="fp32"),
        "P cast in fp32": pol.with_sites(p_cast="fp32"),
    }
    dominant = bound_backward(q, k, v, do, block_m=16, block_n=16)["dominant_site"]
    rows = [dict(distribution=distribution, seed=seed, variant="torch bf16 autograd", grad=n,
                 err=float((base[n] - getattr(ref, n)).abs().max())) for n in GRADS]
    for name, p in variants.items():
        g = attention_backward(q, k, v, do, policy=p, block_m=16, block_n=16)
        rows += [dict(distribution=distribution, seed=seed, variant=name, grad=n,
                      err=float((getattr(g, n) - getattr(ref, n)).abs().max())) for n in GRADS]
    return pd.DataFrame(rows).assign(dominant_site=json.dumps(dominant, sort_keys=True))
