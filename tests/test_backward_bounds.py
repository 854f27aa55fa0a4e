"""The a-priori backward bound (flashnum.analysis.bounds_backward) against the certified
reference: it must hold entry by entry for every preset, precision and shape tried."""

import pytest
import torch

from flashnum.analysis.bounds_backward import GROUPS, bound_backward
from flashnum.engine.backward import attention_backward
from flashnum.reference_backward import reference_backward


def case(nq, nk, d=32, dv=16, seed=1, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, n, e, generator=g).to(dtype).double()
                 for n, e in ((nq, d), (nk, d), (nk, dv), (nq, dv)))


@pytest.mark.parametrize("policy", ["fa2", "naive", "lowp", "exact"])
@pytest.mark.parametrize(
    "nq,nk,causal,precision",
    [(64, 64, False, "bf16"), (100, 77, True, "bf16"), (96, 96, False, "fp16"),
     (64, 80, True, "fp32")],
)
def test_bound_holds_for_every_entry_of_every_gradient(policy, nq, nk, causal, precision):
    q, k, v, do = case(nq, nk)
    ref = reference_backward(q, k, v, do, causal=causal)
    kw = dict(policy=policy, precision=precision, block_m=16, block_n=32, causal=causal)
    g = attention_backward(q, k, v, do, **kw)
    b = bound_backward(q, k, v, do, terms=False, **kw)
    for name, x, r in zip(("dq", "dk", "dv"), (g.dq, g.dk, g.dv), (ref.dq, ref.dk, ref.dv),
                          strict=True):
        assert bool(((x - r).abs() <= b[name]).all()), name


def test_bound_holds_for_inputs_off_the_grid_and_stochastic_rounding():
    q, k, v, do = case(48, 40, dtype=torch.float64)  # rounded to bf16 on the way in
    ref = reference_backward(q, k, v, do)
    for rounding, seed in (("nearest", 0), ("stochastic", 1), ("stochastic", 2)):
        kw = dict(policy="lowp", block_m=16, block_n=16, rounding=rounding)
        g = attention_backward(q, k, v, do, seed=seed, **kw)
        b = bound_backward(q, k, v, do, terms=False, **kw)
        for name, x, r in zip(("dq", "dk", "dv"), (g.dq, g.dk, g.dv), (ref.dq, ref.dk, ref.dv),
                              strict=True):
            assert bool(((x - r).abs() <= b[name]).all()), (rounding, name)


def test_terms_name_a_dominant_site_and_vanish_for_exact_sites():
    q, k, v, do = case(32, 32)
    b = bound_backward(q, k, v, do, policy="fa2", block_m=16, block_n=16)
    for g in ("dq", "dk", "dv"):
        assert set(b["terms"][g]) == set(GROUPS)
        assert b["dominant_site"][g] in GROUPS
        assert b["terms"][g]["inputs"] == 0.0  # bf16 inputs are stored exactly
    # in Algorithm 2 the cast P enters P^T dO only: dS is formed from the fp32 P
    assert b["terms"]["dv"]["p_cast"] > 0.0
    assert b["terms"]["dq"]["p_cast"] == 0.0 and b["terms"]["dk"]["p_cast"] == 0.0
    assert b["terms"]["dq"]["ds_cast"] > 0.0 and b["terms"]["dv"]["ds_cast"] == 0.0
