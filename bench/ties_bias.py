"""Where the bias of low-precision attention on `ties` comes from (docs/bounds.md).

    python bench/ties_bias.py          # ~1 minute on one core

Qiu & Yao 2025: with repeated row maxima (several P exactly 1) and V mostly negative,
bf16 attention has a biased error. For the `ties` distribution (and, for comparison,
gaussian logits with the same V ~ N(v_mean, 0.5^2)) this prints the mean signed error
(and its z-score) of the lowp bf16 policy, of policies rounding only some sites to bf16,
and of lowp with the final division kept in fp32; then the per-site attribution table.
"""

import pandas as pd
import torch

from flashnum.analysis.attribution import attribute
from flashnum.analysis.metrics import signed_err
from flashnum.engine import attention
from flashnum.inputs.distributions import make
from flashnum.numerics.formats import FORMATS
from flashnum.numerics.policy import make_policy
from flashnum.reference import reference

N, D, HEADS, BLOCK_N = 512, 64, 4, 64


def bias(inp_q, inp_k, v, ref, policy, **kw):
    out = attention(inp_q, inp_k, v, precision="bf16", policy=policy, block_n=BLOCK_N, **kw).out
    s = signed_err(out, ref)
    return f"{s['mean_signed_err']:+.2e} (z {s['signed_err_z']:+6.1f})"


def main():
    torch.set_num_threads(1)
    lowp, exact = make_policy("lowp", "bf16"), make_policy("exact", "bf16")
    cases = {
        "lowp": (lowp, {}),
        "lowp, one key block": (lowp, {"block_n": None}),
        "lowp, qiu_yao variant": (lowp, {"variant": "qiu_yao"}),
        "only l, o, div in bf16": (exact.with_sites(l="bf16", o="bf16", div="bf16"), {}),
        "only l, o in bf16": (exact.with_sites(l="bf16", o="bf16"), {}),
        "only div in bf16": (exact.with_sites(div="bf16"), {}),
        "lowp, div and out in fp32": (lowp.with_sites(div="fp32", out="fp32"), {}),
        "lowp, P @ V summed in bf16": (lowp.with_sites(pv_acc="bf16"), {}),
        "fa2": (make_policy("fa2", "bf16"), {}),
    }
    for v_mean in (-1.0, -0.75, +1.0):
        for name in ("ties", "gaussian"):
            inp = make(name, heads=HEADS, seq_len_q=N, head_dim=D, seed=0, block_n=BLOCK_N,
                       **({"v_mean": v_mean} if name == "ties" else {}))
            v = inp.v if name == "ties" else 0.5 * inp.v + v_mean
            ref = reference(inp.q, inp.k, v).out
            print(f"\n{name}, V ~ N({v_mean}, 0.5^2): mean signed error (z)")
            for label, (pol, kw) in cases.items():
                kw = dict(kw)
                if kw.pop("block_n", 0) is None:
                    out = attention(inp.q, inp.k, v, precision="bf16", policy=pol, block_n=N)
                    s = signed_err(out.out, ref)
                    res = f"{s['mean_signed_err']:+.2e} (z {s['signed_err_z']:+6.1f})"
                else:
                    res = bias(inp.q, inp.k, v, ref, pol, **kw)
                print(f"  {label:28s} {res}")
    inp = make("ties", heads=HEADS, seq_len_q=N, head_dim=D, seed=0, block_n=BLOCK_N)
    # the quotient o / l of bf16 state: with every other site exact, the division runs in
    # float64, so res.out is that quotient exactly; where does it sit inside its bf16 ulp?
    bf16 = FORMATS["bf16"]
    q = attention(inp.q, inp.k, inp.v, policy=exact.with_sites(l="bf16", o="bf16"),
                  block_n=BLOCK_N).out.abs()
    pos = q / bf16.ulp(q) - torch.floor(q / bf16.ulp(q))
    print("\nonly l, o in bf16: position of |o/l| inside its bf16 ulp: "
          f"exact {float((pos == 0).double().mean()):.3f}, "
          f"lower half {float(((pos > 0) & (pos < 0.5)).double().mean()):.3f}, "
          f"tie {float((pos == 0.5).double().mean()):.3f}, "
          f"upper half {float((pos > 0.5).double().mean()):.3f}; "
          f"mean of |rnd_bf16(o/l)| - |o/l|: {float((bf16.round(q) - q).mean()):+.2e}")
    t = attribute(inp.q, inp.k, inp.v, precision="bf16", policy="lowp", block_n=BLOCK_N)
    with pd.option_context("display.float_format", "{:+.2e}".format):
        print("\nattribution of the mean signed error, ties, lowp bf16:")
        print(t[t.metric == "mean_signed"].drop(columns="metric").to_string(index=False))


if __name__ == "__main__":
    main()
