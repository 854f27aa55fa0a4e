"""The emulated online-softmax recurrence: invariants, exactness, rounding, the oracle."""

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flashnum
from flashnum.numerics.formats import get_format
from flashnum.numerics.policy import Policy, make_policy


def gaussian(*shape, seed=0, sigma=1.0):
    g = torch.Generator().manual_seed(seed)
    return sigma * torch.randn(*shape, generator=g, dtype=torch.float64)


def qkv(b=1, h=2, nq=96, nk=80, d=16, seed=0, sigma=1.0):
    return (gaussian(b, h, nq, d, seed=seed, sigma=sigma),
            gaussian(b, h, nk, d, seed=seed + 1, sigma=sigma),
            gaussian(b, h, nk, d, seed=seed + 2))


def softmax_ref(q, k, v, causal=False):
    """Plain float64 attention (the seed's `softmax(QK^T) V`), for small sanity checks."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        vis = flashnum.numerics.tiling.causal_visible(q.shape[-2], k.shape[-2])
        s = s.masked_fill(~vis, -math.inf)
    return torch.nan_to_num(torch.softmax(s, -1)) @ v


# -- the seed's example ------------------------------------------------------


def test_the_seed_tutorial_example_is_reproduced():
    # Q, K, V of shape (1, 12, 10); 4 query blocks x 3 key blocks; checked with allclose
    torch.manual_seed(0)
    query, key, value = (torch.randn(1, 12, 10) for _ in range(3))
    probs = torch.nn.functional.softmax(torch.einsum("bqd,bkd->bqk", query, key), dim=-1)
    softmax_output = torch.einsum("bqk,bkd->bqd", probs, value)
    res = flashnum.attention(query, key, value, precision="fp32", policy="exact",
                             block_m=12 // 4, block_n=12 // 3, scale=1.0, trace=True)
    assert res.trace.m.shape == (1, 3, 12)  # 3 key blocks processed per row
    # the seed's torch.allclose(atol=1e-8) is tighter than its own fp32 error on some CPUs
    # (4.2e-7 on AVX-512 MKL): measure both against plain float64 attention instead
    exact = torch.softmax(query.double() @ key.double().transpose(-1, -2), -1) @ value.double()
    assert (res.out - exact).abs().max() <= 1e-12  # exact policy: float64 throughout
    # flash-attn's oracle: the fp32 rounding of our output errs at most 2x the seed's fp32
    assert (res.out.float().double() - exact).abs().max() <= 2 * (
        softmax_output.double() - exact).abs().max()


# -- invariants (hypothesis over shapes, tiles, orders, logit ranges) ----------

ORDERS = ["forward", "reverse", "random", "max_ascending", "max_descending", "partial_first"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nq=st.integers(1, 70), nk=st.integers(1, 90), d=st.sampled_from([4, 16, 32]),
    bm=st.sampled_from([1, 8, 16, 64]), bn=st.sampled_from([1, 7, 16, 32]),
    order=st.sampled_from(ORDERS), scale_exp=st.integers(-3, 3),
    precision=st.sampled_from(["fp16", "bf16", "fp32"]), policy=st.sampled_from(["fa2", "lowp"]),
    causal=st.booleans(), seed=st.integers(0, 1000),
)
def test_softmax_state_invariants(nq, nk, d, bm, bn, order, scale_exp, precision, policy, causal,
                                  seed):
    """l > 0 after the first non-empty key block; m never decreases; the final m equals the
    exact row max of the logits, bitwise. Integer inputs in [-2, 2] and a power-of-two scale
    make every logit exact in float64 and in every format (|q.k| <= 128: 8 bits), so the
    row max is computed here in plain float64, sharing no code with the engine."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randint(-2, 3, (1, 1, n, d), generator=g).double() for n in (nq, nk, nk))
    scale = 2.0**scale_exp
    res = flashnum.attention(q, k, v, precision=precision, policy=policy, block_m=bm,
                             block_n=bn, order=order, causal=causal, seed=seed, trace=True,
                             scale=scale)
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:  # bottom-right: query i sees key j iff j <= i + nk - nq
        s = s.masked_fill(torch.arange(nk) > torch.arange(nq)[:, None] + (nk - nq), -math.inf)
    row_max = s.amax(-1)
    assert torch.equal(res.m, row_max)
    tm, tl = res.trace.m, res.trace.l
    assert bool((tm[..., 1:, :] >= tm[..., :-1, :]).all())
    seen = torch.isfinite(tm)  # a row has met a visible key by this step
    assert bool((tl[seen] > 0).all())
    assert bool((tl[~seen] == 0).all())
    assert torch.equal(res.masked, ~torch.isfinite(row_max))
    assert bool(torch.isfinite(res.out).all())


def test_fp16_logit_overflow_is_reported_not_hidden():
    # q.k = 4 * 200 * 100 = 80000 overflows fp16 (the dot is stored before scaling);
    # 4 * 150 * 100 = 60000 does not
    q = torch.full((1, 1, 2, 4), 200.0, dtype=torch.float64)
    q[..., 1, :] = 150.0
    k, v = torch.full((1, 1, 1, 4), 100.0, dtype=torch.float64), torch.ones(1, 1, 1, 4)
    with pytest.warns(RuntimeWarning, match="1 of 2 output rows are not finite"):
        res = flashnum.attention(q, k, v, precision="fp16", policy="lowp", block_n=1)
    assert res.nonfinite.tolist() == [[[True, False]]]


def test_fully_masked_rows_give_zeros_and_are_flagged_never_nan():
    q, k, v = qkv(1, 2, nq=40, nk=24, d=8)  # causal bottom-right: 16 rows see no key
    for policy in ("fa2", "naive", "lowp"):
        res = flashnum.attention(q, k, v, precision="bf16", policy=policy, causal=True,
                                 block_m=16, block_n=16)
        assert res.masked[..., :16].all() and not res.masked[..., 16:].any()
        assert bool((res.out[..., :16, :] == 0).all()) and not res.out.isnan().any()


def test_rescales_are_counted_in_processing_order():
    q, k, v = qkv(1, 1, nq=8, nk=64, d=8)
    # logits growing with the key index: every forward block raises the max, no reverse one
    k = k + torch.linspace(0, 50, 64, dtype=torch.float64)[:, None] * q.mean(-2, keepdim=True)
    q = q.mean(-2, keepdim=True).expand(1, 1, 8, 8)
    fwd = flashnum.attention(q, k, v, precision="fp32", policy="fa2", block_n=8, order="forward")
    rev = flashnum.attention(q, k, v, precision="fp32", policy="fa2", block_n=8, order="reverse")
    assert bool((fwd.n_rescales == 7).all()) and bool((rev.n_rescales == 0).all())


# -- exactness ------------------------------------------------------------------


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("variant", ["fa2", "fa1", "exp2"])
def test_exact_policy_in_fp64_matches_the_certified_reference(order, variant):
    q, k, v = qkv(2, 1, nq=50, nk=70, d=16, sigma=2.0)
    ref = flashnum.reference(q, k, v, method="certified")
    res = flashnum.attention(q, k, v, precision="fp64", policy="exact", block_m=16, block_n=16,
                             order=order, variant=variant)
    rel = (res.out - ref.out).abs().max() / ref.out.abs().max()
    assert rel < 1e-13


def test_mp_256_bits_block_order_and_size_change_the_output_by_less_than_2_pow_minus_200():
    q, k, v = qkv(1, 1, nq=6, nk=24, d=4, sigma=3.0)
    base = flashnum.attention(q, k, v, precision="mp", mp_bits=256, block_n=24)
    outs = [base.info["out_mp"]]
    for bn, order in [(4, "forward"), (4, "reverse"), (5, "max_ascending"), (1, "random")]:
        outs.append(flashnum.attention(q, k, v, precision="mp", mp_bits=256, block_n=bn,
                                       order=order).info["out_mp"])
    for o in outs[1:]:
        diff = max(abs(a - b) for a, b in zip(o.flatten(), outs[0].flatten(), strict=True))
        assert diff < 2.0**-200
    # and the mp recurrence agrees with the certified reference to float64 rounding
    ref = flashnum.reference(q, k, v)
    assert torch.equal(base.out, ref.out)


# -- rounding really happens ----------------------------------------------------


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_fa2_rounding_error_is_nonzero_and_of_the_order_of_u(precision):
    q, k, v = qkv(1, 4, nq=128, nk=256, d=64)
    ref = flashnum.reference(q, k, v, method="fp64")
    res = flashnum.attention(q, k, v, precision=precision, policy="fa2")
    u = get_format(precision).u
    err = (res.out - ref.out).abs().max().item() / ref.out.abs().max().item()
    # normwise relative error: the input and output casts alone give ~u; the
    # recurrence must not add orders of magnitude (measured: ~0.5-3 u)
    assert u / 16 < err < 16 * u


def test_stochastic_rounding_is_reproducible_by_seed_and_differs_across_seeds():
    q, k, v = qkv(1, 1, nq=32, nk=64, d=16)
    a = flashnum.attention(q, k, v, precision="bf16", policy="lowp", rounding="stochastic", seed=5)
    b = flashnum.attention(q, k, v, precision="bf16", policy="lowp", rounding="stochastic", seed=5)
    c = flashnum.attention(q, k, v, precision="bf16", policy="lowp", rounding="stochastic", seed=6)
    assert torch.equal(a.out, b.out) and not torch.equal(a.out, c.out)


def test_float64_inputs_are_rounded_once_into_the_input_format():
    # fp64 -> fp32 -> bf16 would give -0.7421875; the nearest bf16 is -0.73828125
    x = torch.full((1, 1, 1, 4), -0.7402343453901017, dtype=torch.float64)
    res = flashnum.attention(x, x, x, precision="bf16", policy="fa2")
    assert bool((res.out == -0.73828125).all())


def test_outputs_are_numbers_of_the_output_format():
    q, k, v = qkv()
    for precision in ("fp16", "bf16", "fp8_e4m3"):
        res = flashnum.attention(q, k, v, precision=precision, policy="fa2")
        assert get_format(make_policy("fa2", precision).out).representable(res.out)


def test_variants_agree_with_the_reference_to_bf16_accuracy():
    q, k, v = qkv(1, 2, nq=64, nk=200, d=32, sigma=2.0)
    ref = flashnum.reference(q, k, v, method="fp64")
    for variant in ("fa2", "fa1", "exp2", "lazy", "qiu_yao"):
        res = flashnum.attention(q, k, v, precision="bf16", policy="fa2", variant=variant,
                                 block_n=16)
        assert (res.out - ref.out).abs().max() < 8 * 2.0**-8 * ref.out.abs().max()


def test_max_orders_rank_tiles_over_real_query_rows_only():
    # all logits negative and Nq not a multiple of block_m: zero-padded query rows
    # (logit 0) must not decide the order
    q, k, v = qkv(1, 1, nq=5, nk=32, d=4)
    q = q.abs()
    k = -(k.abs() + torch.arange(32, dtype=torch.float64)[:, None] * 0.1)  # later keys smaller
    res = flashnum.attention(q, k, v, precision="fp32", policy="fa2", block_m=8, block_n=8,
                             order="max_ascending", trace=True)
    assert res.trace.order[0, 0, 0].tolist() == [3, 2, 1, 0]


def test_lazy_rescaling_skips_rescales_below_tau():
    q, k, v = qkv(1, 1, nq=16, nk=256, d=16, sigma=2.0)
    eager = flashnum.attention(q, k, v, precision="fp32", policy="fa2", block_n=16)
    lazy = flashnum.attention(q, k, v, precision="fp32", policy="fa2", block_n=16,
                              variant="lazy", tau=1e9)
    assert eager.n_rescales.sum() > 0 and lazy.n_rescales.sum() == 0
    assert (lazy.out - eager.out).abs().max() < 1e-5


def test_qiu_yao_adjustment_removes_every_p_equal_to_one():
    # two identical keys give every query a repeated row max: P has two entries exactly 1.
    # Integer inputs and scale 1/4: every logit is exact in bf16, so P = fl(exp(s - m)) is
    # computed here from float64 logits and the run's final m
    g = torch.Generator().manual_seed(0)
    q = torch.randint(1, 4, (1, 1, 8, 8), generator=g).double()
    k = torch.randint(-2, 3, (1, 1, 16, 8), generator=g).double()
    k[..., 3, :] = k[..., 7, :] = 4.0  # the largest logit of every row, twice
    v = torch.randn(1, 1, 16, 8, generator=g, dtype=torch.float64)
    s = (q @ k.transpose(-1, -2)) / 4

    def ones_in_p(variant):
        res = flashnum.attention(q, k, v, precision="bf16", policy="lowp", variant=variant,
                                 block_n=16, scale=0.25)
        return (torch.exp(s - res.m[..., None]).to(torch.bfloat16) == 1).sum(-1)

    assert bool((ones_in_p("fa2") >= 2).all())  # the ties Qiu & Yao point at
    assert bool((ones_in_p("qiu_yao") == 0).all())


def test_custom_policy_is_one_dataclass_away():
    pol = make_policy("fa2", "bf16").with_sites(p_cast="fp8_e4m3")
    q, k, v = qkv()
    res = flashnum.attention(q, k, v, policy=pol)
    base = flashnum.attention(q, k, v, policy="fa2")
    assert not torch.equal(res.out, base.out)
    assert Policy(inputs="fp16").only("inputs").sites()["inputs"] == "fp16"


def test_batch_dims_and_unequal_lengths_and_ragged_tails():
    q, k, v = qkv(2, 3, nq=37, nk=53, d=8)
    v = torch.cat([v, v[..., :3]], -1)  # dv != d
    res = flashnum.attention(q, k, v, precision="fp64", policy="exact", block_m=16, block_n=16)
    assert res.out.shape == (2, 3, 37, 11)
    assert torch.allclose(res.out, softmax_ref(q, k, v), rtol=0, atol=1e-14)


# -- bad input: one clear error naming the value and the valid choices -------------


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(precision="fp17"), "unknown precision 'fp17'; valid: fp64, fp32"),
        (dict(policy="fast"), "unknown policy 'fast'; valid: fa2, naive, lowp, exact"),
        (dict(order="sideways"), "unknown order 'sideways'; valid: forward, reverse"),
        (dict(order=[0, 0, 1]), r"not a permutation of range\(2\)"),
        (dict(variant="fa3"), "unknown variant 'fa3'; valid: fa2, fa1"),
        (dict(block_n=0), "block_n must be a positive integer, got 0"),
        (dict(block_m=-4), "block_m must be a positive integer, got -4"),
        (dict(rounding="up"), "unknown rounding 'up'; valid: nearest, stochastic"),
        (dict(backend="cuda"), "unknown backend 'cuda'; valid: emulate, triton, mp"),
    ],
)
def test_bad_arguments_raise_one_clear_error(kw, match):
    q, k, v = qkv(nq=16, nk=100, d=8)
    with pytest.raises(ValueError, match=match):
        flashnum.attention(q, k, v, **{"block_n": 64, **kw})


@pytest.mark.parametrize(
    "kw,error,match",
    [
        (dict(scale=float("nan")), ValueError, "scale must be finite, got nan"),
        (dict(scale=float("inf")), ValueError, "scale must be finite, got inf"),
        (dict(scale="a"), TypeError, "scale must be a real number, got 'a'"),
        (dict(scale=True), TypeError, "scale must be a real number, got True"),
        (dict(causal="yes"), ValueError, "causal must be True or False, or an alignment "
                                         "'bottom_right' .* or 'top_left', got 'yes'"),
        (dict(causal=1), TypeError, "causal must be True or False, or an alignment "
                                    "'bottom_right' .* or 'top_left', got 1"),
        (dict(trace="no"), TypeError, "trace must be True or False, got 'no'"),
        (dict(seed=1.5), TypeError, "seed must be an integer, got 1.5"),
        # checked where the variant takes them (fa2 ignores both: tests/test_hostile_api.py)
        (dict(variant="lazy", tau=-1.0), ValueError, "tau must be >= 0.0, got -1.0"),
        (dict(variant="qiu_yao", beta=float("nan")), ValueError, "beta must be finite, got nan"),
        (dict(precision="mp", mp_bits=1), ValueError, "mp_bits must be an integer >= 2, got 1"),
    ],
)
def test_bad_options_raise_one_error_naming_the_argument(kw, error, match):
    q, k, v = qkv(nq=8, nk=8, d=4)
    with pytest.raises(error, match=match):
        flashnum.attention(q, k, v, **kw)


@pytest.mark.parametrize(
    "shapes,match",
    [
        (((1, 0, 4), (1, 8, 4), (1, 8, 4)), r"query count Nq \(q.shape\[-2\]\) is 0"),
        (((1, 8, 4), (1, 0, 4), (1, 0, 4)), r"key count Nk \(k.shape\[-2\]\) is 0"),
        (((1, 8, 0), (1, 8, 0), (1, 8, 4)), r"head dim d \(q.shape\[-1\]\) is 0"),
        (((1, 8, 4), (1, 8, 4), (1, 8, 0)), r"value dim dv \(v.shape\[-1\]\) is 0"),
        (((0, 2, 8, 4), (0, 2, 8, 4), (0, 2, 8, 4)), r"batch dims \(0, 2\) hold no head"),
        (((2, 0, 8, 4), (2, 0, 8, 4), (2, 0, 8, 4)), r"batch dims \(2, 0\) hold no head"),
    ],
)
def test_empty_shapes_are_rejected_naming_the_empty_dimension(shapes, match):
    q, k, v = (torch.ones(s) for s in shapes)
    with pytest.raises(ValueError, match=match):
        flashnum.attention(q, k, v)


def test_non_tensors_and_integer_tensors_are_type_errors():
    q, k, v = qkv(nq=8, nk=8, d=4)
    with pytest.raises(TypeError, match="k must be a torch.Tensor, got list"):
        flashnum.attention(q, k.tolist(), v)
    with pytest.raises(TypeError, match="v must be floating point, got torch.int64"):
        flashnum.attention(q, k, v.long())


def test_the_triton_backend_without_triton_says_how_to_install_it(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "triton", None)  # what `import triton` meets without it
    monkeypatch.delitem(sys.modules, "flashnum.backends.triton", raising=False)
    q, k, v = qkv(nq=8, nk=8, d=4)
    with pytest.raises(ValueError, match=r"pip install triton \(or pip install -e \.\[triton\]\)"):
        flashnum.attention(q, k, v, backend="triton")


@pytest.mark.parametrize("precision,big,n,what", [
    ("fp16", 7e4, 2, "round to inf or NaN"),  # beyond fp16's 65504 (and its threshold 65520)
    ("fp16", 65519.0, 0, None),  # below the threshold: rounds to 65504, no overflow
    ("fp8_e4m3", 500.0, 2, "saturate to"),  # e4m3 saturates beyond 464 (448 + half an ulp)
])
def test_finite_inputs_that_overflow_the_inputs_format_are_warned_about(precision, big, n, what):
    import warnings

    q, k, v = qkv(nq=8, nk=8, d=4)
    k[0, 0, 1, 2] = big
    k[0, 1, 5, 0] = -big
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        flashnum.attention(q, k, v, precision=precision, policy="fa2")
    msgs = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    if n == 0:
        assert msgs == []
    else:
        assert len(msgs) == 1 and msgs[0].startswith(f"k: {n} of {k.numel()} finite values "
                                                     f"overflow the inputs format {precision}")
        assert what in msgs[0]


# -- the in-place fast path changes no bit --------------------------------------------


def _same_bits(a, b):
    return a.shape == b.shape and torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(
        torch.nan_to_num(a, nan=0.0), torch.nan_to_num(b, nan=0.0)
    )


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32", "tf32", "fp8_e4m3"])
@pytest.mark.parametrize("variant", ["fa2", "exp2", "lazy", "qiu_yao", "qiu_yao_released"])
@pytest.mark.parametrize("order,causal,nq,nk", [("forward", False, 70, 90),
                                                ("reverse", True, 70, 90),
                                                ("forward", True, 90, 40),  # 50 masked rows
                                                ("max_ascending", False, 70, 90)])
@pytest.mark.parametrize("sigma", [1.0, 1e19])  # 1e19: fp32 logits overflow, m = inf/NaN
# flashnum.engine.fused's whole loop where it claims the call, native's exp kernel, or torch's
@pytest.mark.parametrize("kernel", ["fused", True, False])
# sigma 1e19 overflows fp16/fp8 inputs on purpose: attention's warning about it is expected
@pytest.mark.filterwarnings("ignore:.*overflow the inputs format:RuntimeWarning")
def test_fast_path_is_bit_identical_to_the_readable_steps(monkeypatch, precision, variant, order,
                                                          causal, nq, nk, sigma, kernel):
    # fp32 inputs (the stored-input shortcut) in ragged tiles, three heads run one at a time
    # by the fast path (flashnum.engine.fast): every output, the final m and l, the trace and
    # the rescale counts must equal the readable steps' (flashnum.engine.recurrence) bit for bit
    import flashnum.engine.fast
    import flashnum.engine.flash
    import flashnum.engine.fused
    import flashnum.engine.native

    if kernel != "fused":
        monkeypatch.setattr(flashnum.engine.fused, "_enabled", False)
    if not kernel:
        monkeypatch.setattr(flashnum.engine.native, "exp_rows", lambda *a, **kw: False)

    q, k, v = (x.float() for x in qkv(h=3, nq=nq, nk=nk, d=8, seed=3, sigma=sigma))
    kw = dict(precision=precision, policy="fa2", block_m=16, block_n=16, order=order,
              variant=variant, causal=causal, trace=True)
    monkeypatch.setattr(flashnum.engine.fast, "CHUNK", 1)
    fast = flashnum.attention(q, k, v, **kw)
    monkeypatch.setattr(flashnum.engine.flash, "in_place_ok", lambda ar: False)
    monkeypatch.setattr(flashnum.engine.fused, "_enabled", False)
    slow = flashnum.attention(q.double(), k.double(), v.double(), **kw)
    for a, b in [(fast.out, slow.out), (fast.m, slow.m), (fast.l, slow.l),
                 (fast.trace.m, slow.trace.m), (fast.trace.l, slow.trace.l)]:
        assert _same_bits(a, b)
    assert torch.equal(fast.n_rescales, slow.n_rescales)
    assert torch.equal(fast.masked, slow.masked)
    assert bool(fast.masked.any()) == (nq > nk and causal)
