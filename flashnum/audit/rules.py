"""The rules an audited kernel must keep on every case, and the measurements behind them.

    from flashnum.audit.rules import evaluate, ALIGNMENTS
    row = evaluate(fn, case, precision="bf16", alignment="top_left", model="torch_cpu")

Per case (one row of the audit's table):
  crash      the call raised, or returned something that is not a tensor of the input's
             shape and dtype (a kernel that writes garbage or out of bounds is a failed
             case, never a failed audit)
  nonfinite  an inf or NaN where the reference is finite
  masked     a row that sees no key must be 0 (the reference's convention, and torch's,
             flash-attn's and FlashAttention-2's)
  fa_rule    FlashAttention's acceptance rule (flash-attention tests/test_flash_attn.py):
             max|out - ref| <= 2 max|out_std - ref| + atol, where out_std is standard
             attention computed in the same dtype in plain torch
             (flashnum.audit.standard: S = Q K^T scale rounded to the dtype, softmax in
             fp32 rounded to the dtype, P V in the dtype), and
             atol = 2 max|fl32(ref + 0.3 - 0.3) - ref|, the fp32 noise floor flash-attn adds
  lse        where the kernel also returns its log-sum-exp, flash-attn's rule on it:
             max|lse - lse_ref| <= 2 max|lse_std - lse_ref| + 8 u32 max|lse_ref|, with
             lse_std the fp32 logsumexp of the dtype-rounded logits
The reference is flashnum.reference with the target's causal alignment: "certified"
(every output the float64 nearest the exact attention of the stored inputs), "fp64"
(float64 with a proven a-priori bound err_bound), or "auto" (the default): fp64 where its
bound is below 1e-3 of the case's flash-attn bound, so that no verdict can differ from
the certified one, else certified (certified costs up to a minute per case at N = 600
on this machine; the bound and the method used are in the table). The model
(`model=`, a flashnum policy such as "torch_cpu" or "fa2") is reported beside the kernel:
its own error, and how many elements the kernel and the model share bit for bit.
With backward=True the same call is differentiated through autograd and the gradient
rules of flashnum.audit.gradients (grad_crash, grad_nonfinite, grad_masked, dq_rule,
dk_rule, dv_rule) join these; the model's gradients (flashnum.attention_backward) sit
beside the kernel's.
"""

from __future__ import annotations

import math
import time
from typing import NamedTuple

import torch

from flashnum.audit import gradients, models
from flashnum.audit.standard import check_output, standard_attention, standard_lse
from flashnum.reference import reference

ALIGNMENTS = ("top_left", "bottom_right")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
RULES = ("crash", "nonfinite", "masked", "fa_rule", "lse", "grad_crash", "grad_nonfinite",
         "grad_masked", "dq_rule", "dk_rule", "dv_rule")
REFERENCES = ("auto", "certified", "fp64")
AUTO_SLACK = 1e-3  # "auto" keeps the fp64 reference when its proven bound is this small
U32 = 2.0**-24


def aligned_reference(q, k, v, *, causal, alignment, scale=None, method="certified"):
    """flashnum.reference (bottom-right aligned) under either causal alignment.

    Top-left with Nq <= Nk is bottom-right on the first Nq keys (later keys are seen by
    no row); with Nq > Nk its first Nk rows are the square causal case and the rest see
    every key."""
    nq, nk = q.shape[-2], k.shape[-2]
    if not causal or alignment == "bottom_right" or nq == nk:
        return reference(q, k, v, causal=causal, scale=scale, method=method)
    if nq < nk:
        return reference(q, k[..., :nq, :], v[..., :nq, :], causal=True, scale=scale,
                         method=method)
    top = reference(q[..., :nk, :], k, v, causal=True, scale=scale, method=method)
    rest = reference(q[..., nk:, :], k, v, causal=False, scale=scale, method=method)
    top.out = torch.cat([top.out, rest.out], dim=-2)
    top.lse = torch.cat([top.lse, rest.lse], dim=-1)
    top.row_max = torch.cat([top.row_max, rest.row_max], dim=-1)
    top.err_bound = torch.cat([top.err_bound, rest.err_bound], dim=-1)
    return top


def _vmax(x: torch.Tensor) -> float:
    """The largest value (NaN counts as inf); 0 for an empty tensor."""
    return float(torch.nan_to_num(x, nan=math.inf, posinf=math.inf).max()) if x.numel() else 0.0


def _call(fn, q, k, v, causal, scale):
    """(out, lse or None, error message or None)."""
    want = tuple(q.shape[:-1]) + (v.shape[-1],)
    try:
        got = fn(q, k, v, causal=causal, scale=scale)
    except Exception as e:  # a crashing target is a failed case
        first = str(e).splitlines()[0][:120] if str(e) else ""
        return None, None, f"raised {type(e).__name__}: {first}"
    got, lse, why = check_output(got, q, want)
    if why is not None:
        return None, None, why
    return got.detach().to("cpu"), None if lse is None else lse.detach().to("cpu"), None


def _call_isolated(thunk, failed):
    """thunk() in a forked child: its answer comes back through a pipe; a child that dies
    (a signal, an abort on a corrupted heap) or exits without an answer gives
    failed(message that says so). POSIX only (fork)."""
    import os
    import pickle

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run, answer, exit without running the parent's cleanup
        code = 1
        try:
            # the child's death is the finding, reported by the parent in one line: no
            # faulthandler dump of the child's stack (pytest enables one) on the console
            import faulthandler

            faulthandler.disable()
            os.close(r)
            with os.fdopen(w, "wb") as f:
                pickle.dump(thunk(), f)
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if data:
        try:
            return pickle.loads(data)
        except Exception:  # a truncated answer: the child died while writing it
            pass
    if os.WIFSIGNALED(status):
        return failed(f"killed its process (signal {os.WTERMSIG(status)})")
    return failed(f"its process exited with status {os.WEXITSTATUS(status)} and no result")


class _Call(NamedTuple):
    """One case's call as the kernel made it: what its model and the policies beside it
    are run on (do: the upstream gradient, None for a forward-only audit)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    do: torch.Tensor | None
    precision: str
    causal: bool
    alignment: str
    scale: float | None

    @property
    def options(self) -> dict:
        return dict(precision=self.precision, causal=self.causal, alignment=self.alignment,
                    scale=self.scale)


def _model_out(model, c: _Call):
    """The model's output (float64) or None where it cannot take the kernel's causal mask
    (flashnum.audit.models)."""
    return models.forward(models.Candidate.of(model), c.q, c.k, c.v, **c.options)


def _check_out(row, fails, o, ref, finite_ref, masked_rows):
    """nonfinite, masked and fa_rule on the kernel's output o (float64)."""
    row["n_nonfinite"] = int((~torch.isfinite(o) & finite_ref).sum())
    if row["n_nonfinite"]:
        fails.append("nonfinite")
    if bool(masked_rows.any()):
        row["masked_max"] = _vmax(o[masked_rows[..., None].expand_as(o)].abs())
        if not row["masked_max"] == 0.0:
            fails.append("masked")
    err = (o - ref.out).abs()[finite_ref]
    row["err_max"] = _vmax(err)
    row["err_rms"] = float(torch.nan_to_num(err, nan=math.inf).pow(2).mean().sqrt()) if (
        err.numel()) else 0.0
    if not row["err_max"] <= row["fa_bound"]:
        fails.append("fa_rule")


def _check_lse(row, fails, lse, ref, q, k, causal, alignment, scale):
    keep = torch.isfinite(ref.lse)
    lse_std = standard_lse(q, k, causal=causal, alignment=alignment, scale=scale).double()
    e_k = torch.nan_to_num((lse.double() - ref.lse)[keep].abs(), nan=math.inf)
    e_s = (lse_std - ref.lse)[keep].abs()
    row["lse_err_max"] = _vmax(e_k)
    row["lse_bound"] = 2 * _vmax(e_s) + 8 * U32 * _vmax(ref.lse[keep].abs())
    if not row["lse_err_max"] <= row["lse_bound"]:
        fails.append("lse")


def _bound(std, ref_out, finite_ref) -> tuple[float, float]:
    """(max |std - ref|, flash-attn's bound 2 max|std - ref| + 2 max|fl32(ref+0.3-0.3) - ref|)."""
    std_err = _vmax((std - ref_out).abs()[finite_ref & torch.isfinite(std)])
    r32 = ref_out.float()
    noise = ((r32 + 0.3 - 0.3).double() - r32.double()).abs()[finite_ref]
    return std_err, 2 * std_err + 2 * _vmax(noise)


def _beside(row, model, compare, c: _Call, answers, refs) -> None:
    """The columns of what runs beside the kernel, read by no rule: the model's error, its
    bitwise agreement with the kernel (and its gradients'), and the compared policies'.
    answers: the kernel's (out, grads); refs: (ref, gradients' ref, finite_ref)."""
    (out, grads), (ref, gref, finite_ref) = answers, refs
    mo = None
    if model is not None:
        try:
            mo = _model_out(model, c)
        except ValueError:
            mo = None
    if mo is not None:
        row["model_err_max"] = _vmax((mo - ref.out).abs()[finite_ref])
        if out is not None:
            o = out.double()
            row["model_bitwise"] = float(((o == mo) | (o.isnan() & mo.isnan())).float().mean())
            row["model_max_diff"] = _vmax((o - mo).abs())
    if model is not None and c.do is not None:
        try:
            mg = models.backward(models.Candidate.of(model), c.q, c.k, c.v, c.do, **c.options)
        except (ValueError, NotImplementedError):  # no backward of this model here
            mg = None
        if mg is not None:
            gradients.model_columns(row, mg, gref, grads)
    for pol in compare:
        try:
            po = _model_out(pol, c)
        except ValueError:
            po = None
        row[f"{pol}_err_max"] = (float("nan") if po is None
                                 else _vmax((po - ref.out).abs()[finite_ref]))


def evaluate(fn, case, *, precision="bf16", alignment="top_left", model=None,
             reference_method="auto", isolate=False, compare=(), backward=False,
             keep=None) -> dict:
    """One row of the audit's table: the case, the measurements and the verdict per rule.
    isolate: the target runs in a forked child process (a target that corrupts memory
    or aborts then fails its case instead of ending the audit). compare: flashnum
    policies (e.g. fa2, lowp) whose emulated error on the same case is recorded as
    <policy>_err_max, for comparison only (no rule reads it). backward: differentiate fn
    through autograd and judge dQ, dK, dV too (flashnum.audit.gradients). keep: a dict
    that receives keep[case.id] = (out, (dq, dk, dv) or None), the kernel's answers, for
    the diagnosis (flashnum.audit.diagnosis)."""
    t0 = time.perf_counter()
    inp = case.inputs()
    q, k, v = (x.to(DTYPES[precision]) for x in (inp.q, inp.k, inp.v))
    causal, scale = case.causal, inp.scale
    row = dict(case.asdict(), id=case.id, precision=precision, alignment=alignment)
    qkv = (q.double(), k.double(), v.double())
    method = "fp64" if reference_method == "auto" else reference_method
    ref = aligned_reference(*qkv, causal=causal, alignment=alignment, scale=scale, method=method)
    masked_rows = ~torch.isfinite(ref.row_max)  # rows that see no key
    finite_ref = torch.isfinite(ref.out) & ~masked_rows[..., None].expand_as(ref.out)
    std = standard_attention(q, k, v, causal=causal, alignment=alignment, scale=scale).double()
    row["std_err_max"], row["fa_bound"] = _bound(std, ref.out, finite_ref)
    if reference_method == "auto" and not _vmax(ref.err_bound) <= AUTO_SLACK * row["fa_bound"]:
        method = "certified"  # the fp64 bound could move a verdict: certify
        ref = aligned_reference(*qkv, causal=causal, alignment=alignment, scale=scale,
                                method=method)
        row["std_err_max"], row["fa_bound"] = _bound(std, ref.out, finite_ref)
    row["reference"], row["ref_err_bound"] = method, _vmax(ref.err_bound)
    grads, gwhy, do = None, None, None
    if backward:
        # a captured call brings the dO its model sent it (flashnum.capture)
        do = gradients.upstream(case, inp, q.dtype)
        if isolate:
            out, lse, grads, why, gwhy = _call_isolated(
                lambda: gradients.call(fn, q, k, v, do, causal, scale),
                lambda m: (None, None, None, m, None))
        else:
            out, lse, grads, why, gwhy = gradients.call(fn, q, k, v, do, causal, scale)
    elif isolate:
        out, lse, why = _call_isolated(lambda: _call(fn, q, k, v, causal, scale),
                                       lambda m: (None, None, m))
    else:
        out, lse, why = _call(fn, q, k, v, causal, scale)
    fails = []
    if why is not None:
        fails.append("crash")
        row["message"] = why
    else:
        _check_out(row, fails, out.double(), ref, finite_ref, masked_rows)
        if lse is not None:
            _check_lse(row, fails, lse, ref, q, k, causal, alignment, scale)
    gref = None
    if backward:
        gmethod = "fp64" if reference_method == "auto" else reference_method
        gref = gradients.reference_gradients(*qkv, do.double(), causal=causal,
                                             alignment=alignment, scale=scale, method=gmethod)
        row["grad_reference"] = gmethod
        gstd = gradients.standard_gradients(q, k, v, do, causal=causal, alignment=alignment,
                                            scale=scale)
        if gwhy is not None:
            fails.append("grad_crash")
            row["message"] = gwhy
        if grads is not None:
            gradients.check(row, fails, grads, gref, gstd, masked_rows)
        else:  # the limit is still recorded (for the plots and the worst case)
            for name, r, s_ in zip(gradients.GRADS, gref, gstd, strict=True):
                row[f"{name}_std_err_max"], row[f"{name}_bound"] = gradients.bound(s_, r)
    if keep is not None and out is not None:
        keep[case.id] = (out, grads)
    _beside(row, model, compare, _Call(q, k, v, do, precision, causal, alignment, scale),
            (out, grads), (ref, gref, finite_ref))
    row["failed"] = ",".join(fails)
    row["passed"] = not fails
    row["seconds"] = time.perf_counter() - t0
    return row
