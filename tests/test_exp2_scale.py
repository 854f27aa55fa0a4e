"""The exp2 scale site: scale * log2(e) as each kernel forms it (attention(exp2_scale=...)).

    once   fl32(scale * log2 e): flashnum's Triton kernel (computed on the host)
    twice  fl32(fl32(scale) * fl32(1.44269504)): the Triton tutorial's fused attention,
           `qk_scale = sm_scale; qk_scale *= 1.44269504` inside its kernel

The oracles are numpy's fp32 arithmetic and the kernels themselves (a Triton kernel run
by the interpreter on this machine), not flashnum.engine.tiles.exp2_scale.
"""

import importlib.util
import math

import numpy as np
import pytest
import torch

import flashnum
from flashnum.engine.tiles import exp2_scale


def numpy_once(scale: float) -> float:
    return float(np.float32(scale / math.log(2)))


def numpy_twice(scale: float) -> float:
    return float(np.float32(np.float32(scale) * np.float32(1.44269504)))


def test_the_two_forms_are_numpys_fp32_arithmetic_for_many_scales():
    for d in range(1, 257):
        s = 1 / math.sqrt(d)
        assert exp2_scale(s, "once") == numpy_once(s)
        assert exp2_scale(s, "twice") == numpy_twice(s)


def test_about_a_quarter_of_head_dims_give_scales_where_the_forms_differ_by_one_ulp():
    differ = [d for d in range(1, 257) if numpy_once(1 / math.sqrt(d)) != numpy_twice(
        1 / math.sqrt(d))]
    assert 48 in differ and 80 in differ
    assert 0.1 < len(differ) / 256 < 0.4
    for d in differ:
        a, b = np.float32(numpy_once(1 / math.sqrt(d))), np.float32(numpy_twice(1 / math.sqrt(d)))
        assert np.nextafter(a, b) == b  # one fp32 ulp apart
    assert numpy_once(1.3) != numpy_twice(1.3)  # the tutorial's own benchmark scale


def test_a_bad_form_is_rejected_in_one_line():
    q = torch.randn(1, 1, 8, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="exp2_scale 'thrice'.*once, twice"):
        flashnum.attention(q, q, q, variant="exp2", exp2_scale="thrice")


def test_the_engine_applies_the_form_it_is_given():
    # fp32 logits of an exactly representable q k (integers, scale 1.3): the running max
    # m of a one-key row is fl32(s * qk_scale) for the chosen qk_scale
    q = torch.tensor([[[[1.0], [2.0], [3.0]]]], dtype=torch.float64)
    k = torch.tensor([[[[1.0]]]], dtype=torch.float64)
    for form, f in (("once", numpy_once), ("twice", numpy_twice)):
        res = flashnum.attention(q, k, k, precision="fp32", policy="fa2", variant="exp2",
                                 scale=1.3, exp2_scale=form)
        want = [float(np.float32(np.float32(s) * np.float32(f(1.3)))) for s in (1.0, 2.0, 3.0)]
        assert res.m.flatten().tolist() == want


needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="needs triton")


@needs_triton
def test_the_tutorials_in_kernel_product_is_the_twice_form():
    # the tutorial's two lines in a kernel of their own, run as Triton runs them here
    from flashnum.backends import triton_kernel as tk

    tl, triton = tk.tl, tk.triton

    @triton.jit
    def qk_scale_of(sm_scale, out):
        qk_scale = sm_scale
        qk_scale *= 1.44269504
        tl.store(out, qk_scale)

    for scale in (1.3, 1 / math.sqrt(48), 1 / math.sqrt(80), 0.5):
        out = torch.zeros(1, dtype=torch.float32)
        qk_scale_of[(1,)](scale, out)
        assert float(out) == numpy_twice(scale)
    assert numpy_twice(1.3) != numpy_once(1.3)


@needs_triton
def test_flashnums_triton_kernel_holds_the_once_form():
    # scale 1.3, where the forms differ: the kernel's final m (the row max in log2 units,
    # fl32(max s * qk_scale)) equals the engine's with the once form, row for row, and
    # differs from the twice form on most rows
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 16, generator=g) for _ in range(3))
    kw = dict(precision="fp32", policy="fa2", block_m=32, block_n=32, variant="exp2",
              scale=1.3)
    kern = flashnum.attention(q, k, v, backend="triton", **kw)
    once = flashnum.attention(q, k, v, exp2_scale="once", **kw)
    twice = flashnum.attention(q, k, v, exp2_scale="twice", **kw)
    assert torch.equal(kern.m, once.m)
    assert float((kern.m != twice.m).double().mean()) > 0.5
