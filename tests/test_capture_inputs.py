"""A captured call goes everywhere inputs go: distribution=captured in the runner, audit,
the worst-case search and the backward.

Oracles outside flashnum: torch's own SDPA on the tensors the test passed to the model,
a float64 softmax attention written here (bottom-right causal mask), and torch autograd.
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import flashnum
from flashnum import store
from flashnum.harness.config import check
from flashnum.harness.grid import expand
from flashnum.inputs.distributions import make

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"


def attention64(q, k, v, causal, scale):
    """softmax(scale q k^T) v in float64, causal aligned bottom-right (flashnum's)."""
    s = scale * q @ k.transpose(-1, -2)
    if causal:
        nq, nk = s.shape[-2:]
        i, j = torch.arange(nq)[:, None], torch.arange(nk)[None, :]
        s = s.masked_fill(j > i + (nk - nq), -math.inf)
    return torch.softmax(s, -1) @ v


@pytest.fixture(scope="module")
def calls(tmp_path_factory):
    """A capture of three fp64 calls with their dO: plain, causal with a scale, Nq < Nk."""
    path = tmp_path_factory.mktemp("cap") / "c.safetensors"
    g = torch.Generator().manual_seed(0)
    x = [torch.randn(1, 2, 24, 8, generator=g, dtype=torch.float64, requires_grad=True)
         for _ in range(3)]
    kv = torch.randn(1, 2, 40, 8, generator=g, dtype=torch.float64, requires_grad=True)
    with flashnum.capture(path, backward=True) as cap:
        outs = [F.scaled_dot_product_attention(*x),
                F.scaled_dot_product_attention(*x, is_causal=True, scale=0.2),
                F.scaled_dot_product_attention(x[0], kv, kv, is_causal=True)]
        w = torch.randn(*outs[0].shape, generator=g, dtype=torch.float64)
        sum((o * w[..., : o.shape[-1]]).sum() for o in outs).backward()
    return path, x, kv, cap, w


def test_captured_inputs_are_the_calls_tensors_in_float64(calls):
    path, x, kv, cap, _ = calls
    inp = make("captured", path=str(path), call=1)
    assert all(torch.equal(a, b.detach()) for a, b in zip(inp.tensors(), x, strict=True))
    assert inp.causal is True and inp.scale == 0.2 and inp.q.dtype == torch.float64


def test_top_left_causal_with_fewer_queries_keeps_the_keys_they_see(calls):
    path, x, kv, cap, _ = calls
    assert cap.calls[2].causal == "top_left"
    inp = make("captured", path=str(path), call=2)
    assert inp.k.shape[-2] == 24 and inp.causal is True
    want = F.scaled_dot_product_attention(x[0], kv, kv, is_causal=True).detach()
    got = attention64(*inp.tensors(), True, 1 / math.sqrt(8))
    # two float64 evaluations of the same sums: within a few ulps of values <= ~3
    assert (got - want).abs().max() < 1e-13


def test_a_row_sample_of_a_causal_call_is_bottom_right_causal_attention(calls):
    path, x, kv, cap, _ = calls
    inp = make("captured", path=str(path), call=1, head_ids=[1], rows=5, seed=3)
    full = F.scaled_dot_product_attention(*x, is_causal=True, scale=0.2).detach()[:, [1]]
    got = attention64(*inp.tensors(), inp.causal, inp.scale)
    nk = inp.k.shape[-2]  # rows s..s+4 see keys 0..s+4
    assert inp.q.shape[-2] == 5 and torch.equal(inp.q, x[0].detach()[:, [1], nk - 5 : nk])
    assert (got - full[:, :, nk - 5 : nk]).abs().max() < 1e-13
    with pytest.raises(ValueError, match="head_ids must be a list of head indices in 0..1"):
        make("captured", path=str(path), call=1, head_ids=[2])


def test_the_backward_of_a_captured_call_with_its_do_is_the_models_gradient(calls):
    path, x, kv, cap, _ = calls
    (call,) = flashnum.load_capture(path, calls=[1])
    g = flashnum.attention_backward(*call.qkv, call.do, causal=call.causal, scale=call.scale,
                                    precision="fp64", policy="exact")
    # x[1] is the key of call 1 only (and of call 0, whose share we take out by hand)
    q, k, v = (t.detach().requires_grad_() for t in x)
    dq0, dk0 = torch.autograd.grad(F.scaled_dot_product_attention(q, k, v), (q, k),
                                   cap.calls[0].do)
    # fp64 arithmetic on 24 x 8 values: differences are tens of roundings of 2^-53
    assert (g.dk - (x[1].grad - dk0)).abs().max() < 1e-12
    assert call.do is not None and call.do.shape == (1, 2, 24, 8)


@pytest.mark.slow
def test_the_runner_measures_one_captured_call(calls, tmp_path):
    path = calls[0]
    cmd = [sys.executable, "-m", "flashnum.run", "distribution=captured",
           f"distribution.path={path}", "distribution.call=1", "n_jobs=1", "progress=false",
           f"store.root={tmp_path}", f"hydra.run.dir={tmp_path}/hydra"]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    df = store.load(tmp_path / "single")
    assert len(df) == 1
    row = df.iloc[0]
    assert (row.distribution, row.batch, row.heads, row.seq_len_q, row.seq_len_k,
            row.head_dim, bool(row.causal)) == ("captured", 1, 2, 24, 24, 8, True)
    assert 0 < row.max_abs_err <= row.bound and bool(row.ref_ok)
    bad = subprocess.run(cmd[:5] + ["distribution.call=7"] + cmd[6:], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "holds no call 7; valid: 0-2" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_a_captured_case_is_named_by_the_files_content(calls, tmp_path):
    from hydra import compose, initialize_config_dir

    path = tmp_path / "c.safetensors"
    path.write_bytes(calls[0].read_bytes())

    def case(*more):
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose("config", overrides=["distribution=captured",
                                               f"distribution.path={path}",
                                               "distribution.call=0", "shape.seq_len_q=7",
                                               *more])
        check(cfg)
        (c,) = expand(cfg)
        return c

    a = case()
    assert (a.seq_len_q, a.seq_len_k, a.heads, a.causal) == (24, 24, 2, False)
    some = case("distribution.head_ids=[1]", "distribution.rows=5", "seed=2")
    assert (some.seq_len_q, some.heads, some.params["rows"]) == (5, 1, 5)
    assert a.params["sha256"] and a.params["call"] == 0
    with flashnum.capture(path):  # the same path, other content
        F.scaled_dot_product_attention(*(torch.ones(1, 2, 24, 8) for _ in range(3)))
    b = case()
    assert b.case_id != a.case_id and b.params["sha256"] != a.params["sha256"]


def test_audit_runs_a_kernel_on_every_captured_call(calls):
    from flashnum.audit import audit

    def sdpa(q, k, v, causal=False, scale=None):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)

    rep = audit(sdpa, inputs=calls[0], precision="fp32", reference="fp64")
    assert len(rep.table) == 3 and rep.table["distribution"].eq("captured").all()
    assert sorted(rep.table["nq"]) == [24, 24, 24]
    assert rep.passed, rep.summary()


def test_the_search_can_start_from_a_captured_call(calls):
    from flashnum.inputs.search import worst_case

    path = str(calls[0])
    res = worst_case(policy="fa2", precision="bf16", max_evals=6, budget_s=0, save=False,
                     verify=False, start={"path": path, "call": 1})
    start = make("captured", path=path, call=1)
    fmt = flashnum.get_format("bf16")
    q, k, v = (fmt.round(t) for t in start.tensors())
    out = flashnum.attention(q, k, v, precision="bf16", policy="fa2", causal=True,
                             scale=0.2).out
    e0 = float((out - attention64(q, k, v, True, 0.2)).abs().max())
    assert res.baseline == pytest.approx(e0, rel=1e-6)  # the start, measured first
    assert res.error >= res.baseline and res.inputs.q.shape == (1, 2, 24, 8)
    assert res.inputs.causal and res.config["start"]["call"] == 1
    assert torch.equal(res.inputs.q, q)  # the search moves V only


def test_the_backward_runner_uses_the_calls_own_do(calls, tmp_path, monkeypatch):
    from flashnum.harness import backward

    path, x, kv, cap, _ = calls
    conf = {"experiment": "bwd_cap", "base": {"block": 16, "bound": False},
            "grid": [{"name": "c", "distribution": ["captured"], "policy": ["fa2"],
                      "capture": [{"path": str(path), "call": 1}]}]}
    monkeypatch.setattr(backward, "load_conf", lambda name: conf)
    (case,) = backward.expand(conf)
    assert (case["seq_len"], case["head_dim"], case["causal"]) == (24, 8, True)
    assert backward.main(["bwd_cap", f"store.root={tmp_path}"]) == 0
    row = store.load(tmp_path / "bwd_cap").iloc[0]
    # torch autograd in float64 of the bf16-rounded call with its bf16-rounded dO
    q, k, v = (t.detach().bfloat16().double().requires_grad_() for t in x)
    do = cap.calls[1].do.bfloat16().double()
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.2)
    dq, = torch.autograd.grad(out, q, do)
    assert row.ref_dq == pytest.approx(float(dq.abs().max()), rel=1e-12)
    assert row.err_dq > 0 and json.loads(row.capture)["sha256"]
    with pytest.raises(ValueError, match="capture is for distribution captured"):
        backward.expand({"grid": [{"capture": [{"path": str(path)}]}]})


def test_the_gradient_audit_sends_each_call_its_own_do(calls):
    from flashnum.audit import audit

    path, x, kv, cap, _ = calls
    seen = []

    def sdpa(q, k, v, causal=False, scale=None):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        if out.requires_grad:
            out.register_hook(lambda g: seen.append(g.detach().clone()))
        return out

    rep = audit(sdpa, inputs=path, precision="fp32", reference="fp64", backward=True)
    assert len(rep.table) == 3 and len(seen) == 3
    for g, call in zip(seen, cap.calls, strict=True):
        assert torch.equal(g, call.do.float())


def test_the_search_command_starts_from_a_captured_call(calls, tmp_path, capsys):
    from flashnum import worst_case

    path = str(calls[0])
    assert worst_case.main([f"start={path}", "start_call=1", "max_evals=3", "budget=0",
                        "quiet=true", f"store.root={tmp_path}"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["config"]["start"] == {"path": path, "call": 1} and out["family"] == "captured"
    with pytest.raises(SystemExit) as e:
        worst_case.main([f"start={path}", "start_call=7", f"store.root={tmp_path}"])
    assert e.value.code == 2 and "holds no call 7; valid: 0-2" in capsys.readouterr().err
