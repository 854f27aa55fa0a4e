"""Block-scaled formats: MX and NVFP4 quantization equals an independent implementation
(numpy with ml_dtypes' element casts, written from the OCP MX v1.0 spec and NVIDIA's NVFP4
recipe), at the spec's boundaries: zero blocks, saturation, ties, subnormal elements,
E8M0's clamp, partial blocks, non-finite blocks; stochastic rounding is unbiased; and
the formats work as the engine's input and P-cast sites."""

import math

import ml_dtypes
import numpy as np
import pytest
import torch

import flashnum
from flashnum.numerics.blockscaled import BLOCK_FORMATS, quantize
from flashnum.numerics.formats import get_format
from flashnum.numerics.policy import Policy

# element dtype, emax (exponent of the largest normal), max: OCP MX v1.0 table 1
MX = {
    "mxfp8_e4m3": (ml_dtypes.float8_e4m3fn, 8, 448.0),
    "mxfp8_e5m2": (ml_dtypes.float8_e5m2, 15, 57344.0),
    "mxfp6_e3m2": (ml_dtypes.float6_e3m2fn, 4, 28.0),
    "mxfp6_e2m3": (ml_dtypes.float6_e2m3fn, 2, 7.5),
    "mxfp4": (ml_dtypes.float4_e2m1fn, 2, 6.0),
}


def mx_oracle(x: np.ndarray, name: str) -> np.ndarray:
    """OCP MX v1.0 section 6.3, one block of 32 at a time, for float32 x (last axis)."""
    dtype, emax, vmax = MX[name]
    out = np.zeros(x.shape, dtype=np.float64)
    flat, res = x.reshape(-1, x.shape[-1]), out.reshape(-1, x.shape[-1])
    for r in range(flat.shape[0]):
        for b0 in range(0, flat.shape[1], 32):
            blk = flat[r, b0 : b0 + 32].astype(np.float64)
            amax = float(np.max(np.abs(blk)))
            if not math.isfinite(amax):
                res[r, b0 : b0 + 32] = np.nan
                continue
            if amax == 0.0:
                continue
            e = min(max(math.floor(math.log2(amax)) - emax, -127), 127)
            if 2.0 ** (e + emax) > amax:  # log2 rounded up across a power of two
                e -= 1
            xs = np.clip(blk / 2.0**e, -vmax, vmax).astype(np.float32)  # exact: power of 2
            res[r, b0 : b0 + 32] = xs.astype(dtype).astype(np.float64) * 2.0**e
    return out


def nvfp4_oracle(x: np.ndarray) -> np.ndarray:
    """NVFP4 (16-element blocks, e4m3 block scale, fp32 tensor scale), all scale math in
    float32 as Transformer Engine's reference quantizer does; last axis."""
    f32 = np.float32
    amax = f32(np.max(np.abs(x)))
    s_enc = f32(f32(448.0 * 6.0) / amax) if amax > 0 else f32(1.0)
    out = np.zeros(x.shape, dtype=np.float64)
    flat, res = x.reshape(-1, x.shape[-1]), out.reshape(-1, x.shape[-1])
    for r in range(flat.shape[0]):
        for b0 in range(0, flat.shape[1], 16):
            blk = flat[r, b0 : b0 + 16].astype(np.float32)
            d_b = f32(f32(np.max(np.abs(blk)) / f32(6.0)) * s_enc)
            d_b = f32(np.float32(d_b).astype(ml_dtypes.float8_e4m3fn))
            if d_b == 0:
                continue
            enc = f32(s_enc / d_b)
            q = np.clip((blk * enc).astype(np.float32), -6, 6).astype(ml_dtypes.float4_e2m1fn)
            res[r, b0 : b0 + 16] = q.astype(np.float64) * float(d_b) / float(s_enc)
    return out


def spread(shape, seed=0):
    """float32 values whose magnitudes span many binades within and across blocks."""
    g = np.random.default_rng(seed)
    return (g.standard_normal(shape) * 2.0 ** g.integers(-20, 20, shape)).astype(np.float32)


@pytest.mark.parametrize("name", list(MX))
def test_mx_quantization_equals_the_spec_oracle_on_values_spanning_binades(name):
    x = spread((6, 96), seed=1)
    x[0, :32] *= 2.0**60  # a block far above and one far below the element range
    x[1, 32:64] *= 2.0**-60
    got = quantize(torch.from_numpy(x), name).numpy()
    np.testing.assert_array_equal(got, mx_oracle(x, name))


def test_nvfp4_quantization_equals_the_recipe_oracle():
    x = spread((4, 64), seed=2)
    x[2] *= 1e-3  # blocks whose e4m3 scale falls into e4m3's subnormals
    got = quantize(torch.from_numpy(x), "nvfp4").numpy()
    np.testing.assert_array_equal(got, nvfp4_oracle(x))


@pytest.mark.parametrize("name", [n for n, f in BLOCK_FORMATS.items() if f.block])
def test_an_all_zero_block_stays_zero_and_leaves_its_neighbour_alone(name):
    x = torch.zeros(64, dtype=torch.float64)
    x[40] = 3.0
    y = quantize(x, name)
    assert torch.all(y[:32] == 0) and not torch.isnan(y).any()
    assert y[40] == 3.0  # 3 is representable in every element format at its block's scale


def test_block_top_values_saturate_to_the_element_max():
    # amax 500: X = 2^(8 - 8) = 1, and 500 > 448 saturates (the spec's conversion)
    x = torch.tensor([500.0, 448.0, 1.0] + [0.0] * 29, dtype=torch.float64)
    assert quantize(x, "mxfp8_e4m3")[:3].tolist() == [448.0, 448.0, 1.0]
    # mxfp4: amax 7.5 -> X = 2^(2 - 2) = 1; 7.5 > 6 saturates, 7 too (not NaN, not 8)
    x = torch.tensor([7.5, -7.0, 5.9] + [0.0] * 29, dtype=torch.float64)
    assert quantize(x, "mxfp4")[:3].tolist() == [6.0, -6.0, 6.0]


def test_ties_round_to_even_elements():
    # mxfp4 with X = 1: 5 between 4 and 6 -> 4; 1.25 between 1 and 1.5 -> 1;
    # 0.75 between the subnormal 0.5 and 1 -> 1; 0.25 between 0 and 0.5 -> 0
    x = torch.tensor([6.0, 5.0, 1.25, 0.75, 0.25, -2.5] + [0.0] * 26, dtype=torch.float64)
    assert quantize(x, "mxfp4")[:6].tolist() == [6.0, 4.0, 1.0, 1.0, 0.0, -2.0]


def test_subnormal_elements_are_kept():
    # mxfp8_e4m3, X = 1 (amax 256): the e4m3 subnormals 2^-9 .. 7 * 2^-9 survive
    sub = 2.0**-9
    x = torch.tensor([256.0, sub, 3 * sub, 2.5 * sub] + [0.0] * 28, dtype=torch.float64)
    assert quantize(x, "mxfp8_e4m3")[:4].tolist() == [256.0, sub, 3 * sub, 2 * sub]


def test_the_e8m0_scale_clamps_at_two_to_the_minus_127():
    # amax 2^-140 would want X = 2^-148; E8M0 stops at 2^-127, so elements are x / 2^-127
    x = torch.tensor([2.0**-140, 2.0**-135] + [0.0] * 30, dtype=torch.float64)
    y = quantize(x, "mxfp8_e4m3")
    assert y[0] == 0.0 and y[1] == 2.0**-135  # 2^-13 < e4m3's 2^-9: 0; 2^-8: kept


def test_a_non_finite_element_makes_its_block_nan_and_only_its_block():
    x = torch.ones(64, dtype=torch.float64)
    x[3] = math.inf
    y = quantize(x, "mxfp8_e4m3")
    assert torch.isnan(y[:32]).all() and torch.equal(y[32:], torch.ones(32, dtype=y.dtype))


def test_a_partial_last_block_is_its_own_block():
    x = torch.from_numpy(spread((40,), seed=3)).to(torch.float64)
    y = quantize(x, "mxfp6_e2m3")
    assert torch.equal(y[:32], quantize(x[:32], "mxfp6_e2m3"))
    assert torch.equal(y[32:], quantize(x[32:], "mxfp6_e2m3"))


def test_axis_chooses_the_blocking_direction():
    x = torch.from_numpy(spread((64, 8), seed=4))
    assert torch.equal(quantize(x, "mxfp4", axis=0), quantize(x.T, "mxfp4").T)
    assert torch.equal(quantize(x, "nvfp4", axis=-2), quantize(x.T, "nvfp4").T)


def test_nvfp4_row_scales_each_row_and_one_level_underflows_small_blocks():
    x = torch.full((2, 16), 1e-4, dtype=torch.float64)
    x[0] *= 1e4
    row = quantize(x, "nvfp4_row")
    assert torch.equal(row[1], quantize(x[1:], "nvfp4")[0])  # its own fp32 scale
    # one level: the block scale 1e-4 / 6 is below e4m3's least subnormal 2^-9: all lost
    assert torch.all(quantize(x[1:], "nvfp4_1l") == 0)


def test_per_tensor_fp8_uses_one_scale_amax_over_max():
    x = torch.tensor([[896.0, 1.0], [-2.0, 0.5]], dtype=torch.float64)
    y = quantize(x, "fp8_e4m3_tensor")  # s = 2: 896 -> 448 * 2
    assert y.tolist() == [[896.0, 1.0], [-2.0, 0.5]]


def test_stochastic_rounding_is_unbiased_and_picks_a_neighbour():
    g = torch.Generator().manual_seed(0)
    x = torch.zeros(20000, 32, dtype=torch.float64)
    x[:, 0] = 4.0  # X = 1 for mxfp4
    x[:, 1] = 2.6  # between 2 and 3: up with probability 0.6
    y = quantize(x, "mxfp4", rounding="stochastic", generator=g)
    assert set(y[:, 1].unique().tolist()) == {2.0, 3.0}
    mean, se = float(y[:, 1].mean()), float(y[:, 1].std()) / math.sqrt(len(y))
    assert abs(mean - 2.6) < 4 * se
    assert torch.all(y[:, 0] == 4.0)  # representable values never move


def test_bad_names_and_roundings_are_refused():
    with pytest.raises(ValueError, match="valid: mxfp8_e4m3"):
        quantize(torch.ones(4), "mxfp3")
    with pytest.raises(ValueError, match="valid: nearest"):
        quantize(torch.ones(4), "mxfp4", rounding="up")
    with pytest.raises(ValueError, match="Generator"):
        quantize(torch.ones(4), "mxfp4", rounding="stochastic")


def reference64(q, k, v, p_round=None):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    p = torch.exp(s - s.amax(-1, keepdim=True))
    if p_round is None:
        return p @ v / p.sum(-1, keepdim=True)
    p = p.to(torch.float32)  # the fp32 P site
    return p_round(p) @ v / p.to(torch.float64).sum(-1, keepdim=True)


def test_a_block_format_as_the_inputs_site_quantizes_q_k_v_along_the_head_dim():
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 48, 64, generator=g) for _ in range(3))
    res = flashnum.attention(q, k, v, policy=Policy(inputs="mxfp6_e3m2"), block_n=16)
    qq, kq, vq = (torch.from_numpy(mx_oracle(x.numpy(), "mxfp6_e3m2")) for x in (q, k, v))
    # exact sites elsewhere: only the summation order differs from the fp64 oracle
    torch.testing.assert_close(res.out, reference64(qq, kq, vq), rtol=0, atol=1e-13)


def test_a_block_format_at_p_cast_quantizes_p_along_the_keys_before_p_at_v():
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 8, 64, 32, generator=g, dtype=torch.float64) for _ in range(3))
    # one key block of 64 keys: P = fp32(exp(s - rowmax)), then two mxfp8 blocks of 32
    res = flashnum.attention(q, k, v, policy=Policy(p="fp32", p_cast="mxfp8_e5m2"),
                             block_n=64)
    ref = reference64(q, k, v, lambda p: torch.from_numpy(mx_oracle(p.numpy(), "mxfp8_e5m2")))
    # fp64 summation-order differences only (an fp32 P moved across a rounding boundary
    # by them would show as an error of 2^-24 relative: 1e-8, far above this)
    torch.testing.assert_close(res.out, ref, rtol=0, atol=1e-13)
    assert get_format("mxfp8_e5m2") is BLOCK_FORMATS["mxfp8_e5m2"]
