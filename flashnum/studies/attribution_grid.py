"""The stored attribution experiment: flashnum.analysis.attribution.attribute over a grid of
inputs x policies x precisions, one tidy table (experiments/attribution, written by
`python -m flashnum.attribute experiment=true`).

    from flashnum.studies.attribution_grid import EXPERIMENT, experiment
    t = experiment(seeds=(0, 1))
"""

from __future__ import annotations

import pandas as pd

from flashnum.analysis.attribution import attribute
from flashnum.inputs.distributions import make
from flashnum.numerics.policy import make_policy
from flashnum.reference import reference

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
