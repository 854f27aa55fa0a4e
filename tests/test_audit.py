"""The audit passes a correct kernel and fails each seeded bug by the rule that should catch it.

The seeded kernels are a plain-torch blocked online softmax (fp32 state, P cast to the
dtype before P V, as FlashAttention-2) with one bug each, of the kinds kernel developers
write: a dropped ragged tail, a softmax without the max shift, a missing rescale of o, an
off-by-one causal mask.
"""

import math
import textwrap

import pytest
import torch

import flashnum.audit as fa
from flashnum.audit import Case
from flashnum.audit.__main__ import main as cli
from flashnum.testing import assert_attention_accurate

BLOCK = 64
CASES = [
    Case("gaussian", 77, 77, 64, False, 1, 2),             # ragged: 77 = 64 + 13
    Case("late_max", 77, 77, 64, True, 1, 1),              # the max arrives in the last block
    Case("scaled", 128, 128, 64, False, 1, 1, params={"temperature": 32.0}),  # logits > 88
    Case("gaussian", 100, 300, 64, True, 1, 1),            # causal, Nq != Nk
]


def blocked(q, k, v, causal=False, scale=None, *, bug=None):
    """FlashAttention-2's recurrence in plain torch; `bug` seeds one mistake."""
    nq, nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    qf = q.float()
    m = torch.full(q.shape[:-1], -math.inf)
    l = torch.zeros(q.shape[:-1])
    o = torch.zeros(*q.shape[:-1], v.shape[-1])
    end = nk - nk % BLOCK if bug == "dropped_tail" else nk
    i = torch.arange(nq)[:, None]
    for j0 in range(0, end, BLOCK):
        kb, vb = k[..., j0 : j0 + BLOCK, :].float(), v[..., j0 : j0 + BLOCK, :]
        s = (qf @ kb.transpose(-1, -2)) * scale
        if causal:
            j = torch.arange(j0, j0 + kb.shape[-2])[None, :]
            s = s.masked_fill(j > i + (1 if bug == "off_by_one" else 0), -math.inf)
        m_new = torch.maximum(m, s.amax(-1))
        if bug == "no_max_shift":
            m_new = torch.zeros_like(m_new)
        m_safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
        alpha = torch.exp(m - m_safe)
        p = torch.exp(s - m_safe[..., None])
        l = l * alpha + p.sum(-1)
        if bug != "missing_rescale":
            o = o * alpha[..., None]
        o = o + (p.to(v.dtype) @ vb).float()
        m = m_new
    out = o / torch.where(l > 0, l, torch.ones_like(l))[..., None]
    return out.to(q.dtype)


def _kernel(bug):
    def fn(q, k, v, causal=False, scale=None):
        return blocked(q, k, v, causal, scale, bug=bug)
    return fn


def _audit(fn, **kw):
    return fa.audit(fn, precision="bf16", case_list=CASES, alignment="top_left", **kw)


def test_the_audit_passes_a_correct_blocked_kernel():
    rep = _audit(_kernel(None))
    assert rep.passed, rep.summary()


def test_the_audit_passes_torch_sdpa_and_its_model_matches_it_bit_for_bit():
    rep = fa.audit("torch_sdpa", precision="bf16", budget="quick")
    assert rep.passed, rep.summary()
    assert rep.alignment == "top_left" and rep.model == "torch_cpu"
    assert (rep.table["model_bitwise"] == 1.0).all()


@pytest.mark.parametrize("bug,rule,where", [
    ("dropped_tail", "fa_rule", "Nq77Nk77"),
    ("no_max_shift", "nonfinite", "temperature=32"),
    ("missing_rescale", "fa_rule", "late_max"),
    ("off_by_one", "fa_rule", "causal"),
])
def test_each_seeded_bug_is_caught_by_its_rule(bug, rule, where):
    rep = _audit(_kernel(bug))
    assert not rep.passed
    broken = rep.broken()
    assert rule in broken, rep.summary()
    assert any(where in case for case in broken[rule]), rep.summary()
    assert f"rule {rule} broken" in rep.summary()


def test_a_crashing_or_garbage_target_fails_its_cases_without_stopping_the_audit():
    def crashes(q, k, v, causal=False, scale=None):
        if q.shape[-2] % BLOCK:
            raise IndexError("out of bounds")
        return blocked(q, k, v, causal, scale)

    def garbage(q, k, v, causal=False, scale=None):
        return q[..., :1]

    rep = _audit(crashes)
    assert set(rep.broken()) == {"crash"} and len(rep.broken()["crash"]) == 3
    assert "IndexError" in rep.summary()
    rep = _audit(garbage)
    assert len(rep.broken()["crash"]) == len(CASES)


def test_an_isolated_audit_survives_a_target_that_kills_its_process():
    # a target that aborts (as one that corrupts its heap does) on ragged lengths: with
    # isolate=True each call runs in a forked child, the aborted cases fail (crash) and
    # the other cases are judged as usual
    import os

    def aborts(q, k, v, causal=False, scale=None):
        if q.shape[-2] % BLOCK:
            os.abort()
        return blocked(q, k, v, causal, scale)

    rep = _audit(aborts, isolate=True)
    assert set(rep.broken()) == {"crash"} and len(rep.broken()["crash"]) == 3
    assert "signal 6" in rep.summary()
    assert _audit(_kernel(None), isolate=True).passed


def test_the_causal_alignment_is_the_targets_and_the_wrong_one_fails():
    top_left = fa.audit("torch_sdpa", precision="bf16", case_list=CASES[3:])
    assert top_left.passed
    wrong = fa.audit("torch_sdpa", precision="bf16", case_list=CASES[3:],
                     alignment="bottom_right")
    assert "fa_rule" in wrong.broken()


def test_the_lse_a_kernel_returns_is_checked():
    def bad_lse(q, k, v, causal=False, scale=None):  # the LSE left in log2 units
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, is_causal=causal, scale=scale)[:2]
        return out, lse * math.log2(math.e)

    assert fa.audit("torch_flash_cpu", precision="bf16", case_list=CASES[:2]).passed
    assert "lse" in fa.audit(bad_lse, precision="bf16", case_list=CASES[:2]).broken()


def test_the_report_saves_its_table_markdown_and_plots(tmp_path):
    rep = _audit(_kernel("missing_rescale"), model="fa2")
    out = rep.save(tmp_path / "r")
    for f in ("table.parquet", "table.csv", "report.md", "audit.json", "error_vs_n.png",
              "error_by_distribution.png"):
        assert (out / f).exists(), f
    assert "FAIL" in (out / "report.md").read_text()


def test_assert_attention_accurate_fails_with_the_summary():
    with pytest.raises(AssertionError, match="rule fa_rule broken"):
        assert_attention_accurate(_kernel("missing_rescale"), precision="bf16")
    assert assert_attention_accurate(fa.targets.torch_sdpa, precision="bf16").passed


@pytest.mark.slow
def test_the_command_line_exits_0_1_2(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_kernels.py").write_text(textwrap.dedent("""
        import torch
        def shifted(q, k, v, causal=False, scale=None):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
            return out + 0.01
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    store = f"store.root={tmp_path / 'store'}"
    with pytest.raises(SystemExit) as e:
        cli(["target=nope", store])
    assert e.value.code == 2
    assert "valid: torch_sdpa" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli(["experiment=nope", store])
    assert e.value.code == 2
    assert "valid: kernel_audit" in capsys.readouterr().err
    assert cli(["target=my_kernels:shifted", "budget=quick", store]) == 1
    assert (tmp_path / "store" / "audit" / "my_kernels_shifted-bf16-quick" / "report.md").exists()
    assert cli(["target=torch_sdpa", "budget=quick", "model=none", store]) == 0
