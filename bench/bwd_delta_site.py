"""Where does the fa2 backward's dQ error come from on outlier inputs? (numbers for docs)

    python bench/bwd_delta_site.py

The bwd_order cases where the emulated fa2 backward breaks flash-attn's 2x rule on dQ
(fa3_outliers, seed 1) rerun with one site at a time made wider: O stored in fp32 (D =
rowsum(dO * O) then reads an unrounded O), dS cast in fp32, P cast in fp32. Prints each
gradient's max error against the certified reference, torch's bf16 autograd error, and
the bound's dominant site. Writes bench/results/bwd_delta_site.json.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from flashnum.analysis.bounds_backward import bound_backward
from flashnum.engine.backward import attention_backward
from flashnum.harness import backward as hb
from flashnum.numerics.policy import make_backward_policy
from flashnum.reference import reference_backward

OUT = Path(__file__).parent / "results" / "bwd_delta_site.json"


def main():
    torch.set_num_threads(1)
    case = dict(hb.DEFAULT, policy="fa2", precision="bf16", seq_len=64, head_dim=32, block=16,
                distribution="fa3_outliers", seed=1)
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
    res = {"case": case, "torch_bf16_autograd": {
        n: float((base[n] - getattr(ref, n)).abs().max()) for n in ("dq", "dk", "dv")}}
    for name, p in variants.items():
        g = attention_backward(q, k, v, do, policy=p, block_m=16, block_n=16)
        res[name] = {n: float((getattr(g, n) - getattr(ref, n)).abs().max())
                     for n in ("dq", "dk", "dv")}
    res["dominant_site"] = bound_backward(q, k, v, do, block_m=16, block_n=16)["dominant_site"]
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
