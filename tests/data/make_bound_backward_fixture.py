"""Writes tests/data/bound_backward_fixture.pt: inputs and the values bound_backward returned
for them, so that changes to its evaluation can be checked bit for bit against stored values.

    python tests/data/make_bound_backward_fixture.py      (run once, before such a change)

The inputs are kept from the file when it exists (only the values are computed again):
they were drawn once, and the values are a function of them alone on every machine
(flashnum.numerics.accumulate and elementary fix every sum's order and every exp).
"""

from __future__ import annotations

from pathlib import Path

import torch

import flashnum.analysis.bounds_backward as bb

# (policy, precision, causal, rounding, heads, nq, nk, d, rows per chunk or None)
CASES = [
    ("fa2", "bf16", False, "nearest", 1, 130, 130, 16, None),
    ("fa2", "bf16", True, "nearest", 2, 100, 100, 16, 32),
    ("fa2", "fp16", False, "stochastic", 1, 77, 150, 8, 20),
    ("naive", "bf16", True, "nearest", 1, 96, 96, 16, 40),
    ("lowp", "fp16", False, "nearest", 2, 70, 70, 8, None),
]


def case_values(case, inputs):
    policy, precision, causal, rounding, *_ , rows = case
    old = bb._ROWS
    try:
        if rows is not None:  # several row chunks: the dK, dV sums over chunks
            bb._ROWS = rows * inputs[1].shape[-2]
        b = bb.bound_backward(*inputs, policy=policy, precision=precision, causal=causal,
                              rounding=rounding, block_m=32, block_n=32)
    finally:
        bb._ROWS = old
    return {g: b[g] for g in ("dq", "dk", "dv")} | {"max": b["max"], "terms": b["terms"],
                                                      "dominant_site": b["dominant_site"]}


def main():
    path = Path(__file__).with_name("bound_backward_fixture.pt")
    kept = {tuple(e["case"]): e["inputs"] for e in torch.load(path)} if path.exists() else {}
    gen = torch.Generator().manual_seed(13)
    out = []
    for case in CASES:
        _, _, _, _, h, nq, nk, d, _ = case
        q, do = (torch.randn(h, nq, d, generator=gen) for _ in range(2))
        k, v = (torch.randn(h, nk, d, generator=gen) for _ in range(2))
        inputs = kept.get(tuple(case), (q, k, v, do))
        out.append(dict(case=case, inputs=inputs, values=case_values(case, inputs)))
    torch.save(out, path)


if __name__ == "__main__":
    main()
