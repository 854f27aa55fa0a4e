"""examples/capture_hf.py captures a Hugging Face transformers model's attention exactly.

A randomly initialised tiny Llama (no weights or data from a hub: HF_HUB_OFFLINE is set),
SDPA attention, grouped-query heads. The oracle is a spy put in place of
torch.nn.functional.scaled_dot_product_attention inside the block, as in test_capture.
"""

import importlib.util
import os
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

import flashnum

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers reads it: never download
pytest.importorskip("transformers", reason="transformers is the optional extra [hf]")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "capture_hf.py"


def example():
    spec = importlib.util.spec_from_file_location("capture_hf", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_tiny_llama_is_captured_call_by_call_with_its_do(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ex = example()
    model = ex.tiny_llama(0)
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(1))
    seen = []

    def spy(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
        out = inner(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                    scale=scale, **kw)
        rec = dict(q=q.detach().clone(), k=k.detach().clone(), is_causal=is_causal,
                   mask=attn_mask, scale=scale, gqa=kw.get("enable_gqa", False))
        out.register_hook(lambda g: rec.update(do=g.detach().clone()))
        seen.append(rec)
        return out

    path = tmp_path / "hf.safetensors"
    with flashnum.capture(path, backward=True) as cap:
        inner = F.scaled_dot_product_attention
        with mock.patch.object(F, "scaled_dot_product_attention", spy):
            model(ids, labels=ids).loss.backward()
    assert [c.module for c in cap.calls] == ["model.layers.0.self_attn",
                                             "model.layers.1.self_attn"]
    assert len(seen) == 2
    for call, s in zip(cap.calls, seen, strict=True):
        assert torch.equal(call.q, s["q"]) and torch.equal(call.do, s["do"])
        k = s["k"].repeat_interleave(4 // s["k"].shape[1], dim=1) if s["gqa"] else s["k"]
        assert torch.equal(call.k, k) and call.k.shape[1] == 4
        assert call.is_causal == s["is_causal"] and s["mask"] is None and call.causal is True
        assert call.scale == s["scale"] == 16 ** -0.5
    back = flashnum.load_capture(path)
    assert [c.meta() for c in back] == [c.meta() for c in cap.calls]


def test_the_example_runs_from_the_command_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert example().main(["--out", str(tmp_path / "a.safetensors"), "--seq-len", "8"]) == 0
    assert "call 1: model.layers.1.self_attn q (1, 4, 8, 16) causal=True" in capsys.readouterr().out
    assert len(flashnum.load_capture(tmp_path / "a.safetensors")) == 2
