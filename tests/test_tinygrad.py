"""tinygrad's SDPA: the product sites it needs, its exp2, its model, its target.

The product sites (qk_product, pv_product) run without tinygrad and are checked against
ml_dtypes' bf16 and numpy's float32, term by term. What compares with tinygrad itself
needs it and a clang its CPU device compiles with (flashnum.audit.targets_tinygrad):
where either is missing those tests skip, saying what to install.
"""

import math

import ml_dtypes
import numpy as np
import pytest
import torch

from flashnum.engine import fused, logits
from flashnum.engine.arith import Arith
from flashnum.engine.fast import in_place_ok
from flashnum.numerics import accumulate
from flashnum.numerics.formats import FORMATS, get_format
from flashnum.numerics.policy import make_policy

BF16 = ml_dtypes.bfloat16


def _bf16_values(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(torch.bfloat16).float()


def _oracle(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """c = 0, then c = fp32(c + bf16(a_t b_t)) for t in order (ml_dtypes, numpy float32)."""
    c = np.zeros((a.shape[0], b.shape[1]), dtype=np.float32)
    for t in range(a.shape[1]):
        prod = (a[:, t, None].astype(np.float32) * b[None, t, :].astype(np.float32))
        c = (c + prod.astype(BF16).astype(np.float32)).astype(np.float32)
    return c


def test_a_product_rounded_before_its_sum_is_bf16_products_summed_in_fp32_in_order():
    a, b = _bf16_values((40, 64), 0), _bf16_values((64, 24), 1)
    want = _oracle(a.numpy(), b.numpy())
    ar = Arith(make_policy("fa2", "fp32"), "nearest", 0, torch.float32)
    got = ar.dot(a, b, FORMATS["fp32"], FORMATS["bf16"])
    assert np.array_equal(got.numpy().view(np.uint32), want.view(np.uint32))
    # the site matters: the FMA chain (the default, product exact) differs on these inputs
    chain = accumulate.dot(a, b, "fp32").numpy()
    assert (chain != want).mean() > 0.5


def test_the_logits_round_each_product_where_the_policy_says_and_only_there():
    q, k = _bf16_values((1, 1, 33, 64), 2), _bf16_values((1, 1, 40, 64), 3)
    scale = 1 / math.sqrt(64)
    pol = make_policy("fa2", "fp32").with_sites(qk_product="bf16")
    s = logits(q, k, precision="fp32", policy=pol, block_m=16, block_n=16)
    want = _oracle(q[0, 0].numpy(), k[0, 0].numpy().T) * np.float32(scale)
    assert np.array_equal(s[0, 0].float().numpy().view(np.uint32), want.view(np.uint32))
    s0 = logits(q, k, precision="fp32", policy="fa2", block_m=16, block_n=16)
    chain = accumulate.dot(q[0, 0], k[0, 0].T, "fp32") * torch.tensor(scale, dtype=torch.float32)
    assert torch.equal(s0[0, 0].float(), chain)  # exact product (the default): one FMA chain


def test_the_in_place_and_fused_paths_refuse_a_rounded_product():
    from flashnum.engine.recurrence import Run
    from flashnum.engine.tiles import Tiles
    from flashnum.engine.variants import variant_of

    pol = make_policy("fa2", "fp32").with_sites(pv_product="bf16")
    ar = Arith(pol, "nearest", 0, torch.float32)
    assert not in_place_ok(ar)
    assert in_place_ok(Arith(make_policy("fa2", "fp32"), "nearest", 0, torch.float32))
    x = torch.zeros(1, 8, 4)
    run = Run(ar, variant_of("fa2"), FORMATS["fp32"], True)
    why = fused.claim(run, Tiles.of(x, x, x, 4, 4), "fa2")
    assert why == "a product rounded before its sum (pv_product)"


def test_a_product_in_a_format_an_fp32_sum_cannot_hold_is_one_line_naming_it():
    ar = Arith(make_policy("fa2", "fp64"), "nearest", 0, torch.float64)
    with pytest.raises(ValueError, match="a product in p30 is not an fp32 number.*valid: a "
                                         "format within fp32"):
        ar.dot(torch.ones(2, 3), torch.ones(3, 2), FORMATS["fp32"], get_format("p30"))


# -- against tinygrad ------------------------------------------------------------------


def _needs_tinygrad():
    from flashnum.audit.targets_tinygrad import toolchain

    why = toolchain()
    if why:
        pytest.skip(why)


def test_tinygrads_exp2_is_its_polynomial_bit_for_bit():
    _needs_tinygrad()
    from flashnum.audit.targets_tinygrad import _tinygrad
    from flashnum.models.tinygrad import exp2

    tg = _tinygrad()
    rng = np.random.default_rng(0)
    # its whole range, the softmax's [-30, 0], rintk's ties and the edges of its selects
    edges = [0.0, -0.0, 0.5, -0.5, 0.49999997, -0.49999997, 1.5, -1.5, 127.99999, 128.0,
             -126.0, -149.5, -150.0, -150.00002, math.inf, -math.inf, math.nan]
    x = np.concatenate([rng.uniform(-160, 130, 100_000), rng.uniform(-30, 0, 100_000),
                        rng.uniform(-1, 1, 100_000), edges]).astype(np.float32)
    got = tg.Tensor(x).exp2().numpy()
    model = exp2(x)
    same = (got.view(np.uint32) == model.view(np.uint32)) | (np.isnan(got) & np.isnan(model))
    assert same.all(), x[~same][:5]


# (N, d, causal) of the agreement checked here; the full grid (N 77, 128, 256; d 64, 128;
# causal and not) is `python -m flashnum.audit.targets_tinygrad`
CASES = [(77, 64, False), (77, 128, True), (128, 64, True), (256, 64, False)]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_model_equals_tinygrads_kernel_on_at_least_999_in_1000_outputs(precision):
    _needs_tinygrad()
    from flashnum.audit.targets_tinygrad import model_share

    equal, total = model_share(precision, CASES)
    assert equal / total >= 0.999, f"{equal} of {total}"  # measured: every one


def test_tinygrads_sdpa_takes_no_scale_and_says_so_in_one_line():
    from flashnum.audit.targets_tinygrad import tinygrad_sdpa

    q = torch.zeros(1, 1, 4, 16)
    with pytest.raises(ValueError, match=r"takes no scale: scale=0\.5; valid: None or "
                                         r"1/sqrt\(d\) = 0\.25"):
        tinygrad_sdpa(q, q, q, scale=0.5)


def test_a_compiler_that_is_not_clang_is_named_with_what_to_install(monkeypatch):
    from flashnum.audit.targets_tinygrad import compiler

    monkeypatch.setenv("CC", "/nonexistent/cc")
    cc, why = compiler()
    assert cc == "/nonexistent/cc"
    assert why.startswith("tinygrad's CPU device needs clang >= 19, /nonexistent/cc is not "
                          "clang: pip install 'flashnum[tinygrad]'")


def test_the_kernel_table_says_what_installs_tinygrad_or_its_compiler(monkeypatch):
    import importlib.util

    from flashnum.audit import kernel_table

    monkeypatch.setenv("CC", "/nonexistent/cc")  # a compiler that is not clang
    if importlib.util.find_spec("tinygrad") is not None:
        status, why = kernel_table.missing("tinygrad")
        assert status == "missing" and why.startswith(
            "target tinygrad: tinygrad's CPU device needs clang >= 19")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tinygrad" else real(name, *a))
    assert kernel_table.missing("tinygrad") == (
        "missing", "tinygrad: pip install 'flashnum[tinygrad]'")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_targets_gradients_are_tinygrads_own(dtype):
    """dQ, dK, dV through torch autograd equal tinygrad's Tensor.gradient of the same call,
    written here against tinygrad's API, bit for bit; the gradient of a tensor already
    realised (what a naive wrapper takes) is measured to differ from it by O(1)."""
    _needs_tinygrad()
    from flashnum.audit.targets_tinygrad import _tinygrad, tinygrad_sdpa

    tg = _tinygrad()
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 2, 40, 16, generator=g).to(dtype) for _ in range(4))
    xs = [x.clone().requires_grad_() for x in (q, k, v)]
    tinygrad_sdpa(*xs, causal=True).backward(do)

    def tiny(x):
        bits = x.view(torch.int16).numpy() if dtype == torch.bfloat16 else x.numpy()
        t = tg.Tensor(bits, device="CPU")
        return (t.bitcast(tg.dtypes.bfloat16) if dtype == torch.bfloat16 else t).realize()

    tq, tk, tv = (tiny(x) for x in (q, k, v))
    out = tq.scaled_dot_product_attention(tk, tv, is_causal=True)
    for ours, want in zip(xs, out.gradient(tq, tk, tv, gradient=tiny(do)), strict=True):
        w = want.realize()
        if dtype == torch.bfloat16:
            w = torch.from_numpy(w.bitcast(tg.dtypes.int16).numpy().copy()).view(dtype)
        else:
            w = torch.from_numpy(w.numpy().copy())
        assert torch.equal(ours.grad, w)
