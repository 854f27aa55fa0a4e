"""flashnum.capture records exactly the scaled_dot_product_attention calls a model makes.

The oracle is outside flashnum: a spy that the test puts in place of
torch.nn.functional.scaled_dot_product_attention inside the block (what a plain
monkeypatch of the function sees, its output's gradient through a tensor hook of its
own), and Q, K, V computed by hand from nn.TransformerEncoderLayer's weights. Captured
tensors must equal what the spy saw bit for bit: a capture copies, it never computes.
"""

import math
import warnings
from unittest import mock

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import flashnum
from flashnum.inputs.capture import FORMAT, capture_index, load_call


class Spy:
    """Stands in for F.scaled_dot_product_attention: keeps each call's arguments and dO."""

    def __init__(self):
        self.seen = []
        self.inner = F.scaled_dot_product_attention  # capture's recorder, when inside one

    def __call__(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                 enable_gqa=False):
        rec = dict(q=q.detach().clone(), k=k.detach().clone(), v=v.detach().clone(),
                   attn_mask=attn_mask, is_causal=is_causal, scale=scale, do=None)
        self.seen.append(rec)
        out = self.inner(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
                         is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
        if out.requires_grad:
            out.register_hook(lambda g: rec.update(do=g.detach().clone()))
        return out


def spied():
    spy = Spy()
    return spy, mock.patch.object(F, "scaled_dot_product_attention", spy)


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def assert_matches(call, seen, backward):
    q = seen["q"]
    assert same(call.q, q) and same(call.k, seen["k"]) and same(call.v, seen["v"])
    assert call.is_causal == seen["is_causal"]
    want_scale = seen["scale"] if seen["scale"] is not None else 1 / math.sqrt(q.shape[-1])
    assert call.scale == want_scale and call.scale_given == seen["scale"]
    if backward:
        assert seen["do"] is not None and same(call.do, seen["do"])
    else:
        assert call.do is None


def direct_calls(backward):
    """Three direct calls: plain, causal with a given scale, bf16."""
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(2, 3, 7, 8, generator=g) for _ in range(3)]
    bf = [torch.randn(1, 2, 5, 16, generator=g).bfloat16() for _ in range(3)]
    for t in (*args, *bf):
        t.requires_grad_(backward)
    outs = [F.scaled_dot_product_attention(*args),
            F.scaled_dot_product_attention(*args, is_causal=True, scale=0.3),
            F.scaled_dot_product_attention(*bf)]
    if backward:
        sum((o.float() * torch.arange(o.numel()).reshape(o.shape)).sum() for o in outs).backward()


@pytest.mark.parametrize("backward", [False, True])
def test_direct_calls_are_recorded_by_value_flag_and_scale(tmp_path, backward):
    with flashnum.capture(tmp_path / "c.safetensors", backward=backward) as cap:
        spy, patch = spied()
        with patch:
            direct_calls(backward)
    assert [c.index for c in cap.calls] == [0, 1, 2]
    for call, seen in zip(cap.calls, spy.seen, strict=True):
        assert_matches(call, seen, backward)
    assert [c.causal for c in cap.calls] == [False, True, False]  # Nq == Nk: both alignments


@pytest.mark.parametrize("backward", [False, True])
def test_transformer_encoder_layer_in_training_mode(tmp_path, backward):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True).train()
    x = torch.randn(2, 6, 16)
    with flashnum.capture(tmp_path / "c.safetensors", backward=backward) as cap:
        spy, patch = spied()
        with patch:
            y = layer(x)
            if backward:
                (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
    assert len(cap.calls) == len(spy.seen) == 1
    call = cap.calls[0]
    assert_matches(call, spy.seen[0], backward)
    assert call.module == "self_attn" and call.module_type == "MultiheadAttention"
    # by hand: the packed in-projection, split into 4 heads of 4
    qkv = F.linear(x, layer.self_attn.in_proj_weight, layer.self_attn.in_proj_bias)
    for t, part in zip(call.qkv, qkv.chunk(3, dim=-1), strict=True):
        assert torch.equal(t, part.reshape(2, 6, 4, 4).transpose(1, 2))
    assert call.scale == 1 / math.sqrt(4) and call.causal is False
    # the file holds the same calls
    back = flashnum.load_capture(tmp_path / "c.safetensors")
    assert len(back) == 1 and back[0].meta() == call.meta()
    for name in ("q", "k", "v", "do"):
        a, b = getattr(back[0], name), getattr(call, name)
        assert (a is None and b is None) or same(a, b)


def test_a_causal_encoder_stack_names_each_layers_attention(tmp_path):
    torch.manual_seed(1)
    enc = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True), num_layers=2,
        enable_nested_tensor=False)
    x = torch.randn(1, 5, 8)
    mask = nn.Transformer.generate_square_subsequent_mask(5)
    with flashnum.capture(None) as cap:
        spy, patch = spied()
        with patch:
            enc(x, mask=mask, is_causal=True)
    assert [c.module for c in cap.calls] == ["layers.0.self_attn", "layers.1.self_attn"]
    for call, seen in zip(cap.calls, spy.seen, strict=True):
        assert same(call.q, seen["q"])
        torch_causal = seen["is_causal"] or (seen["attn_mask"] is not None and bool(
            (seen["attn_mask"] == mask).all()))
        assert torch_causal and call.causal is True  # Nq == Nk: top-left is bottom-right


def test_eval_mode_and_no_grad_still_go_through_sdpa():
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).eval()
    with torch.no_grad(), flashnum.capture(None) as cap:
        layer(torch.randn(2, 3, 8))
    assert len(cap.calls) == 1 and cap.calls[0].q.shape == (2, 2, 3, 4)


def test_torch_causal_is_top_left_and_recorded_as_such_when_shapes_differ():
    q, k = torch.randn(1, 1, 3, 4), torch.randn(1, 1, 5, 4)
    with flashnum.capture(None) as cap:
        F.scaled_dot_product_attention(q, k, k, is_causal=True)
    assert cap.calls[0].is_causal is True and cap.calls[0].causal == "top_left"


def test_a_boolean_causal_mask_is_causal_and_other_masks_are_kept_or_refused():
    q = torch.randn(1, 2, 4, 8)
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    additive = torch.randn(4, 4)
    band = causal & causal.T.tril(1).T  # not the causal mask
    with flashnum.capture(None) as cap:
        F.scaled_dot_product_attention(q, q, q, attn_mask=causal)
        F.scaled_dot_product_attention(q, q, q, attn_mask=torch.zeros(4, 4).masked_fill(
            ~causal, -math.inf))
        F.scaled_dot_product_attention(q, q, q, attn_mask=band)
        F.scaled_dot_product_attention(q, q, q, attn_mask=additive)
    a, b, c, d = cap.calls
    assert (a.mask_kind, a.causal, a.mask) == ("causal", True, None)
    assert (b.mask_kind, b.causal, b.mask) == ("causal", True, None)
    assert c.mask_kind == "bool" and torch.equal(c.mask, band.expand(1, 2, 4, 4))
    assert d.mask_kind == "additive" and torch.equal(d.mask, additive.expand(1, 2, 4, 4))
    with pytest.raises(ValueError, match="attn_mask that is not causal"):
        c.check_plain()


def test_three_dim_calls_and_gqa_are_stored_as_batch_heads_n_d():
    q3 = torch.randn(3, 5, 4)
    q, k = torch.randn(1, 4, 5, 8), torch.randn(1, 2, 5, 8)
    with flashnum.capture(None) as cap:
        F.scaled_dot_product_attention(q3, q3, q3)
        F.scaled_dot_product_attention(q, k, k, enable_gqa=True)
    assert torch.equal(cap.calls[0].q, q3[:, None])
    g = cap.calls[1]
    assert g.enable_gqa and torch.equal(g.k[:, 1], k[:, 0]) and torch.equal(g.k[:, 2], k[:, 1])


def test_limits_choose_calls_heads_rows_and_bytes(tmp_path):
    q = torch.randn(1, 4, 32, 8)
    one = 4 * 2 * (6 * 8 + 2 * 32 * 8)  # fp32 bytes of 2 heads: 6 query rows, 32 keys
    with flashnum.capture(None, calls=[1, 2, 3], heads=[3, 1], rows=6, seed=5,
                          max_bytes=2 * one - 1) as cap:
        for causal in (False, False, True, False):
            F.scaled_dot_product_attention(q, q, q, is_causal=causal)
    assert [c.index for c in cap.calls] == [1, 2]  # call 0 not chosen, call 3 over budget
    assert cap.skipped[0][0] == 3 and "max_bytes" in cap.skipped[0][1]
    plain, causal = cap.calls
    assert plain.heads == [3, 1] and len(plain.rows) == 6 and plain.rows == sorted(plain.rows)
    assert torch.equal(plain.q, q[:, [3, 1]][:, :, plain.rows])
    assert torch.equal(plain.k, q[:, [3, 1]])
    # causal rows are consecutive and keep the keys they see: bottom-right causal
    s = causal.rows[0]
    assert causal.rows == list(range(s, s + 6)) and causal.causal is True
    assert torch.equal(causal.k, q[:, [3, 1], : s + 6])
    with pytest.raises(ValueError, match="rows must be None or an int"):
        flashnum.capture(None, rows=0)
    with pytest.raises(ValueError, match="heads must be None or a list"):
        flashnum.capture(None, heads="0")


def test_row_samples_are_seeded():
    q = torch.randn(1, 1, 64, 4)
    rows = []
    for seed in (0, 0, 1):
        with flashnum.capture(None, rows=8, seed=seed) as cap:
            F.scaled_dot_product_attention(q, q, q)
        rows.append(cap.calls[0].rows)
    assert rows[0] == rows[1] != rows[2]


def test_no_call_says_so_in_one_line(tmp_path):
    with pytest.warns(UserWarning, match="no scaled_dot_product_attention call") as w:
        with flashnum.capture(tmp_path / "e.safetensors"):
            torch.randn(3).sum()
    assert len(w) == 1 and "\n" not in str(w[0].message)
    assert flashnum.load_capture(tmp_path / "e.safetensors") == []
    with pytest.raises(ValueError, match="holds no attention calls"):
        load_call(tmp_path / "e.safetensors", 0)


def test_another_format_version_is_one_clear_error(tmp_path):
    from safetensors.torch import save_file

    save_file({"0.q": torch.zeros(1)}, str(tmp_path / "old.safetensors"),
              metadata={"format": "flashnum.capture/0", "calls": "[]"})
    with pytest.raises(ValueError, match=f"format 'flashnum.capture/0'.*{FORMAT}"):
        flashnum.load_capture(tmp_path / "old.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"not a tensor file")
    with pytest.raises(ValueError, match="is not a flashnum capture"):
        capture_index(tmp_path / "junk.safetensors")


def test_the_file_loads_without_pickle_and_the_function_is_restored(tmp_path):
    before = F.scaled_dot_product_attention
    q = torch.randn(1, 1, 3, 4)
    with flashnum.capture(tmp_path / "c.safetensors"):
        F.scaled_dot_product_attention(q, q, q)
    assert F.scaled_dot_product_attention is before
    assert (tmp_path / "c.safetensors").read_bytes()[8:9] == b"{"  # safetensors' JSON header
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (call,) = flashnum.load_capture(tmp_path / "c.safetensors")
    assert torch.equal(call.q, q)


def test_nested_captures_each_record_the_call_once_and_an_error_writes_nothing(tmp_path):
    q = torch.randn(1, 1, 3, 4)
    with flashnum.capture(None) as outer:
        F.scaled_dot_product_attention(q, q, q)
        with flashnum.capture(None) as inner:
            F.scaled_dot_product_attention(q, 2 * q, q)
    assert [c.index for c in outer.calls] == [0, 1] and len(inner.calls) == 1
    assert torch.equal(inner.calls[0].k, outer.calls[1].k)
    with pytest.raises(RuntimeError, match="model failed"):
        with flashnum.capture(tmp_path / "x.safetensors"):
            F.scaled_dot_product_attention(q, q, q)
            raise RuntimeError("model failed")
    assert not (tmp_path / "x.safetensors").exists()
    assert F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention


def test_a_call_the_recorder_cannot_take_still_runs_and_is_reported():
    from flashnum.inputs import capture as module

    real = module._as4d

    def as4d(x):  # a layout the recorder fails on: head_dim 5, say
        if x.shape[-1] == 5:
            raise RuntimeError("odd layout")
        return real(x)

    q4, q5 = torch.randn(1, 1, 3, 4), torch.randn(1, 1, 3, 5)
    want = F.scaled_dot_product_attention(q5, q5, q5)
    with mock.patch.object(module, "_as4d", as4d):
        with pytest.warns(UserWarning, match=r"calls \[0\] could not be recorded"):
            with flashnum.capture(None) as cap:
                got = F.scaled_dot_product_attention(q5, q5, q5)
                F.scaled_dot_product_attention(q4, q4, q4)
    assert torch.equal(got, want) and [c.index for c in cap.calls] == [1]
    assert cap.skipped == [(0, "not recorded: RuntimeError: odd layout")]
