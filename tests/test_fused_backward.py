"""The fused backward (flashnum.engine.fused_backward) gives the torch loop's bits on every
call it claims, and hands every other call to the torch loop.

The oracle is the torch loop itself (flashnum.engine.backward._flash: torch ops and
torch.matmul, per key block over every query row), run on the same case with the fused
path switched off: the fused loop shares none of its code, only native.c's exp (checked
on every float32 input by the experiment exp_exhaustive). Cases are drawn from every shipped
backward experiment's grid, run as the experiment runner runs them, and from random shapes
(ragged N, Nq != Nk, causal alignments, blocks, dQ orders, exp2, precisions).
"""

import random

import pytest
import torch
from bits import same_bits  # tests/bits.py
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flashnum
from flashnum.engine import fused_backward, native
from flashnum.harness import backward as harness
from flashnum.numerics.policy import make_backward_policy

pytestmark = pytest.mark.skipif(not native.available(), reason="no C compiler: no fused path")

# bwd_attribution's cases are per-site reruns (one site rounded, or one left exact): the
# float64 carrier, which the fused loop does not claim
EXPERIMENTS = sorted(p.stem for p in harness.CONF.glob("bwd_*.yaml")
                     if p.stem != "bwd_attribution")
PER_GRID = 5  # claimed cases drawn from each experiment
TRIES = 30  # cases tried per experiment
MAX_N = 1024  # largest seq_len drawn (the test stays quick)
FIELDS = ("dq", "dk", "dv", "lse", "delta", "out", "masked", "ds_rowsum")


def backward(on: bool, *args, **kw):
    """flashnum.attention_backward with the fused loop on or off; also whether it ran."""
    ran = []
    real = fused_backward.run

    def spy(*a, **k):
        ran.append(True)
        return real(*a, **k)

    fused_backward.set_enabled(on)
    fused_backward.run = spy
    try:
        g = flashnum.attention_backward(*args, **kw)
    finally:
        fused_backward.run = real
        fused_backward.set_enabled(True)
    return g, bool(ran)


def assert_same(on, off, case):
    for f in FIELDS:
        assert same_bits(getattr(on, f), getattr(off, f)), (case, f)


def run_case(case: dict, on: bool):
    """The case's backward call as flashnum.harness.backward.run_case makes it."""
    inp, do = harness.inputs(case)
    causal = case["causal"] or inp.causal
    kw = dict(policy=case["policy"], precision=case["precision"], block_m=case["block"],
              block_n=case["block"], causal=causal, scale=inp.scale)
    given_ = {}
    if case["forward_variant"] != "fa2":
        fwd = flashnum.attention(inp.q, inp.k, inp.v, variant=case["forward_variant"], **kw)
        given_ = dict(out=fwd.out, lse=fwd.lse)
    return backward(on, inp.q, inp.k, inp.v, do, dq_order=case["dq_order"], measure_ds=True,
                    **kw, **given_)


def drawn(name):
    cases = [c for c in harness.expand(harness.load_conf(name))
             if not c["attribution"] and c["seq_len"] <= MAX_N]
    random.Random(name).shuffle(cases)
    return cases


@pytest.mark.parametrize("name", EXPERIMENTS)
@pytest.mark.filterwarnings("ignore:.*overflow the inputs format:RuntimeWarning")
def test_cases_drawn_from_each_backward_grid_are_bit_identical_with_the_fused_path_on_and_off(
        name):
    claimed = 0
    for case in drawn(name)[:TRIES]:
        on, ran = run_case(case, True)
        if not ran:
            continue  # not claimed: the torch loop ran both times
        off, ran_off = run_case(case, False)
        assert not ran_off
        assert_same(on, off, case)
        claimed += 1
        if claimed == PER_GRID:
            break
    assert claimed >= 3, name  # every one of these grids has fa2 cases


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(nq=st.integers(1, 150), nk=st.integers(1, 150), d=st.sampled_from([8, 16, 24, 64]),
       dv=st.sampled_from([8, 16, 40]), bm=st.sampled_from([8, 16, 32, 64]),
       bn=st.sampled_from([8, 16, 32, 64]),
       causal=st.sampled_from([False, True, "top_left"]),
       precision=st.sampled_from(["bf16", "fp16", "fp32"]),
       dq_order=st.sampled_from(["forward", "reverse", "random"]), exp2=st.booleans(),
       heads=st.integers(1, 3), seed=st.integers(0, 2**16), log_range=st.floats(0.0, 3.0))
def test_random_shapes_masks_orders_and_precisions_are_bit_identical(
        nq, nk, d, dv, bm, bn, causal, precision, dq_order, exp2, heads, seed, log_range):
    g = torch.Generator().manual_seed(seed)
    spread = float(torch.exp(torch.tensor(log_range)))  # large logits: P near 0 and 1

    def x(n, e):
        return torch.randn(heads, n, e, generator=g, dtype=torch.float64) * spread

    q, k, v, do = x(nq, d), x(nk, d), x(nk, dv), x(nq, dv)
    kw = dict(precision=precision, block_m=bm, block_n=bn, causal=causal, seed=seed,
              dq_order=dq_order, exp2=exp2, measure_ds=True)
    on, ran = backward(True, q, k, v, do, **kw)
    off, _ = backward(False, q, k, v, do, **kw)
    assert ran
    assert_same(on, off, kw)


def test_the_benchmark_case_is_bit_identical():
    # bench/bench_backward.py's shape in one head and N = 1024: bf16 fa2, 64 x 64 blocks
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(2, 1024, 64, generator=g).bfloat16() for _ in range(4))
    fwd = flashnum.attention(q, k, v)
    on, ran = backward(True, q, k, v, do, out=fwd.out, lse=fwd.lse)
    off, _ = backward(False, q, k, v, do, out=fwd.out, lse=fwd.lse)
    assert ran
    assert_same(on, off, "bench")


@pytest.mark.parametrize("policy,kw,why", [
    ("lowp", {}, "not fp32"),
    ("exact", {}, "not the fp32 carrier"),
    ("fa2", dict(rounding="stochastic"), "round to nearest"),
    ("fa2", dict(precision="tf32"), "not fp32"),
    (make_backward_policy("fa2", "bf16").with_sites(dp="bf16"), {}, "site dp"),
    (make_backward_policy("fa2", "bf16").with_sites(p_cast="fp8_e4m3"), {}, "p_cast"),
])
def test_what_it_does_not_claim_runs_the_torch_loop_and_says_why(monkeypatch, policy, kw, why):
    from flashnum.engine.arith import Arith, carrier

    pol = make_backward_policy(policy, kw.get("precision", "bf16"))
    dtype = torch.float64 if torch.float64 in (carrier(pol), carrier(pol.forward)) else \
        torch.float32
    ar = Arith(pol, kw.get("rounding", "nearest"), 0, dtype)
    shape = (16, 16, 16, 16, 32, 64)
    assert why in fused_backward.claim(ar, 0.25, shape)
    g = torch.Generator().manual_seed(1)
    q, k, v, do = (torch.randn(1, 40, 16, generator=g, dtype=torch.float64) for _ in range(4))
    _, ran = backward(True, q, k, v, do, policy=policy, block_m=16, block_n=16, **kw)
    assert not ran
    monkeypatch.setattr(fused_backward, "_enabled", False)
    ar32 = Arith(make_backward_policy("fa2", "bf16"), "nearest", 0, torch.float32)
    assert fused_backward.claim(ar32, 0.25, shape) == "disabled"


def test_the_fa2_preset_is_claimed_in_each_precision_it_runs_on_the_fp32_carrier():
    from flashnum.engine.arith import Arith

    for precision in ("bf16", "fp16", "fp32"):
        ar = Arith(make_backward_policy("fa2", precision), "nearest", 0, torch.float32)
        assert fused_backward.claim(ar, 0.125, (64, 64, 64, 64, 256, 4096)) is None, precision
