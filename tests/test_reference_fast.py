"""The certified reference's fast path (flashnum/reference/fast.py), as a specification:

- exp_dd errs by no more than its stated bound (EXP_REL + EXP_PER_XL |xl|), against
  mpmath at 250 bits;
- every double-double the fast path produces lies within its stated bound of the exact
  value (an mpmath row loop at 300 bits written here, sharing no code with it), on
  adversarial rows: large logits, ties, near-equal logits, cancellation in V, causal
  masks, bf16 inputs, scales that are not powers of two, a negative scale;
- what it certifies is bitwise what the arb path gives (out, lse, row_max, err_bound)
  and what mpmath at 400 bits rounds to;
- a value sitting on a rounding boundary, or within 2^-120 of one, is not accepted: the
  row goes to the arb path, which settles it;
- the stored benchmark (bench/results/reference.json) shows certified >= 100x the mpmath
  row loop in CPU time at both precisions, bitwise equal to it and to the arb path.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import mpmath
import numpy as np
import pytest
import torch

from flashnum.reference import reference
from flashnum.reference.certified import certified
from flashnum.reference.dd import EXP_PER_XL, EXP_REL, exp_dd
from flashnum.reference.fast import Head, approx_block, fast_head
from flashnum.reference.inputs import visible_len

CTX = mpmath.MPContext()
CTX.prec = 300


def test_exp_dd_is_within_its_bound():
    rng = np.random.default_rng(0)
    step = math.log(2) / 2**16
    x = np.concatenate([
        rng.uniform(-85, 0.5, 3000),
        (np.arange(-40, 40) + 0.5) * step,  # the reduction's half-way points
        [0.0, -85.0, 0.5, -1e-300, -step / 2, -83.17766166719343],
    ])
    xl = rng.uniform(-0.5, 0.5, x.size) * np.spacing(np.abs(x))  # normalised low parts
    ph, pl = exp_dd(x, xl)
    for i in range(x.size):
        e = CTX.exp(CTX.mpf(x[i]) + CTX.mpf(xl[i]))
        rel = abs((CTX.mpf(ph[i]) + CTX.mpf(pl[i])) / e - 1)
        assert rel <= EXP_REL + EXP_PER_XL * abs(xl[i]), (x[i], xl[i], float(rel))


def exact_rows(q, k, v, vis, scale):
    """out, lse, row_max of one head in mpmath at 300 bits: the oracle of the bounds."""
    d = q.shape[1]
    sc = 1 / CTX.sqrt(d) if scale is None else CTX.mpf(scale)
    K = [[CTX.mpf(x) for x in row] for row in k.tolist()]
    rows = []
    for i, qi in enumerate(q.tolist()):
        c = int(vis[i])
        s = [sc * CTX.fdot([CTX.mpf(x) for x in qi], K[j]) for j in range(c)]
        m = max(s)
        p = [CTX.exp(x - m) for x in s]
        l = CTX.fsum(p)
        vt = v.T.tolist()
        o = [CTX.fdot(p, [CTX.mpf(x) for x in col[:c]]) / l for col in vt]
        rows.append((o, m + CTX.log(l), m))
    return rows


def adversarial(name):
    """One head (q, k, v, causal, scale) of a hard kind, small enough for mpmath."""
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    nq, nk, d = 6, 40, 16
    q, k, v = (torch.randn(n, d, generator=g, dtype=torch.float64) for n in (nq, nk, nk))
    causal, scale = False, None
    if name == "large_logits":  # logits up to ~1e3: most p below e^-85 (dropped, bounded)
        q, k = q * 12, k * 12
    elif name == "ties":  # the same key eight times and again: ties at the max
        k[1:9] = k[0]
        k[20:30] = k[0]
        q[0] = k[0]
    elif name == "near_equal":  # every logit within 1e-12 of the others
        k = k[:1] + 1e-13 * torch.randn(nk, d, generator=g, dtype=torch.float64)
    elif name == "cancel_v":  # near-equal weights, V alternating +-1e3: |o| ~ 1e-2
        k = k[:1] + 1e-5 * k
        v = 1e3 * (-1.0) ** torch.arange(nk)[:, None] + 1e-6 * v
    elif name == "causal_bf16":
        q, k, v = (x.to(torch.bfloat16).to(torch.float64) for x in (q, k, v))
        causal = True
    elif name == "scale_d48":  # 1/sqrt(48) is irrational: a double-double scale
        q, k = (torch.randn(n, 48, generator=g, dtype=torch.float64) for n in (nq, nk))
    elif name == "negative_scale":
        scale = -0.3
    return q, k, v, causal, scale


KINDS = ["gaussian", "large_logits", "ties", "near_equal", "cancel_v", "causal_bf16",
         "scale_d48", "negative_scale"]


@pytest.mark.parametrize("name", KINDS)
def test_fast_bounds_hold_against_mpmath(name):
    q, k, v, causal, scale = adversarial(name)
    vis = visible_len(q.shape[0], k.shape[0], causal)
    with np.errstate(all="ignore"):
        a = approx_block(Head(k.numpy(), v.numpy(), scale), q.numpy(), vis)
    assert all(np.isfinite(t[2]).all() for t in a.values())  # a bound for every value
    for i, (o, lse, m) in enumerate(exact_rows(q, k, v, vis, scale)):
        for key, exact in (("lse", lse), ("row_max", m)):
            hi, lo, b = (t[i] for t in a[key])
            assert abs(CTX.mpf(hi) + CTX.mpf(lo) - exact) <= b, (name, key, i)
        hi, lo, b = a["out"]
        for c, exact in enumerate(o):
            assert abs(CTX.mpf(hi[i, c]) + CTX.mpf(lo[i, c]) - exact) <= b[i, c], (name, i, c)


@pytest.mark.parametrize("bits", [256, 128])
@pytest.mark.parametrize("name", KINDS)
def test_fast_path_is_bitwise_the_arb_path_and_mpmath(name, bits):
    q, k, v, causal, scale = adversarial(name)
    q, k, v = (x[None] for x in (q, k, v))
    vis = visible_len(q.shape[1], k.shape[1], causal)
    fast = certified(q, k, v, vis, scale, bits, 1)
    arb = certified(q, k, v, vis, scale, bits, 1, fast=False)
    assert fast[4]["fast_rows"] >= 4, fast[4]  # most rows settle on the fast path
    assert arb[4]["fast_rows"] == 0
    for x, y in zip(fast[:4], arb[:4], strict=True):  # out, lse, row_max, err_bound
        assert torch.equal(x, y)
    mp = reference(q, k, v, causal=causal, scale=scale, method="mpmath", bits=400,
                   cache=False)
    assert torch.equal(fast[0], mp.out) and torch.equal(fast[1], mp.lse)
    assert torch.equal(fast[2], mp.row_max)


def test_a_value_on_or_next_to_a_rounding_boundary_goes_to_arb():
    # d = 1, scale 1: the logits are q k_j exactly. Keys 0 and 1 tie, with values 1 and
    # 1 + 2^-52: their mean is the tie 1 + 2^-53. Key 2, 60 below, adds e^-60 (w - 1 -
    # 2^-53) / 2, under 2^-120: row 0 sits next to the tie, row 1 (logits 0, 0, 15) is
    # ordinary; with keys 0 and 1 alone every row is exactly on the tie.
    w = 1 + 2.0**-53 + 2.0**-40
    k = torch.tensor([[0.0], [0.0], [-60.0]], dtype=torch.float64)
    v = torch.tensor([[1.0], [1 + 2.0**-52], [w]], dtype=torch.float64)
    q = torch.tensor([[1.0], [-0.25]], dtype=torch.float64)
    assert math.exp(-60) * 2.0**-41 < 2.0**-120
    for kk, vv, want in ((k, v, [False, True]), (k[:2], v[:2], [False, False])):
        vis = visible_len(2, kk.shape[0], False)
        ok = fast_head(q.numpy(), kk.numpy(), vv.numpy(), vis, None)[4]
        assert ok.tolist() == want
        with np.errstate(all="ignore"):
            hi, lo, b = approx_block(Head(kk.numpy(), vv.numpy(), None), q.numpy(), vis)["out"]
        mid = CTX.mpf(1) + CTX.mpf(2) ** -53
        # the bound's interval holds the tie: no rounding can be certified from it
        assert abs(CTX.mpf(hi[0, 0]) + CTX.mpf(lo[0, 0]) - mid) <= b[0, 0]
    near = reference(q[None], k[None], v[None], cache=False)
    assert near.info["fast_rows"] == 1
    assert near.out[0, 0, 0].item() == 1 + 2.0**-52  # just above the tie: rounded up
    mp = reference(q[None], k[None], v[None], method="mpmath", bits=400, cache=False)
    assert torch.equal(near.out, mp.out) and torch.equal(near.lse, mp.lse)
    tie = reference(q[None], k[None, :2], v[None, :2], cache=False)
    assert tie.info["fast_rows"] == 0
    assert (tie.out == 1.0).all()  # the exact tie, rounded to even by the arb path


def test_the_stored_benchmark_meets_the_goal_bitwise():
    r = json.loads((Path(__file__).parent.parent / "bench" / "results" /
                    "reference.json").read_text())
    assert {x["bits"] for x in r["runs"]} == {256, 128} and r["n"] == 4096
    for x in r["runs"]:
        assert x["speedup_cpu"] >= 100, x["bits"]
        assert x["mpmath_rows_bitwise_equal_certified"] and x["arb_rows_bitwise_equal_certified"]
        assert x["certified_uncertain_rows"] == 0


@pytest.mark.parametrize("big", [1e12, 1e13, 1e14, 1e15])
def test_logits_too_large_for_the_bound_go_to_arb(big):
    # |q k| ~ 1e24 or 1e30: the double-double logits err by about 1 or far more, so the
    # fast path knows nothing and says so (an infinite bound); arb settles every row
    q, k, v, _, _ = adversarial("gaussian")
    q, k = q * big, k * big
    vis = visible_len(q.shape[0], k.shape[0], False)
    with np.errstate(all="ignore"):
        a = approx_block(Head(k.numpy(), v.numpy(), None), q.numpy(), vis)
    assert np.isinf(a["out"][2]).all() and np.isinf(a["lse"][2]).all()
    ref = reference(q[None], k[None], v[None], cache=False)
    assert ref.info["fast_rows"] == 0 and ref.info["uncertain_rows"] == 0
    mp = reference(q[None], k[None], v[None], method="mpmath", bits=400, cache=False)
    assert torch.equal(ref.out, mp.out) and torch.equal(ref.lse, mp.lse)


def test_groups_and_blocks_of_rows_do_not_change_the_result(monkeypatch):
    # the GEMMs run per group of rows and the elementwise passes per block: ragged groups
    # of 3 rows in blocks of 2 (then 1) give what one group of every row gives
    import flashnum.reference.fast as fast

    for name in ("gaussian", "causal_bf16", "scale_d48"):
        q, k, v, causal, scale = adversarial(name)
        args = (q.numpy(), k.numpy(), v.numpy(), visible_len(6, 40, causal), scale)
        whole = fast_head(*args)
        monkeypatch.setattr(fast, "GROUP", 3 * 40)
        monkeypatch.setattr(fast, "BLOCK", 2 * 40)
        parts = fast_head(*args)
        monkeypatch.undo()
        for a, b in zip(whole, parts, strict=True):
            assert np.array_equal(a, b), name
