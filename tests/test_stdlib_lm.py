"""models/stdlib_lm.py, the trained model's script: a few steps of training on the
standard library's sources, then its capture, end to end at a tiny size.

The capture's heads are checked against q computed here by hand from the saved weights
(RMSNorm, the qkv projection and the rotary embedding written out in the test), and the
selection rule (the heads with the largest and smallest mass on key 0) against torch's
softmax of those q, k."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "models" / "stdlib_lm.py"


def run(*args, timeout=600):
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("lm")
    p = run("train", "--out", str(out / "run"), "--steps", "3", "--layers", "2", "--d-model",
            "32", "--heads", "4", "--context", "64", "--batch", "2", "--log-every", "1",
            "--val-every", "3", "--val-batches", "1", "--threads", "1")
    assert p.returncode == 0, p.stderr
    return out


def test_training_saves_weights_and_a_loss_curve(trained):
    log = json.loads((trained / "run" / "log.json").read_text())
    assert log["steps_done"] == 3 and log["stopped_by"] == "steps"
    assert [c["step"] for c in log["curve"]] == [1, 2, 3]
    assert "val_loss" in log["curve"][-1] and log["corpus"]["files"]["train"] > 100
    assert (trained / "run" / "model.safetensors").stat().st_size > 0


@pytest.mark.slow
def test_the_capture_keeps_the_last_rows_of_two_heads_per_layer(trained):
    from safetensors.torch import load_file

    import flashnum

    cap, info = trained / "cap.safetensors", trained / "cap.json"
    p = run("capture", "--run", str(trained / "run"), "--out", str(cap), "--info", str(info),
            "--rows", "16", "--threads", "1")
    assert p.returncode == 0, p.stderr
    calls = flashnum.load_capture(cap)
    assert [c.index for c in calls] == [0, 1] and all(c.causal is True for c in calls)
    assert calls[0].rows == list(range(48, 64))
    assert calls[0].q.shape == (1, 2, 16, 8) and calls[0].k.shape == (1, 2, 64, 8)
    assert calls[0].do is not None and calls[0].do.shape == (1, 2, 16, 8)
    # layer 0's q and k by hand: RMSNorm of the embedding (BOS first), qkv, rotary
    w = load_file(str(trained / "run" / "model.safetensors"))
    meta = json.loads(info.read_text())
    tok = torch.tensor(meta["tokens"])[None]
    x = w["embed.weight"][tok]
    x = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + torch.finfo(x.dtype).eps)
    x = x * w["blocks.0.norm1.weight"]
    q, k, _ = (x @ w["blocks.0.attn.qkv.weight"].T).split(32, dim=-1)
    q, k = (t.view(1, 64, 4, 8).transpose(1, 2) for t in (q, k))
    inv = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    ang = torch.arange(64, dtype=torch.float64)[:, None] * inv
    cos, sin = torch.cat([ang.cos()] * 2, -1).float(), torch.cat([ang.sin()] * 2, -1).float()

    def rope(t):
        return t * cos + torch.cat([-t[..., 4:], t[..., :4]], -1) * sin

    q, k = rope(q), rope(k)
    heads = calls[0].heads
    torch.testing.assert_close(calls[0].q, q[:, heads, 48:], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(calls[0].k, k[:, heads], rtol=1e-5, atol=1e-6)
    mask = torch.ones(64, 64, dtype=torch.bool).tril()
    s = q.double() @ k.double().transpose(-1, -2) / 8 ** 0.5
    p0 = torch.softmax(s.masked_fill(~mask, -torch.inf), -1)[0, :, :, 0].mean(-1)
    assert heads == sorted({int(p0.argmax()), int(p0.argmin())})
    kept = [(r["layer"], r["head"]) for r in meta["heads"] if r["kept"]]
    assert kept == [(i, h) for i, c in enumerate(calls) for h in c.heads]


@pytest.mark.slow
def test_a_run_cut_short_is_remade_bit_for_bit_by_stop_after(tmp_path):
    args = ["--steps", "6", "--stop-after", "2", "--layers", "1", "--d-model", "16",
            "--heads", "2", "--context", "32", "--batch", "2", "--val-batches", "1",
            "--threads", "1"]
    for name in ("a", "b"):
        p = run("train", "--out", str(tmp_path / name), *args)
        assert p.returncode == 0, p.stderr
    a, b = ((tmp_path / n / "model.safetensors").read_bytes() for n in ("a", "b"))
    assert a == b
    log = json.loads((tmp_path / "a" / "log.json").read_text())
    assert (log["steps_done"], log["steps_planned"], log["stopped_by"]) == (2, 6, "steps")


@pytest.mark.slow
def test_bad_arguments_are_one_line_with_status_2(tmp_path):
    p = run("train", "--out", str(tmp_path), "--d-model", "30", "--heads", "4")
    assert p.returncode == 2 and "--d-model 30 must split" in p.stderr
    p = run("capture", "--run", str(tmp_path / "none"))
    assert p.returncode == 2 and "holds no model.safetensors" in p.stderr
