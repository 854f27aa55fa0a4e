"""The fused backward: every (batch, head) through FlashAttention-2's Algorithm 2 in one C loop.

    from flashnum.engine import fused_backward
    why = fused_backward.claim(ar, scale_s, shape)     # None: the fused loop runs it
    fused_backward.run(ar, Padded(q, k, v, do, lse, delta), perm, vis, bm, bn, scale_s,
                       exp2, Grads(dq, dk, dv, None))  # fills dq, dk, dv in place

flashnum.engine.backward._flash runs each key block over every query row at once with
torch ops: every tile goes through memory between the GEMMs, the exp, dS and the tile
sums, and the dV and dK tile sums are Python loops. Here fused_backward.c's
`fn_fused_backward` runs one head through all its key blocks (dQ's order) and query blocks
while the tiles stay in cache, on torch's OpenMP threads over (batch, head). It performs
the torch loop's operations in its order, so it changes no bit of any result:

  - the five GEMMs per tile (S, dP, dV, dK, dQ) are flashnum.numerics.accumulate's
    chains (each dot one FMA chain over k from +0, the torch loop's accumulate.dot),
    compiled into the loop from accumulate.c on the path accumulate.isa() names;
  - the exp is native.c's correctly rounded exp_round (the exp site's own kernel), the
    bf16 and fp16 casts round to nearest even as torch's casts do;
  - rowsum(dS) (measure_ds) is accumulate.c's cascade (accumulate.rowsum);
  - every fp32 operation is the one IEEE operation the torch loop performs
    (-ffp-contract=off); dQ, dK and dV accumulate in the same order.

`claim` is the one place that decides what the fused loop runs: the flash structure on
the fp32 carrier, round to nearest, S, the LSE, P, dP, dS and the dQ, dK, dV accumulators
fp32, the five GEMMs accumulated in fp32, P and dS cast to fp32, bf16 or fp16, exp or
exp2, any dQ order, causal or not, ragged, with or without measure_ds. The fa2 preset in
bf16, fp16 and fp32 is of that form; lowp, naive and exact are not. Anything else, or no
compiler, or FLASHNUM_FUSED=0, runs the torch loop. tests/test_fused_backward.py
checks the two bit for bit over the shipped backward experiments' grids.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import threading
from pathlib import Path
from typing import NamedTuple

import torch

from flashnum.engine import native
from flashnum.numerics import accumulate, build

_SRC = Path(__file__).with_name("fused_backward.c")
CASTS = {"fp32": 0, "bf16": 1, "fp16": 2}  # P and dS casts the C loop rounds itself
FP32_SITES = ("s", "lse", "p", "dp", "ds", "dv", "dk", "dq",
              "qk_acc", "dp_acc", "dv_acc", "dk_acc", "dq_acc")
ROWS = 256  # query rows per GEMM of S, dP and dQ (a multiple of block_m)

_enabled = os.environ.get("FLASHNUM_FUSED", "1") != "0"
_lock = threading.Lock()
_lib: list = []  # [the library] once built, [None] if it cannot be
_why = ""


class _Job(ctypes.Structure):
    """fused_backward.c's bwd_job."""

    _fields_ = (
        [("isa", ctypes.c_int)]
        + [(n, ctypes.c_void_p) for n in ("q", "k", "v", "dout", "lse", "delta", "kt", "vt",
                                          "perm", "vis")]
        + [(n, ctypes.c_int64) for n in ("B", "nqp", "nkp", "bm", "bn", "d", "dv", "n_kb",
                                         "g")]
        + [("scale", ctypes.c_float)]
        + [(n, ctypes.c_int) for n in ("base2", "p_cast", "ds_cast")]
        + [(n, ctypes.c_void_p) for n in ("dq", "dk", "dvv", "ds_rowsum")])


def set_enabled(flag: bool) -> None:
    """Turn the fused backward on or off for this process (tests and benchmarks compare)."""
    global _enabled
    _enabled = bool(flag)


def _build() -> ctypes.CDLL:
    """native.c's text with fused_backward.c after it, compiled once by flashnum.numerics.build
    with native's flags and native's corrections for the hard exp inputs (found by
    native._probe_fixes on the exp part alone, whose build native's own has cached)."""
    torch_lib = Path(torch.__file__).parent / "lib"
    how = dict(libs=[f"-Wl,-rpath,{torch_lib}"], extra=(torch.__version__, repr(native.HARD)))
    flag_sets = [native._GCC_TUNE + native._FLAGS, native._FLAGS]
    fixes = native._probe_fixes(flag_sets, how)
    lib = native._open(build.shared_library("fused_backward",
                                            accumulate.source() + native.source(fixes)
                                            + _SRC.read_text(),
                                            flag_sets, **how))
    missed = native._kernel_misses(lib)
    if any(missed.values()):
        raise OSError(f"kernel not correctly rounded on {missed}")
    lib.fn_fused_backward.restype = None
    lib.fn_fused_backward.argtypes = [ctypes.c_void_p, ctypes.c_int]
    return lib


def library() -> ctypes.CDLL | None:
    """The loaded library (built on first call), or None (status() says why)."""
    global _why
    if not _lib:
        with _lock:
            if not _lib:
                try:
                    if not native.available():
                        raise OSError(native.status())
                    _lib.append(_build())
                except (OSError, subprocess.SubprocessError) as e:
                    _why = str(e)
                    _lib.append(None)
    return _lib[0]


def status() -> str:
    """One line: whether the fused backward can run in this process, and if not why."""
    if not _enabled:
        return "off (disabled)"
    if library() is None or accumulate.isa() == "torch":
        return f"off (library: {_why or 'built'}; accumulate: {accumulate.status()})"
    return f"on (flashnum.engine.fused_backward, {accumulate.isa()})"


def _is_fp32(f) -> bool:
    return getattr(f, "name", None) == "fp32" and not getattr(f, "saturate", False)


def claim(ar, scale_s: float, shape: tuple[int, ...], measure_ds: bool = False) -> str | None:
    """None if the fused loop runs this flash-structure call bit-identically, else why not.

    ar: the backward's Arith; scale_s: the scale as the s site holds it; shape:
    (bm, bn, d, dv, rows, nqp): rows per GEMM (`group` query blocks), padded query rows."""
    if not _enabled:
        return "disabled"
    if ar.dtype is not torch.float32 or ar.stochastic:
        return "not the fp32 carrier with round to nearest"
    wide = [s for s in FP32_SITES if not _is_fp32(ar.fmt(s))]
    if wide:
        return f"site {wide[0]} is {ar.fmt(wide[0])}, not fp32"
    for site in ("p_cast", "ds_cast"):
        f = ar.fmt(site)
        if getattr(f, "name", None) not in CASTS or getattr(f, "saturate", False):
            return f"{site} is {f}"
    if not 0.0 < scale_s < float("inf"):
        return f"the scale as stored is {scale_s}"
    if library() is None or accumulate.isa() == "torch":
        return "no native kernel"
    return None


def group(n_qb: int, bm: int) -> int:
    """Query blocks per GEMM of S, dP and dQ: the most that divide n_qb within ROWS rows."""
    g = max(1, min(n_qb, ROWS // bm))
    while n_qb % g:
        g -= 1
    return g


class Padded(NamedTuple):
    """backward._flash's operands, rows padded to whole blocks: (B, N, .) fp32 tensors,
    lse the row LSE shifted by 0 where a row is fully masked, delta = rowsum(dO * O)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    do: torch.Tensor
    lse: torch.Tensor
    delta: torch.Tensor


class Grads(NamedTuple):
    """The zeroed fp32 accumulators run() fills in place (ds_rowsum: None when unmeasured)."""

    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    ds_rowsum: torch.Tensor | None


def run(ar, x: Padded, perm: list[int], vis: torch.Tensor, bm: int, bn: int, scale_s: float,
        exp2: bool, g: Grads) -> None:
    """Algorithm 2 on the padded operands x into the accumulators g, in place. vis: (nqp,)
    int64, the keys each (padded) row sees, a prefix (0 for padding rows). Call after
    claim() said None."""
    qp, kp, vp, dop, lse, delta = (t.contiguous() for t in x)
    B, nqp, d = qp.shape
    nkp, dvw = kp.shape[1], vp.shape[-1]
    perm_t = torch.tensor(perm, dtype=torch.int64)
    # K_j^T and V_j^T of every key block, (B, n_kb, d | dv, bn): B of the tiles' S and dP
    kt, vt = (t.reshape(B, nkp // bn, bn, -1).transpose(-1, -2).contiguous() for t in (kp, vp))
    vis = vis.to(torch.int64).contiguous()
    for acc in [a for a in g if a is not None]:
        assert acc.is_contiguous() and acc.dtype is torch.float32
    job = _Job(
        accumulate.ISAS[accumulate.isa()], qp.data_ptr(), kp.data_ptr(), vp.data_ptr(),
        dop.data_ptr(), lse.data_ptr(), delta.data_ptr(), kt.data_ptr(), vt.data_ptr(),
        perm_t.data_ptr(), vis.data_ptr(),
        B, nqp, nkp, bm, bn, d, dvw, len(perm), group(nqp // bm, bm),
        scale_s, int(exp2), CASTS[ar.fmt("p_cast").name], CASTS[ar.fmt("ds_cast").name],
        g.dq.data_ptr(), g.dk.data_ptr(), g.dv.data_ptr(),
        None if g.ds_rowsum is None else g.ds_rowsum.data_ptr())
    library().fn_fused_backward(ctypes.byref(job), torch.get_num_threads())


__all__ = ["Grads", "Padded", "claim", "group", "run", "set_enabled", "status", "CASTS"]
