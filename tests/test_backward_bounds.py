"""The a-priori backward bound (flashnum.analysis.bounds_backward) against the certified
reference: it must hold entry by entry for every preset, precision and shape tried."""

import pytest
import torch

from flashnum.analysis.bounds_backward import GROUPS, bound_backward
from flashnum.api import attention_backward
from flashnum.reference import reference_backward


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


@pytest.mark.parametrize("policy", ["fa2", "naive", "lowp"])
@pytest.mark.parametrize("magnitude", [30.0, 100.0, 300.0])
def test_a_gradient_that_may_overflow_fp16_gets_an_infinite_bound_never_a_false_one(
        policy, magnitude):
    """dO and V of size `magnitude` push dP, dS and the dQ/dK accumulators toward fp16's
    largest number 65504: at 100 lowp's dQ and dK overflow to inf, at 300 fa2's too. The
    rounding model fl(x) = x (1 + delta) + eta fails past that number, so wherever a site may
    overflow the bound must be inf; wherever it is finite it must hold (fp64 reference:
    its error is ~1e-16 relative, against fp16 errors above 1e-4)."""
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 64, 16, generator=g).half().double() for _ in range(4))
    v, do = (v * magnitude).half().double(), (do * magnitude).half().double()
    kw = dict(policy=policy, precision="fp16", block_m=16, block_n=16)
    grads = attention_backward(q, k, v, do, **kw)
    b = bound_backward(q, k, v, do, terms=False, **kw)
    ref = reference_backward(q, k, v, do, method="fp64")
    for name in ("dq", "dk", "dv"):
        x, bound = getattr(grads, name), b[name]
        assert not bool(bound.isnan().any()), name
        assert bool(bound[~x.isfinite()].isinf().all()), name  # overflowed: no finite bound
        fin = bound.isfinite()
        assert bool(((x - getattr(ref, name)).abs()[fin] <= bound[fin]).all()), name
    if magnitude == 30.0:  # far below the largest number: the check changes nothing
        assert all(b["max"][n] < float("inf") for n in ("dq", "dk", "dv"))


def test_an_unbounded_term_makes_the_bound_inf_never_nan():
    """Logits of size ~300 in bf16 make some error terms of the naive bound infinite;
    where such a term meets an exact zero (P underflowed) the product inf * 0 would be NaN:
    the bound reports inf there, which is what an unbounded term means."""
    g = torch.Generator().manual_seed(1)
    q, k, v, do = (torch.randn(1, 48, 16, generator=g) for _ in range(4))
    q, k = q * 12, k * 12
    q, k, v, do = (x.bfloat16().double() for x in (q, k, v, do))
    b = bound_backward(q, k, v, do, policy="naive", precision="bf16", block_m=16, block_n=16,
                       terms=False)
    assert any(bool(b[n].isinf().any()) for n in ("dq", "dk", "dv"))
    assert not any(bool(b[n].isnan().any()) for n in ("dq", "dk", "dv"))
