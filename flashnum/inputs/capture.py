"""Capture the attention inputs of a real model: every scaled_dot_product_attention call.

    import flashnum
    with flashnum.capture("run.safetensors", backward=True) as cap:
        loss = model(x).square().sum()
        loss.backward()                    # inside the block: dO is recorded as it arrives
    call = cap.calls[0]                    # call.q .k .v .causal .scale .do .module .index
    flashnum.attention(*call.qkv, causal=call.causal, scale=call.scale, precision="bf16")
    flashnum.attention_backward(*call.qkv, call.do, causal=call.causal, scale=call.scale)
    calls = flashnum.load_capture("run.safetensors")   # the same list, read without pickle

What is recorded, per call of torch.nn.functional.scaled_dot_product_attention made inside
the block, in order (`index` counts every call, also those the limits leave out):
  q, k, v   the tensors as called, by value and dtype, as (batch, heads, N, d): a 3-d call
            (N', L, E) is stored as (N', 1, L, E); more leading dims are flattened into
            batch. With enable_gqa, k and v are stored expanded to q's heads.
  is_causal torch's flag as passed. torch aligns its causal mask top-left (query i sees
            keys 0..i); flashnum's causal=True is bottom-right (flashnum.numerics.tiling).
            They agree when Nq == Nk, so `causal` is True there and "top_left" otherwise.
  scale     the softmax scale torch used: the given one, else 1/sqrt(E) (scale_given keeps
            what was passed).
  mask      attn_mask: a boolean mask (True = attend) or a float mask of 0 and -inf only
            (the same thing, as torch adds it) is recorded as a boolean tensor, and is
            replaced by causal when it equals the top-left causal mask. Any other float
            mask is recorded as given (mask_kind "additive"); flashnum's engine computes
            neither kind of explicit mask, so consumers refuse such calls with a ValueError.
  dropout_p recorded; flashnum's engine has no dropout, so a call with dropout_p > 0 is
            the deterministic attention its inputs would give, not what the model ran.
  do        with backward=True: the gradient reaching the call's output (a tensor hook).
  module    the dotted name of the innermost nn.Module running the call ("" outside any),
            named from the outermost module called inside the block (global forward
            pre-hooks keep the stack), e.g. "layers.0.self_attn".

How calls are seen: a TorchFunctionMode sees every call of the op, however it was
imported. torch runs a mode's handler with the mode switched off, so calls made *inside*
another handled Python function (nn.MultiheadAttention's multi_head_attention_forward,
which nn.TransformerEncoderLayer uses) would be missed; for those, the module attribute
torch.nn.functional.scaled_dot_product_attention, which that function looks up at call
time, is a recorder while the block runs. A call is recorded once either way. The mode
also turns off TransformerEncoderLayer's fused inference path (it checks for modes), so
eval and no-grad runs go through SDPA and are seen. nn.MultiheadAttention called with
need_weights=True (its default when called directly) computes attention without SDPA and
is not seen.

Limits, to keep a large model's capture bounded (applied in this order):
  calls     which calls to keep: None (all), an iterable of indices, or a function
            (index, module) -> bool
  heads     which heads (of q) to keep: None (all) or a list of head indices
  rows      how many query rows to keep: None (all) or n. A non-causal call keeps n rows
            drawn without replacement (sorted; seeded by `seed` and the call's index).
            A causal call keeps n consecutive rows s..s+n-1 (s drawn the same way) and the
            keys 0..s+n-1 they see: exactly bottom-right causal attention of Nq = n over
            Nk = s+n keys, so `causal` is True. The kept indices are in `rows`.
  max_bytes a byte budget for the file's tensors: a call that would pass it is left out
            (its index in cap.skipped with the reason), later smaller calls still fit.

The file is safetensors: tensors "<n>.q", "<n>.k", "<n>.v", "<n>.do", "<n>.mask" for the
n-th kept call, and the metadata "format" (FORMAT) and "calls" (a JSON list of each call's
fields but the tensors). load_capture reads it without pickle, after checking the whole
file's layout and every call's fields (flashnum.inputs.capture_file): a file of another
format, or a malformed one, is one ValueError naming the file and what is wrong.
"""

from __future__ import annotations

import hashlib
import math
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from flashnum.inputs.capture_file import (  # noqa: F401  (the file's API, named here too)
    FORMAT,
    CapturedCall,
    CaptureError,
    capture_index,
    file_sha256,
    load_call,
    load_capture,
    save_capture,
)

_SDPA = torch._C._nn.scaled_dot_product_attention  # F.scaled_dot_product_attention is this


# -- shapes ---------------------------------------------------------------------------

def _as4d(x: torch.Tensor) -> torch.Tensor:
    """(..., L, E) as (batch, heads, L, E): 3-d is (N, 1, L, E), more dims flatten into batch."""
    if x.ndim == 2:
        return x[None, None]
    if x.ndim == 3:
        return x[:, None]
    return x.reshape(-1, x.shape[-3], *x.shape[-2:])


def _expand_kv(x: torch.Tensor, hq: int) -> torch.Tensor:
    """GQA: key/value heads repeated to q's head count, as SDPA's enable_gqa does."""
    hk = x.shape[1]
    return x if hk == hq else x.repeat_interleave(hq // hk, dim=1)


def _causal_mask(nq: int, nk: int) -> torch.Tensor:
    """torch's is_causal mask: top-left aligned, query i sees keys 0..i."""
    return torch.ones(nq, nk, dtype=torch.bool).tril()


def flashnum_causal(is_causal: bool, nq: int, nk: int) -> bool | str:
    """torch's is_causal (top-left) as flashnum's causal (True is bottom-right)."""
    if not is_causal:
        return False
    return True if nq == nk else "top_left"


def row_generator(seed: int, index: int) -> torch.Generator:
    h = hashlib.sha256(f"flashnum:capture:{seed}:{index}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(h[:8], "little") >> 1)


def select_rows(nq: int, nk: int, n: int | None, causal: bool, g: torch.Generator,
                offset: int = 0):
    """(row indices or None, keys kept): n query rows, causal ones consecutive (docstring).

    offset: where query 0's causal mask ends: 0 top-left (torch), nk - nq bottom-right.
    """
    if n is None or n >= nq:
        return None, nk
    if causal:  # rows s..s+n-1 see keys 0..offset+s+n-1: bottom-right causal over those
        s = int(torch.randint(0, nq - n + 1, (1,), generator=g))
        return list(range(s, s + n)), min(nk, offset + s + n)
    return sorted(torch.randperm(nq, generator=g)[:n].tolist()), nk


def _check_selection(heads, rows) -> None:
    if heads is not None and (isinstance(heads, (str, bytes)) or not all(
            isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in heads)):
        raise ValueError(f"heads must be None or a list of head indices >= 0, got {heads!r}")
    if rows is not None and (isinstance(rows, bool) or not isinstance(rows, int) or rows < 1):
        raise ValueError(f"rows must be None or an int >= 1 (query rows kept), got {rows!r}")


# -- recording ------------------------------------------------------------------------

def _mask_kind(mask, nq: int, nk: int):
    """(kind, boolean-or-float mask): torch's attn_mask classified (module docstring)."""
    if mask is None:
        return "none", None
    if mask.dtype != torch.bool:
        if bool(((mask == 0) | (mask == -math.inf)).all()):
            mask = mask == 0  # adding 0 or -inf is attending or not
        else:
            return "additive", mask
    if bool((mask == _causal_mask(nq, nk).to(mask.device)).all()):
        return "causal", None
    return "bool", mask


class _Recorder:
    """The state of one capture: counters, the module stack, the records."""

    def __init__(self, backward, calls, heads, rows, max_bytes, seed):
        self.backward, self.heads, self.rows, self.seed = backward, heads, rows, seed
        self.keep = _keep_fn(calls)
        self.max_bytes = max_bytes
        self.bytes = 0
        self.count = 0
        self.records: list[CapturedCall] = []
        self.skipped: list[tuple[int, str]] = []
        self.stack: list[tuple[torch.nn.Module, str]] = []
        self.names: dict[tuple[int, int], str | None] = {}
        self.busy = False  # inside the recorder: the op's own dispatch must not record again
        self.open = True

    # module names: the innermost module running, named through its parents' _modules
    def pre_hook(self, module, args):
        if not self.stack:
            name = ""
        else:
            parent, pname, _ = self.stack[-1]
            key = (id(parent), id(module))
            if key in self.names and self.names[key] is not None and \
                    parent.get_submodule(self.names[key]) is not module:
                del self.names[key]  # ids reused after a module was freed
            if key not in self.names:  # a descendant: containers (ModuleList) are not called
                self.names[key] = next(
                    (n for n, m in parent.named_modules(remove_duplicate=False)
                     if m is module and n), None)
            child = self.names[key]
            name = (f"{pname}.{child}" if pname else child) if child is not None else pname
        self.stack.append((module, name, type(module).__name__))

    def post_hook(self, module, args, out):
        if self.stack and self.stack[-1][0] is module:
            self.stack.pop()

    def call(self, args, kwargs):
        """Run SDPA on (args, kwargs), recording it; returns its output."""
        a = _bind(*args, **kwargs)
        index = self.count
        self.count += 1
        self.busy = True
        try:
            out = _SDPA(*args, **kwargs)
        finally:
            self.busy = False
        if not self.open:
            return out
        module, module_type = self.stack[-1][1:] if self.stack else ("", "")
        if not self.keep(index, module):
            return out
        try:
            rec = self._record(index, module, module_type, a)
        except Exception as e:  # a layout this recorder does not know: the model runs on
            self.skipped.append((index, f"not recorded: {type(e).__name__}: {e}"))
            return out
        if rec is None:
            return out
        if self.backward and out.requires_grad:
            sel = rec._select
            out.register_hook(lambda g, rec=rec, sel=sel: self._grad(rec, sel, g))
        return out

    def _record(self, index, module, module_type, a):
        q, k, v = (_as4d(a[n].detach()) for n in ("q", "k", "v"))
        nq, nk, hq = q.shape[-2], k.shape[-2], q.shape[1]
        if a["enable_gqa"]:
            k, v = _expand_kv(k, hq), _expand_kv(v, hq)
        kind, mask = _mask_kind(a["attn_mask"], nq, nk)
        is_causal = bool(a["is_causal"]) or kind == "causal"
        if mask is not None:  # broadcast to (batch, heads, Nq, Nk) before any selection
            mask = mask.detach().expand(*a["q"].shape[:-2], nq, nk)
            mask = _as4d(mask).expand(q.shape[0], hq, nq, nk)
        heads = self.heads
        if heads is not None:
            bad = [h for h in heads if h >= hq]
            if bad:
                self.skipped.append((index, f"heads {bad} out of range (call has {hq})"))
                return None
            q, k, v = q[:, heads], k[:, heads], v[:, heads]
            mask = mask[:, heads] if mask is not None else None
        row_idx, nk_kept = select_rows(nq, nk, self.rows, is_causal and mask is None,
                                       row_generator(self.seed, index))
        if row_idx is not None:
            q = q[:, :, row_idx]
            k, v = k[:, :, :nk_kept], v[:, :, :nk_kept]
            mask = mask[:, :, row_idx] if mask is not None else None
        causal = (True if row_idx is not None else flashnum_causal(True, nq, nk)) \
            if is_causal and mask is None else False
        # the budget is checked on the views, before anything is copied
        size = sum(x.numel() * x.element_size() for x in (q, k, v, mask) if x is not None)
        if self.backward:  # dO will have q's rows and v's width, in v's dtype
            size += q.shape[0] * q.shape[1] * q.shape[2] * v.shape[-1] * v.element_size()
        if self.max_bytes is not None and self.bytes + size > self.max_bytes:
            self.skipped.append((index, f"max_bytes: {size} more bytes would pass "
                                        f"{self.max_bytes} ({self.bytes} used)"))
            return None
        self.bytes += size
        q, k, v = (x.to("cpu", copy=True).contiguous() for x in (q, k, v))
        mask = mask.to("cpu", copy=True).contiguous() if mask is not None else None
        sg = a["scale"]  # torch's default scale is 1/sqrt(E), E the query's last dim
        scale = float(sg) if sg is not None else 1.0 / math.sqrt(a["q"].shape[-1])
        rec = CapturedCall(
            index=index, module=module, module_type=module_type, q=q, k=k, v=v,
            is_causal=bool(a["is_causal"]), causal=causal, scale=scale,
            scale_given=None if sg is None else float(sg), mask=mask,
            mask_kind=kind, dropout_p=float(a["dropout_p"]), enable_gqa=bool(a["enable_gqa"]),
            heads=list(heads) if heads is not None else None, rows=row_idx,
            shape={n: list(a[n].shape) for n in ("q", "k", "v")}
            | ({"mask": list(a["attn_mask"].shape)} if a["attn_mask"] is not None else {}),
            dtype=str(a["q"].dtype).removeprefix("torch."))
        rec._select = (heads, row_idx)
        self.records.append(rec)
        return rec

    def _grad(self, rec, sel, g):
        if self.open:
            heads, row_idx = sel
            g = _as4d(g.detach())
            if heads is not None:
                g = g[:, heads]
            if row_idx is not None:
                g = g[:, :, row_idx]
            # several backward passes through one call add up, as they do in .grad
            g = g.to("cpu", copy=True).contiguous()
            rec.do = g if rec.do is None else rec.do + g
        return None


def _bind(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
          enable_gqa=False):
    """SDPA's arguments by name (its signature in torch >= 2.5)."""
    return dict(q=query, k=key, v=value, attn_mask=attn_mask, dropout_p=dropout_p,
                is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)


def _keep_fn(calls):
    if calls is None:
        return lambda index, module: True
    if callable(calls):
        return calls
    try:
        wanted = {int(i) for i in calls}
    except (TypeError, ValueError):
        raise ValueError(f"calls must be None, an iterable of call indices or a function "
                         f"(index, module) -> bool, got {calls!r}") from None
    return lambda index, module: index in wanted


class _Mode(TorchFunctionMode):
    def __init__(self, rec: _Recorder):
        super().__init__()
        self.rec = rec

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _SDPA and not self.rec.busy:
            return self.rec.call(args, kwargs)
        return func(*args, **kwargs)


class capture:
    """Record every scaled_dot_product_attention call made inside a with block.

        with flashnum.capture(path, backward=False, calls=None, heads=None, rows=None,
                              max_bytes=None, seed=0) as cap:
            model(x)
        cap.calls      # list of CapturedCall, in call order
        cap.skipped    # (index, reason) of calls the limits left out

    path:      where the safetensors file is written when the block ends (None: nowhere)
    backward:  also record dO (run the backward inside the block)
    calls, heads, rows, max_bytes, seed: the limits (module docstring)

    A block that makes no attention call warns in one line and writes a file of no calls.
    """

    def __init__(self, path: str | Path | None, *, backward: bool = False, calls=None,
                 heads=None, rows: int | None = None, max_bytes: int | None = None,
                 seed: int = 0):
        _check_selection(heads, rows)
        if max_bytes is not None and (isinstance(max_bytes, bool) or
                                      not isinstance(max_bytes, int) or max_bytes < 0):
            raise ValueError(f"max_bytes must be None or an int >= 0, got {max_bytes!r}")
        self.path = Path(path) if path is not None else None
        self._rec = _Recorder(bool(backward), calls, None if heads is None else list(heads),
                              rows, max_bytes, int(seed))
        self._handles = []

    @property
    def calls(self) -> list[CapturedCall]:
        return self._rec.records

    @property
    def skipped(self) -> list[tuple[int, str]]:
        return self._rec.skipped

    def __enter__(self):
        rec = self._rec
        mm = torch.nn.modules.module
        self._handles = [mm.register_module_forward_pre_hook(rec.pre_hook),
                         mm.register_module_forward_hook(rec.post_hook, always_call=True)]
        self._patched = F.scaled_dot_product_attention

        def recorder(*args, **kwargs):
            return rec.call(args, kwargs) if not rec.busy else _SDPA(*args, **kwargs)

        F.scaled_dot_product_attention = recorder
        self._mode = _Mode(rec)
        self._mode.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb):
        self._mode.__exit__(exc_type, exc, tb)
        F.scaled_dot_product_attention = self._patched
        for h in self._handles:
            h.remove()
        self._rec.open = False
        if exc_type is not None:
            return False
        if not self.calls:
            where = f"; wrote {self.path}" if self.path is not None else ""
            warnings.warn(f"flashnum.capture: no scaled_dot_product_attention call was "
                          f"recorded ({self._rec.count} made, {len(self.skipped)} left out: "
                          f"cap.skipped says why){where}", stacklevel=2)
        failed = [i for i, why in self.skipped if why.startswith("not recorded")]
        if failed and self.calls:
            warnings.warn(f"flashnum.capture: calls {failed} could not be recorded (cap.skipped "
                          f"says why)", stacklevel=2)
        if self.calls and self._rec.backward:
            missing = [c.index for c in self.calls if c.do is None]
            if missing:
                warnings.warn(f"flashnum.capture: no dO reached calls {missing} (was the "
                              f"backward run inside the block?)", stacklevel=2)
        if self.path is not None:
            save_capture(self.path, self.calls)
        return False
