"""Error measures: each definition on a handmade case with a known answer."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from flashnum.analysis import metrics
from flashnum.numerics.formats import FORMATS


def _t(rows):
    return torch.tensor(rows, dtype=torch.float64)


REF = _t([[1.0, -2.0], [4.0, 0.5]])
OUT = _t([[1.5, -2.0], [4.0, 0.0]])  # errors: +0.5 at (0, 0), -0.5 at (1, 1)


def test_absolute_and_rms_errors_by_hand():
    assert metrics.max_abs_err(OUT, REF) == 0.5
    assert metrics.rmse(OUT, REF) == pytest.approx(math.sqrt((0.25 + 0.25) / 4), rel=1e-15)


def test_normwise_and_row_relative_errors_by_hand():
    # ||e||_F = sqrt(0.5), ||ref||_F = sqrt(1 + 4 + 16 + 0.25)
    assert metrics.normwise_rel_err(OUT, REF) == pytest.approx(
        math.sqrt(0.5 / 21.25), rel=1e-15
    )
    # row 0: 0.5 / 2, row 1: 0.5 / 4
    assert metrics.row_rel_errs(OUT, REF).tolist() == [0.25, 0.125]
    assert metrics.max_row_rel_err(OUT, REF) == 0.25


def test_componentwise_relative_error_uses_the_row_floor():
    # (1, 1): |e| = 0.5 against |ref| = 0.5 -> 1; with the floor u * 4 = 2^-6 it stays 1
    assert metrics.max_rel_err(OUT, REF, "bf16") == 1.0
    # an exact zero reference entry with a tiny error: measured against u * ||row||_inf
    ref, out = _t([[0.0, 8.0]]), _t([[2.0**-12, 8.0]])
    u = FORMATS["bf16"].u
    assert metrics.max_rel_err(out, ref, "bf16") == pytest.approx(2.0**-12 / (u * 8), rel=0)
    # an absolute floor given by the caller replaces it
    assert metrics.max_rel_err(out, ref, "bf16", rel_floor=1.0) == 2.0**-12


def test_ulp_error_by_hand():
    # bf16 spacing in [1, 2) is 2^-7; in [4, 8) it is 2^-5
    ref, out = _t([[1.0, 4.0]]), _t([[1.0 + 2.0**-7, 4.0 + 2.0**-6]])
    assert metrics.ulp_errs(out, ref, "bf16").tolist() == [[1.0, 0.5]]


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from(["bf16", "fp16", "fp8_e4m3", "fp32"]),
    st.integers(0, 2**31 - 1),
    st.floats(-12, 6),
)
def test_a_correctly_rounded_output_is_within_half_an_ulp(fmt, seed, log_scale):
    g = torch.Generator().manual_seed(seed)
    ref = torch.randn(4, 16, generator=g, dtype=torch.float64) * 2.0**log_scale
    out = FORMATS[fmt].round(ref)
    assert metrics.max_ulp_err(out, ref, fmt) <= 0.5


def test_signed_error_by_hand():
    ref = torch.zeros(1, 4, dtype=torch.float64)
    out = _t([[1.0, 2.0, 3.0, 6.0]])
    s = metrics.signed_err(out, ref)
    assert s["mean_signed_err"] == 3.0
    std = math.sqrt(((2**2) + 1 + 0 + 3**2) / 3)
    assert s["signed_err_stderr"] == pytest.approx(std / 2, rel=1e-15)
    assert s["signed_err_z"] == pytest.approx(3.0 / (std / 2), rel=1e-15)


def test_bias_z_small_for_symmetric_noise_and_large_for_biased_noise():
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(64, 64, generator=g, dtype=torch.float64)
    noise = torch.randn(64, 64, generator=g, dtype=torch.float64) * 1e-3
    # symmetric noise: z ~ N(0, 1); |z| > 4 has probability 6e-5
    assert abs(metrics.signed_err(ref + noise, ref)["signed_err_z"]) < 4
    # the same noise shifted by a tenth of its std: z ~ 0.1 * sqrt(4096) = 6.4
    biased = metrics.signed_err(ref + noise + 1e-4, ref)["signed_err_z"]
    assert biased > 4
    # a one-signed error (every tie broken downward, Qiu & Yao) gives a huge negative z
    assert metrics.signed_err(ref - noise.abs(), ref)["signed_err_z"] < -20


def test_summary_has_every_key_and_the_naive_ratio():
    naive = _t([[1.0, -2.0], [4.0, 0.25]])  # max error 0.25, rms 0.125
    row = metrics.summary(OUT, REF, "bf16", naive_out=naive)
    for key in ("max_abs_err", "rmse", "normwise_rel_err", "max_row_rel_err", "max_rel_err",
                "max_ulp_err", "mean_signed_err", "signed_err_stderr", "signed_err_z",
                "naive_ratio", "naive_rmse_ratio"):
        assert key in row and isinstance(row[key], float)
    assert row["naive_ratio"] == 2.0
    assert row["naive_rmse_ratio"] == pytest.approx(math.sqrt(0.125) / 0.125, rel=1e-15)
    assert "naive_ratio" not in metrics.summary(OUT, REF, "bf16")


def test_fully_masked_rows_give_no_nan():
    ref = torch.zeros(2, 3, 4, dtype=torch.float64)
    out = torch.zeros(2, 3, 4, dtype=torch.float64)
    ref[:, 1:], out[:, 1:] = 1.0, 1.0 + 2.0**-8
    row = metrics.summary(out, ref, "bf16", naive_out=out)
    assert not any(math.isnan(x) for x in row.values())
    assert row["max_row_rel_err"] == 2.0**-8 and row["naive_ratio"] == 1.0
    # masked rows dropped: the mean is over the 16 unmasked entries only
    masked = torch.tensor([[True, False, False]] * 2)
    assert metrics.summary(out, ref, "bf16", masked=masked)["mean_signed_err"] == 2.0**-8
    # an all-exact, all-zero output: every measure is 0, never NaN
    zero = metrics.summary(torch.zeros(1, 2, 2), torch.zeros(1, 2, 2), "fp16")
    assert all(x == 0.0 for x in zero.values())


def test_nonzero_error_against_zero_reference_is_infinite_not_nan():
    ref, out = torch.zeros(1, 2, dtype=torch.float64), _t([[1e-3, 0.0]])
    assert metrics.max_row_rel_err(out, ref) == math.inf
    assert metrics.normwise_rel_err(out, ref) == math.inf


def test_bad_input_names_the_problem():
    with pytest.raises(ValueError, match="shapes differ"):
        metrics.summary(torch.zeros(2, 3), torch.zeros(3, 2), "bf16")
    with pytest.raises(ValueError, match="unknown format"):
        metrics.summary(OUT, REF, "bf17")
    with pytest.raises(ValueError, match="rel_floor"):
        metrics.max_rel_err(OUT, REF, "bf16", rel_floor=-1.0)
