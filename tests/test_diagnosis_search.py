"""What the diagnosis searches: key blocks up to one block of the whole row, FlexAttention's
order of key blocks (the tiles a block mask cuts first, then the whole ones), every
registered kernel model, and a gradient audit of a kernel without a backward.

The toy kernels are written out here in plain torch, each step of the softmax as the
kernel it stands for takes it, sharing no code with flashnum: logits Q K^T in fp32 times
the fp32 scale, P = exp(S - m) in fp32, P cast to bf16 for P V (summed in fp32), l the
fp32 row sum of P, the output o / l stored in bf16. Their mask is torch's (top-left), as
the audit assumes for a callable.
"""

import pytest
import torch

import flashnum.audit as fa
from flashnum.audit import Case, models
from flashnum.audit.diagnosis import REPRODUCES
from flashnum.models import MODELS, Model

# N = 600 and 1100 need a key block past 256 (the largest of models.BLOCK_NS) to be one
# block of the row; 300 leaves a ragged block of 128; causal and not
CASES = [Case("gaussian", 600, 600, 64, False, 1, 2), Case("late_max", 300, 300, 64, True, 1, 2),
         Case("gaussian", 4, 1100, 128, False, 1, 1), Case("ramp", 256, 256, 64, True, 1, 1)]
# the toys and the model that stands for them differ by the order of fp32 sums (the dots'
# and the row sum's), which moves a bf16 output only where an fp32 ulp crosses a bf16
# rounding boundary: measured 0.99995 (whole row) and 1.0 (128-key blocks) on CASES
TOY_SHARE = 0.999


def _logits(q, k, causal, scale):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = (q.float() @ k.float().transpose(-1, -2)) * torch.tensor(scale, dtype=torch.float32)
    if causal:  # top-left: query i sees keys 0..i
        nq, nk = s.shape[-2:]
        s = s.masked_fill(torch.arange(nk) > torch.arange(nq)[:, None], float("-inf"))
    return s


def _one_block_of_the_row(q, k, v, causal=False, scale=None):
    """FlashAttention-2 with one key block of the whole row: the plain softmax."""
    s = _logits(q, k, causal, scale)
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - m)
    l = p.sum(-1, keepdim=True)
    o = p.to(torch.bfloat16).float() @ v.float()
    return (o / l).to(q.dtype)


def _visits(qb, nq, nk, b, causal):
    """Query block qb's key blocks of size b: those the mask or a ragged end cuts, then the
    whole ones, each in forward order (FlexAttention's partial then full blocks)."""
    rows = range(qb * b, (qb + 1) * b)
    cut, whole = [], []
    for kb in range(-(-nk // b)):
        keys = range(kb * b, (kb + 1) * b)
        seen = [i < nq and j < nk and (not causal or j <= i) for i in rows for j in keys]
        if all(seen):
            whole.append(kb)
        elif any(seen):
            cut.append(kb)
    return cut + whole


def _blocks_of_128_partial_first(q, k, v, causal=False, scale=None):
    """FlashAttention-2's online softmax over 128-key blocks in _visits' order."""
    b, s_all = 128, _logits(q, k, causal, scale)
    nq, nk = s_all.shape[-2:]
    out = torch.empty(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    for qb in range(-(-nq // b)):
        rows = slice(qb * b, min(nq, (qb + 1) * b))
        m = torch.full(s_all[..., rows, 0].shape, float("-inf"))
        l = torch.zeros_like(m)
        o = torch.zeros(*m.shape, v.shape[-1])
        for kb in _visits(qb, nq, nk, b, causal):
            keys = slice(kb * b, min(nk, (kb + 1) * b))
            s = s_all[..., rows, keys]
            m_new = torch.maximum(m, s.amax(-1))
            shift = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
            alpha = torch.exp(m - shift)
            p = torch.exp(s - shift[..., None])
            l = l * alpha + p.sum(-1)
            o = o * alpha[..., None] + p.to(torch.bfloat16).float() @ v[..., keys, :].float()
            m = m_new
        out[..., rows, :] = (o / l[..., None]).to(q.dtype)
    return out


def test_visits_is_the_order_written_out_by_hand():  # the toy's own order, checked once
    assert [_visits(qb, 384, 384, 128, True) for qb in range(3)] == [[0], [1, 0], [2, 0, 1]]
    assert [_visits(qb, 300, 300, 128, True) for qb in range(3)] == [[0], [1, 0], [0, 1, 2]]


def test_a_kernel_of_one_key_block_per_row_is_named_so():
    rep = fa.audit(_one_block_of_the_row, precision="bf16", case_list=CASES, diagnose=True)
    d = rep.diagnosis
    best = d["closest"]
    assert best["model"] == "fa2, one key block of the row", d["shares"].head()
    assert best["block_n"] == models.ROW and best["bitwise"] >= TOY_SHARE
    assert d["reproduced"] and "closest flashnum model fa2, one key block of the row" in \
        rep.summary()
    # one block of 256 keys, the largest of BLOCK_NS, does not reproduce it
    shares = d["shares"].set_index("model")["bitwise"]
    assert shares["fa2, block_n 256"] < best["bitwise"]


def test_a_kernel_of_128_key_blocks_partial_first_is_named_with_its_order():
    rep = fa.audit(_blocks_of_128_partial_first, precision="bf16", case_list=CASES,
                   diagnose=True)
    d = rep.diagnosis
    best = d["closest"]
    assert best["model"] == "fa2, block_n 128, partial-then-full order", d["shares"].head()
    assert best["bitwise"] >= TOY_SHARE and d["reproduced"]
    shares = d["shares"].set_index("model")["bitwise"]
    assert shares["fa2, block_n 128"] < best["bitwise"]  # the order is what tells them apart
    s = rep.summary()
    assert "closest flashnum model fa2, block_n 128, partial-then-full order" in s, s
    # the cost is stated: models run once per case and distinct values
    cost = d["cost"]
    assert cost["cases"] == len(CASES) and cost["model_runs"] + cost["reused"] == sum(
        r for r in d["shares"]["cases"])
    assert f"{cost['model_runs']} model runs" in s


def _rounds_p_to_4_bits(q, k, v, causal=False, scale=None):
    """The softmax with P kept to 4 significand bits: no flashnum model computes that."""
    s = _logits(q, k, causal, scale)
    p = torch.softmax(s, -1)
    mant, e = torch.frexp(p)
    p = torch.ldexp(torch.round(mant * 16) / 16, e)
    return (p @ v.float()).to(q.dtype)


def test_a_kernel_no_model_matches_gets_no_model_and_no_site():
    rep = fa.audit(_rounds_p_to_4_bits, precision="bf16", case_list=CASES, diagnose=True)
    d = rep.diagnosis
    assert d["closest"]["bitwise"] < REPRODUCES and not d["reproduced"] and d["site"] is None
    s = rep.summary()
    assert "no flashnum model reproduces the kernel" in s and "no site is attributed" in s, s


def test_every_registered_kernel_model_is_a_candidate(monkeypatch):
    assert {m for m in MODELS} <= {c.policy for c in models.candidates()}
    # a model registered after import joins as well, without naming it anywhere here
    toy = Model("toy_model", "a model registered now", MODELS["torch_math"].forward)
    monkeypatch.setitem(MODELS, "toy_model", toy)
    assert models.Candidate("toy_model") in models.candidates()
    case = [Case("gaussian", 77, 77, 64, False, 1, 1)]
    d = fa.audit(_one_block_of_the_row, precision="bf16", case_list=case,
                 diagnose=True).diagnosis
    assert "toy_model" in set(d["shares"]["model"])


def _no_backward(q, k, v, causal=False, scale=None):
    if q.requires_grad or k.requires_grad or v.requires_grad:
        raise NotImplementedError("no backward on this device")
    return _one_block_of_the_row(q, k, v, causal, scale)


def test_a_kernel_without_a_backward_is_still_diagnosed_on_its_outputs():
    rep = fa.audit(_no_backward, precision="bf16", case_list=CASES[:2], backward=True,
                   diagnose=True)
    msgs = set(rep.table["message"])
    assert len(msgs) == 1 and next(iter(msgs)).startswith("no backward: "), msgs
    d = rep.diagnosis
    assert d["forward_only"] and d["answered"] == 2
    assert d["closest"]["model"] == "fa2, one key block of the row"
    s = rep.summary()
    assert "no flashnum model could be run" not in s, s
    assert "the kernel gave no gradient (no backward): its outputs alone are compared" in s


@pytest.mark.parametrize("spec,want", [
    ("fa2:fa2:row", models.Candidate("fa2", "fa2", models.ROW)),
    ("fa2:fa2:128:partial_first", models.Candidate("fa2", "fa2", 128, "partial_first")),
    ("lowp:exp2:32", models.Candidate("lowp", "exp2", 32))])
def test_a_model_spec_names_a_tiling(spec, want):
    assert models.Candidate.of(spec) == want


@pytest.mark.parametrize("spec,match", [("fa2:fa2:wide", "block_n 'wide'.*valid: a positive"),
                                        ("fa2:fa2:64:sideways", "order 'sideways'.*valid:")])
def test_a_bad_model_spec_names_the_valid_values(spec, match):
    with pytest.raises(ValueError, match=match):
        models.Candidate.of(spec)


@pytest.mark.parametrize("policy,variant", [("fa2", "fa2"), ("fa2", "exp2"), ("fa2", "fa1"),
                                            ("lowp", "fa2")])
def test_candidates_with_one_bits_key_compute_the_same_values(policy, variant):
    # the premise of running each model once per distinct values: run both and compare
    g = torch.Generator().manual_seed(2)
    pairs = [((256, 256, False), (128, "forward"), (128, "partial_first")),  # no cut tile
             ((77, 77, True), (256, "forward"), (models.ROW, "forward")),    # both clamp to 77
             ((77, 77, True), (128, "partial_first"), (models.ROW, "forward"))]
    for (nq, nk, causal), a, b in pairs:
        q, k, v = (torch.randn(1, 2, n, 64, generator=g, dtype=torch.float64)
                   for n in (nq, nk, nk))
        ca, cb = (models.Candidate(policy, variant, *t) for t in (a, b))
        assert ca.bits_key(nq, nk, causal) == cb.bits_key(nq, nk, causal)
        oa, ob = (models.forward(c, q, k, v, precision="bf16", causal=causal,
                                 alignment="top_left") for c in (ca, cb))
        assert torch.equal(oa, ob), (nq, nk, causal, a, b)
    # and a tiling that changes the visiting order has a key of its own
    c = models.Candidate(policy, variant, 128, "partial_first")
    assert c.bits_key(300, 300, True) != models.Candidate(policy, variant, 128).bits_key(
        300, 300, True)
