"""The emulated backward (flashnum.engine.backward) and the backward reference.

Oracles: torch autograd of attention written here in plain torch (float64, or bf16
tensors as a user runs it), and the certified reference (python-flint balls), which
shares no code with the emulator.
"""

import math

import pytest
import torch

from flashnum.api import attention_backward
from flashnum.reference import reference_backward

PRESETS = ("fa2", "naive", "lowp", "exact")


def bf16_values(*shape, gen):
    return torch.randn(*shape, generator=gen).bfloat16().double()


def inputs(nq, nk, d=32, dv=16, lead=(2,), seed=0):
    g = torch.Generator().manual_seed(seed)
    return (bf16_values(*lead, nq, d, gen=g), bf16_values(*lead, nk, d, gen=g),
            bf16_values(*lead, nk, dv, gen=g), bf16_values(*lead, nq, dv, gen=g))


def autograd(q, k, v, do, causal, dtype, scale=None):
    """Gradients of sum(do * softmax(scale q k^T) v), torch autograd in `dtype`."""
    q, k, v = (x.detach().clone().to(dtype).requires_grad_() for x in (q, k, v))
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        nq, nk = s.shape[-2:]
        seen = torch.arange(nk)[None, :] <= torch.arange(nq)[:, None] + (nk - nq)
        s = s.masked_fill(~seen, -math.inf)
    p = torch.softmax(s, -1).nan_to_num()  # a row that sees nothing: P = 0
    (p @ v).backward(do.to(dtype))
    return tuple(x.grad.double() for x in (q, k, v))


def bf16_ulp(x):
    e = torch.floor(torch.log2(x.abs().clamp_min(2.0**-126)))
    return 2.0 ** (e - 7)


CASES = [  # (nq, nk, causal, block_m, block_n)
    (64, 64, False, 16, 16),
    (100, 77, False, 32, 16),   # ragged in both
    (77, 100, True, 16, 32),    # Nq < Nk causal
    (130, 64, True, 32, 16),    # Nq > Nk causal: 66 fully masked rows
]


@pytest.mark.parametrize("exp2", [False, True])
@pytest.mark.parametrize("nq,nk,causal,bm,bn", CASES)
def test_exact_policy_equals_float64_autograd(nq, nk, causal, bm, bn, exp2):
    q, k, v, do = inputs(nq, nk, lead=(2, 3))
    g = attention_backward(q, k, v, do, policy="exact", block_m=bm, block_n=bn, causal=causal,
                           exp2=exp2)
    ref = autograd(q, k, v, do, causal, torch.float64)
    for name, x, r in zip("qkv", (g.dq, g.dk, g.dv), ref, strict=True):
        rel = ((x - r).abs().max() / r.abs().max()).item()
        assert rel <= 1e-12, (name, rel)


@pytest.mark.parametrize("policy", PRESETS)
def test_fully_masked_rows_give_zero_gradients_never_nan(policy):
    q, k, v, do = inputs(40, 16)
    g = attention_backward(q, k, v, do, policy=policy, causal=True, block_m=16, block_n=8)
    for x in (g.dq, g.dk, g.dv, g.delta):
        assert bool(torch.isfinite(x).all())
    assert int(g.masked[0].sum()) == 24
    assert bool((g.dq[:, :24] == 0).all())
    assert bool(g.dk.abs().sum() > 0) and bool(g.dv.abs().sum() > 0)


def test_naive_policy_reproduces_torch_bf16_autograd():
    # torch sums in fp32 in its own order; an order change flips a bf16 rounding now and
    # then (fp32 partial sums err by ~2^-24 relative, bf16 spacing is 2^-8), and a flipped
    # dP or dS moves the gradients downstream by a fraction of their largest value's ulp
    # (measured, seeds 0-3: <= 3 ulps of the element, <= 1/8 ulp of the largest)
    q, k, v, do = inputs(100, 77, d=64, dv=64)
    g = attention_backward(q, k, v, do, policy="naive")
    ref = autograd(q, k, v, do, False, torch.bfloat16)
    for name, x, r in zip("qkv", (g.dq, g.dk, g.dv), ref, strict=True):
        same = (x == r).double().mean().item()
        assert same >= 0.99, (name, same)
        assert (x - r).abs().max() <= bf16_ulp(r.abs().max()), name


@pytest.mark.parametrize("causal", [False, True])
def test_fa2_bf16_obeys_flash_attn_rule_against_certified_reference(causal):
    # flash-attn's test: max|ours - ref| <= 2 max|torch standard attention in bf16 - ref|
    q, k, v, do = inputs(96, 96, d=32, dv=32, lead=(1,), seed=3)
    ref = reference_backward(q, k, v, do, causal=causal)
    assert ref.info["uncertain"] == 0
    g = attention_backward(q, k, v, do, policy="fa2", block_m=32, block_n=32, causal=causal)
    base = autograd(q, k, v, do, causal, torch.bfloat16)
    for name, x, b, r in zip("qkv", (g.dq, g.dk, g.dv), base, (ref.dq, ref.dk, ref.dv),
                             strict=True):
        ours, theirs = (x - r).abs().max().item(), (b - r).abs().max().item()
        assert ours <= 2 * theirs, (name, ours, theirs)


def test_delta_equals_rowsum_p_dp_in_exact_policy():
    q, k, v, do = inputs(50, 70, lead=(1,))
    g = attention_backward(q, k, v, do, policy="exact", block_m=16, block_n=16)
    p = torch.softmax((q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1]), -1)
    terms = p * (do @ v.transpose(-1, -2))
    # both sides are float64 sums of <= 70 + 16 terms: gamma_n * (sum |terms| + sum |dO O|)
    n = 70 + 16 + 2
    bound = 2 * n * 2.0**-53 * (terms.abs().sum(-1) + (do.abs() * g.out.abs()).sum(-1))
    assert bool(((g.delta - terms.sum(-1)).abs() <= bound).all())


def test_ds_row_sums_vanish_in_exact_policy():
    q, k, v, do = inputs(64, 64, lead=(1,))
    g = attention_backward(q, k, v, do, policy="exact", block_m=16, block_n=16, measure_ds=True)
    # each dS_ij = P_ij (dP_ij - D_i) carries float64 errors of ~n u |P_ij| (|dP_ij| + |D_i|)
    p = torch.softmax((q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1]), -1)
    dp = do @ v.transpose(-1, -2)
    scale = (p * (dp.abs() + g.delta.abs()[..., None])).sum(-1)
    assert bool((g.ds_rowsum.abs() <= 4 * 200 * 2.0**-53 * scale).all())


def test_dk_and_dv_do_not_depend_on_dq_order_and_dq_moves_at_most_one_ulp():
    q, k, v, do = inputs(64, 128, lead=(1,))
    runs = [attention_backward(q, k, v, do, block_m=16, block_n=16, dq_order=o)
            for o in ("forward", "reverse", "random", [7, 0, 6, 1, 5, 2, 4, 3])]
    for g in runs[1:]:
        assert torch.equal(g.dk, runs[0].dk) and torch.equal(g.dv, runs[0].dv)
        assert bool(((g.dq - runs[0].dq).abs() <= bf16_ulp(runs[0].dq)).all())


def test_given_forward_is_the_forward_used():
    import flashnum

    q, k, v, do = inputs(48, 48, lead=(1,))
    fwd = flashnum.attention(q, k, v, block_m=16, block_n=16)
    a = attention_backward(q, k, v, do, block_m=16, block_n=16)
    b = attention_backward(q, k, v, do, block_m=16, block_n=16, out=fwd.out, lse=fwd.lse)
    assert torch.equal(a.dq, b.dq) and torch.equal(a.dk, b.dk) and torch.equal(a.dv, b.dv)


def test_stochastic_rounding_is_seeded():
    q, k, v, do = inputs(32, 32, lead=(1,))
    a, b, c = (attention_backward(q, k, v, do, policy="lowp", rounding="stochastic", seed=s,
                                  block_m=16, block_n=16) for s in (1, 1, 2))
    assert torch.equal(a.dq, b.dq) and torch.equal(a.dk, b.dk)
    assert not torch.equal(a.dq, c.dq)


@pytest.mark.parametrize("policy", PRESETS)
def test_outputs_are_values_of_the_output_format(policy):
    q, k, v, do = inputs(40, 24, lead=(1,))
    g = attention_backward(q, k, v, do, policy=policy, block_m=16, block_n=8)
    if policy != "exact":
        for x in (g.dq, g.dk, g.dv):
            assert torch.equal(x, x.bfloat16().double())


@pytest.mark.parametrize(
    "kw,word",
    [
        (dict(policy="fast"), "fast"),
        (dict(dq_order="sideways"), "sideways"),
        (dict(dq_order=[0, 0]), "permutation"),
        (dict(precision="fp7"), "fp7"),
        (dict(block_n=0), "block_n"),
        (dict(rounding="up"), "up"),
    ],
)
def test_bad_arguments_raise_one_line_naming_the_value(kw, word):
    q, k, v, do = inputs(16, 16, lead=(1,))
    with pytest.raises(ValueError, match=word):
        attention_backward(q, k, v, do, **{"block_m": 8, "block_n": 8, **kw})


def test_do_of_the_wrong_shape_is_refused():
    q, k, v, do = inputs(16, 16, lead=(1,))
    with pytest.raises(ValueError, match="do has shape"):
        attention_backward(q, k, v, do[..., :3])


@pytest.mark.parametrize("causal", [False, True])
def test_certified_reference_agrees_with_float64_autograd(causal):
    # float64 autograd errs by a few hundred u at these sizes; the certified values are
    # correctly rounded: they must agree to 1e-12 relative to each gradient's size
    q, k, v, do = inputs(40, 30, lead=(2,), seed=5)
    ref = reference_backward(q, k, v, do, causal=causal, cache=False)
    assert ref.info["uncertain"] == 0
    auto = autograd(q, k, v, do, causal, torch.float64)
    for name, x, r in zip("qkv", (ref.dq, ref.dk, ref.dv), auto, strict=True):
        assert ((x - r).abs().max() / r.abs().max()).item() <= 1e-12, name


def test_reference_backward_is_cached():
    from flashnum import reference_backward as rb_mod  # noqa: F401  (the function)
    from flashnum.reference.backward import cache_info

    q, k, v, do = inputs(20, 20, lead=(1,), seed=9)
    a = reference_backward(q, k, v, do, method="fp64")
    hits = cache_info()["memory_hits"]
    b = reference_backward(q, k, v, do, method="fp64")
    assert cache_info()["memory_hits"] == hits + 1
    assert torch.equal(a.dq, b.dq)


@pytest.mark.parametrize("causal", [False, True])
def test_native_fused_pass_gives_the_values_of_the_general_path(causal):
    from flashnum.engine import native

    if not native.available():
        pytest.skip(native.status())
    q, k, v, do = (x.float() for x in inputs(70, 45, lead=(2,)))
    fused = attention_backward(q, k, v, do, block_m=16, block_n=16, causal=causal)
    native.set_enabled(False)
    try:
        plain = attention_backward(q, k, v, do, block_m=16, block_n=16, causal=causal)
    finally:
        native.set_enabled(True)
    for a, b in zip((fused.dq, fused.dk, fused.dv), (plain.dq, plain.dk, plain.dv),
                    strict=True):
        assert torch.equal(a, b)


def test_the_exp2_form_recomputes_p_in_log2_units_from_the_same_forward():
    q, k, v, do = inputs(64, 64)
    g = attention_backward(q, k, v, do, policy="fa2", block_m=16, block_n=16)
    g2 = attention_backward(q, k, v, do, policy="fa2", block_m=16, block_n=16, exp2=True)
    # the stored LSE in log2 units, rounded once to fp32 from the same forward's LSE
    import flashnum

    fwd = flashnum.attention(q, k, v, precision="bf16", policy="fa2", block_m=16, block_n=16)
    want = (fwd.lse * 1.4426950408889634).float().double()
    assert torch.equal(g2.lse, want) and torch.equal(g2.out, g.out)
    # the same error as the natural form's, to within the output's rounding (bf16)
    ref = reference_backward(q, k, v, do)
    for name in ("dq", "dk", "dv"):
        e, e2 = ((getattr(x, name) - getattr(ref, name)).abs().max() for x in (g, g2))
        assert e2 <= 2 * e, name


def test_the_exp2_form_is_refused_where_no_lse_is_stored():
    q, k, v, do = inputs(32, 32)
    with pytest.raises(ValueError, match="naive"):
        attention_backward(q, k, v, do, policy="naive", exp2=True)
    with pytest.raises(TypeError, match="exp2"):
        attention_backward(q, k, v, do, exp2="yes")


@pytest.mark.parametrize("variant", ["fa1", "exp2", "lazy", "qiu_yao"])
def test_a_variants_forward_supplies_o_and_the_lse(variant):
    import flashnum
    from flashnum.inputs.distributions import make

    inp = make("ties", seq_len_q=64, head_dim=32, block_n=16, seed=0)
    do = inputs(64, 64, d=32, dv=32, lead=(1, 1))[3]
    kw = dict(policy="lowp", block_m=16, block_n=16, scale=inp.scale)
    fwd = flashnum.attention(inp.q, inp.k, inp.v, variant=variant, **kw)
    g = attention_backward(inp.q, inp.k, inp.v, do, variant=variant, **kw)
    given = attention_backward(inp.q, inp.k, inp.v, do, out=fwd.out, lse=fwd.lse, **kw)
    assert torch.equal(g.out, fwd.out) and torch.equal(g.dq, given.dq)
    assert torch.equal(g.dk, given.dk) and torch.equal(g.dv, given.dv)
    # on tied maxima in lowp each variant's forward rounds differently, and dQ follows
    base = attention_backward(inp.q, inp.k, inp.v, do, **kw)
    assert not torch.equal(g.out, base.out) and not torch.equal(g.dq, base.dq)
