"""The bound tightness table: flashnum.analysis.bounds against the measured error over the
input catalogue (the table experiment bound_tightness, conf/table/; docs/bounds.md quotes it).

    from flashnum.studies.tightness import tightness_table
    t = tightness_table(seq_len=128, seeds=range(1))
    flashnum.analysis.bounds.tightness_summary(t)
"""

from __future__ import annotations

import math

import pandas as pd

from flashnum.analysis.bounds import bound, verdict
from flashnum.api import attention
from flashnum.inputs.distributions import DISTRIBUTIONS, FROM_FILE, make
from flashnum.reference import reference


def tightness_table(distributions=None, *, policies=("fa2", "naive", "lowp"),
                    precisions=("bf16", "fp16", "fp32"), block_ns=(16, 64),
                    orders=("forward", "reverse"), variant="fa2", seq_len=256, head_dim=64,
                    heads=1, seeds=(0,), prob=True, delta=1e-3):
    """One row per case: the measured max |out - ref|, the bounds, and their ratio.

    measured is max_ij |out - ref| (ref certified, flashnum.reference); holds checks
    measured <= bound + max ref.err_bound. tightness = bound / measured (>= 1 when the
    bound holds; inf bounds, e.g. a site that may overflow, give inf). The naive policy
    ignores tiling and order: it runs once per (distribution, seed, precision, block_n).
    """
    names = [n for n in DISTRIBUTIONS if n not in FROM_FILE] if distributions is None else list(
        distributions)
    rows = []
    for name in names:
        for seed in seeds:
            for bn in block_ns:
                nk = seq_len - seq_len // 4 if name == "masked" else None
                try:
                    inp = make(name, heads=heads, seq_len_q=seq_len, seq_len_k=nk,
                               head_dim=head_dim, seed=seed, block_n=bn)
                except ValueError:
                    continue  # e.g. late_max needs >= 2 key blocks
                ref = reference(inp.q, inp.k, inp.v, causal=inp.causal, scale=inp.scale)
                ref_err = float(ref.err_bound.max())
                for policy in policies:
                    for precision in precisions:
                        for order in (orders if policy != "naive" else orders[:1]):
                            kw = dict(precision=precision, policy=policy, block_n=bn,
                                      causal=inp.causal, scale=inp.scale, variant=variant)
                            res = attention(inp.q, inp.k, inp.v, order=order, **kw)
                            b = bound(inp.q, inp.k, inp.v, n_rescales=res.n_rescales,
                                      prob=prob, delta=delta, **kw)
                            err = float((res.out - ref.out).abs().max())
                            ratio = lambda x, e=err: x / e if e > 0 else math.inf  # noqa: E731
                            fin, holds = verdict(b["bound"], err - ref_err)
                            holds_prob = verdict(b["bound_prob"], err - ref_err)[1]
                            rows.append(dict(
                                distribution=name, seed=seed, policy=policy,
                                precision=precision, block_n=bn, order=order, variant=variant,
                                measured=err, ref_err=ref_err, bound=b["bound"],
                                bound_prob=b["bound_prob"], tightness=ratio(b["bound"]),
                                tightness_prob=ratio(b["bound_prob"]),
                                bound_finite=fin, holds=holds, holds_prob=holds_prob,
                                dominant_site=b["dominant_site"],
                                first_order=b["first_order"],
                            ))
    return pd.DataFrame(rows)
