"""The audit of gradients passes a correct backward and fails each seeded backward bug by the
rule that should catch it.

The seeded kernels are FlashAttention-2's backward (Dao 2023, Algorithm 2) in plain torch,
written as autograd.Functions: the forward keeps O and the fp32 LSE, the backward
recomputes P = exp(scale S - L) tile by tile (32 x 32), fp32 accumulators, P and dS cast
to the dtype before their GEMMs, each with one mistake of the kinds kernel developers
write: D = rowsum(dO * O) read from the wrong O (one row off), dK without the softmax
scale, dS not masked on the causal diagonal tiles, one key block's dQ contribution
dropped.
"""

import math

import pytest
import torch

import flashnum.audit as fa
from flashnum.audit import Case, gradients
from flashnum.audit.__main__ import main as cli
from flashnum.audit.rules import aligned_reference

TILE = 32
CASES = [
    Case("gaussian", 77, 77, 64, False, 1, 2),             # ragged: 77 = 2 x 32 + 13
    Case("late_max", 77, 77, 64, True, 1, 1),              # causal: diagonal tiles
    Case("gaussian", 100, 300, 64, True, 1, 1),            # causal, Nq != Nk (top-left)
]


def _mask(nq, nk, causal, rows, cols):
    """True where query i does not see key j (top-left: j > i)."""
    if not causal:
        return torch.zeros(len(rows), len(cols), dtype=torch.bool)
    return cols[None, :] > rows[:, None]


class FlashAttention2(torch.autograd.Function):
    """FA2's forward result and Algorithm 2's backward; `bug` seeds one mistake."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, bug):
        nq, nk = q.shape[-2], k.shape[-2]
        s = (q.float() @ k.float().transpose(-1, -2)) * scale
        s = s.masked_fill(_mask(nq, nk, causal, torch.arange(nq), torch.arange(nk)), -math.inf)
        lse = torch.logsumexp(s, dim=-1)
        out = (torch.exp(s - lse[..., None]) @ v.float()).to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale, ctx.bug = causal, scale, bug
        return out

    @staticmethod
    def backward(ctx, do):
        q, k, v, out, lse = ctx.saved_tensors
        causal, scale, bug, dt = ctx.causal, ctx.scale, ctx.bug, q.dtype
        qf, kf, vf, dof, of = (x.float() for x in (q, k, v, do, out))
        nq, nk = q.shape[-2], k.shape[-2]
        if bug == "wrong_o":  # O read one row off (a stride or offset mistake)
            of = of.roll(1, dims=-2)
        delta = (dof * of).sum(-1)
        dq, dk, dv = torch.zeros_like(qf), torch.zeros_like(kf), torch.zeros_like(vf)
        last = (nk - 1) // TILE * TILE
        for i0 in range(0, nq, TILE):
            rows = torch.arange(i0, min(i0 + TILE, nq))
            for j0 in range(0, nk, TILE):
                cols = torch.arange(j0, min(j0 + TILE, nk))
                mask = _mask(nq, nk, causal, rows, cols)
                if bool(mask.all()):
                    continue  # a tile past the diagonal: skipped, as kernels do
                qi, doi = qf[..., rows, :], dof[..., rows, :]
                kj, vj = kf[..., cols, :], vf[..., cols, :]
                p_raw = torch.exp((qi @ kj.transpose(-1, -2)) * scale - lse[..., rows, None])
                p = p_raw.masked_fill(mask, 0.0)
                dv[..., cols, :] += p.to(dt).float().transpose(-1, -2) @ doi
                dp = doi @ vj.transpose(-1, -2)
                diagonal = bool(mask.any())
                ds = (p_raw if bug == "ds_unmasked" and diagonal else p) * (
                    dp - delta[..., rows, None])
                ds = ds.to(dt).float()
                dk[..., cols, :] += ds.transpose(-1, -2) @ qi
                if not (bug == "dq_block_dropped" and j0 == last):
                    dq[..., rows, :] += ds @ kj
        dk = dk if bug == "dk_no_scale" else dk * scale
        return (dq * scale).to(dt), dk.to(dt), dv.to(dt), None, None, None


def _kernel(bug):
    def fn(q, k, v, causal=False, scale=None):
        sc = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        return FlashAttention2.apply(q, k, v, causal, sc, bug)

    fn.__qualname__ = f"fa2_backward[{bug}]"
    return fn


def _audit(fn, cases=CASES, **kw):
    return fa.audit(fn, precision="bf16", case_list=cases, alignment="top_left",
                    backward=True, diagnose=False, **kw)


def test_a_correct_flash_backward_keeps_every_gradient_rule():
    rep = _audit(_kernel(None))
    assert rep.passed, rep.summary()
    for g in ("dq", "dk", "dv"):
        assert (rep.table[f"{g}_err_max"] <= rep.table[f"{g}_bound"]).all()
        assert (rep.table[f"{g}_err_max"] > 0).all()  # measured, not skipped
    assert "output and gradients" in rep.summary()


@pytest.mark.parametrize("bug,rules,where", [
    ("wrong_o", {"dq_rule", "dk_rule"}, "gaussian/B1H2/Nq77Nk77"),
    ("dk_no_scale", {"dk_rule"}, "Nq77Nk77"),
    ("ds_unmasked", {"dq_rule", "dk_rule"}, "causal"),
    ("dq_block_dropped", {"dq_rule"}, "Nq77Nk77"),
])
def test_each_seeded_backward_bug_is_caught_by_its_rule(bug, rules, where):
    rep = _audit(_kernel(bug))
    broken = rep.broken()
    assert not rep.passed
    assert set(broken) == rules, rep.summary()  # its rules, and no other
    for rule in rules:
        assert any(where in case for case in broken[rule]), rep.summary()
        assert f"rule {rule} broken" in rep.summary()
    assert "fa_rule" not in broken  # the forward is right in every one


def test_the_rule_is_flash_attentions_each_gradient_against_2x_standard_attention():
    # the limit recomputed here from its definition (hopper/test_flash_attn.py): autograd
    # through softmax(Q K^T scale) V in bf16, plain torch, against the certified gradients
    case = CASES[1]
    rep = _audit(_kernel(None), cases=[case], reference="certified")
    inp = case.inputs()
    q, k, v = (x.to(torch.bfloat16).requires_grad_(True) for x in (inp.q, inp.k, inp.v))
    s = (q @ k.transpose(-1, -2)) * (1 / 8)
    s = s.masked_fill(torch.ones(77, 77, dtype=torch.bool).triu(1), -math.inf)
    out = torch.softmax(s, dim=-1) @ v
    do = gradients.draw_do(case, out.shape, torch.bfloat16)
    std = torch.autograd.grad(out, (q, k, v), do)
    import flashnum

    ref = flashnum.reference_backward(inp.q.bfloat16().double(), inp.k.bfloat16().double(),
                                      inp.v.bfloat16().double(), do.double(), causal=True)
    for g, s_, r in zip(("dq", "dk", "dv"), std, (ref.dq, ref.dk, ref.dv), strict=True):
        noise = (r.float() + 0.3 - 0.3).double() - r.float().double()
        limit = 2 * float((s_.double() - r).abs().max()) + 2 * float(noise.abs().max())
        assert rep.table[f"{g}_bound"].iloc[0] == pytest.approx(limit, rel=0.05)


def test_fully_masked_rows_need_zero_finite_gradients():
    # bottom-right with Nq 96 > Nk 64: the first 32 rows see no key
    case = [Case("masked", 96, 64, 64, True, 1, 1)]

    def additive(q, k, v, causal=False, scale=None):  # a -1e4 bias instead of -inf
        s = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(q.shape[-1]))
        hide = torch.arange(64)[None, :] > torch.arange(96)[:, None] - 32
        p = torch.softmax((s + hide * -1e4).float(), dim=-1).to(q.dtype)
        return p @ v

    def nan_softmax(q, k, v, causal=False, scale=None):  # an additive -inf mask, NaN rows
        s = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(q.shape[-1]))  # zeroed by a where:
        hide = torch.arange(64)[None, :] > torch.arange(96)[:, None] - 32  # forward right,
        s = (s + torch.zeros_like(s).masked_fill(hide, -math.inf)).float()  # NaN back
        e = torch.exp(s - s.amax(-1, keepdim=True))
        p = e / e.sum(-1, keepdim=True)
        return torch.where(torch.isnan(p), torch.zeros_like(p), p).to(q.dtype) @ v

    rep = fa.audit(additive, precision="bf16", case_list=case, alignment="bottom_right",
                   backward=True, diagnose=False)
    assert {"masked", "grad_masked"} <= set(rep.broken()), rep.summary()
    assert rep.table["grad_masked_max"].iloc[0] > 0
    rep = fa.audit(nan_softmax, precision="bf16", case_list=case, alignment="bottom_right",
                   backward=True, diagnose=False)
    assert "grad_nonfinite" in rep.broken() and "masked" not in rep.broken(), rep.summary()


def test_a_kernel_without_a_backward_fails_grad_crash_and_the_audit_goes_on():
    def detached(q, k, v, causal=False, scale=None):
        with torch.no_grad():
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    rep = _audit(detached, cases=CASES[:1])
    assert set(rep.broken()) == {"grad_crash"}
    assert "backward raised RuntimeError" in rep.summary()


def test_torch_sdpa_gradients_sit_beside_the_model_of_its_backward():
    rep = fa.audit("torch_sdpa", precision="bf16", case_list=CASES[:1], backward=True,
                   diagnose=False)
    assert rep.passed, rep.summary()
    t = rep.table
    assert (t["dv_err_max"] > 0).all() and (t["model_bitwise"] == 1.0).all()
    # the forward model torch_cpu is checked element by element; its backward sits
    # beside the kernel's where the installed flashnum has it
    from flashnum.audit import models

    if models.runs(models.Candidate("torch_cpu"), "bf16", True):
        assert {"model_dq_err_max", "model_dq_bitwise"} <= set(t)


def test_torchs_cpu_flash_backward_breaks_the_dv_rule_where_torchs_math_backend_keeps_it():
    # a finding (torch 2.13, bf16): with Nq = 300 the CPU flash kernel's dV takes five
    # query blocks of 64, and a dV summed in bf16 across them errs by 2.3x standard
    # attention's; autograd through the math backend (standard attention) keeps the rule
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def math_sdpa(q, k, v, causal=False, scale=None):
        with sdpa_kernel(SDPBackend.MATH):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                    scale=scale)

    case = [CASES[0], Case("gaussian", 300, 100, 64, True, 1, 2)]
    flash = fa.audit("torch_sdpa", precision="bf16", case_list=case, backward=True,
                     diagnose=False)
    assert flash.broken() == {"dv_rule": [case[1].id]}, flash.summary()
    assert fa.audit(math_sdpa, precision="bf16", case_list=case, backward=True,
                    diagnose=False).passed


def test_flashnum_triton_is_differentiated_through_its_backward_kernels():
    case = [Case("gaussian", 64, 64, 64, True, 1, 1)]
    rep = fa.audit("flashnum_triton", precision="bf16", case_list=case, backward=True,
                   diagnose=False)
    assert rep.passed, rep.summary()
    t = rep.table
    # fa2 models the kernels: equal on nearly every gradient entry (the interpreter's
    # numpy exp and dot order differ from the emulator's, docs/kernel.md)
    for g in ("dq", "dk", "dv"):
        assert t[f"model_{g}_bitwise"].iloc[0] > 0.9, rep.summary()


def test_the_fp64_gradient_reference_moves_no_verdict_on_the_quick_cases():
    # reference="auto" takes reference_backward's fp64 method for the gradients; against
    # the certified gradients its error is below 1e-9 of every rule's limit here
    cases = [c for c in fa.cases("quick") if c.nq * c.nk <= 128 * 128]
    assert len(cases) >= 3
    for case in cases:
        inp = case.inputs()
        q, k, v = (x.bfloat16().double() for x in (inp.q, inp.k, inp.v))
        do = gradients.draw_do(case, (*q.shape[:-1], v.shape[-1]), torch.bfloat16).double()
        kw = dict(causal=case.causal, alignment="top_left", scale=inp.scale)
        f64 = gradients.reference_gradients(q, k, v, do, method="fp64", **kw)
        cert = gradients.reference_gradients(q, k, v, do, method="certified", **kw)
        std = gradients.standard_gradients(q.bfloat16(), k.bfloat16(), v.bfloat16(),
                                           do.bfloat16(), **kw)
        for a, b, s in zip(f64, cert, std, strict=True):
            limit = gradients.bound(s, b)[1]
            assert float((a - b).abs().max()) <= 1e-9 * limit
    assert aligned_reference  # the forward's reference is the same module's


def test_the_command_line_takes_backward_true(tmp_path):
    store = f"store.root={tmp_path / 'store'}"
    assert cli(["target=flashnum.audit.targets:torch_sdpa", "budget=quick", "backward=true",
                "diagnose=false", store]) in (0, 1)
    out = tmp_path / "store" / "audit" / "flashnum.audit.targets_torch_sdpa-bf16-quick-backward"
    assert (out / "error_vs_limit.png").exists()
    assert "dq_err_max" in (out / "table.csv").read_text()


def test_torchs_bf16_dv_is_summed_in_bf16_across_its_query_blocks():
    # why torch's dV breaks the rule at Nq = 300: P^T dO per block of 64 query rows (the
    # kernel's split for 192 <= Nq < 768), each block's fp32 product added into a bf16 dV,
    # equals torch's dV on far more entries than the same sums kept in fp32
    case = Case("gaussian", 300, 100, 64, True, 1, 2)
    inp = case.inputs()
    q, k, v = (x.to(torch.bfloat16) for x in (inp.q, inp.k, inp.v))
    do = gradients.draw_do(case, q.shape, torch.bfloat16)
    vg = v.clone().requires_grad_(True)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, vg, is_causal=True)
    (dv_torch,) = torch.autograd.grad(out, (vg,), do)
    s = (q.float() @ k.float().transpose(-1, -2)) / 8
    s = s.masked_fill(torch.arange(100)[None, :] > torch.arange(300)[:, None], -math.inf)
    p = torch.softmax(s, dim=-1).to(torch.bfloat16).float()
    share = {}
    for acc in ("fp32", "bf16"):
        dv = torch.zeros(1, 2, 100, 64)
        for i0 in range(0, 300, 64):
            dv = dv + p[..., i0 : i0 + 64, :].transpose(-1, -2) @ do[..., i0 : i0 + 64, :].float()
            dv = dv.to(torch.bfloat16).float() if acc == "bf16" else dv
        share[acc] = float((dv.to(torch.bfloat16) == dv_torch).float().mean())
    assert share["bf16"] > 0.95 and share["fp32"] < 0.7, share


def test_an_isolated_gradient_audit_runs_forward_and_backward_in_the_child():
    rep = _audit(_kernel("dk_no_scale"), cases=CASES[:1], isolate=True)
    assert set(rep.broken()) == {"dk_rule"}, rep.summary()
    assert _audit(_kernel(None), cases=CASES[:1], isolate=True).passed


def test_assert_attention_accurate_checks_gradients_when_asked():
    from flashnum.testing import assert_attention_accurate

    with pytest.raises(AssertionError, match="rule dk_rule broken"):
        assert_attention_accurate(_kernel("dk_no_scale"), precision="bf16", backward=True)


def test_a_kernel_without_a_backward_is_said_so_and_its_forward_still_judged():
    # torch's compiled flex attention on CPU refuses any input that requires grad
    def forward_only(q, k, v, causal, scale):
        if q.requires_grad:
            raise NotImplementedError("no backward on this device")
        return torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=causal, scale=scale)

    rep = fa.audit(forward_only, precision="bf16", budget="quick", backward=True)
    t = rep.table
    assert set(rep.broken()) == {"grad_crash"}  # every forward rule judged, and kept
    assert t["message"].str.startswith("no backward: inputs that require grad make it "
                                       "raised NotImplementedError").all()
