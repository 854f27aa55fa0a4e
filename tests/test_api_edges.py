"""The edges of the public API, as a specification: each bad call, the exception it raises
and the words its one-line message must hold; then what is accepted on purpose (numpy
integers, blocks beyond the data, 3-D and mixed-dtype tensors), the memory guard, the
warnings, the causal alignments and split-KV in the policy's precision.

Every refusal goes through flashnum.engine.checks, which attention, attention_backward
and split-KV share.
"""

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import flashnum
import flashnum.engine.checks
from flashnum import attention, attention_backward, make_policy
from flashnum.api import attention_splitkv
from flashnum.engine.call import call_of
from flashnum.engine.emulate import emulate
from flashnum.engine.splitkv import split_attention
from flashnum.reference import reference, reference_backward


def qkv(nq=8, nk=8, d=4, h=2, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, h, n, d, generator=g, dtype=torch.float64).to(dtype)
                 for n in (nq, nk, nk))


Q, K, V = qkv()
DO = qkv(seed=1)[0]
OUT, LSE = Q.clone(), Q[..., 0].clone()  # shapes of a forward's O and LSE


def fwd(**kw):
    return lambda: attention(Q, K, V, **kw)


def bwd(**kw):
    return lambda: attention_backward(Q, K, V, DO, **kw)


def triton_bwd(**kw):
    def call():
        from flashnum.backends.triton_backward import attention_backward_triton

        return attention_backward_triton(Q, K, V, DO, **kw)
    return call


# (edge, call, exception, words the message holds): each was accepted, or refused with
# another exception or words, before these checks
REFUSED = [
    ("order of floats", fwd(block_n=4, order=[1.9, 0.2]), TypeError,
     ["order must be", "permutation of range(2)", "[1.9, 0.2]"]),
    ("order of bools", fwd(block_n=4, order=[True, False]), TypeError,
     ["order must be", "[True, False]"]),
    ("order None", fwd(order=None), TypeError, ["order must be", "forward", "None"]),
    ("int64 with input_transform",
     lambda: attention(Q.long(), K.long(), V.long(), input_transform="smooth_k"), TypeError,
     ["q must be floating point", "torch.int64"]),
    ("complex64 with input_transform",
     lambda: attention(*(x.to(torch.complex64) for x in (Q, K, V)), input_transform="hadamard"),
     TypeError, ["q must be floating point", "complex64"]),
    ("backward with out=, lse= and scale=inf", bwd(out=OUT, lse=LSE, scale=math.inf),
     ValueError, ["scale must be finite", "inf"]),
    ("backward with out=, lse= and causal=None", bwd(out=OUT, lse=LSE, causal=None),
     TypeError, ["causal must be True or False", "top_left", "None"]),
    ("backward with scale < 0", bwd(scale=-0.5, causal=True), ValueError,
     ["scale must be > 0", "-0.5"]),
    ("backward with scale = 0", bwd(scale=0.0), ValueError, ["scale must be > 0"]),
    ("forward with scale = 0", fwd(scale=0.0), ValueError, ["scale must be > 0"]),
    ("policy fa3 with precision mp", fwd(precision="mp", policy="fa3"), ValueError,
     ["unknown policy 'fa3'", "fa2", "exact"]),
    ("meta tensors", lambda: attention(*(x.to("meta") for x in (Q, K, V))), ValueError,
     ["q is a meta tensor", "valid"]),
    ("0-d q with input_transform",
     lambda: attention(torch.tensor(1.0), K, V, input_transform="hadamard"), ValueError,
     ["q must have shape (..., N, d)", "()"]),
    ("q/k heads 0 with input_transform",
     lambda: attention(Q[:, :0], K[:, :0], V[:, :0], input_transform="hadamard"), ValueError,
     ["batch dims (1, 0) hold no head"]),
    ("block_n=0 with num_splits>1", fwd(block_n=0, num_splits=2), ValueError,
     ["block_n must be a positive integer", "0"]),
    ("block_n='64' with num_splits>1", fwd(block_n="64", num_splits=2), TypeError,
     ["block_n must be a positive integer", "'64'"]),
    ("num_splits=0", fwd(num_splits=0), ValueError, ["num_splits must be an integer >= 1"]),
    ("backward with d = 0", lambda: attention_backward(Q[..., :0], K[..., :0], V, DO),
     ValueError, ["head dim d (q.shape[-1]) is 0"]),
    ("seed 2**70", fwd(order="random", block_n=4, seed=2**70), ValueError,
     ["seed must be an integer in [-2**63, 2**63 - 1]", str(2**70)]),
    ("a Policy on backend mp", fwd(backend="mp", policy=make_policy("lowp", "bf16")),
     ValueError, ["a Policy is not supported by backend 'mp'", "a policy name",
                  "backend 'emulate'"]),
    ("precision mp with num_splits=2", fwd(precision="mp", num_splits=2), ValueError,
     ["split-KV (num_splits=2) is not supported", "precision 'mp'", "backend 'emulate'"]),
    ("model torch_cpu with num_splits=2", fwd(model="torch_cpu", num_splits=2), ValueError,
     ["model 'torch_cpu' is a model of one kernel", "num_splits=1"]),
    ("a bad dq_order", bwd(block_n=4, dq_order=[0, 0]), ValueError,
     ["dq_order [0, 0] is not a permutation of range(2)"]),
    ("causal 'yes'", fwd(causal="yes"), ValueError,
     ["causal must be True or False", "'bottom_right'", "'top_left'", "'yes'"]),
    ("top_left on the triton backend", fwd(causal="top_left", backend="triton",
                                           precision="fp16"), ValueError,
     ["causal='top_left' is not supported by backend 'triton'", "bottom_right"]),
    ("top_left in the triton backward", triton_bwd(precision="fp16", causal="top_left"),
     ValueError, ["causal='top_left' is not supported by backend 'triton'"]),
    ("torch_cpu bottom-right with Nq != Nk",
     lambda: attention(Q, K[..., :5, :], V[..., :5, :], model="torch_cpu", causal=True),
     ValueError, ["model 'torch_cpu'", "top-left", "causal='top_left'"]),
    ("input_transform unknown", fwd(input_transform="rotate"), ValueError,
     ["unknown input_transform 'rotate'", "smooth_k"]),
]


# the same door's neighbours, refused as well before the checks had one home
HELD = [
    ("backward with scale NaN", bwd(scale=math.nan), ValueError, ["scale must be finite", "nan"]),
    ("batch dim 0 with input_transform",
     lambda: attention(Q[:0], K[:0], V[:0], input_transform="smooth_k"), ValueError,
     ["batch dims (0, 2) hold no head"]),
    ("a bad dq_order name", bwd(dq_order="max_ascending"), ValueError,
     ["unknown dq_order 'max_ascending'", "forward, reverse, random"]),
    ("backward mp", bwd(precision="mp"), ValueError, ["unknown precision 'mp'", "fp32"]),
    ("backward exp2 not a bool", bwd(exp2="yes"), TypeError, ["exp2 must be True or False"]),
    ("GQA heads not a multiple", lambda: attention(qkv(h=3)[0], *qkv(h=2)[1:]), ValueError,
     ["multiple of key/value heads"]),
]


@pytest.mark.parametrize("edge, call, error, words", REFUSED + HELD,
                         ids=[r[0] for r in REFUSED + HELD])
def test_a_bad_call_is_one_error_naming_the_argument_and_what_is_valid(edge, call, error,
                                                                        words):
    with pytest.raises(error) as info:
        call()
    msg = str(info.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg, f"{edge}: {w!r} not in {msg!r}"


# -- accepted on purpose -----------------------------------------------------------------


def test_numpy_integers_are_integers():
    a = attention(Q, K, V, block_m=np.int64(4), block_n=np.int32(4), seed=np.int64(3),
                  num_splits=np.int64(2))
    b = attention(Q, K, V, block_m=4, block_n=4, seed=3, num_splits=2)
    assert torch.equal(a.out, b.out)


def test_blocks_beyond_the_data_run_as_blocks_equal_to_it():
    q, k, v = qkv(nq=40, nk=40, d=8)
    huge = attention(q, k, v, block_m=2**40, block_n=2**40)  # 2^80 logits if padded
    same = attention(q, k, v, block_m=40, block_n=40)
    assert torch.equal(huge.out, same.out) and torch.equal(huge.lse, same.lse)
    q, k, v = qkv(nq=6, nk=6, d=8)  # below 16 rows or keys, as a block of 16 (clamp_block)
    assert torch.equal(attention(q, k, v, block_n=2**40).out,
                       attention(q, k, v, block_n=16).out)
    g = attention_backward(q, k, v, q, block_m=2**40, block_n=2**40)
    assert torch.equal(g.dq, attention_backward(q, k, v, q, block_m=16, block_n=16).dq)


def test_splits_beyond_the_key_blocks_run_as_one_per_key_block():
    q, k, v = qkv(nq=4, nk=130, d=8)  # 3 key blocks of 64
    many = attention(q, k, v, num_splits=10**9, block_n=64)
    three = attention(q, k, v, num_splits=3, block_n=64)
    assert torch.equal(many.out, three.out)
    # and the clamp is the identity on values: empty splits merge to nothing
    kw = dict(precision="bf16", policy="fa2", block_m=4, block_n=64, order="forward",
              variant="fa2", scale=None, rounding="nearest", seed=0, backend="emulate",
              mp_bits=256, tau=8.0, beta=2.0)
    eight = split_attention(call_of(q, k, v, num_splits=8, **kw), emulate)
    assert torch.equal(eight.out, three.out) and torch.equal(eight.lse, three.lse)


def test_three_d_tensors_are_heads_and_two_d_one_head():
    four = attention(Q, K, V)
    assert torch.equal(attention(Q[0], K[0], V[0]).out, four.out[0])
    assert torch.equal(attention(Q[0, 1], K[0, 1], V[0, 1]).out, four.out[0, 1])


def test_mixed_dtypes_are_their_values():
    q16 = Q.to(torch.bfloat16)
    mixed = attention(q16, K.double(), V, precision="fp32")
    same = attention(q16.double(), K.double(), V.double(), precision="fp32")
    assert torch.equal(mixed.out, same.out)


# -- memory --------------------------------------------------------------------------------


def test_a_call_beyond_the_memory_available_is_refused_naming_the_estimate(monkeypatch):
    # 2^17 queries and keys in one block of each: 2^34 logits per tile, ~1.5 TB
    q = torch.zeros(1, 1, 2**17, 1)
    with pytest.raises(ValueError, match=r"needs an estimated [0-9.]+ TB of memory .* "
                                         r"is available"):
        attention(q, q, q, block_m=2**17, block_n=2**17)
    with pytest.raises(ValueError, match="needs an estimated"):
        attention_backward(q, q, q, q, block_m=2**17, block_n=2**17)
    monkeypatch.setattr(flashnum.engine.checks, "available_bytes", lambda: 1 << 20)
    with pytest.raises(ValueError, match=r"needs an estimated [0-9.]+ MB .* 1.0 MB is avail"):
        attention(*qkv(nq=512, nk=512, d=8), block_m=512, block_n=512)


# -- warnings --------------------------------------------------------------------------------


def test_grad_requiring_inputs_raise_no_warning():
    q = Q.clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        attention(q, K, V)
        attention_backward(q, K, V, DO)


def test_finite_inputs_with_non_finite_outputs_warn_naming_how_many_rows():
    q, k, v = qkv(nq=8, nk=8, d=4)
    q[..., :3, :], k = 1e20, k * 1e20  # 3 rows of logits ~1e40: beyond fp32 (the s site)
    with pytest.warns(RuntimeWarning, match="6 of 16 output rows are not finite"):
        res = attention(q.double(), k.double(), v.double(), precision="fp32")
    assert int(res.nonfinite.sum()) == 6


# -- causal alignments (torch's SDPA in float64 as the oracle) -------------------------------


@pytest.mark.parametrize("nq, nk", [(100, 77), (77, 100), (64, 64)])
def test_top_left_is_torchs_is_causal_and_true_is_bottom_right(nq, nk):
    q, k, v = qkv(nq=nq, nk=nk, d=16, dtype=torch.float64)
    kw = dict(precision="fp64", policy="exact", block_m=32, block_n=32)
    top = attention(q, k, v, causal="top_left", **kw)
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert float((top.out - sdpa).abs().max()) < 1e-13
    assert not top.masked.any()  # every row sees key 0
    true, br = (attention(q, k, v, causal=c, **kw) for c in (True, "bottom_right"))
    assert torch.equal(true.out, br.out)
    # bottom-right: the top-left mask shifted by Nk - Nq
    bias = torch.zeros(nq, nk, dtype=torch.float64).masked_fill(
        torch.arange(nk)[None, :] > torch.arange(nq)[:, None] + (nk - nq), -math.inf)
    ref = torch.nan_to_num(F.scaled_dot_product_attention(q, k, v, attn_mask=bias), nan=0.0)
    assert float((br.out - ref).abs().max()) < 1e-13
    assert float((reference(q, k, v, causal="top_left").out - sdpa).abs().max()) < 1e-13


def test_the_backward_and_its_reference_follow_the_alignment():
    q, k, v = (x.requires_grad_() for x in qkv(nq=50, nk=30, d=8, dtype=torch.float64))
    do = qkv(nq=50, nk=30, d=8, seed=2, dtype=torch.float64)[0]
    F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do)
    g = attention_backward(q, k, v, do, precision="fp64", policy="exact", causal="top_left",
                           block_m=16, block_n=16)
    r = reference_backward(q.detach(), k.detach(), v.detach(), do, causal="top_left",
                           method="fp64")
    for ours, rg, tg in ((g.dq, r.dq, q.grad), (g.dk, r.dk, k.grad), (g.dv, r.dv, v.grad)):
        assert float((ours - tg).abs().max()) < 1e-12
        assert float((rg - tg).abs().max()) < 1e-12
    assert not g.masked.any()


# -- split-KV in the policy's precision ------------------------------------------------------


def test_exact_split_kv_is_exact():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 16, n, 64, generator=g, dtype=torch.float64)[:, :8]
               for n in (16, 1000, 1000))
    res = attention(q, k, v, precision="fp64", policy="exact", num_splits=7)
    s = (q @ k.transpose(-1, -2)) / 8.0  # the oracle: plain float64 softmax
    out = torch.softmax(s, -1) @ v
    assert float((res.out - out).abs().max()) < 1e-13  # fp32 partials/merge: 3.6e-7
    assert res.info["split_precision"] == res.info["merge_precision"] == "exact"


def test_split_kv_with_gqa_follows_the_top_left_mask():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 20, 16, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 300, 16, generator=g, dtype=torch.float64) for _ in range(2))
    res = attention(q, k, v, precision="fp64", policy="exact", num_splits=3, causal="top_left")
    want = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1),
                                          v.repeat_interleave(2, 1), is_causal=True)
    assert float((res.out - want).abs().max()) < 1e-13


def test_split_kv_defaults_are_fp32_for_fa2_and_the_dtype_for_lowp():
    q, k, v = qkv(nq=4, nk=300, d=8)
    fa2 = attention(q, k, v, num_splits=3, precision="bf16", policy="fa2")
    named = attention(q, k, v, num_splits=3, precision="bf16", policy="fa2",
                      split_precision="fp32", merge_precision="fp32")
    assert torch.equal(fa2.out, named.out)
    lowp = attention_splitkv(q, k, v, num_splits=3, precision="bf16", policy="lowp")
    assert (lowp.info["split_precision"], lowp.info["merge_precision"]) == ("bf16", "bf16")


def test_the_runner_takes_causal_top_left_and_true_stays_the_case_it_was():
    from hydra import compose, initialize_config_dir

    from flashnum.harness.grid import CONF, columns, expand

    def cases(*overrides):
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return expand(compose("config", overrides=["experiment=smoke", *overrides]))

    true, br, tl = cases("causal=true"), cases("causal=bottom_right"), cases("causal=top_left")
    assert [c.case_id for c in true] == [c.case_id for c in br]
    assert "causal_align" not in columns(true)  # the stored tables' columns, unchanged
    assert all(c.causal and c.causal_align == "top_left" for c in tl)
    assert not {c.case_id for c in tl} & {c.case_id for c in true}
    with pytest.raises(ValueError, match="causal must be true or false, or an alignment"):
        cases("causal=diagonal")
