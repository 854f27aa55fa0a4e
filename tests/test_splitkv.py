"""Split-KV decoding: S contiguous key splits merged by their log-sum-exp give attention
(exactly, up to fp64 summation order, when nothing is rounded), for decode shapes, GQA,
causal masks and more splits than key blocks; the merged max is the row max; storing
the partials in a narrower format costs what its unit roundoff says."""

import math

import pytest
import torch

import flashnum
from flashnum.api import attention_splitkv
from flashnum.engine.splitkv import split_bounds
from flashnum.numerics.policy import Policy

EXACT = Policy(name="exact")


def softmax64(q, k, v, causal):
    """fp64 attention with its own causal mask (key j visible to row i iff j <= i + nk - nq);
    GQA by repeating K/V heads. Returns out, lse, row max."""
    q, k, v = (x.to(torch.float64) for x in (q, k, v))
    if q.shape[-3] != k.shape[-3]:
        g = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(g, -3), v.repeat_interleave(g, -3)
    nq, nk = q.shape[-2], k.shape[-2]
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        i, j = torch.arange(nq)[:, None], torch.arange(nk)[None, :]
        s = s.masked_fill(j > i + nk - nq, -math.inf)
    m = s.amax(-1)
    p = torch.exp(s - torch.where(torch.isfinite(m), m, 0)[..., None])
    l = p.sum(-1)
    out = torch.nan_to_num(p @ v / l[..., None])
    return out, m + torch.log(l), m


def qkv(hq, hkv, nq, nk, d=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, hq, nq, d, generator=g, dtype=torch.float64),
            torch.randn(2, hkv, nk, d, generator=g, dtype=torch.float64) * 2,
            torch.randn(2, hkv, nk, d, generator=g, dtype=torch.float64))


def test_splits_are_contiguous_whole_key_blocks_and_the_tail_is_empty():
    assert split_bounds(300, 64, 2) == [(0, 192), (192, 300)]
    assert split_bounds(100, 64, 4) == [(0, 64), (64, 100), (100, 100), (100, 100)]


@pytest.mark.parametrize("nq,nk,splits,causal,heads", [
    (1, 1000, 4, False, (8, 2)),     # decode, GQA 4 query heads per K/V head
    (16, 1000, 7, True, (4, 4)),     # causal decode: the last split is partly masked
    (5, 100, 9, False, (2, 1)),      # more splits than key blocks: empty splits
    (16, 8, 3, True, (2, 2)),        # causal with Nq > Nk: fully masked rows
])
def test_exact_split_attention_equals_fp64_softmax(nq, nk, splits, causal, heads):
    q, k, v = qkv(*heads, nq, nk)
    res = attention_splitkv(q, k, v, num_splits=splits, split_precision="fp64",
                            merge_precision="fp64", policy=EXACT, block_n=64, causal=causal)
    out, lse, m = softmax64(q, k, v, causal)
    # nothing is rounded: fp64 summation order alone (|out| <= max|v| ~ 4, 2^-52 * Nk terms)
    torch.testing.assert_close(res.out, out, rtol=0, atol=1e-12)
    fin = torch.isfinite(lse)
    torch.testing.assert_close(res.lse[fin], lse[fin], rtol=0, atol=1e-12)
    assert torch.equal(res.masked, ~fin) and torch.all(res.out[~fin] == 0)
    # the merged max is the row max (up to the fp64 dot's summation order), not a split's
    torch.testing.assert_close(res.m, m, rtol=0, atol=1e-13)


def test_empty_splits_change_nothing():
    q, k, v = qkv(2, 2, 3, 130)  # 3 key blocks of 64
    kw = dict(policy="fa2", precision="bf16", block_n=64)
    three = attention_splitkv(q, k, v, num_splits=3, **kw)
    eight = attention_splitkv(q, k, v, num_splits=8, **kw)
    assert torch.equal(three.out, eight.out) and torch.equal(three.lse, eight.lse)


def test_one_split_is_the_unsplit_kernel():
    q, k, v = qkv(2, 2, 4, 300)
    one = attention_splitkv(q, k, v, num_splits=1, precision="fp32")
    whole = flashnum.attention(q, k, v, precision="fp32")
    assert torch.equal(one.out, whole.out)


def test_split_fp32_partials_cost_no_more_than_twice_the_unsplit_bf16_error():
    # flash-attn's oracle: the split kernel's error against fp64 within twice that of the
    # same-precision unsplit kernel on the same (bf16-stored) inputs
    q, k, v = (x.to(torch.bfloat16).to(torch.float64) for x in qkv(4, 4, 8, 4096, seed=3))
    out, _, _ = softmax64(q, k, v, False)
    pol = Policy(inputs="bf16", qk_acc="fp32", s="fp32", m="fp32", p="fp32", p_cast="bf16",
                 pv_acc="fp32", l_acc="fp32", l="fp32", o="fp32", div="fp32", out="fp32")
    whole = flashnum.attention(q, k, v, policy=pol)
    split = attention_splitkv(q, k, v, num_splits=16, policy=pol)
    e_whole = (whole.out - out).abs().max()
    e_split = (split.out - out).abs().max()
    assert e_split <= 2 * e_whole


def test_bf16_partials_err_by_the_lse_rounding_bound():
    # o_s rounded to bf16 moves out by <= u max|v|; lse_s rounded to bf16 moves each weight
    # exp(lse_s - lse) by a factor within exp(+-2 u max|lse_s|): out moves by at most
    # (exp(2 u L) - 1) max|v| more, L = max |lse_s| (here ~6, so ~5% of max|v|)
    q, k, v = qkv(2, 2, 4, 2048, seed=4)
    ex = dict(policy=EXACT, block_n=64, merge_precision="fp64")
    ref = attention_splitkv(q, k, v, num_splits=8, split_precision="fp64", **ex)
    bf = attention_splitkv(q, k, v, num_splits=8, split_precision="bf16", **ex)
    parts = [attention_splitkv(q, k[..., a:b, :], v[..., a:b, :], num_splits=1,
                               split_precision="fp64", **ex).lse
             for a, b in split_bounds(2048, 64, 8)]
    u, L, vmax = 2.0**-8, float(torch.stack(parts).abs().max()), float(v.abs().max())
    err = float((bf.out - ref.out).abs().max())
    assert err <= u * vmax + (math.exp(2 * u * L) - 1) * vmax
    assert err > 1e-6  # and the bf16 partials do cost something


def test_bad_split_arguments_are_refused():
    q, k, v = qkv(2, 2, 1, 64)
    with pytest.raises(ValueError, match="num_splits"):
        attention_splitkv(q, k, v, num_splits=0)
    with pytest.raises(ValueError, match="split_precision|valid"):
        attention_splitkv(q, k, v, num_splits=2, split_precision="fp7")
    q3, k3, v3 = qkv(3, 2, 1, 64)
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        attention_splitkv(q3, k3, v3, num_splits=2)


def test_flashnum_attention_takes_num_splits_and_gqa_shapes():
    q, k, v = qkv(4, 2, 2, 300)
    via_api = flashnum.attention(q, k, v, num_splits=3, split_precision="bf16", block_n=64)
    direct = attention_splitkv(q, k, v, num_splits=3, split_precision="bf16", block_n=64)
    assert torch.equal(via_api.out, direct.out)
    assert flashnum.attention(q, k, v).out.shape == (2, 4, 2, 32)  # GQA without splits
