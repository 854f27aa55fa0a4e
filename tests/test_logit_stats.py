"""flashnum.analysis.logit_stats: each statistic against an oracle computed another way
(torch's softmax and SDPA mask, torch's own bf16/fp16 rounding, hand-built inputs)."""

import math

import pytest
import torch

from flashnum.analysis.logit_stats import STATS, head_stats


def qk(nq=16, nk=48, d=8, heads=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, heads, nq, d, generator=g, dtype=torch.float64),
            torch.randn(1, heads, nk, d, generator=g, dtype=torch.float64))


@pytest.mark.parametrize("causal", [False, True])
def test_sink_mass_entropy_and_max_match_torch_softmax(causal):
    q, k = qk()
    nq, nk = q.shape[-2], k.shape[-2]
    s = (q @ k.transpose(-1, -2)) * 0.3
    if causal:  # bottom-right: row i sees keys 0..i + nk - nq (torch's tril with offset)
        keep = torch.ones(nq, nk, dtype=torch.bool).tril(diagonal=nk - nq)
        s = s.masked_fill(~keep, -math.inf)
    p = torch.softmax(s, dim=-1)
    rows = head_stats(q, k, scale=0.3, causal=causal)
    assert [(r["batch"], r["head"]) for r in rows] == [(0, 0), (0, 1)]
    for h, r in enumerate(rows):
        assert set(STATS) <= set(r)
        assert r["sink_mass"] == pytest.approx(float(p[0, h, :, 0].mean()), rel=1e-12)
        assert r["sink_max"] == pytest.approx(float(p[0, h, :, 0].max()), rel=1e-12)
        assert r["max_prob"] == pytest.approx(float(p[0, h].max(-1).values.mean()), rel=1e-12)
        assert r["max_logit"] == pytest.approx(float(s[0, h].max()), rel=1e-12)
        n = torch.isfinite(s[0, h]).sum(-1).double()
        ent = -torch.where(p[0, h] > 0, p[0, h] * p[0, h].log(), 0.0).sum(-1) / n.log()
        assert r["entropy"] == pytest.approx(float(ent.mean()), rel=1e-10)


def test_ties_count_the_keys_whose_p_rounds_to_one_in_torch_bf16_and_fp16():
    # logits at the max, just inside and just outside each format's rounding-to-1 window
    d = torch.tensor([0.0, -2.0 ** -10, -0.00195, -0.00196, -2.0 ** -13, -2.0 ** -11, -1.0])
    # q = (1, 0), k_j = (s_j, 0): the logit of key j is s_j exactly
    k = torch.zeros(1, 1, d.numel(), 2, dtype=torch.float64)
    k[..., 0] = 3.0 + d
    q = torch.tensor([[[[1.0, 0.0]]]], dtype=torch.float64)
    r = head_stats(q, k, scale=1.0)[0]
    ref = (3.0 + d) - (3.0 + d).max()
    want_bf16 = int((ref.exp().to(torch.bfloat16) == 1).sum())
    want_fp16 = int((ref.exp().to(torch.float16) == 1).sum())
    assert (want_bf16, want_fp16) == (5, 2)  # the window edges of bf16 lie in the list
    assert r["ties_bf16"] == want_bf16 and r["ties_fp16"] == want_fp16
    assert r["ties_exact"] == 0.0
    k[0, 0, 1, 0] = 3.0  # a second exact maximum
    assert head_stats(q, k, scale=1.0)[0]["ties_exact"] == 1.0


def test_outlier_channels_are_counted_from_the_channel_rms():
    q, k = qk(nq=64, nk=64, d=16, heads=1)
    k[..., 3] *= 20.0  # one massive key channel
    q[..., [1, 2]] *= 10.0  # two query channels
    r = head_stats(q, k)[0]
    rms_k = k[0, 0].square().mean(0).sqrt()
    assert r["k_outlier_ratio"] == pytest.approx(float(rms_k.max() / rms_k.median()))
    assert (r["k_outliers"], r["q_outliers"]) == (1, 2)
    assert r["k_absmax"] == float(k.abs().max())


def test_bad_shapes_and_flags_are_refused_in_one_line():
    q, k = qk()
    with pytest.raises(ValueError, match="batch, heads"):
        head_stats(q, k[:, :1])
    with pytest.raises(ValueError, match="causal must be True or False"):
        head_stats(q, k, causal="top_left")
