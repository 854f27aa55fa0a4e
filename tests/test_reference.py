"""The exact reference: what `flashnum.reference` promises, as tests.

certified  = the float64 nearest the exact attention of the given inputs; checked
             against an independent mpmath row loop, at 256 bits and at 400 bits.
fp64       = float64 attention whose error stays below its stated a-priori bound.
cache      = a second call with the same inputs is not recomputed (memory, disk).
"""

from __future__ import annotations

import math

import mpmath
import pytest
import torch
from flint import arb, ctx

import flashnum.reference.certified as certified_mod
from flashnum.reference import (
    cache_info,
    clear_cache,
    input_hash,
    reference,
    reference_cache_dir,
)

U = 2.0**-53


def gen(seed):
    return torch.Generator().manual_seed(seed)


def qkv(shape_q, nk, dv=None, seed=0, sq=1.0, sk=1.0):
    g = gen(seed)
    *lead, nq, d = shape_q
    dv = d if dv is None else dv
    q = torch.randn(*lead, nq, d, generator=g, dtype=torch.float64) * sq
    k = torch.randn(*lead, nk, d, generator=g, dtype=torch.float64) * sk
    v = torch.randn(*lead, nk, dv, generator=g, dtype=torch.float64)
    return q, k, v


def assert_same(a, b):
    """Bitwise equal float64 results (NaN-free; -inf allowed)."""
    for name in ("out", "lse", "row_max"):
        x, y = getattr(a, name), getattr(b, name)
        assert torch.equal(x, y), f"{name}: max diff {(x - y).abs().nan_to_num().max()}"


# -- certified against mpmath -----------------------------------------------------------
# Both sides round to float64 at the end. mpmath at 256 bits is off the exact value by
# ~2^-240 relative, so the two can differ only if the exact value lies within 2^-240 of
# a rounding boundary: they must agree bitwise (far stronger than 2^-60 relative).


def test_certified_equals_mpmath_on_gaussian_inputs():
    q, k, v = qkv((2, 24, 16), nk=40, dv=8, seed=1)
    c = reference(q, k, v, cache=False)
    m = reference(q, k, v, method="mpmath", cache=False)
    assert_same(c, m)
    assert c.info["uncertain_rows"] == 0
    # every value certified: its ball's relative radius < 2^-60 and the rounding certain
    assert bool((c.err_bound <= c.out.abs().amax(-1) * 2.0**-52).all())


def test_certified_on_wide_range_logits_where_fp64_exps_underflow():
    q, k, v = qkv((1, 16, 16), nk=64, dv=8, seed=2, sq=20.0, sk=20.0)
    s = (q @ k.transpose(-1, -2)) / 4
    x = s - s.amax(-1, keepdim=True)
    assert (s.amax(-1) - s.amin(-1)).min() > 1000  # logit range 1e3 to 2e3
    assert (x < -745).float().mean() > 0.4  # exp(x) is 0 in float64 for half the entries
    c = reference(q, k, v, cache=False)
    m = reference(q, k, v, method="mpmath", cache=False)
    assert_same(c, m)


def test_certified_is_correctly_rounded_against_mpmath_at_400_bits():
    q, k, v = qkv((16, 16), nk=48, dv=8, seed=3, sq=2.0)
    c = reference(q, k, v, cache=False)
    m = reference(q, k, v, method="mpmath", bits=400, cache=False)
    assert_same(c, m)


def test_causal_with_fully_masked_rows_and_nq_ne_nk():
    # bottom-right aligned: with Nq=12 > Nk=8 rows 0..3 see no key
    q, k, v = qkv((2, 12, 8), nk=8, dv=4, seed=4)
    c = reference(q, k, v, causal=True, cache=False)
    m = reference(q, k, v, causal=True, method="mpmath", cache=False)
    assert_same(c, m)
    dead = torch.arange(12) < 4
    assert torch.equal(c.masked, dead.expand(2, 12))
    assert bool((c.out[:, :4] == 0).all()) and bool((c.err_bound[:, :4] == 0).all())
    assert bool(torch.isneginf(c.lse[:, :4]).all() and torch.isneginf(c.row_max[:, :4]).all())
    # row 4 sees exactly key 0: its output is v_0, exactly
    assert torch.equal(c.out[:, 4], v[:, 0])
    # Nq < Nk: every row sees a prefix of length i + Nk - Nq + 1
    q, k, v = qkv((5, 8), nk=9, dv=3, seed=5)
    assert_same(
        reference(q, k, v, causal=True, cache=False),
        reference(q, k, v, causal=True, method="mpmath", cache=False),
    )


def test_batch_and_head_dims_are_independent_problems():
    q, k, v = qkv((2, 3, 6, 8), nk=10, dv=5, seed=6)
    c = reference(q, k, v, causal=True, cache=False)
    assert c.out.shape == (2, 3, 6, 5) and c.lse.shape == c.err_bound.shape == (2, 3, 6)
    one = reference(q[1, 2], k[1, 2], v[1, 2], causal=True, cache=False)
    assert torch.equal(c.out[1, 2], one.out) and torch.equal(c.lse[1, 2], one.lse)
    assert_same(c, reference(q, k, v, causal=True, method="mpmath", cache=False))


def test_scale_none_is_exactly_one_over_sqrt_d_and_other_scales():
    # d = 3: 1/sqrt(3) is irrational; a float scale is taken as the value it holds
    q, k, v = qkv((6, 3), nk=7, dv=2, seed=7)
    for scale in (None, 1 / math.sqrt(3), -0.7, 0.0):
        assert_same(
            reference(q, k, v, scale=scale, cache=False),
            reference(q, k, v, scale=scale, method="mpmath", cache=False),
        )
    zero = reference(q, k, v, scale=0.0, cache=False)  # uniform weights: the mean of v
    assert torch.allclose(zero.out, v.mean(0).expand(6, 2), rtol=0, atol=4 * U)


def test_exact_tie_is_rounded_to_even():
    # all logits equal: exp(X) = exp(0) = 1 exactly (the shift is exact), so the output
    # is the exact mean (1 + (1 + 2^-52)) / 2 = 1 + 2^-53, a tie: nearest-even gives 1.0
    d = 3  # scale 1/sqrt(3) is a ball, yet scale * 0 = 0 exactly
    q = torch.ones(1, d, dtype=torch.float64)
    k = torch.ones(2, d, dtype=torch.float64)
    v = torch.tensor([[1.0], [1.0 + 2.0**-52]], dtype=torch.float64)
    c = reference(q, k, v, cache=False)
    assert c.out.item() == 1.0 and c.info["uncertain_rows"] == 0
    old = ctx.prec
    ctx.prec = 200
    try:
        lse = arb(3).sqrt() + arb(2).log()  # sqrt(3) + log 2, far from a float64 boundary
        assert float(lse.lower()) == float(lse.upper()) == c.lse.item()
    finally:
        ctx.prec = old
    v[1] = 1.0 + 3 * 2.0**-52  # mean 1 + 3 2^-53: the tie now goes up to 1 + 2^-51
    assert reference(q, k, v, cache=False).out.item() == 1.0 + 2.0**-51


@pytest.mark.parametrize("method", ["certified", "fp64", "mpmath"])
def test_empty_and_extreme_shapes(method):
    g = gen(18)
    r = reference(
        torch.randn(3, 4, generator=g),
        torch.zeros(0, 4),
        torch.zeros(0, 2),
        method=method,
        cache=False,
    )  # no keys: every row is fully masked
    assert bool((r.out == 0).all() and r.masked.all() and (r.err_bound == 0).all())
    r = reference(
        torch.zeros(2, 0, 4), torch.zeros(2, 3, 4), torch.zeros(2, 3, 5), method=method, cache=False
    )
    assert r.out.shape == (2, 0, 5) and r.lse.shape == (2, 0)
    r = reference(
        torch.randn(3, 4, generator=g),
        torch.randn(5, 4, generator=g),
        torch.zeros(5, 0),
        method=method,
        cache=False,
    )  # dv = 0: lse still defined
    assert r.out.shape == (3, 0) and bool(torch.isfinite(r.lse).all())


def test_logits_beyond_float64_range_round_to_inf():
    # |q.k| ~ 1e320: the exact row max and lse overflow float64, as correct rounding says
    q, k, v = qkv((3, 4), nk=5, dv=2, seed=19, sq=1e160, sk=1e160)
    c = reference(q, k, v, cache=False)
    assert bool(torch.isposinf(c.row_max).all() and torch.isposinf(c.lse).all())
    assert_same(c, reference(q, k, v, method="mpmath", cache=False))
    assert bool(torch.isposinf(reference(q, k, v, method="fp64", cache=False).err_bound).all())


def test_precision_is_raised_until_the_rounding_is_certain():
    # at 64 bits the balls are ~2^-55 wide relative: too wide for 2^-60, so every row
    # is recomputed at 128 bits; the result is the same correctly rounded float64
    q, k, v = qkv((8, 8), nk=16, dv=4, seed=8)
    low = reference(q, k, v, bits=64, cache=False)
    assert low.info["max_prec"] >= 128
    assert_same(low, reference(q, k, v, bits=256, cache=False))


def test_worker_processes_give_the_same_result(monkeypatch):
    q, k, v = qkv((3, 10, 8), nk=12, dv=4, seed=9)
    fast = reference(q, k, v, cache=False)
    monkeypatch.setattr(certified_mod, "FAST_MIN_BITS", 10**9)  # every row through arb
    one = reference(q, k, v, cache=False, workers=1)
    two = reference(q, k, v, cache=False, workers=2)
    assert two.info["workers"] == 2 and two.info["fast_rows"] == 0
    assert_same(one, two)
    assert torch.equal(one.err_bound, two.err_bound)
    assert fast.info["fast_rows"] == 30
    assert_same(fast, one)
    assert torch.equal(fast.err_bound, one.err_bound)


def test_precision_state_is_restored():
    q, k, v = qkv((4, 8), nk=6, seed=10)
    mp_prec, flint_prec = mpmath.mp.prec, ctx.prec
    reference(q, k, v, bits=300, cache=False)
    reference(q, k, v, method="mpmath", bits=300, cache=False)
    assert mpmath.mp.prec == mp_prec and ctx.prec == flint_prec


# -- fp64 and its a-priori bound --------------------------------------------------------


def test_torch_float64_exp_is_within_one_ulp():
    # the fp64 bound assumes |fl(exp(x)) - exp(x)| <= ulp(exp(x)) (SLEEF's u10 exp)
    g = gen(11)
    x = torch.cat(
        [
            -745 * torch.rand(3000, generator=g, dtype=torch.float64),
            -torch.rand(1000, generator=g, dtype=torch.float64),
        ]
    )
    y = torch.exp(x)
    old = ctx.prec
    ctx.prec = 128
    try:
        worst = max(
            abs(float(arb(yi) - arb(xi).exp())) / math.ulp(yi)
            for xi, yi in zip(x.tolist(), y.tolist(), strict=True)
        )
    finally:
        ctx.prec = old
    assert worst <= 1.0, worst


CASES = {
    # name: (q scale, k scale, Nk): gaussian, logits scaled up, huge logit range
    "gaussian": (1.0, 1.0, 96),
    "scaled": (4.0, 4.0, 96),
    "huge_range": (12.0, 12.0, 96),
}


@pytest.mark.parametrize("name", list(CASES))
def test_fp64_error_is_below_its_bound(name):
    sq, sk, nk = CASES[name]
    q, k, v = qkv((2, 32, 16), nk=nk, dv=8, seed=12, sq=sq, sk=sk)
    for causal in (False, True):
        exact = reference(q, k, v, causal=causal, cache=False)
        f = reference(q, k, v, causal=causal, method="fp64", cache=False)
        err = (f.out - exact.out).abs().amax(-1)
        assert bool((err <= f.err_bound).all()), (err / f.err_bound).max()
        # not absurdly loose: a worst-case bound sits ~d/sqrt(d) (logits) and
        # ~n/sqrt(n) (sums) above the typical error; seen here: 50 to 300
        ratio = f.err_bound.max() / err.max()
        print(f"{name} causal={causal}: max err {err.max():.2e}, bound/measured {ratio:.0f}")
        assert err.max() > 0 and ratio < 2000
        assert torch.equal(f.masked, exact.masked)


def test_fp64_fully_masked_rows():
    q, k, v = qkv((6, 8), nk=3, seed=13)
    f = reference(q, k, v, causal=True, method="fp64", cache=False)
    assert bool((f.out[:3] == 0).all() and torch.isneginf(f.lse[:3]).all())
    assert bool((f.err_bound[:3] == 0).all() and not f.out.isnan().any())


# -- cache --------------------------------------------------------------------------------


def test_second_call_is_served_from_memory():
    clear_cache()
    q, k, v = qkv((5, 8), nk=6, seed=14)
    n0 = cache_info()["computed"]
    a = reference(q, k, v)
    b = reference(q.clone(), k.clone(), v.clone())
    info = cache_info()
    assert info["computed"] == n0 + 1 and info["memory_hits"] >= 1
    assert_same(a, b)
    a.out.zero_()  # the caller owns its copy: the cache is not changed through it
    assert_same(b, reference(q, k, v))
    reference(q, k, v, causal=True)  # other options: another entry
    assert cache_info()["computed"] == n0 + 2


def test_disk_cache_persists_across_processes(tmp_path, monkeypatch):
    q, k, v = qkv((5, 8), nk=6, seed=15)
    old = reference_cache_dir(tmp_path)
    try:
        clear_cache()
        a = reference(q, k, v, method="fp64")
        assert (tmp_path / (input_hash(q, k, v, method="fp64") + ".pt")).exists()
        clear_cache()  # as if a new process
        n0, d0 = cache_info()["computed"], cache_info()["disk_hits"]
        b = reference(q, k, v, method="fp64")
        assert cache_info()["computed"] == n0 and cache_info()["disk_hits"] == d0 + 1
        assert_same(a, b) and torch.equal(a.err_bound, b.err_bound)
    finally:
        reference_cache_dir(old)
    monkeypatch.setenv("FLASHNUM_CACHE", str(tmp_path / "env"))
    reference(q, k, v, causal=True)
    assert (tmp_path / "env" / (input_hash(q, k, v, causal=True) + ".pt")).exists()
    clear_cache()


def test_input_hash_sees_every_option():
    q, k, v = qkv((4, 8), nk=5, seed=16)
    h = input_hash(q, k, v)
    assert h == input_hash(q.clone(), k.clone(), v.clone())
    others = [
        input_hash(q, k, v, causal=True),
        input_hash(q, k, v, scale=0.5),
        input_hash(q, k, v, method="fp64"),
        input_hash(q, k, v, bits=128),
        input_hash(q.float().double(), k, v),  # the values of q rounded to fp32 ...
        input_hash(q.reshape(2, 2, 8), k.expand(2, 5, 8), v.expand(2, 5, 8)),
    ]
    assert input_hash(q.float(), k, v) != others[-1]  # ... and the same values as fp32
    q2 = q.clone()
    q2[0, 0] = math.nextafter(q2[0, 0].item(), 1.0)
    others.append(input_hash(q2, k, v))
    assert len({h, *others}) == len(others) + 1


# -- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(k=torch.zeros(5, 7)), "d=8 but k has d=7"),
        (dict(v=torch.zeros(4, 3)), "Nk=5 but v has Nk=4"),
        (dict(q=torch.zeros(2, 4, 8)), "leading dims differ"),
        (dict(q=torch.zeros(8)), "ndim >= 2"),
        (dict(method="exact"), "unknown method 'exact'; valid: certified, fp64, mpmath"),
        (dict(bits=32), "bits must be an integer >= 64, got 32"),
        (dict(scale=float("nan")), "scale must be None or a finite real, got nan"),
        (dict(causal="yes"), "causal must be True or False"),
        (dict(q=torch.ones(4, 8, dtype=torch.complex128)), "valid: a real float"),
        (dict(q=torch.zeros(4, 0), k=torch.zeros(5, 0)), "d=0; valid: a head dim d >= 1"),
    ],
)
def test_bad_input_raises_one_clear_error(change, match):
    args = dict(q=torch.zeros(4, 8), k=torch.zeros(5, 8), v=torch.zeros(5, 3))
    args.update(change)
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    with pytest.raises(ValueError, match=match.replace("(", r"\(")):
        reference(q, k, v, **args)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nan_and_inf_inputs_are_refused(bad):
    q, k, v = qkv((4, 8), nk=5, seed=17)
    for name in ("q", "k", "v"):
        t = dict(q=q.clone(), k=k.clone(), v=v.clone())
        t[name][1, 2] = bad
        with pytest.raises(ValueError, match=f"{name} contains {bad}"):
            reference(t["q"], t["k"], t["v"], cache=False)
