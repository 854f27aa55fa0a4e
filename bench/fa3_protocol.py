"""FA3 Table 3's fp16 rows at one protocol fixed in advance, over seeds.

    python bench/fa3_protocol.py              # 8 seeds, about a minute on one core
    python bench/fa3_protocol.py --seeds 4

`flashnum.reproduce.fa3_table3` searches 36 protocols for the one that best matches the
published numbers (FA3 omits N, d and the seed); a best-of-36 match overstates the
agreement. Here the protocol is fixed before looking at the result:

* FA3's own description: each entry of Q, K, V is N(0, 1) + N(0, 100) Bernoulli(0.001)
  (variance 100: outlier std 10), softmax scale 1/sqrt(d), RMSE against attention in
  float64 on the *unrounded* inputs;
* what FA3 does not state, chosen once: d = 128 (the head dimension of FA3's fp8 rows and
  of its headline benchmarks) and N = 8192 (the N of the fp8 rows of the same table, so
  that all six rows share one shape); 8 heads of 128 query rows against all N keys per
  seed (rows are independent, so the subsample estimates the RMSE of all N rows); fp16
  `naive` (standard attention) and `fa2` with FlashAttention-2's forward tiles 128 x 64.

Writes bench/results/fa3_protocol.json: per seed the two RMSEs and their ratio, and the
spread over seeds (mean, min, max, relative standard deviation).
"""

import argparse
import json
import math
import os
import time

import torch

from flashnum.engine import attention
from flashnum.inputs.distributions import make

PUBLISHED = {"naive": 3.2e-4, "fa2": 1.9e-4}  # FA3 Table 3, fp16 standard / FlashAttention-2
PROTOCOL = dict(n=8192, d=128, heads=8, rows=128, outlier_std=10.0, p=0.001,
                scale="1/sqrt(d)", reference="float64 on the unrounded inputs",
                block_m=128, block_n=64)


def rmse_at(seed: int) -> dict:
    P = PROTOCOL
    inp = make("fa3_outliers", heads=P["heads"], seq_len_q=P["rows"], seq_len_k=P["n"],
               head_dim=P["d"], seed=seed, outlier_std=P["outlier_std"], p=P["p"])
    q, k, v = (x.to(torch.float64) for x in inp.tensors())
    scale = 1 / math.sqrt(P["d"])
    s = (q @ k.transpose(-1, -2)) * scale
    e = torch.exp(s - s.amax(-1, keepdim=True))
    exact = (e @ v) / e.sum(-1, keepdim=True)  # FA3's "attention in FP64"
    out = {}
    for policy in ("naive", "fa2"):
        res = attention(q, k, v, precision="fp16", policy=policy, scale=scale,
                        block_m=P["block_m"], block_n=P["block_n"])
        out[policy] = float((res.out - exact).pow(2).mean().sqrt())
    out["ratio"] = out["naive"] / out["fa2"]
    return out


def spread(xs):
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else math.nan
    return dict(mean=m, min=min(xs), max=max(xs), rel_sd=sd / m)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results",
                                                  "fa3_protocol.json"))
    a = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    per_seed = {}
    for seed in range(a.seeds):
        per_seed[seed] = rmse_at(seed)
        r = per_seed[seed]
        print(f"seed {seed}: standard {r['naive']:.3e}, FA2 {r['fa2']:.3e}, "
              f"ratio {r['ratio']:.2f}", flush=True)
    summary = {key: spread([r[key] for r in per_seed.values()])
               for key in ("naive", "fa2", "ratio")}
    summary["ratio_of_means"] = summary["naive"]["mean"] / summary["fa2"]["mean"]
    result = dict(protocol=PROTOCOL, published=PUBLISHED,
                  published_ratio=PUBLISHED["naive"] / PUBLISHED["fa2"], seeds=a.seeds,
                  per_seed=per_seed, summary=summary, seconds=time.time() - t0,
                  machine="2-core Intel Xeon @ 2.0 GHz (shared)")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    s = summary
    print(f"standard {s['naive']['mean']:.2e} (+-{100 * s['naive']['rel_sd']:.0f}%), FA2 "
          f"{s['fa2']['mean']:.2e} (+-{100 * s['fa2']['rel_sd']:.0f}%), ratio "
          f"{s['ratio_of_means']:.2f} (per seed {s['ratio']['min']:.2f}-{s['ratio']['max']:.2f}; "
          f"published {result['published_ratio']:.2f}); {result['seconds']:.0f} s -> {a.out}")


if __name__ == "__main__":
    main()
