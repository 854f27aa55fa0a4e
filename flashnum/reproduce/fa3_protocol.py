"""FA3 Table 3's fp16 rows at one protocol fixed in advance, over seeds: the table of the
experiment fa3_protocol (conf/table/fa3_protocol.yaml; README, docs/reproductions.md and
the paper quote it through flashnum.figures.quantities).

    python -m flashnum.run experiment=fa3_protocol

`repro_fa3_table3` searches 36 protocols for the one that best matches the published
numbers (FA3 omits N, d and the seed); a best-of-36 match overstates the agreement. Here
one protocol is measured over seeds. Its shape was chosen after the search had found it
as the best joint match (so seeds 0-7, the table fa3_protocol, include the search's own
seed 0); conf/table/fa3_protocol_heldout.yaml runs it on seeds 100-115, committed before
that table's only run:

* FA3's own description: each entry of Q, K, V is N(0, 1) + N(0, 100) Bernoulli(0.001)
  (variance 100: outlier std 10), softmax scale 1/sqrt(d), RMSE against attention in
  float64 on the *unrounded* inputs;
* what FA3 does not state, chosen once, after the search: d = 128 (the head dimension of
  FA3's fp8 rows and of its headline benchmarks) and N = 8192 (the N of the fp8 rows of
  the same table, so that all six rows share one shape); 8 heads of 128 query rows against
  all N keys per seed (rows are independent, so the subsample estimates the RMSE of all N
  rows); fp16 `naive` (standard attention) and `fa2` with FlashAttention-2's forward tiles
  128 x 64.

One row per seed: the protocol's parameters, then the two RMSEs and their ratio.
`summary(df)` gives the spread over seeds (mean, min, max, relative standard deviation).
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from flashnum.analysis.metrics import head_rmse
from flashnum.api import attention
from flashnum.inputs.distributions import make
from flashnum.reference import plain64

PUBLISHED = {"naive": 3.2e-4, "fa2": 1.9e-4}  # FA3 Table 3, fp16 standard / FlashAttention-2


def rmse_at(seed: int, n: int, d: int, heads: int, rows: int, outlier_std: float, p: float,
            block_m: int, block_n: int) -> dict:
    """The fp16 RMSE of standard attention and of FA2 at one seed, and their ratio."""
    inp = make("fa3_outliers", heads=heads, seq_len_q=rows, seq_len_k=n, head_dim=d,
               seed=seed, outlier_std=outlier_std, p=p)
    q, k, v = (x.to(torch.float64) for x in inp.tensors())
    scale = 1 / math.sqrt(d)
    exact = plain64(q, k, v, scale=scale)  # FA3's "attention in FP64"
    out = {}
    for policy in ("naive", "fa2"):
        res = attention(q, k, v, precision="fp16", policy=policy, scale=scale,
                        block_m=block_m, block_n=block_n)
        out[f"rmse_{policy}"], _ = head_rmse(res.out, exact)
    out["ratio"] = out["rmse_naive"] / out["rmse_fa2"]
    return out


def fa3_protocol_table(seeds: int = 8, n: int = 8192, d: int = 128, heads: int = 8,
                       rows: int = 128, outlier_std: float = 10.0, p: float = 0.001,
                       block_m: int = 128, block_n: int = 64,
                       first_seed: int = 0) -> pd.DataFrame:
    """One row per seed first_seed .. first_seed + seeds - 1 (one torch thread: the float64
    reference's sums). first_seed > 0 draws a seed set no earlier run has seen
    (conf/table/fa3_protocol_heldout.yaml)."""
    torch.set_num_threads(1)
    protocol = dict(n=n, d=d, heads=heads, rows=rows, outlier_std=outlier_std, p=p,
                    block_m=block_m, block_n=block_n)
    out = []
    for seed in range(first_seed, first_seed + seeds):
        r = rmse_at(seed, **protocol)
        out.append(dict(seed=seed, **protocol, **r))
        print(f"seed {seed}: standard {r['rmse_naive']:.3e}, FA2 {r['rmse_fa2']:.3e}, "
              f"ratio {r['ratio']:.2f}", flush=True)
    return pd.DataFrame(out)


def _spread(xs) -> dict:
    xs = list(xs)
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else math.nan
    return dict(mean=m, min=min(xs), max=max(xs), rel_sd=sd / m)


def summary(df: pd.DataFrame) -> dict:
    """The protocol, the published ratio and the spread over seeds of the stored rows:
    {"protocol", "seeds", "published_ratio", "summary": {naive, fa2, ratio: {mean, min,
    max, rel_sd}, ratio_of_means}}."""
    df = df.sort_values("seed")
    keys = ("n", "d", "heads", "rows", "outlier_std", "p", "block_m", "block_n")
    s = {k: _spread(df[f"rmse_{k}"]) for k in ("naive", "fa2")}
    s["ratio"] = _spread(df["ratio"])
    s["ratio_of_means"] = s["naive"]["mean"] / s["fa2"]["mean"]
    return dict(protocol={k: df[k].iloc[0].item() for k in keys}, seeds=len(df),
                published=PUBLISHED, published_ratio=PUBLISHED["naive"] / PUBLISHED["fa2"],
                summary=s)
