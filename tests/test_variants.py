"""Variants are objects (flashnum.engine.variants): a name and its shorthand keywords mean
the object, every backend runs the variants it declares and refuses the others, and the
modules that read a variant (grid, bounds, invariants) read its fields."""

import math

import pytest
import torch

import flashnum
from flashnum.analysis.bounds import VARIANTS as BOUNDED
from flashnum.analysis.bounds import bound
from flashnum.engine import variants as vs
from flashnum.engine.variants import FA2, Exp2, Lazy, QiuYao, variant_of


def qkv(nq=40, nk=56, d=8, seed=0, sigma=3.0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, n, d, generator=g, dtype=torch.float64) * sigma
            for n in (nq, nk, nk)]


def same_bits(a, b):
    return torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(a.nan_to_num(0.0),
                                                                       b.nan_to_num(0.0))


@pytest.mark.parametrize("obj,name,kw", [
    (Lazy(tau=2.0), "lazy", dict(tau=2.0)),
    (QiuYao(beta=1.5), "qiu_yao", dict(beta=1.5)),
    (Exp2(exp2_scale="twice"), "exp2", dict(exp2_scale="twice")),
    (FA2(), "fa2", {}),
])
def test_an_object_and_its_shorthand_compute_the_same_bits(obj, name, kw):
    q, k, v = qkv()
    a = flashnum.attention(q, k, v, block_n=16, variant=obj, causal=True, trace=True)
    b = flashnum.attention(q, k, v, block_n=16, variant=name, causal=True, trace=True, **kw)
    for x, y in [(a.out, b.out), (a.m, b.m), (a.l, b.l), (a.trace.m, b.trace.m)]:
        assert same_bits(x, y)
    assert a.info["variant"] == b.info["variant"] == name


def test_a_parameter_changes_the_result_where_the_variant_takes_it():
    # the rescale of a lazy max is skipped while the max grows by <= tau: a larger tau
    # skips more rescales (the counts are the run's own, not a tolerance)
    q, k, v = qkv(sigma=4.0)
    few = flashnum.attention(q, k, v, block_n=8, variant=Lazy(tau=0.5)).n_rescales.sum()
    many = flashnum.attention(q, k, v, block_n=8, variant=Lazy(tau=0.0)).n_rescales.sum()
    assert few < many
    # a parameter the variant does not take is ignored (the harness passes tau to all)
    a = flashnum.attention(q, k, v, block_n=8, variant="fa2", tau=0.5)
    b = flashnum.attention(q, k, v, block_n=8, variant="fa2")
    assert same_bits(a.out, b.out)


def test_bad_variants_name_the_problem():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="unknown variant 'fa3'; valid: fa2, fa1"):
        flashnum.attention(q, k, v, variant="fa3")
    with pytest.raises(TypeError, match="variant must be a name"):
        flashnum.attention(q, k, v, variant=3)
    with pytest.raises(ValueError, match="tau=4.0 disagrees with variant Lazy"):
        flashnum.attention(q, k, v, variant=Lazy(tau=2.0), tau=4.0)
    with pytest.raises(ValueError, match="tau must be >= 0"):
        Lazy(tau=-1.0)
    with pytest.raises(ValueError, match="beta must be finite"):
        QiuYao(beta=math.inf)
    with pytest.raises(ValueError, match="unknown exp2_scale 'thrice'"):
        Exp2(exp2_scale="thrice")


@pytest.mark.parametrize("name", list(vs.VARIANTS))
@pytest.mark.parametrize("backend", ["emulate", "mp"])
def test_a_backend_runs_the_variants_it_declares_and_refuses_the_others(name, backend):
    # sigma 1: every block's row sum is far above qiu_yao_released's floor of 1e-10
    q, k, v = (x[:1, :12, :4] for x in qkv(sigma=1.0))
    kw = dict(variant=name, backend=backend, block_m=8, block_n=8, mp_bits=64,
              precision="fp64")
    if backend in vs.VARIANTS[name].backends:
        res = flashnum.attention(q, k, v, **kw)
        ref = flashnum.reference(q, k, v)
        # every variant computes softmax(S) V; in fp64 (or 64 bits) with 12 keys of d = 4
        # its error is a few dozen roundings of 2^-53 relative to max|v| < 10: < 1e-12
        assert float((res.out - ref.out).abs().max()) < 1e-12
    else:
        with pytest.raises(ValueError, match=f"variant '{name}' is not run by backend"):
            flashnum.attention(q, k, v, **kw)


def test_the_triton_backend_takes_the_variants_that_declare_it():
    triton = pytest.importorskip("flashnum.backends.triton")
    assert triton.VARIANTS == tuple(n for n, c in vs.VARIANTS.items() if "triton" in
                                    c.backends)
    q, k, v = qkv()
    with pytest.raises(ValueError, match="variant 'lazy' is not run by backend 'triton'"):
        flashnum.attention(q, k, v, variant="lazy", backend="triton")


def test_the_grid_fixes_the_parameters_a_variant_does_not_take():
    from flashnum.harness.grid import VARIANT_CLASSES, VARIANT_PARAMS  # noqa: F401

    takes = {n: set(c.params()) for n, c in vs.VARIANTS.items()}
    assert takes["lazy"] == {"tau"} and takes["qiu_yao"] == {"beta"}
    assert takes["exp2"] == {"exp2_scale"} and takes["fa2"] == set()
    assert VARIANT_PARAMS == {"tau": 8.0, "beta": 2.0, "exp2_scale": "once"}


def test_the_bound_takes_the_variants_it_has_a_bound_for():
    q, k, v = qkv()
    assert set(BOUNDED) == {n for n, c in vs.VARIANTS.items() if c.bounded}
    a = bound(q, k, v, policy="fa2", block_n=16, variant=Lazy(tau=2.0))["bound"]
    c = bound(q, k, v, policy="fa2", block_n=16, variant="lazy")["bound"]
    assert math.isfinite(a) and c > a  # tau 8 (a name: its default) allows larger P than 2
    with pytest.raises(ValueError, match="no bound for variant 'qiu_yao_released'"):
        bound(q, k, v, policy="fa2", block_n=16, variant="qiu_yao_released")


def test_variant_of_is_the_one_door_from_a_name():
    assert variant_of("lazy", tau=3.0, beta=9.0) == Lazy(tau=3.0)
    assert variant_of("qiu_yao_released") == vs.QiuYaoReleased(beta=2.0)
    assert variant_of(Lazy(tau=3.0), tau=3.0) == Lazy(tau=3.0)
    assert [c.name for c in vs.VARIANTS.values()] == list(vs.VARIANTS)
