"""Rounding into formats: the boundaries Higham & Pranesh's chop tests probe, checked
against independent implementations (torch's native casts, exact rational arithmetic)."""

from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flashnum.numerics.formats import FORMATS, get_format

NATIVE = [n for n in ("fp16", "bf16", "fp8_e4m3", "fp8_e5m2") if FORMATS[n].torch_dtype is not None]


def t(*xs):
    return torch.tensor(xs, dtype=torch.float64)


@pytest.mark.parametrize(
    "name,u,xmax,xmin,xsub",
    [
        ("fp32", 2.0**-24, (2 - 2.0**-23) * 2.0**127, 2.0**-126, 2.0**-149),
        ("tf32", 2.0**-11, (2 - 2.0**-10) * 2.0**127, 2.0**-126, 2.0**-136),
        ("fp16", 2.0**-11, 65504.0, 2.0**-14, 2.0**-24),
        ("bf16", 2.0**-8, (2 - 2.0**-7) * 2.0**127, 2.0**-126, 2.0**-133),
        ("fp8_e4m3", 2.0**-4, 448.0, 2.0**-6, 2.0**-9),
        ("fp8_e5m2", 2.0**-3, 57344.0, 2.0**-14, 2.0**-16),
    ],
)
def test_each_format_knows_its_parameters(name, u, xmax, xmin, xsub):
    f = get_format(name)
    assert (f.u, f.max, f.min_normal, f.min_subnormal) == (u, xmax, xmin, xsub)
    # the parameters are numbers of the format, and the next ones up/down are not
    assert f.representable(t(xmax, xmin, xsub, -xmax))
    assert f.round(t(xsub / 2)).item() == 0.0  # tie between 0 and xsub goes to even 0
    assert f.round(t(xsub * 0.75)).item() == xsub


@pytest.mark.parametrize("name", ["fp16", "bf16", "fp8_e5m2", "tf32"])
def test_overflow_threshold_is_where_round_to_nearest_leaves_the_finite_numbers(name):
    f = get_format(name)
    below = torch.nextafter(t(f.overflow_threshold), t(0.0))
    assert f.round(below).item() == f.max
    assert f.round(t(f.overflow_threshold)).item() == float("inf")
    assert f.round(-t(f.overflow_threshold)).item() == float("-inf")


def test_fp16_overflow_threshold_is_65520():
    assert get_format("fp16").overflow_threshold == 65520.0


def test_e4m3_saturates_by_default_and_can_give_nan_like_the_raw_cast():
    f = get_format("fp8_e4m3")
    assert f.round(t(463.9, 464.0, 1e6, float("inf"))).tolist() == [448.0] * 4
    assert f.overflow_threshold == 464.0
    assert f.round(t(464.0001), saturate=False).isnan().item()
    # 464 is the tie between 448 (significand 1.110, even) and 480 (the NaN encoding)
    assert f.round(t(464.0), saturate=False).item() == 448.0


def test_ties_go_to_even():
    bf16 = get_format("bf16")
    one_ulp = 2.0**-7  # spacing of bf16 in [1, 2)
    # 1 + ulp/2 sits between 1 (even) and 1 + ulp (odd): goes to 1
    assert bf16.round(t(1 + one_ulp / 2)).item() == 1.0
    # 1 + 3 ulp/2 sits between 1 + ulp (odd) and 1 + 2 ulp (even): goes up
    assert bf16.round(t(1 + 3 * one_ulp / 2)).item() == 1 + 2 * one_ulp
    fp16 = get_format("fp16")
    assert fp16.round(t(2049.0)).item() == 2048.0 and fp16.round(t(2051.0)).item() == 2052.0


def test_nan_inf_signed_zero_pass_through():
    y = get_format("bf16").round(t(float("nan"), float("inf"), -float("inf"), -0.0))
    assert y[0].isnan() and y[1] == float("inf") and y[2] == -float("inf")
    assert torch.signbit(y[3])


@pytest.mark.parametrize("name", NATIVE)
def test_agrees_with_torch_native_casts_on_fp32_inputs(name):
    # on fp32 inputs torch's cast is a single round-to-nearest-even: an independent check
    g = torch.Generator().manual_seed(1)
    mant = torch.randn(200_000, generator=g, dtype=torch.float32)
    expo = torch.randint(-40, 20, (200_000,), generator=g).to(torch.float32)
    x = (mant * torch.exp2(expo)).to(torch.float64)
    f = get_format(name)
    ours = f.round(x)
    native = x.to(torch.float32).to(f.torch_dtype).to(torch.float64)
    assert torch.equal(ours, native)


def _nearest_even_fraction(x: float, f) -> float:
    """Round a float64 to the format with exact rationals (slow, independent)."""
    fx = Fraction(x)
    if fx == 0:
        return 0.0
    a = abs(fx)
    e = max(a.numerator.bit_length() - a.denominator.bit_length(), f.emin)
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    e = max(e, f.emin)
    spacing = Fraction(2) ** (e - f.p + 1)
    q, r = divmod(a, spacing)
    if r * 2 > spacing or (r * 2 == spacing and q % 2 == 1):
        q += 1
    y = float(q * spacing)
    if y > f.max:
        y = float("inf")
    return y if fx > 0 else -y


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_subnormal=True))
def test_bf16_and_fp16_are_correctly_rounded_from_float64(x):
    # torch and ml_dtypes convert float64 -> bf16 through fp32 and double-round; we do not
    for name in ("bf16", "fp16", "tf32"):
        f = get_format(name)
        assert f.round(t(x)).item() == _nearest_even_fraction(x, f)


def test_a_known_double_rounding_case_is_rounded_correctly():
    from fractions import Fraction

    x = -0.7402343453901017  # fp32 rounding first puts it on a bf16 tie
    lo, hi = -0.7421875, -0.73828125  # its bf16 neighbours (2^-8 apart)
    assert hi - lo == 2.0**-8 and lo < x < hi
    # exactly: x is nearer to hi, so hi is the correctly rounded bf16 value
    assert abs(Fraction(x) - Fraction(hi)) < abs(Fraction(x) - Fraction(lo))
    # the trap is real: float64 -> fp32 -> bf16 (torch's cast) gives the other neighbour
    assert torch.tensor(x, dtype=torch.float64).float().bfloat16().item() == lo
    assert get_format("bf16").round(t(x)).item() == hi


def test_subnormals_are_kept_with_the_fixed_spacing():
    f = get_format("fp16")
    xs = t(3 * 2.0**-24, 2.5 * 2.0**-24, 3.5 * 2.0**-24)
    assert f.round(xs).tolist() == [3 * 2.0**-24, 2 * 2.0**-24, 4 * 2.0**-24]


def test_stochastic_rounding_is_unbiased_seeded_and_lands_on_neighbours():
    f = get_format("bf16")
    x = torch.full((100_000,), 1 + 2.0**-7 / 4, dtype=torch.float64)  # a quarter ulp above 1
    y = f.round(x, "stochastic", torch.Generator().manual_seed(3))
    assert set(y.unique().tolist()) == {1.0, 1 + 2.0**-7}
    frac_up = (y > 1).double().mean().item()
    # binomial(1e5, 1/4): standard deviation 0.0014; 5 sigma
    assert abs(frac_up - 0.25) < 5 * (0.25 * 0.75 / 1e5) ** 0.5
    y2 = f.round(x, "stochastic", torch.Generator().manual_seed(3))
    assert torch.equal(y, y2)


def test_stochastic_rounding_needs_a_generator_and_a_known_mode():
    with pytest.raises(ValueError, match="Generator"):
        get_format("bf16").round(t(1.0), "stochastic")
    with pytest.raises(ValueError, match="valid: nearest, stochastic"):
        get_format("bf16").round(t(1.0), "up")


def test_unknown_format_names_the_valid_ones():
    with pytest.raises(ValueError, match="unknown format 'fp17'.*bf16"):
        get_format("fp17")


def test_p_bit_formats_and_mp():
    assert get_format("p5").u == 2.0**-5
    assert get_format("mp", mp_bits=100).u == 2.0**-100
    assert get_format("mp300").p == 300
