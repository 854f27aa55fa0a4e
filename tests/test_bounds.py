"""The a-priori bounds: they hold, on every distribution, policy, tiling, order and variant.

Every check compares the engine's error against the reference with the reference's own
certified error added (|out - exact| <= |out - ref| + |ref - exact|), never a tolerance.
"""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import binom

from flashnum.analysis.bounds import bound
from flashnum.api import attention
from flashnum.engine.variants import QiuYao
from flashnum.inputs.distributions import DISTRIBUTIONS, FROM_FILE, make
from flashnum.numerics.policy import make_policy
from flashnum.reference import reference


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # tiny matmuls on a shared 2-core machine: one intra-op thread is ~1000x faster than
    # two contending ones; restored afterwards so that no other module is affected
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


CATALOGUE = [n for n in DISTRIBUTIONS if n not in FROM_FILE]  # replayed from a file
POLICIES = ("fa2", "naive", "lowp")
PRECISIONS = ("bf16", "fp16", "fp32")


def _draw(name, seed=0, n=32, d=16, block_n=8):
    nk = None if name != "masked" else n - 8
    # the block-structured distributions need >= 2 key blocks
    return make(name, seq_len_q=n, seq_len_k=nk, head_dim=d, seed=seed,
                block_n=min(block_n, (nk or n) // 2))


def _excess(inp, ref, res, b):
    """Per row: |out - ref|_inf - err_bound(ref) - bound_row; <= 0 where the bound holds."""
    err = (res.out - ref.out).abs().amax(-1) - ref.err_bound
    return err - b["bound_rows"]


@pytest.mark.parametrize("name", CATALOGUE)
def test_bound_holds_on_every_distribution_policy_and_precision(name):
    inp = _draw(name)
    ref = reference(inp.q, inp.k, inp.v, causal=inp.causal, scale=inp.scale)
    for policy in POLICIES:
        for precision in PRECISIONS:
            kw = dict(precision=precision, policy=policy, block_n=8, causal=inp.causal,
                      scale=inp.scale)
            res = attention(inp.q, inp.k, inp.v, block_m=16, **kw)
            b = bound(inp.q, inp.k, inp.v, n_rescales=res.n_rescales, **kw)
            if not math.isfinite(b["bound"]):
                continue  # a site may overflow: the bound says so instead of lying
            assert bool((_excess(inp, ref, res, b) <= 0).all()), (policy, precision, b)


@pytest.mark.parametrize("name", CATALOGUE)
def test_bound_holds_with_each_product_rounded_before_its_sum(name):
    # the product sites (tinygrad's bf16 dots): u_p |q||k| per term of S, u_p |p||v| of P V
    inp = _draw(name)
    ref = reference(inp.q, inp.k, inp.v, causal=inp.causal, scale=inp.scale)
    for policy, rounding in (("fa2", "nearest"), ("naive", "nearest"), ("fa2", "stochastic")):
        for precision in PRECISIONS:
            fp = precision if precision != "fp32" else "bf16"
            pol = make_policy(policy, precision).with_sites(qk_product=fp, pv_product=fp)
            kw = dict(precision=precision, policy=pol, block_n=8, causal=inp.causal,
                      scale=inp.scale, rounding=rounding)
            res = attention(inp.q, inp.k, inp.v, block_m=16, **kw)
            b = bound(inp.q, inp.k, inp.v, n_rescales=res.n_rescales, **kw)
            assert b["terms"]["qk_product"] > 0 and b["terms"]["pv_product"] > 0
            if not math.isfinite(b["bound"]):
                continue  # a site may overflow: the bound says so instead of lying
            assert bool((_excess(inp, ref, res, b) <= 0).all()), (policy, precision, b)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(CATALOGUE),
    n=st.integers(16, 80),
    d=st.sampled_from([8, 16, 32]),
    policy=st.sampled_from(POLICIES),
    precision=st.sampled_from(PRECISIONS),
    block_n=st.sampled_from([4, 8, 16, 32]),
    order=st.sampled_from(["forward", "reverse", "random", "max_ascending", "max_descending"]),
    variant=st.sampled_from(["fa2", "fa1", "exp2", "lazy", "qiu_yao"]),
    rounding=st.sampled_from(["nearest", "nearest", "stochastic"]),
    seed=st.integers(0, 3),
    exact_rescales=st.booleans(),
)
def test_bound_holds_for_every_tiling_order_variant_and_rounding(
    name, n, d, policy, precision, block_n, order, variant, rounding, seed, exact_rescales
):
    inp = _draw(name, seed=seed, n=n, d=d, block_n=block_n)
    ref = reference(inp.q, inp.k, inp.v, causal=inp.causal, scale=inp.scale)
    block_n = inp.block_n
    kw = dict(precision=precision, policy=policy, block_n=block_n, causal=inp.causal,
              scale=inp.scale, variant=variant, rounding=rounding)
    res = attention(inp.q, inp.k, inp.v, block_m=16, order=order, seed=seed, **kw)
    b = bound(inp.q, inp.k, inp.v, n_rescales=res.n_rescales if exact_rescales else None, **kw)
    if math.isfinite(b["bound"]):
        assert bool((_excess(inp, ref, res, b) <= 0).all())


def test_bound_holds_without_rounding_and_in_fp64():
    # the engine's exact sites still compute in float64: the bound counts u = 2^-53 there
    inp = _draw("gaussian", n=48, d=32)
    ref = reference(inp.q, inp.k, inp.v)
    for precision, policy in (("bf16", "exact"), ("fp64", "fa2"), ("fp64", "naive")):
        res = attention(inp.q, inp.k, inp.v, precision=precision, policy=policy, block_n=16)
        b = bound(inp.q, inp.k, inp.v, precision=precision, policy=policy, block_n=16)
        assert b["bound"] < 1e-12
        assert bool((_excess(inp, ref, res, b) <= 0).all())


def test_fully_masked_rows_have_zero_bound_and_overflow_gives_inf():
    inp = _draw("masked")
    b = bound(inp.q, inp.k, inp.v, precision="bf16", policy="fa2", block_n=8, causal=True)
    masked = reference(inp.q, inp.k, inp.v, causal=True).masked
    assert bool(masked.any()) and bool((b["bound_rows"][masked] == 0).all())
    assert bool((b["bound_rows"][~masked] > 0).all())
    # V near fp16's max: o = sum_j P_j V_j overflows an fp16 accumulator
    hot = _draw("near_overflow")
    assert bound(hot.q, hot.k, hot.v, precision="fp16", policy="lowp", block_n=8)["bound"] == (
        math.inf)


def test_terms_are_the_first_order_part_and_name_the_dominant_site():
    inp = _draw("gaussian", n=64, d=32)
    b = bound(inp.q, inp.k, inp.v, precision="bf16", policy="fa2", block_n=16)
    # first order is linear: the per-site parts add up to it (to O(t u) = 2^-12 u)
    assert sum(b["terms"].values()) == pytest.approx(b["first_order"], rel=1e-3)
    assert b["first_order"] <= b["bound"]
    # in fa2 bf16 the only bf16 roundings are the inputs, the P cast and the output
    assert b["dominant_site"] == max(b["terms"], key=b["terms"].get)
    assert b["dominant_site"] in ("inputs", "p_cast", "out")
    # exact sites contribute float64-level terms only
    assert b["terms"]["l"] < 1e-4 * b["terms"]["inputs"]


def test_bound_grows_with_the_unit_roundoff():
    inp = _draw("gaussian", n=64, d=32)
    bs = [bound(inp.q, inp.k, inp.v, precision=p, policy="lowp", block_n=16)["bound"]
          for p in ("fp32", "fp16", "bf16")]
    assert bs[0] < bs[1] < bs[2]
    # first order: halving nothing but the mantissa (fp16 has 3 more bits than bf16) cuts
    # the bound by about 2^3
    assert 4 < bs[2] / bs[1] < 16


def test_probabilistic_bound_is_sharper_than_the_deterministic_one():
    inp = _draw("gaussian", n=128, d=64, block_n=32)
    b = bound(inp.q, inp.k, inp.v, precision="fp32", policy="fa2", block_n=32, prob=True)
    # fp32: the d = 64 term QK^T accumulation dominates; sqrt(d) lambda u vs d u
    assert b["bound_prob"] < b["bound"] / 2
    assert math.isnan(bound(inp.q, inp.k, inp.v, precision="fp32", policy="fa2",
                            block_n=32)["bound_prob"])


def test_probabilistic_bound_holds_as_often_as_it_promises():
    # stochastic rounding satisfies the model exactly (mean-independent errors, Connolly,
    # Higham & Mary 2021); inputs on the bf16 grid so that the (nearest) input cast is exact
    delta = 0.25
    cases = fails = 0
    for seed in range(3):
        inp = make("gaussian", seq_len_q=32, head_dim=16, seed=seed, block_n=8, grid="bf16")
        ref = reference(inp.q, inp.k, inp.v)
        for policy, rounding in (("lowp", "stochastic"), ("fa2", "stochastic"),
                                 ("lowp", "nearest"), ("naive", "nearest")):
            kw = dict(precision="bf16", policy=policy, block_n=8, rounding=rounding)
            b = bound(inp.q, inp.k, inp.v, prob=True, delta=delta, **kw)
            for run in range(3 if rounding == "stochastic" else 1):
                res = attention(inp.q, inp.k, inp.v, seed=run, **kw)
                err = float(((res.out - ref.out).abs().amax(-1) - ref.err_bound).max())
                cases += 1
                fails += err > b["bound_prob"]
    # failures ~ Binomial(cases, <= delta): allow the 1 - 1e-4 quantile
    assert fails <= binom.ppf(1 - 1e-4, cases, delta), (fails, cases)


def test_bad_input_names_the_problem():
    inp = _draw("gaussian")
    with pytest.raises(ValueError, match="unknown variant"):
        bound(inp.q, inp.k, inp.v, policy="fa2", block_n=8, variant="fa3")
    with pytest.raises(ValueError, match="block_n"):
        bound(inp.q, inp.k, inp.v, policy="fa2", block_n=0)
    with pytest.raises(ValueError, match="delta"):
        bound(inp.q, inp.k, inp.v, policy="fa2", block_n=8, delta=1.5)
    with pytest.raises(ValueError, match="unknown policy"):
        bound(inp.q, inp.k, inp.v, policy="fa9", block_n=8)
    with pytest.raises(ValueError, match="n_rescales"):
        bound(inp.q, inp.k, inp.v, policy="fa2", block_n=8, n_rescales=torch.zeros(3))


# -- a bound is never a wrong finite number: the overflow family ---------------------------

def _error_within(q, k, v, b, **kw):
    """The engine's error on (q, k, v) is covered by the bound b (an infinite bound covers
    anything, a non-finite output nothing finite)."""
    res = attention(q, k, v, **kw)
    ref = reference(q, k, v, causal=kw.get("causal", False), scale=kw.get("scale"))
    if math.isinf(b):
        return True
    err = float(((res.out - ref.out).abs().amax(-1) - ref.err_bound).max())
    return bool(torch.isfinite(res.out).all()) and err <= b


def _t(rows):
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("policy", ["naive", "lowp"])
@pytest.mark.parametrize("precision", ["fp16", "fp8_e4m3", "fp8_e5m2"])
def test_an_unscaled_dot_beyond_the_logits_format_makes_the_bound_infinite(policy, precision):
    # the engine stores q.k in the logits' format before multiplying by the scale: with
    # scale = 2^-17 the dot 2^16 overflows fp16 (and saturates e4m3, overflows e5m2) while
    # the scaled logit 0.5 is small
    q, k, v = _t([[256.0]]), _t([[0.0], [-256.0]]), _t([[0.0], [1.0]])
    kw = dict(precision=precision, policy=policy, block_n=2, scale=2.0**-17)
    b = bound(q, k, v, **kw)["bound"]
    assert b == math.inf
    assert _error_within(q, k, v, b, **kw)


def test_a_dot_that_overflows_at_the_default_scale_makes_the_bound_infinite():
    # d = 256, q = k = 16: q.k = 65536 > fp16's max 65504, although the logit is 4096
    q, k, v = torch.full((1, 256), 16.0), torch.full((2, 256), 16.0), _t([[0.0], [1.0]])
    kw = dict(precision="fp16", policy="naive", block_n=2)
    assert bool(torch.isnan(attention(q, k, v, **kw).out).all())  # what the bound must flag
    assert bound(q, k, v, **kw)["bound"] == math.inf


def test_partial_sums_of_a_narrow_dot_accumulator_are_checked_for_overflow():
    from flashnum.numerics.policy import make_policy

    # 300 * 300 + 300 * (-300): the dot is 0, its first partial sum 90000 overflows fp16
    pol = make_policy("fa2", "fp16").with_sites(qk_acc="fp16")
    q, k, v = _t([[300.0, 300.0]]), _t([[300.0, -300.0], [1.0, 1.0]]), _t([[0.0], [1.0]])
    kw = dict(precision="fp16", policy=pol, block_n=2, scale=1e-4)
    assert bool(torch.isnan(attention(q, k, v, **kw).out).all())
    assert bound(q, k, v, **kw)["bound"] == math.inf
    # the same policy on a dot whose partial sums fit has a finite bound that holds
    small = _t([[3.0, 3.0]]), _t([[3.0, -3.0], [1.0, 1.0]]), v
    b = bound(*small, **kw)["bound"]
    assert math.isfinite(b) and _error_within(*small, b, **kw)


@pytest.mark.parametrize("bad, match", [
    (dict(scale=-0.125), "scale"), (dict(scale=0.0), "scale"), (dict(scale=math.inf), "scale"),
    (dict(scale=math.nan), "scale"), (dict(scale="a"), "scale"),
    (dict(variant=QiuYao(beta=0.5)), "beta"), (dict(variant=QiuYao(beta=0.9)), "beta"),
])
def test_bound_rejects_reals_outside_its_derivation(bad, match):
    # qiu_yao runs with any beta > 0; the bound's derivation assumes beta >= 1
    inp = _draw("gaussian")
    with pytest.raises(ValueError, match=match):
        bound(inp.q, inp.k, inp.v, policy="fa2", block_n=8, **bad)
