"""The API and the audit under arguments a user might well pass.

fp8 tensors are refused in one TypeError that says how to pass them; a parameter a
variant does not take is ignored whatever its value, as documented; reference() refuses a
call beyond the memory available with its estimate, as attention() does; the audit of a
causal kernel under the wrong alignment says which alignment it keeps; the kernel table
says "missing" for a package not installed, with the extra, and ends with a summary.

Oracles: the exception types and their one line; bitwise equality with the call without
the ignored parameter; a bottom-right SDPA wrapper written here (torch's own kernel, an
explicit mask); the kernel table's rows as dicts.
"""

import importlib.util

import pandas as pd
import pytest
import torch

import flashnum
import flashnum.engine.checks
from flashnum.audit import kernel_table

X = torch.randn(1, 2, 16, 8, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu",
                                   "float4_e2m1fn_x2"])
def test_a_narrow_float_tensor_is_one_type_error_saying_how_to_pass_it(dtype):
    dt = getattr(torch, dtype, None)
    if dt is None:
        pytest.skip(f"torch {torch.__version__} has no {dtype}")
    x = torch.zeros(1, 1, 4, 4, dtype=dt) if "float4" in dtype else X.to(dt)
    for call in (lambda: flashnum.attention(x, X, X), lambda: flashnum.attention(X, X, x),
                 lambda: flashnum.attention_backward(x, x, x, x)):
        with pytest.raises(TypeError) as e:
            call()
        msg = str(e.value)
        assert dtype in msg and ".float()" in msg and "fp8_e4m3" in msg and "\n" not in msg
    if dtype.startswith("float8"):  # what the line says to do works, and is exact
        y = x.float()
        assert flashnum.attention(y, y, y, precision="fp8_e4m3").out.shape == X.shape
        ref = flashnum.reference(x, x, x)  # the reference reads fp8 as it is
        assert torch.equal(ref.out, flashnum.reference(y, y, y).out)


@pytest.mark.parametrize("variant", ["fa2", "fa1", "exp2"])
def test_tau_and_beta_are_ignored_by_a_variant_that_does_not_take_them(variant):
    plain = flashnum.attention(X, X, X, variant=variant, precision="bf16")
    for kw in (dict(tau=-1), dict(tau=float("nan")), dict(beta=float("inf"))):
        got = flashnum.attention(X, X, X, variant=variant, precision="bf16", **kw)
        assert torch.equal(got.out, plain.out), kw
    with pytest.raises(ValueError, match="tau must be >= 0"):  # where it is taken, checked
        flashnum.attention(X, X, X, variant="lazy", tau=-1)


def test_reference_refuses_a_call_beyond_the_memory_with_its_estimate(monkeypatch):
    q = torch.randn(1, 1, 1, 64).expand(1, 1, 2**28, 64)  # an expanded view: no memory yet
    with pytest.raises(ValueError, match=r"reference needs an estimated [0-9.]+ [TP]B of "
                                         r"memory .* is available"):
        flashnum.reference(q, q, q)
    monkeypatch.setattr(flashnum.engine.checks, "available_bytes", lambda: 1 << 20)
    with pytest.raises(ValueError, match=r"needs an estimated [0-9.]+ MB .* 1.0 MB is avail"):
        flashnum.reference(X, X, X, method="fp64")


def test_the_kernel_table_says_missing_with_the_extra_for_every_package(monkeypatch):
    real = importlib.util.find_spec
    gone = {"triton", "jax", "onnx", "onnxruntime"}
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in gone else real(name, *a))
    assert kernel_table.missing("flashnum_triton") == (
        "missing", "triton: pip install 'flashnum[triton]'")
    assert kernel_table.missing("jax_xla") == ("missing", "jax: pip install 'flashnum[kernels]'")
    row, table = kernel_table.table_row("flashnum_triton", "bf16", "quick")
    assert row["status"] == "missing" and table is None


def test_the_kernel_table_ends_with_a_readable_summary_table():
    df = pd.DataFrame([
        dict(target="torch_sdpa", precision="bf16", status="ran", cases=8, kept=6,
             worst_ratio=0.45, model_bitwise=1.0, closest="torch_cpu", time_s=1e-4),
        dict(target="jax_xla", precision="fp16", status="missing",
             install="jax: pip install 'flashnum[kernels]'"),
        dict(target="ort_mha", precision="bf16", status="unsupported: raised X: y", cases=8,
             kept=0)])
    text = kernel_table.summary_table(df)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["target", "prec", "status"]
    assert "6/8" in lines[1] and "100.0%" in lines[1] and "torch_cpu" in lines[1]
    assert lines[2].split()[2] == "missing" and lines[3].split()[2] == "unsupported"
    assert lines[-1].strip() == "to add the missing ones: jax: pip install 'flashnum[kernels]'"


def bottom_right(q, k, v, causal=False, scale=None):
    """torch's SDPA with flash-attn's bottom-right causal mask (query i sees keys up to
    i + Nk - Nq); rows that see no key are 0."""
    mask = None
    if causal:
        nq, nk = q.shape[-2], k.shape[-2]
        mask = torch.ones(nq, nk, dtype=torch.bool).tril(nk - nq)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return torch.nan_to_num(out) if causal else out


@pytest.mark.slow
def test_an_audit_under_the_wrong_alignment_names_the_one_the_kernel_keeps():
    rep = flashnum.audit(bottom_right, precision="bf16", budget="quick")  # top-left default
    assert not rep.passed
    a = rep.diagnosis["alignment"]
    assert a == dict(alignment="bottom_right", given="top_left", cases=a["cases"],
                     passed=a["cases"]) and a["cases"] >= 2
    text = rep.summary()
    assert "the kernel's causal mask is bottom_right-aligned, not top_left; audit it with " \
           "alignment=\"bottom_right\"" in text, text
    assert flashnum.audit(bottom_right, precision="bf16", budget="quick",
                          alignment="bottom_right").passed
