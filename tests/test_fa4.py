"""FlashAttention-4's numerics and the fp8 MMA accumulator: the polynomial exp2 errs by its
approximation error and no more; as the exp site it moves attention by at most twice that
(times max|V|); P scaled by 2^offset before an fp8 cast with a lazy-rescale threshold
saturates e4m3 exactly when offset + threshold > log2(448) (flash-attention #2716) and
not e5m2; an accumulator of 14 truncated bits across key blocks errs more than one
promoted to fp32 after every block (the two-level fix); the k-group adder of the fp8 MMA
(aligned to the largest addend, 14 bits kept) equals an exact-rational implementation."""

import math
from fractions import Fraction

import mpmath
import pytest
import torch

import flashnum
from flashnum.numerics.blockscaled import scaled
from flashnum.numerics.formats import FORMATS, get_format
from flashnum.numerics.hwarith import FP22, POLY3, exp2_poly, kgroup_dot, kgroup_sum
from flashnum.numerics.policy import Policy

FP32_SITES = dict(qk_acc="fp32", s="fp32", m="fp32", p="fp32", p_cast="fp32", pv_acc="fp32",
                  l_acc="fp32", l="fp32", o="fp32", div="fp32", out="fp64")


def poly_rel_err(f: float) -> float:
    """|p(f) / 2^f - 1| for FA4's cubic, in 60-digit arithmetic (no fp32 anywhere)."""
    with mpmath.workdps(60):
        c = [mpmath.mpf(Fraction(x).numerator) / Fraction(x).denominator for x in POLY3]
        t = mpmath.mpf(f)
        return float(abs((c[0] + t * (c[1] + t * (c[2] + t * c[3]))) / mpmath.power(2, t) - 1))


def test_integer_arguments_give_exact_powers_of_two():
    x = torch.arange(-126, 128, dtype=torch.float32)
    assert torch.equal(exp2_poly(x).double(), torch.exp2(x.double()))


def test_poly_exp2_errs_by_the_cubic_approximation_plus_three_fp32_roundings():
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(400, generator=g, dtype=torch.float64) * 60 - 40).to(torch.float32)
    y = exp2_poly(x).double()
    exact = torch.exp2(x.double())
    got = ((y - exact) / exact).abs()
    f = (x.double() - torch.floor(x.double())).tolist()
    bound = torch.tensor([poly_rel_err(t) for t in f], dtype=torch.float64) + 4 * 2.0**-24
    assert torch.all(got <= bound)


def test_the_cubic_approximation_error_is_about_two_to_the_minus_13_point_5():
    worst = max(poly_rel_err(i / 4000) for i in range(4000))
    assert 8.7e-5 < worst < 8.8e-5  # the figure the module docstring quotes


def test_poly_exp2_as_the_exp_site_moves_attention_by_at_most_twice_its_error():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 64, 32, generator=g, dtype=torch.float64) for _ in range(3))
    pol = Policy(inputs="fp32", **FP32_SITES)
    ref = flashnum.attention(q, k, v, policy=pol, variant="exp2", block_n=16)
    poly = flashnum.attention(q, k, v, policy=pol.with_sites(p="fp32_poly3"), variant="exp2",
                              block_n=16)
    # every P and alpha off by a factor (1 + d), |d| <= 8.8e-5 + 2^-22: out = sum p v / sum p
    # moves by at most 2 d / (1 - d) max|v| (plus fp32 rounding of the rest, 2^-20 max|v|)
    d = 8.8e-5 + 2.0**-22
    diff = float((poly.out - ref.out).abs().max())
    assert diff <= (2 * d / (1 - d) + 2.0**-20) * float(v.abs().max())
    assert diff > 1e-6  # and it is the polynomial that ran


def sink_inputs(delta: float, nk: int = 128, sink_at: int = 100):
    """Logits (scale 1): the first key block near 0, the second at -4 but for one sink key
    at `delta`, whose value row is 4: the row max grows by about delta when the second
    block arrives, and the sink carries about 15% of the softmax mass."""
    g = torch.Generator().manual_seed(2)
    d = 16
    q = torch.zeros(1, 4, d, dtype=torch.float64)
    q[..., 0] = 1.0
    k = torch.randn(1, nk, d, generator=g, dtype=torch.float64)
    k[0, :64, 0] *= 0.1
    k[0, 64:, 0] = -4.0
    k[0, sink_at, 0] = delta
    v = torch.randn(1, nk, d, generator=g, dtype=torch.float64).clamp(-3, 3)
    v[0, sink_at] = 4.0
    return q, k, v


def fa4_fp8(q, k, v, fmt: str, offset: int, threshold: float):
    """P * 2^offset cast to `fmt` (and / 2^offset after: exact), l from the uncast P, lazy
    rescaling with FA4's threshold in log2 units; every other site exact."""
    pol = Policy(p_cast=scaled(FORMATS[fmt], 2.0**offset), l_from="p", name="fa4_fp8")
    return flashnum.attention(q, k, v, policy=pol, variant="lazy", tau=threshold * math.log(2),
                              scale=1.0, block_n=64)


def exact_out(q, k, v):
    p = torch.softmax(q @ k.transpose(-1, -2), -1)
    return p @ v


@pytest.mark.parametrize("fmt,offset,threshold,saturates", [
    ("fp8_e4m3", 8, 4, True),    # 2^(8 + 4) = 4096 > 448: flash-attention #2716
    ("fp8_e5m2", 8, 4, False),   # 4096 < 57344
    ("fp8_e4m3", 4, 4, False),   # the fix: offset + threshold <= log2(448) = 8.8
])
def test_offset_plus_threshold_past_log2_of_the_max_saturates_the_cast(fmt, offset, threshold,
                                                                        saturates):
    delta = 2.5  # the max grows by 2.5 < 4 ln 2 = 2.77: no rescale, so P reaches e^2.5 2^off
    q, k, v = sink_inputs(delta)
    res = fa4_fp8(q, k, v, fmt, offset, threshold)
    assert torch.all(res.n_rescales == 0)  # the lazy threshold kept the stale max
    err = float((res.out - exact_out(q, k, v)).abs().max())
    # without saturation: every P in o is off by a factor within 1 +- u (l is exact), so
    # |out - exact| <= u max|v|; saturation cuts the sink's P from 12.2 to 448 / 2^offset
    u = get_format(fmt).u
    assert (err > u * float(v.abs().max())) == saturates
    assert (float(exp_max(offset, threshold)) > get_format(fmt).max) == saturates


def exp_max(offset, threshold):
    return 2.0 ** (offset + threshold)  # the largest scaled P the threshold allows


def test_fp22_rounds_toward_zero_at_14_bits():
    x = torch.tensor([1 + 2**-13 + 2**-14, -(1 + 2**-13 + 2**-14), 3.0, 2.0**-130])
    assert FP22.round(x).tolist() == [1 + 2**-13, -(1 + 2**-13), 3.0, 2.0**-130]
    assert get_format("fp22") is FP22


def test_a_fp22_accumulator_across_blocks_errs_more_than_the_two_level_fix():
    g = torch.Generator().manual_seed(3)
    q, k = (torch.randn(1, 1, 1024, 16, generator=g, dtype=torch.float64) * 0.3 for _ in range(2))
    v = torch.rand(1, 1, 1024, 16, generator=g, dtype=torch.float64)  # P V sums of one sign
    base = Policy(inputs="fp8_e4m3", **{**FP32_SITES, "p_cast": "fp8_e4m3"})
    ref = flashnum.attention(q, k, v, policy=base)  # the same kernel with fp32 accumulation
    one = flashnum.attention(q, k, v, policy=base.with_sites(pv_acc="fp22", o="fp22"))
    two = flashnum.attention(q, k, v, policy=base.with_sites(pv_acc="fp22", o="fp32"))
    e1, e2 = ((r.out - ref.out).abs().max().item() for r in (one, two))
    # the truncation bias grows with the number of additions into one register: 1024 in
    # the one-level accumulator, 64 per block in the two-level one
    assert e1 > 3 * e2 > 0


def test_a_scaled_cast_is_a_format_name():
    f = get_format("fp8_e4m3*256")
    x = torch.tensor([2.0**-12, 1.5, 3.0])
    # 2^-12 * 256 = 2^-4: an e4m3 normal; 3 * 256 = 768 > 448 saturates to 448 / 256
    assert f.round(x).tolist() == [2.0**-12, 1.5, 1.75]
    assert get_format("fp8_e4m3").round(x)[0] == 0.0  # unscaled: below half of 2^-9
    with pytest.raises(ValueError, match="positive factor"):
        get_format("fp8_e4m3*-1")


def test_the_fp8_offset_table_flags_saturation_where_the_budget_is_broken():
    from flashnum.reproduce import fa4_offset

    df = fa4_offset.fp8_offset(quick=True)
    n = fa4_offset.OFFSET_SIZES["quick"]["n"]
    u = df["format"].map(lambda f: get_format(f).u)
    # budget kept: P in o off by a factor 1 +- u, or by 2^-10 / 2^offset absolute in e4m3's
    # subnormals, over l >= 1: |out - exact| <= (u + n 2^-(10 + offset)) max|v|
    slack = (u + n * 2.0 ** (-10 - df["offset"])) / u
    ok = df[df["budget_ok"]]
    assert (ok["err_over_u_vmax"] <= slack[ok.index]).all()
    hit = df[df["predicted_saturation"] & (df["growth"] == 2.5)]
    assert len(hit) == 1 and hit["format"].item() == "fp8_e4m3" and hit["offset"].item() == 8
    assert hit["err_over_u_vmax"].item() > 1  # the saturation error passes the rounding bound


def test_the_pcast_table_collapses_past_the_predicted_threshold_and_not_before():
    from flashnum.reproduce import pcast_collapse

    df = pcast_collapse.pcast_threshold(quick=True)
    fwd = df[df["order"] == "forward"]
    past = fwd["delta"] > fwd["delta_all"]  # spread 0: every non-sink P flushed past it
    assert (fwd.loc[past, "rel_err"] > 0.999).all()
    assert (fwd.loc[past, "flushed_fraction"] == 1).all()
    assert (fwd.loc[~past, "rel_err"] < 0.5).all()
    assert (fwd.loc[~past, "flushed_fraction"] == 0).all()
    # the static scale S = 256 moves the threshold by ln 256 = 5.5: delta 8 survives with it
    row = fwd[(fwd["delta"] == 8.0) & (fwd["p_scale"] == 256.0)]
    assert row["rel_err"].item() < 0.01


# -- the fp8 MMA's k-group adder ------------------------------------------------------


def group_oracle(acc: float, terms: list[float], bits: int, shift: str) -> Fraction:
    """One k-group in exact rationals: every addend cut to `bits` bits below the largest
    one's leading bit (math.frexp of a float is exact), the cut values summed exactly."""
    xs = [Fraction(acc)] + [Fraction(t) for t in terms]
    big = max(abs(x) for x in xs)
    if big == 0:
        return Fraction(0)
    e = math.frexp(float(big))[1]  # big in [2^(e-1), 2^e)
    grid = Fraction(2) ** (e - bits)
    cut = (lambda r: math.trunc(r)) if shift == "trunc" else (lambda r: math.floor(r))
    return sum((cut(x / grid) * grid for x in xs), Fraction(0))


def e4m3_values(g, shape, lo=-8, hi=4):
    mag = torch.rand(shape, generator=g, dtype=torch.float64) * 2.0 ** torch.randint(
        lo, hi, shape, generator=g).double()
    sign = torch.randint(0, 2, shape, generator=g).double() * 2 - 1
    return FORMATS["fp8_e4m3"].round(mag * sign)


@pytest.mark.parametrize("shift", ["trunc", "floor"])
def test_a_kgroup_sum_equals_the_exact_rational_one(shift):
    g = torch.Generator().manual_seed(11)
    terms = e4m3_values(g, (40, 32)) * e4m3_values(g, (40, 32))  # fp8 x fp8: exact
    terms[0] = 0.0  # an all-zero group
    terms[1, :16] = 0.0
    acc = torch.randn(40, generator=g, dtype=torch.float64).float().double() * 4
    acc[0] = 0.0
    acc[2] = 1e3  # an accumulator far above the products: they are cut to nothing
    got = kgroup_sum(acc, terms, 14, shift)
    want = [group_oracle(float(a), t.tolist(), 14, shift) for a, t in zip(acc, terms, strict=True)]
    assert got.tolist() == [float(w) for w in want]
    assert all(float(w) == w for w in want)  # the group sums are exact in float64


def test_the_mma_probe_of_sageattention2_cuts_the_accumulators_low_ten_bits():
    # A = B = 0, D = A B + C: C comes back with 13 mantissa bits (22-bit "FP22")
    c = torch.tensor([1 + 2**-13 + 2**-20, -(3 + 2**-12 + 2**-22), 2.0**100 * (1 + 2**-23)],
                     dtype=torch.float64)
    d = kgroup_sum(c, torch.zeros(3, 32, dtype=torch.float64))
    assert d.tolist() == FP22.round(c).tolist() == [1 + 2**-13, -(3 + 2**-12), 2.0**100]


def test_a_kgroup_dot_chains_the_groups_as_the_exact_rational_one_does():
    g = torch.Generator().manual_seed(12)
    a = e4m3_values(g, (3, 80), lo=-6, hi=1).abs()  # P: fp8, in [0, 1]
    b = e4m3_values(g, (80, 4))  # V: fp8 of either sign; 80 = two groups of 32 and a 16
    got = kgroup_dot(a, b, k=32, bits=14, shift="trunc")
    for i in range(3):
        for j in range(4):
            acc = Fraction(0)
            for g0 in (0, 32, 64):
                prods = [float(a[i, t] * b[t, j]) for t in range(g0, min(g0 + 32, 80))]
                acc = group_oracle(float(acc), prods, 14, "trunc")
            assert got[i, j].item() == acc


def test_fp22_k32_is_a_pv_accumulator_site_and_the_two_level_fix_still_helps():
    g = torch.Generator().manual_seed(3)
    q, k = (torch.randn(1, 1, 1024, 16, generator=g, dtype=torch.float64) * 0.3 for _ in range(2))
    v = torch.rand(1, 1, 1024, 16, generator=g, dtype=torch.float64)  # P V sums of one sign
    base = Policy(inputs="fp8_e4m3", **{**FP32_SITES, "p_cast": "fp8_e4m3"})
    ref = flashnum.attention(q, k, v, policy=base)
    two = flashnum.attention(q, k, v, policy=base.with_sites(pv_acc="fp22_k32", o="fp32"))
    one = flashnum.attention(q, k, v, policy=base.with_sites(pv_acc="fp22_k32", o="fp22"))
    e1, e2 = ((r.out - ref.out).abs().max().item() for r in (one, two))
    # the one-level O register keeps truncating across all 16 key blocks; the two-level
    # one only within a block's 2 groups (measured, seeds 0-2: 3.7-4.1e-4 against
    # 4.7-5.3e-5; docs/formats.md)
    assert 0 < 3 * e2 < e1
    assert get_format("fp22_k32").dot is not None
