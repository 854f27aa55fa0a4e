"""A failing audit says why: the flashnum model that reproduces the kernel bit for bit, the
site that makes that model's error, and the worst case, its ratio and its error together.

The kernels (flashnum.audit.ports) are pure-PyTorch ports of FlashAttention-2 of the kind
people write: the online softmax over 64-key chunks on bf16 tensors, so that m, l and o
stay in bf16 (what flashnum's `lowp` policy models); one of them forgets to rescale l.
"""

import json

import pandas as pd
import pytest
import torch

import flashnum.audit as fa
from flashnum.audit import Case, models
from flashnum.audit.diagnosis import worst_case
from flashnum.audit.ports import CHUNK, bf16_port, forgets_to_rescale_l
from flashnum.models import MODELS


@pytest.fixture(scope="module")
def port_report():
    return fa.audit(bf16_port, precision="bf16", budget="quick")


def test_a_bf16_port_audited_without_a_model_is_named_lowp(port_report):
    rep = port_report
    assert not rep.passed and rep.model is None
    d = rep.diagnosis
    assert d["closest"]["policy"] == "lowp" and d["closest"]["variant"] == "fa2"
    assert d["closest"]["block_n"] == CHUNK
    assert d["closest"]["bitwise"] > 0.999  # lowp reproduces the port, not merely leads
    s = rep.summary()
    assert "diagnosis: closest flashnum model lowp, block_n 64" in s, s
    # every other candidate is further away, each with its share
    shares = d["shares"].set_index("model")["bitwise"]
    assert shares.drop("lowp, block_n 64").max() < 0.95
    assert {"fa2, block_n 64", "naive"} <= set(shares.index)


def test_the_dominant_site_and_the_worst_case_are_named(port_report):
    rep = port_report
    d, t = rep.diagnosis, rep.table
    w = d["worst"]
    row = t.set_index("id").loc[w["id"]]
    # the worst ratio and the worst error come from the same, named case
    assert w["err"] == row["err_max"] and w["bound"] == row["fa_bound"]
    assert w["ratio"] == pytest.approx(row["err_max"] / row["fa_bound"])
    assert w["ratio"] == pytest.approx((t["err_max"] / t["fa_bound"]).max())
    assert f"worst case {w['id']}: out error {w['err']:.3g}" in rep.summary()
    site = d["site"]
    from flashnum.numerics.policy import SITES

    assert site["site"] in SITES and site["case"] == w["id"]
    assert f"dominant site of lowp, block_n 64's out error: {site['site']}" in rep.summary()


def test_a_port_that_forgets_to_rescale_l_is_caught_and_diagnosed():
    rep = fa.audit(forgets_to_rescale_l, precision="bf16", budget="quick")
    assert "fa_rule" in rep.broken() and len(rep.broken()["fa_rule"]) >= 5
    d = rep.diagnosis
    # no model reproduces it: lowp is still the closest, far from every value, and the
    # sites of a model that does not compute what the port computes are not its sites
    assert d["closest"]["policy"] == "lowp" and d["closest"]["bitwise"] < 0.9
    assert d["reproduced"] is False and d["site"] is None
    assert d["worst"]["ratio"] > 10
    s = rep.summary()
    assert "no flashnum model reproduces the kernel" in s and "no site is attributed" in s, s
    assert "closest, lowp, block_n 64, equals it bit for bit on" in s, s


def _rounds_logits_to_3_bits(q, k, v, causal, scale):
    """Attention whose logits keep 3 significand bits: no flashnum model computes that."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    m, e = torch.frexp(s)
    s = torch.ldexp(torch.round(m * 8) / 8, e)
    if causal:
        nq, nk = s.shape[-2:]
        s = s.masked_fill(torch.ones(nq, nk, dtype=torch.bool).triu(1), float("-inf"))
    return (torch.softmax(s, -1) @ v.float()).to(q.dtype)


def test_a_kernel_no_model_fits_is_reported_as_such():
    rep = fa.audit(_rounds_logits_to_3_bits, precision="bf16", budget="quick")
    assert not rep.passed
    d = rep.diagnosis
    assert d["reproduced"] is False and d["site"] is None
    assert d["closest"]["bitwise"] < 0.99  # the closest is named, with its share
    assert "no flashnum model reproduces the kernel" in rep.summary()


def test_a_passing_audit_runs_no_diagnosis_unless_asked():
    case = [Case("gaussian", 77, 77, 64, False, 1, 1)]
    assert fa.audit(bf16_port, precision="bf16", case_list=case).diagnosis is None
    d = fa.audit(bf16_port, precision="bf16", case_list=case, diagnose=True).diagnosis
    assert d["closest"]["policy"] == "lowp"
    with pytest.raises(TypeError, match="diagnose must be True or False"):
        fa.audit(bf16_port, precision="bf16", case_list=case, diagnose="yes")


def test_the_candidates_come_from_one_list_and_join_when_flashnum_runs_them():
    names = {c.policy for c in models.CANDIDATES}
    from flashnum.numerics.policy import PRESETS

    assert set(PRESETS) | {"torch_cpu", "triton_tutorial"} <= names
    q = torch.linspace(-1, 1, 80).reshape(2, 5, 8)
    for c in models.CANDIDATES:
        try:
            import flashnum

            kind = (dict(model=c.policy) if c.policy in MODELS
                    else dict(policy=c.policy, variant=c.variant))
            flashnum.attention(q, q, q, precision="bf16", causal=True, **kind)
            runs = True
        except (ValueError, TypeError, NotImplementedError, KeyError):
            runs = False
        assert (c in models.available("bf16")) == runs, c


def test_a_gradient_audit_diagnoses_the_gradients_too():
    # torch's CPU flash backward breaks dv_rule at Nq 300 (tests/test_audit_backward.py)
    cases = [Case("gaussian", 77, 77, 64, False, 1, 1), Case("gaussian", 300, 100, 64, True, 1, 2)]
    rep = fa.audit("torch_sdpa", precision="bf16", case_list=cases, backward=True,
                   model="torch_cpu")
    d = rep.diagnosis
    assert d is not None and d["worst"]["quantity"] == "dv"
    assert {"out_bitwise", "dq_bitwise", "dk_bitwise", "dv_bitwise"} <= set(d["shares"])
    assert d["site"] is None or d["site"]["quantity"] == "dv"
    assert "diagnosis: closest flashnum model" in rep.summary()


def test_the_report_saves_the_diagnosis_and_plots_the_limit(tmp_path, port_report):
    out = port_report.save(tmp_path / "r")
    for f in ("diagnosis.csv", "error_vs_limit.png", "error_vs_n.png", "report.md"):
        assert (out / f).exists(), f
    meta = json.loads((out / "audit.json").read_text())
    assert meta["diagnosis"]["closest"]["policy"] == "lowp"
    assert meta["worst"]["id"] == port_report.diagnosis["worst"]["id"]
    assert pd.read_csv(out / "diagnosis.csv").iloc[0]["policy"] == "lowp"
    md = (out / "report.md").read_text()
    assert "closest flashnum model lowp" in md and "## Diagnosis" in md


def test_worst_case_reads_ratio_and_error_from_one_row():
    t = pd.DataFrame([dict(id="a", err_max=1.0, fa_bound=10.0, std_err_max=5.0),
                      dict(id="b", err_max=0.5, fa_bound=0.25, std_err_max=0.1)])
    w = worst_case(t)
    assert (w["id"], w["err"], w["bound"], w["ratio"]) == ("b", 0.5, 0.25, 2.0)


def test_the_diagnosis_of_captured_calls_sends_each_model_the_recorded_do(tmp_path):
    # a captured call's backward gets the dO its model sent it; the models the diagnosis
    # runs get the same dO, so torch's own model equals torch's gradients bit for bit
    import flashnum

    path = tmp_path / "c.safetensors"
    g = torch.Generator().manual_seed(0)
    x = [torch.randn(1, 2, 48, 64, generator=g, dtype=torch.float64, requires_grad=True)
         for _ in range(3)]
    with flashnum.capture(path, backward=True):
        out = torch.nn.functional.scaled_dot_product_attention(*x, is_causal=True)
        (out * torch.randn(out.shape, generator=g, dtype=torch.float64)).sum().backward()
    if not models.runs(models.Candidate("torch_cpu"), "bf16", True):
        pytest.skip("this flashnum has no torch_cpu backward")
    rep = fa.audit("torch_sdpa", inputs=path, precision="bf16", backward=True, diagnose=True)
    best = rep.diagnosis["closest"]
    assert best["policy"] == "torch_cpu" and best["dq_bitwise"] == 1.0, rep.summary()


def test_a_kernel_that_answers_no_case_is_not_blamed_on_the_models():
    def raises(q, k, v, causal, scale):
        raise NotImplementedError("no kernel for this device")

    rep = fa.audit(raises, precision="bf16", budget="quick")
    assert not rep.passed and rep.diagnosis["answered"] == 0
    assert "the kernel answered none of the cases" in rep.summary()
