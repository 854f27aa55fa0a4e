"""A capture file (what flashnum.capture writes): its format, checked before it is read.

    save_capture(path, calls)            # safetensors: tensors and a JSON index, no pickle
    index = capture_index(path)          # every call's fields; the file checked, no tensor read
    calls = load_capture(path)           # the CapturedCall list, as cap.calls had it
    call = load_call(path, 3)            # the call whose index is 3
    need = load_bytes(path, 3)           # what reading it as float64 costs, from the header
    file_sha256(path)                    # what names the file's content in a case id

The file is safetensors: 8 bytes, the little-endian length n of a JSON header, the header
(each tensor's dtype, shape and byte range; "__metadata__" with "format" = FORMAT and
"calls", a JSON list of each call's fields but its tensors), then the tensors' bytes.
Tensors "<i>.q", "<i>.k", "<i>.v" (required), "<i>.do" and "<i>.mask" for the i-th call.

Everything is checked before anything large is read, so that a hostile path cannot hang,
exhaust memory or crash a reader: the path is a regular file (not a device, a folder, a
pipe or a /proc file); n leaves room for the header in the file and is within
safetensors' own limit (MAX_HEADER); the header is JSON whose byte ranges tile the rest
of the file exactly (so the file's size is the tensors' size: a sparse 4 TB file with a
header of zeros is refused at once); every call's fields have their types, its tensors
exist with shapes that agree. Any failure is one CaptureError (a ValueError; a missing
file's is also a FileNotFoundError) naming the file and what is wrong. Only then are
tensors read (safetensors maps the file), or the file hashed whole (file_sha256).
"""

from __future__ import annotations

import hashlib
import json
import math
import stat
from dataclasses import dataclass, field
from pathlib import Path

import torch

FORMAT = "flashnum.capture/1"
TENSORS = ("q", "k", "v", "do", "mask")
MAX_HEADER = 100_000_000  # safetensors' own limit on the JSON header's length
# safetensors' dtype names: bytes per element, and the torch dtype (the floats a call holds)
DTYPES = {"F64": (8, torch.float64), "F32": (4, torch.float32), "F16": (2, torch.float16),
          "BF16": (2, torch.bfloat16), "F8_E4M3": (1, torch.float8_e4m3fn),
          "F8_E5M2": (1, torch.float8_e5m2), "BOOL": (1, torch.bool), "U8": (1, torch.uint8),
          "I8": (1, torch.int8), "I16": (2, torch.int16), "I32": (4, torch.int32),
          "I64": (8, torch.int64)}
FLOATS = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}
CAUSAL = (False, True, "top_left")
MASK_KINDS = ("none", "causal", "bool", "additive")


class CaptureError(ValueError):
    """A file flashnum cannot read as a capture; str() is one line naming it and why."""


class MissingCapture(CaptureError, FileNotFoundError):
    """No file at the path: a CaptureError, and the FileNotFoundError it always was."""


@dataclass(eq=False)  # tensors have no single truth value: compare fields, meta() or values
class CapturedCall:
    """One recorded scaled_dot_product_attention call (flashnum.inputs.capture)."""

    index: int  # order among every SDPA call made inside the capture, from 0
    module: str  # dotted name of the innermost module running the call ("" the outermost)
    module_type: str  # its class name, "" outside any module
    q: torch.Tensor  # (batch, heads, Nq, d), the dtype it was called with
    k: torch.Tensor  # (batch, heads, Nk, d)
    v: torch.Tensor  # (batch, heads, Nk, dv)
    is_causal: bool  # torch's flag as passed (top-left causal mask)
    causal: bool | str  # flashnum's: False, True (bottom-right) or "top_left"
    scale: float  # the softmax scale torch used
    scale_given: float | None = None  # the scale argument as passed
    do: torch.Tensor | None = None  # (batch, heads, Nq, dv): gradient reaching the output
    mask: torch.Tensor | None = None  # (batch, heads, Nq, Nk) attn_mask, see mask_kind
    mask_kind: str = "none"  # none, causal (a mask equal to the causal one), bool, additive
    dropout_p: float = 0.0
    enable_gqa: bool = False
    heads: list[int] | None = None  # q's head indices kept (None: all)
    rows: list[int] | None = None  # query row indices kept (None: all)
    shape: dict = field(default_factory=dict)  # the shapes as called: q, k, v, mask
    dtype: str = ""

    @property
    def qkv(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.q, self.k, self.v

    def meta(self) -> dict:
        """Every field but the tensors, JSON-able (the file's index entry)."""
        return {f: getattr(self, f) for f in self.__dataclass_fields__ if f not in TENSORS}

    def check_plain(self) -> None:
        """ValueError when flashnum's engine cannot compute this call as recorded."""
        if self.mask is not None:
            raise ValueError(
                f"captured call {self.index} ({self.module or 'no module'}) has a "
                f"{self.mask_kind} attn_mask that is not causal; flashnum computes causal "
                f"or unmasked attention only (valid: calls with mask_kind none or causal)")


FIELDS = tuple(f for f in CapturedCall.__dataclass_fields__ if f not in TENSORS)
REQUIRED = ("index", "module", "module_type", "is_causal", "causal", "scale")


@dataclass(frozen=True)
class Entry:
    """One tensor of the file as its header describes it."""

    dtype: str
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Checked:
    """A capture file that passed every check: its calls' fields and its tensors' entries."""

    path: Path
    calls: list
    tensors: dict


# -- writing ---------------------------------------------------------------------------

def save_capture(path: str | Path, calls: list[CapturedCall]) -> Path:
    """Write calls to a safetensors file (the module docstring); returns path."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for n, c in enumerate(calls):
        for name in TENSORS:
            t = getattr(c, name)
            if t is not None:
                tensors[f"{n}.{name}"] = t.contiguous()
    index = [c.meta() for c in calls]
    save_file(tensors, str(path), metadata={"format": FORMAT, "calls": json.dumps(index)})
    return path


# -- the header ------------------------------------------------------------------------

def _bad(path, why: str) -> CaptureError:
    return CaptureError(f"{path} is not a flashnum capture ({FORMAT}, safetensors): {why}")


def _regular(path: Path) -> int:
    """The size of the regular file at path; CaptureError for anything else."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise MissingCapture(f"no capture file at {path} (valid: a file written by "
                             f"flashnum.capture)") from None
    except OSError as e:
        raise CaptureError(f"{path} cannot be read: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "a device, pipe or socket"
        raise _bad(path, f"it is {kind}, not a regular file")
    if st.st_size < 10:  # 8 bytes of length and the smallest JSON object, {}
        raise _bad(path, f"{st.st_size} bytes, too short for a safetensors file")
    return st.st_size


def _header(path: Path) -> tuple[dict, int]:
    """(the JSON header, the tensors' byte count), read with at most MAX_HEADER + 8 bytes."""
    size = _regular(path)
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if n < 2 or n > min(MAX_HEADER, size - 8):
                raise _bad(path, f"its header length {n} does not fit a file of {size} "
                                 f"bytes (safetensors' limit: {MAX_HEADER})")
            text = f.read(n)
    except OSError as e:
        raise CaptureError(f"{path} cannot be read: {e.strerror or e}") from None
    if len(text) != n:
        raise _bad(path, f"its header ends after {len(text)} of {n} bytes")
    try:
        header = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _bad(path, f"its header is not JSON ({type(e).__name__})") from None
    if not isinstance(header, dict):
        raise _bad(path, f"its header is a JSON {type(header).__name__}, not an object")
    return header, size - 8 - n


def _entries(path: Path, header: dict, data: int) -> dict[str, Entry]:
    """The tensors of the header, their byte ranges tiling the data exactly."""
    out, spans = {}, []
    for name, e in header.items():
        if name == "__metadata__":
            continue
        ok = isinstance(e, dict) and set(e) == {"dtype", "shape", "data_offsets"}
        ok = ok and e["dtype"] in DTYPES and _ints(e["shape"]) and _ints(e["data_offsets"])
        if not ok or len(e["data_offsets"]) != 2:
            raise _bad(path, f"tensor {name!r} has no valid dtype ({', '.join(DTYPES)}), "
                             f"shape and data_offsets: {str(e)[:80]}")
        a, b = e["data_offsets"]
        width = math.prod(e["shape"]) * DTYPES[e["dtype"]][0]
        if b - a != width:
            raise _bad(path, f"tensor {name!r} of shape {e['shape']} holds {width} bytes "
                             f"but its data_offsets span {b - a}")
        out[name] = Entry(e["dtype"], tuple(e["shape"]))
        spans.append((a, b))
    end = 0
    for a, b in sorted(spans):
        if a != end:
            raise _bad(path, f"its tensors' bytes leave a gap or overlap at byte {end}")
        end = b
    if end != data:
        raise _bad(path, f"its header describes {end} bytes of tensors but the file holds "
                         f"{data} after the header")
    return out


def _ints(x) -> bool:
    return isinstance(x, list) and all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in x)


# -- the index of calls ----------------------------------------------------------------

def _calls(path: Path, header: dict) -> list[dict]:
    meta = header.get("__metadata__")
    if not isinstance(meta, dict):
        raise _bad(path, "it has no metadata (was it written by flashnum.capture?)")
    if meta.get("format") != FORMAT:
        raise CaptureError(f"{path} is a capture of format {meta.get('format')!r}; this "
                           f"flashnum reads {FORMAT!r} (capture it again with this version)")
    if "calls" not in meta:
        raise _bad(path, "its metadata has no 'calls' (the index of recorded calls)")
    try:
        calls = json.loads(meta["calls"]) if isinstance(meta["calls"], str) else None
    except (ValueError, RecursionError):
        calls = None
    if not isinstance(calls, list) or not all(isinstance(m, dict) for m in calls):
        raise _bad(path, f"its metadata 'calls' is not a JSON list of call records: "
                         f"{str(meta['calls'])[:60]!r}")
    seen = set()
    for n, m in enumerate(calls):
        why = _call_fields(m)
        if why:
            raise _bad(path, f"call record {n}: {why}")
        if m["index"] in seen:
            raise _bad(path, f"call record {n}: index {m['index']} appears twice")
        seen.add(m["index"])
    return calls


def _num(x, lo=None, hi=None, positive=False) -> bool:
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    return ok and (lo is None or x >= lo) and (hi is None or x <= hi) and (
        not positive or x > 0)


def _idx_list(x) -> bool:
    return x is None or (_ints(x) and len(x) > 0)


CHECKS = {  # each field of a call record: its test, and what is valid
    "index": (lambda x: _ints([x]), "an integer >= 0"),
    "module": (lambda x: isinstance(x, str), "a string"),
    "module_type": (lambda x: isinstance(x, str), "a string"),
    "is_causal": (lambda x: isinstance(x, bool), "true or false"),
    "causal": (lambda x: any(x is c or (isinstance(x, str) and x == c) for c in CAUSAL),
               "false, true or \"top_left\""),
    "scale": (lambda x: _num(x, positive=True), "a finite number > 0"),
    "scale_given": (lambda x: x is None or _num(x), "null or a finite number"),
    "mask_kind": (lambda x: x in MASK_KINDS, ", ".join(MASK_KINDS)),
    "dropout_p": (lambda x: _num(x, 0.0, 1.0), "a number in [0, 1]"),
    "enable_gqa": (lambda x: isinstance(x, bool), "true or false"),
    "heads": (_idx_list, "null or a list of integers >= 0"),
    "rows": (_idx_list, "null or a list of integers >= 0"),
    "shape": (lambda x: isinstance(x, dict) and all(_ints(s) for s in x.values()),
              "an object of shapes"),
    "dtype": (lambda x: isinstance(x, str), "a string"),
}


def _call_fields(m: dict) -> str | None:
    """What is wrong with one call record's fields, or None."""
    extra = sorted(set(m) - set(FIELDS))
    if extra:
        return f"unknown field(s) {', '.join(map(repr, extra))}; valid: {', '.join(FIELDS)}"
    missing = [f for f in REQUIRED if f not in m]
    if missing:
        return f"no {', '.join(missing)}"
    for name, x in m.items():
        test, valid = CHECKS[name]
        if not test(x):
            return f"{name} is {json.dumps(x)[:40]}; valid: {valid}"
    return None


def _call_tensors(path: Path, n: int, m: dict, tensors: dict) -> None:
    """The tensors of the n-th call: q, k, v present, floating, 4-d, shapes that agree."""
    t = {name: tensors.get(f"{n}.{name}") for name in TENSORS}
    where = f"call record {n} (index {m['index']})"
    for name in ("q", "k", "v"):
        if t[name] is None:
            raise _bad(path, f"{where} has no tensor {n}.{name}")
    for name, e in t.items():
        if e is None:
            continue
        if len(e.shape) != 4 or 0 in e.shape:
            raise _bad(path, f"{where}: {name} has shape {list(e.shape)}; valid: (batch, "
                             f"heads, N, d), every dim >= 1")
        if e.dtype not in FLOATS and not (name == "mask" and e.dtype == "BOOL"):
            raise _bad(path, f"{where}: {name} has dtype {e.dtype}; valid: a float dtype")
    (b, h, nq, d), (nk, dv) = t["q"].shape, (t["k"].shape[2], t["v"].shape[3])
    want = dict(k=(b, h, nk, d), v=(b, h, nk, dv), do=(b, h, nq, dv), mask=(b, h, nq, nk))
    for name, shape in want.items():
        if t[name] is not None and t[name].shape != shape:
            raise _bad(path, f"{where}: {name} has shape {list(t[name].shape)}, q "
                             f"{list(t['q'].shape)} asks for {list(shape)}")
    if (t["mask"] is not None) != (m.get("mask_kind", "none") in ("bool", "additive")):
        raise _bad(path, f"{where}: mask_kind {m.get('mask_kind', 'none')!r} and the "
                         f"tensor {n}.mask disagree")


def check_file(path: str | Path) -> Checked:
    """Every check of the module docstring (no tensor read); CaptureError on the first
    that fails. Remembered per (path, size, modification time)."""
    path = Path(path)
    key = _key(path)
    if key in _CHECKED:
        return _CHECKED[key]
    header, data = _header(path)
    tensors = _entries(path, header, data)
    calls = _calls(path, header)
    names = {f"{n}.{t}" for n in range(len(calls)) for t in TENSORS}
    extra = sorted(set(tensors) - names)
    if extra:
        raise _bad(path, f"tensor(s) {', '.join(extra[:3])} belong to no call record")
    for n, m in enumerate(calls):
        _call_tensors(path, n, m, tensors)
    _CHECKED[key] = Checked(path, calls, tensors)
    return _CHECKED[key]


def _key(path: Path) -> tuple:
    try:
        st = path.stat()
    except OSError:
        return (str(path), None)  # never cached: _regular says what is wrong
    return (str(path.resolve()), st.st_size, st.st_mtime_ns)


_CHECKED: dict = {}


# -- reading ---------------------------------------------------------------------------

def capture_index(path: str | Path) -> list[dict]:
    """The index of a capture file (every call's fields but its tensors), tensors unread."""
    return [dict(m) for m in check_file(path).calls]


def _position(path, c: Checked, call: int) -> int:
    """The record number of the call whose index is `call`; ValueError naming those held."""
    for n, m in enumerate(c.calls):
        if m["index"] == call:
            return n
    have = [m["index"] for m in c.calls]
    if not have:
        raise ValueError(f"{path} holds no attention calls")
    raise ValueError(f"{path} holds no call {call!r}; valid: {_ranges(have)}")


def load_bytes(path: str | Path, call: int) -> int:
    """What reading call `call` as float64 costs: its tensors as stored and in float64."""
    c = check_file(path)
    n = _position(path, c, call)
    return sum(e.numel * (DTYPES[e.dtype][0] + 8) for name in TENSORS
               if (e := c.tensors.get(f"{n}.{name}")) is not None)


def call_shapes(path: str | Path, call: int) -> dict[str, tuple[int, ...]]:
    """The shapes of call `call`'s tensors (q, k, v; do and mask when held), unread."""
    c = check_file(path)
    n = _position(path, c, call)
    return {name: c.tensors[f"{n}.{name}"].shape for name in TENSORS
            if f"{n}.{name}" in c.tensors}


def load_capture(path: str | Path, calls=None) -> list[CapturedCall]:
    """The calls of a capture file, as cap.calls had them; `calls`: indices to read (None:
    all). Read by safetensors (no pickle), after every check of the module docstring:
    CaptureError (a ValueError) for a file that is not a capture of this format."""
    from safetensors import safe_open

    c = check_file(path)
    if calls is None:
        want = None
    else:
        try:
            want = {int(i) for i in calls}
        except (TypeError, ValueError):
            raise ValueError(f"calls must be None or an iterable of call indices, got "
                             f"{calls!r}") from None
    try:
        f = safe_open(str(path), framework="pt")
    except Exception as e:  # checked above: only a file changed meanwhile lands here
        raise _bad(path, str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    out = []
    for n, m in enumerate(c.calls):
        if want is not None and m["index"] not in want:
            continue
        t = {name: f.get_tensor(f"{n}.{name}") if f"{n}.{name}" in c.tensors else None
             for name in TENSORS}
        out.append(CapturedCall(**m, **t))
    return out


def load_call(path: str | Path, call: int) -> CapturedCall:
    """The call of a capture file whose index is `call`; ValueError naming those it holds."""
    _position(path, check_file(path), call)
    return load_capture(path, calls=[call])[0]


def _ranges(xs: list[int]) -> str:
    """1, 2, 3, 5 -> '1-3, 5'."""
    out, xs = [], sorted(xs)
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ", ".join(out)


def file_sha256(path: str | Path) -> str:
    """sha256 of a capture file's bytes, after check_file: what names its content in a case
    id. Remembered per (path, size, modification time): a grid hashes one file once."""
    check_file(path)
    key = _key(Path(path))
    if key not in _SHA256:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _SHA256[key] = h.hexdigest()
    return _SHA256[key]


_SHA256: dict = {}
