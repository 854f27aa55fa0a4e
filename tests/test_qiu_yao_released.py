"""variant="qiu_yao_released": Qiu & Yao's max adjustment as their attention.py computes it.

The logits here are exact in bf16 (head dim 1, q = the wanted logit, k = +-1, scale 1), so
each expectation is worked out by hand from the rules of their code (window max - 1e-3 in
bf16, block row sum clamped at 1e-10, fully masked tiles counted as ties), independently of
the engine. The experiment qiu_yao_agreement checks the variant against their code itself.
"""

from __future__ import annotations

import math

import pytest
import torch

import flashnum

BF16_FLOOR = float(torch.tensor(1e-10).to(torch.bfloat16))  # 1e-10 as a bf16 row sum holds it


def one_row(logits, v):
    """q, k, v of one head whose single query row has exactly these logits (scale 1)."""
    s = torch.tensor(logits, dtype=torch.float64)
    q = torch.ones(1, 1, 1, 1, dtype=torch.float64)
    return q, s.reshape(1, 1, -1, 1), torch.tensor(v, dtype=torch.float64).reshape(1, 1, -1, 1)


def run(q, k, v, variant, **kw):
    return flashnum.attention(q, k, v, precision="bf16", policy="lowp", block_m=16,
                              block_n=kw.pop("block_n", 16), scale=1.0, variant=variant, **kw)


def test_a_logit_one_bf16_ulp_below_a_max_in_a_quarter_to_a_half_counts_as_a_tie():
    # max 0.30078125 (bf16 ulp 2^-9 ~ 0.00195 > 1e-3): the exact window excludes max - ulp,
    # their bf16 max - 1e-3 rounds down to max - ulp and includes it
    mx = 0.30078125
    q, k, v = one_row([mx, mx - 2.0**-9, -1.0, -2.0], [1.0, 2.0, 3.0, 4.0])
    assert float(run(q, k, v, "qiu_yao").m) == mx
    assert float(run(q, k, v, "qiu_yao_released").m) == 2 * mx


def test_above_a_half_both_windows_take_exact_ties_only():
    mx = 0.6015625  # ulp 2^-8: max - 1e-3 rounds back to the max in bf16
    q, k, v = one_row([mx, mx - 2.0**-8, -1.0], [1.0, 2.0, 3.0])
    assert float(run(q, k, v, "qiu_yao_released").m) == mx
    q, k, v = one_row([mx, mx, -1.0], [1.0, 2.0, 3.0])
    assert float(run(q, k, v, "qiu_yao_released").m) == 2 * mx


def collapse_case(t: float):
    """Two tied logits t (values -1, -1.125), the rest -t: the released fix shifts by 2t,
    so l = 2 exp(-t) (+ 14 exp(-3t), negligible) meets the 1e-10 clamp at t = ln(2/1e-10)."""
    return one_row([t, t] + [-t] * 14, [-1.0, -1.125] + [0.5] * 14)


def onset() -> float:
    """The max logit above which the clamp replaces the row sum of two tied maxima."""
    return math.log(2 / BF16_FLOOR)


def test_the_row_sum_clamp_onset_lies_near_23_7():
    assert 23.71 < onset() < 23.73


@pytest.mark.parametrize("t", [23.5, 23.75, 24.0, 32.0])
def test_the_released_fix_collapses_the_output_above_the_onset_and_not_below(t):
    q, k, v = collapse_case(t)
    ref = -1.0625  # (v_0 + v_1) / 2: the other 14 weights are below exp(-2t) of the ties
    idealised = float(run(q, k, v, "qiu_yao").out)
    released = float(run(q, k, v, "qiu_yao_released").out)
    assert idealised == ref  # exact in bf16: no clamp, no collapse
    p = float(torch.tensor(math.exp(-t)).to(torch.bfloat16))  # exp(t - 2t) in bf16
    if t < onset():
        assert released == ref
    else:
        # o = p (v_0 + v_1), l = the floor: out = ref * 2 p / floor, to bf16 accuracy
        expect = ref * 2 * p / BF16_FLOOR
        assert expect > ref * 0.999  # |expect| < |ref|: it shrinks towards 0
        assert abs(released - expect) <= 4 * 2.0**-8 * abs(expect)


def test_the_collapse_reaches_the_published_size_at_a_max_logit_near_35():
    # -1.06 -> ~ -1.5e-5: 2 exp(-t) / 1e-10 ~ 1.4e-5 at t ~ 35
    q, k, v = collapse_case(35.0)
    out = float(run(q, k, v, "qiu_yao_released").out)
    assert -3e-5 < out < -0.5e-5


def test_a_fully_masked_causal_tile_counts_as_ties_and_sets_the_max_to_zero():
    # causal, 32 keys in two blocks of 16: query rows 0..15 see only the first block; every
    # logit negative and distinct (no tie in a visible tile). Idealised: m stays the
    # (negative) row max. Released: the masked second tile is all ties with a negative
    # max -> block max 0 -> m = 0, and l gains the clamped row sum 1e-10 of the masked tile
    g = torch.Generator().manual_seed(0)
    q = torch.ones(1, 1, 32, 1, dtype=torch.float64)
    k = -(1 + torch.arange(32, dtype=torch.float64) / 8).reshape(1, 1, 32, 1)  # bf16-exact
    v = torch.randn(1, 1, 32, 1, generator=g, dtype=torch.float64)
    ideal = run(q, k, v, "qiu_yao", causal=True)
    rel = run(q, k, v, "qiu_yao_released", causal=True)
    assert bool((ideal.m[..., :16] < 0).all())
    assert bool((rel.m[..., :16] == 0).all())
    # rows 16..31 see keys of both blocks: a finite max, the rule does not touch them
    assert torch.equal(rel.m[..., 16:], ideal.m[..., 16:])
    # the output barely moves: o and l are both rescaled by exp(m_old - 0)
    assert (rel.out - ideal.out).abs().max() <= 4 * 2.0**-8


def test_a_row_that_sees_no_key_stays_masked():
    q = torch.ones(1, 1, 40, 1, dtype=torch.float64)
    k = -torch.ones(1, 1, 20, 1, dtype=torch.float64)
    v = torch.ones(1, 1, 20, 1, dtype=torch.float64)
    res = run(q, k, v, "qiu_yao_released", causal=True)  # bottom-right: rows 0..19 see none
    assert bool(res.masked[..., :20].all()) and not bool(res.masked[..., 20:].any())
    assert bool((res.out[..., :20, :] == 0).all())


def test_the_multiprecision_backend_refuses_the_released_variant():
    q, k, v = one_row([1.0, 2.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="qiu_yao_released"):
        flashnum.attention(q, k, v, precision="mp", variant="qiu_yao_released")
