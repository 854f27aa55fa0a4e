"""Inputs replayed from a file instead of drawn: a worst case the search saved
(worst_case) and a real model's attention call (captured), with the memory check that
refuses a captured case too large for the machine before a byte of it is read.
"""

from __future__ import annotations

import torch

from flashnum.engine import checks as engine_checks  # available_bytes read at each call
from flashnum.inputs.capture import select_rows
from flashnum.inputs.capture_file import call_shapes, file_sha256, load_bytes, load_call
from flashnum.inputs.draws import Shape, _check
from flashnum.inputs.io import load_inputs
from flashnum.numerics.tiling import clamp_block


def worst_case(g, sh: Shape, *, path: str = ""):
    """Inputs saved by flashnum.inputs.search (a worst case found by the search), replayed bitwise.

    The shape arguments of make() are ignored: the tensors come from the file.
    """
    _check(bool(path), "worst_case needs path=<file saved by flashnum.inputs.search>")
    t, meta = load_inputs(path)
    return dict(q=t["q"], k=t["k"], v=t["v"], causal=meta["causal"], scale=meta["scale"],
                params=dict(path=str(path), source=meta["name"], **meta["params"]))


def captured(g, sh: Shape, *, path: str = "", call: int = 0, head_ids: list | None = None,
             rows: int | None = None, sha256: str = ""):
    """A real model's attention call, recorded by flashnum.capture: its Q, K, V exactly.

    path: the capture file; call: the call's index (its order in the model, as
    flashnum.load_capture reports it); head_ids: which of its heads (None: all); rows: how
    many query rows, drawn with `seed` (None: all; causal calls keep consecutive rows and
    the keys they see, which is bottom-right causal attention again: see
    flashnum.inputs.capture); sha256: the file's content hash (the harness fills it in,
    so that a changed capture is a different case; given, it must match).
    The scale is the one the model used; causal is the model's, in flashnum's terms
    (torch's top-left mask with Nq < Nk sees only the first Nq keys, kept as causal
    attention of Nq x Nq). The tensors are converted to float64 exactly; the shape
    arguments of make() are ignored. Calls flashnum cannot compute (an attn_mask other
    than causal, top-left causal with Nq > Nk) are refused with a ValueError. With a dO
    recorded (capture(backward=True)), Inputs.do holds it, selected like Q.
    """
    _check(bool(path), "captured needs path=<file written by flashnum.capture>")
    check_memory(path, call, head_ids, rows)  # the file checked and its cost, before reading
    if sha256 and file_sha256(path) != sha256:
        raise ValueError(f"{path} has changed: its sha256 is no longer {sha256}")
    c = load_call(path, call)
    c.check_plain()
    q, k, v = (t.to(torch.float64) for t in c.qkv)  # exact: every float format fits fp64
    do = c.do.to(torch.float64) if c.do is not None else None
    causal = c.causal
    if causal == "top_left":
        _check(q.shape[-2] <= k.shape[-2],
               f"captured call {call} is top-left causal with Nq = {q.shape[-2]} > Nk = "
               f"{k.shape[-2]}, which flashnum's bottom-right causal cannot express")
        k, v = k[..., : q.shape[-2], :], v[..., : q.shape[-2], :]  # keys no query sees
        causal = True
    if head_ids is not None:
        ok = isinstance(head_ids, (list, tuple)) and all(
            isinstance(h, int) and 0 <= h < q.shape[1] for h in head_ids)
        _check(ok and len(head_ids) > 0, f"head_ids must be a list of head indices in "
               f"0..{q.shape[1] - 1} of captured call {call}, got {head_ids!r}")
        q, k, v = q[:, head_ids], k[:, head_ids], v[:, head_ids]
        do = do[:, head_ids] if do is not None else None
    if rows is not None:
        _check(isinstance(rows, int) and not isinstance(rows, bool) and rows >= 1,
               f"rows must be an int >= 1 (query rows kept), got {rows!r}")
        nq, nk = q.shape[-2], k.shape[-2]
        idx, nk_kept = select_rows(nq, nk, rows, bool(causal), g, offset=nk - nq)
        if idx is not None:
            q, k, v = q[:, :, idx], k[:, :, :nk_kept], v[:, :, :nk_kept]
            do = do[:, :, idx] if do is not None else None
    return dict(q=q.contiguous(), k=k.contiguous(), v=v.contiguous(), causal=bool(causal),
                scale=c.scale, do=do.contiguous() if do is not None else None,
                params=dict(module=c.module, dtype=c.dtype))


def _selected(path, call, head_ids, rows) -> tuple:
    """The shapes (q, k, v, do or None) a case reads of the call, its heads and rows kept:
    what it costs, from the file's header alone (from above: a causal call's rows keep at
    most every key)."""
    sh = call_shapes(path, call)
    b, h, nq, d = sh["q"]
    nk, dv = sh["k"][2], sh["v"][3]
    h = len(head_ids) if isinstance(head_ids, (list, tuple)) and head_ids else h
    nq = min(nq, rows) if isinstance(rows, int) and not isinstance(rows, bool) else nq
    return (b, h, nq, d), (b, h, nk, d), (b, h, nk, dv), (b, h, nq, dv) if "do" in sh else None


def check_memory(path, call, head_ids=None, rows=None, *, block_m: int | None = None,
                 block_n: int | None = None, backward: bool = False) -> int:
    """The estimated peak memory of a case of captured call `call` (the call read as
    float64, and with blocks given the engine's estimate, flashnum.engine.checks.peak_bytes,
    at the kept shape); ValueError naming it when more than the machine has available,
    before a byte of a tensor is read. Returns the estimate."""
    need = load_bytes(path, call)
    q, k, v, _ = _selected(path, call, head_ids, rows)
    if block_m is not None and block_n is not None:
        meta = [torch.empty(s, device="meta") for s in (q, k, v)]
        need += engine_checks.peak_bytes(*meta, block_m=clamp_block(block_m, q[2]),
                                         block_n=clamp_block(block_n, k[2]), backward=backward)
    have = engine_checks.available_bytes()
    if have is not None and need > have:
        human = engine_checks.human
        raise ValueError(
            f"{path}: a case of captured call {call} needs an estimated {human(need)} of "
            f"memory (q {q}, k {k}, v {v}, read as float64 and computed) and {human(have)} "
            f"is available; valid: fewer rows (rows=N), fewer heads (head_ids=[...]) or a "
            f"smaller call")
    return need
