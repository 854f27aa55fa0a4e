"""The audit of gradients: dQ, dK, dV of a kernel through autograd, against the exact ones.

    from flashnum.audit.gradients import draw_do, reference_gradients, standard_gradients
    do = draw_do(case, out_shape, torch.bfloat16)      # the case's seeded upstream gradient
    ref = reference_gradients(q, k, v, do, causal=True, alignment="top_left", method="fp64")
    std = standard_gradients(q, k, v, do, causal=True, alignment="top_left")   # (dq, dk, dv)

Per case (with audit(..., backward=True); columns of the audit's table):
  grad_crash     autograd through the kernel raised, or gave no gradient, or one of the
                 wrong shape or dtype
  grad_nonfinite an inf or NaN in dQ, dK or dV where the reference is finite
  grad_masked    a row that sees no key must get dQ = 0 (its dK, dV contribution is 0 too,
                 which the error rule sees)
  dq_rule, dk_rule, dv_rule   flash-attn's rule on each gradient (hopper/test_flash_attn.py,
                 Dao-AILab/flash-attention 01afd16: `dq_atol = 2 * (dq_ref + 0.3 - 0.3 -
                 dq_ref).abs().max()`, `(dq - dq_ref).abs().max() <= 2 * (dq_pt -
                 dq_ref).abs().max() + dq_atol`): max|g - g_ref| <= 2 max|g_std - g_ref| +
                 2 max|fl32(g_ref + 0.3 - 0.3) - g_ref|, with g_std autograd through standard
                 attention in the same dtype (flashnum.audit.standard.standard_attention with
                 torch.softmax on the dtype's logits, as attention_ref(upcast=False)), the
                 forward rule's slack taken from the gradient's own reference
dO is drawn per case from a generator seeded by the case's id (standard normal, rounded
to the dtype), so that every run of an audit sees the same dO.

The reference is flashnum.reference_backward under the kernel's causal alignment. With
reference="auto" (the default) its fp64 method (float64 gradients of the max-shifted
softmax; no proven bound): on the quick budget it differs from the certified gradients by
less than 1e-9 of every rule's bound (tests/test_audit_backward.py), so no verdict there
can move; reference="certified" certifies every case (seconds per case at N = 256).
"""

from __future__ import annotations

import math
import zlib

import torch

from flashnum.audit.standard import check_output, standard_attention
from flashnum.reference import reference_backward

GRADS = ("dq", "dk", "dv")


def draw_do(case, shape, dtype) -> torch.Tensor:
    """The case's upstream gradient dO: standard normal, seeded by the case id, in dtype."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"dO/{case.id}".encode()))
    return torch.randn(tuple(shape), generator=gen, dtype=torch.float64).to(dtype)


def upstream(case, inp, dtype) -> torch.Tensor:
    """The dO a case's backward receives: a captured call's own (flashnum.capture), else
    draw_do's."""
    if getattr(inp, "do", None) is not None:
        return inp.do.to(dtype)
    return draw_do(case, (*inp.q.shape[:-1], inp.v.shape[-1]), dtype)


def reference_gradients(q, k, v, do, *, causal, alignment, scale=None, method="fp64"):
    """flashnum.reference_backward (bottom-right aligned) under either causal alignment:
    (dq, dk, dv) float64.

    Top-left with Nq < Nk: the keys past Nq are seen by no row (their dK, dV are 0), the
    rest is the bottom-right case on the first Nq keys. Nq > Nk: the first Nk rows are the
    square causal case and the others see every key; rows add into dK and dV
    independently, so the two calls' dK (dV) are summed (one float64 rounding)."""
    nq, nk = q.shape[-2], k.shape[-2]
    kw = dict(scale=scale, method=method)
    if not causal or alignment == "bottom_right" or nq == nk:
        g = reference_backward(q, k, v, do, causal=causal, **kw)
        return g.dq, g.dk, g.dv
    if nq < nk:
        g = reference_backward(q, k[..., :nq, :], v[..., :nq, :], do, causal=True, **kw)
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        dk[..., :nq, :], dv[..., :nq, :] = g.dk, g.dv
        return g.dq, dk, dv
    top = reference_backward(q[..., :nk, :], k, v, do[..., :nk, :], causal=True, **kw)
    rest = reference_backward(q[..., nk:, :], k, v, do[..., nk:, :], causal=False, **kw)
    return torch.cat([top.dq, rest.dq], dim=-2), top.dk + rest.dk, top.dv + rest.dv


def standard_gradients(q, k, v, do, *, causal, alignment, scale=None):
    """(dq, dk, dv) float64 of autograd through standard attention in the inputs' dtype
    (flash-attn's dq_pt: attention_ref with upcast=False, torch.softmax on the dtype's
    logits, whose backward reads the rounded P)."""
    qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    out = standard_attention(qg, kg, vg, causal=causal, alignment=alignment, scale=scale,
                             softmax_in_dtype=True)
    return tuple(g.double() for g in torch.autograd.grad(out, (qg, kg, vg), do))


def call(fn, q, k, v, do, causal, scale):
    """One forward and backward call through autograd: (out, lse, (dq, dk, dv) or None,
    error message of the forward or None, error message of the backward or None)."""
    want = tuple(q.shape[:-1]) + (v.shape[-1],)
    qg, kg, vg = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    try:
        got = fn(qg, kg, vg, causal=causal, scale=scale)
    except Exception as e:  # a crashing target is a failed case ...
        try:  # ... unless only differentiable inputs make it raise: a kernel with no backward
            got = fn(q.detach(), k.detach(), v.detach(), causal=causal, scale=scale)
        except Exception:
            return None, None, None, _raised(e), None
        out, lse, why = check_output(got, q, want)
        return (_host(out), _host(lse), None, why,
                None if why else f"no backward: inputs that require grad make it {_raised(e)}")
    out, lse, why = check_output(got, q, want)
    if why is not None:
        return None, None, None, why, None
    try:
        grads = torch.autograd.grad(out, (qg, kg, vg), do.to(out.device), allow_unused=True)
    except Exception as e:
        return _host(out), _host(lse), None, None, "backward " + _raised(e)
    for name, g, x in zip(GRADS, grads, (q, k, v), strict=True):
        if g is None:
            return _host(out), _host(lse), None, None, f"no gradient for {name[1]}"
        if tuple(g.shape) != tuple(x.shape) or g.dtype != x.dtype:
            return _host(out), _host(lse), None, None, (
                f"{name} has shape {tuple(g.shape)} {g.dtype}, expected {tuple(x.shape)} "
                f"{x.dtype}")
    return _host(out), _host(lse), tuple(_host(g) for g in grads), None, None


def _raised(e: Exception) -> str:
    first = str(e).splitlines()[0][:120] if str(e) else ""
    return f"raised {type(e).__name__}: {first}"


def _host(x):
    return None if x is None else x.detach().to("cpu")


def _vmax(x: torch.Tensor) -> float:
    """The largest value (NaN and inf count as inf); 0 for an empty tensor."""
    return float(torch.nan_to_num(x, nan=math.inf, posinf=math.inf).max()) if x.numel() else 0.0


def bound(std: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(max |g_std - ref|, flash-attn's bound 2 max|g_std - ref| + 2 max|fl32(ref + 0.3 -
    0.3) - ref|) over the entries where the reference is finite. Where standard attention's
    own gradient overflows (an inf or NaN where the reference is finite: fp16 near its
    largest number), its error is inf and so is the limit: the rule cannot judge there,
    grad_nonfinite does."""
    fin = torch.isfinite(ref)
    std_err = _vmax((std - ref).abs()[fin])
    r32 = ref.float()
    noise = ((r32 + 0.3 - 0.3).double() - r32.double()).abs()[fin]
    return std_err, 2 * std_err + 2 * _vmax(noise)


def check(row: dict, fails: list, grads, ref, std, masked_rows) -> None:
    """grad_nonfinite, grad_masked and the three rules on the kernel's gradients."""
    bad = 0
    for name, g, r, s in zip(GRADS, grads, ref, std, strict=True):
        g = g.double()
        fin = torch.isfinite(r)
        bad += int((~torch.isfinite(g) & fin).sum())
        row[f"{name}_err_max"] = _vmax((g - r).abs()[fin])
        row[f"{name}_std_err_max"], row[f"{name}_bound"] = bound(s, r)
        if not row[f"{name}_err_max"] <= row[f"{name}_bound"]:
            fails.append(f"{name}_rule")
    row["grad_nonfinite"] = bad
    if bad:
        fails.append("grad_nonfinite")
    if bool(masked_rows.any()):
        dq = grads[0].double()
        row["grad_masked_max"] = _vmax(dq[masked_rows[..., None].expand_as(dq)].abs())
        if not row["grad_masked_max"] == 0.0:
            fails.append("grad_masked")


def model_columns(row: dict, g, ref, grads) -> None:
    """The model's error on each gradient beside the kernel's, and the share of entries the
    kernel and the model have equal bit for bit."""
    for name, r, kg in zip(GRADS, ref, grads or (None,) * 3, strict=True):
        mg = getattr(g, name)
        row[f"model_{name}_err_max"] = _vmax((mg - r).abs()[torch.isfinite(r)])
        if kg is not None:
            kd = kg.double()
            row[f"model_{name}_bitwise"] = float(((kd == mg) | (kd.isnan() & mg.isnan()))
                                                 .double().mean())
