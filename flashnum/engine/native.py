"""Fused C kernels for the emulator's hottest sites (flashnum/engine/native.c).

The emulator's model of the exp site is "evaluate in float64, round once to fp32"
(flashnum.engine.arith.Arith.exp). In torch that takes five passes over every logit tile
(scale, subtract, widen, exp, narrow) plus two for P's bf16 cast, and torch's float64
exp (MKL VML) is slow. These kernels do the same arithmetic in fewer passes:

    exp_rows(s, m, p, pc, "bf16", base2, scale)  # p = fp32(exp(fl(fl(s c) - m))), pc = bf16(p)
    rescale_add(o, alpha, pv)                    # o = fl(fl(o alpha) + pv), in place
    round_bf16(x)                                # torch's x.to(bfloat16).to(float32)

They are accelerators, never a different model: on every float32 argument the exp
value equals the torch path's and both are correctly rounded (`python -m
flashnum.run experiment=exp_exhaustive` checks all 4.5e9 arguments of exp and exp2, and the bf16
rounding on all 2^32 bit patterns; tests check samples and the hard cases). So a
result never depends on whether the kernels were used (docs/engine.md).

Built on first use with the system C compiler (cc, or $CC) by flashnum.numerics.build into
its cache ($FLASHNUM_CACHE, else ~/.cache/flashnum; keyed by source, flags, compiler and
CPU), linked against the OpenMP runtime torch already loaded so that both share one
thread pool. Without a compiler, on a CPU
other than x86-64, or with FLASHNUM_NATIVE=0, `available()` is False, `status()`
says why, and the engine takes the torch path.
"""

from __future__ import annotations

import ctypes
import functools
import math
import os
import platform
import subprocess
import threading
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

from flashnum.numerics import accumulate, build, elementary

_SRC = Path(__file__).with_name("native.c")
# -ffp-contract=off: every operation is the IEEE one written (no FMA), at any vector
# width; -fno-trapping-math only lets selects vectorise (no operation changes)
_FLAGS = ["-O3", "-fopenmp", "-ffp-contract=off", "-fno-trapping-math", "-fno-math-errno",
          "-fPIC", "-shared"]
# GCC's generic tuning refuses vector gathers (the table lookup); try these first
_GCC_TUNE = ["-mtune-ctrl=use_gather_2parts,use_gather_4parts,use_gather"]
CASTS = {None: 0, "bf16": 1}  # the P casts the kernel rounds itself

# The float32 inputs whose exp (exp2) lies within 4 float64 ulps of an fp32 rounding
# boundary, found by the experiment exp_exhaustive over every float32 input. On any
# other input a float64 evaluation with error below 2 ulps (MKL's and SLEEF's are below
# 1, the kernel's below 1.3) rounds to the correctly rounded fp32 value; on these both
# paths are checked against mpmath when first used and corrected where they miss.
HARD = {
    "exp": [1.5199068911897484e-05, 0.00010996452328981832, 0.0003790732880588621,
            -2.9802322387695312e-08, -0.0017157304100692272, -0.007352583575993776,
            -14.567090034484863],
    "exp2": [8.599132428344092e-08, 4.041586635139538e-06, 0.00051697320304811,
             0.0029695758130401373, 0.007975024171173573, -6.449350848924951e-07,
             -0.00010100034705828875, -0.0018018260598182678, -0.029743773862719536,
             -0.15543314814567566, -150.0],
}

_lock = threading.Lock()
_lib = None
_why = None  # why the kernel is not available (None: not tried yet or available)


@functools.cache
def _constants() -> dict[str, str]:
    """The kernel's constants, from mpmath, as C hex literals (see native.c)."""
    import mpmath as mp

    with mp.workprec(256):
        k = 256 / mp.log(2)
        e = int(mp.floor(mp.log(k, 2)))
        k_hi = mp.nint(k * 2 ** (28 - e)) / 2 ** (28 - e)  # 29 significant bits
        c = {f"C{i}": float((mp.log(2) / 256) ** i / mp.factorial(i)) for i in range(1, 5)}
        table = [float(mp.mpf(2) ** (mp.mpf(j) / 256)) for j in range(256)]
        out = {"KHI": float(k_hi), "KLO": float(k - k_hi), **c}
    lit = {name: x.hex() for name, x in out.items()}
    lit["TABLE"] = ", ".join(x.hex() for x in table)
    return lit


def correctly_rounded(x: float, base2: bool = False) -> float:
    """The fp32 value nearest exp(x) (exp2(x)), ties to even, from mpmath at 200 bits."""
    import mpmath as mp

    with mp.workprec(200):
        v = mp.mpf(2) ** x if base2 else mp.exp(x)
        exact = Fraction(int(mp.nint(v * mp.mpf(2) ** 300)), 2**300)
    if exact >= 2**128 - 2**103:  # at or past fp32's overflow threshold
        return math.inf
    c = np.float32(float(v))
    cands = [np.nextafter(c, np.float32(0)), c, np.nextafter(c, np.float32(np.inf))]
    return float(min(cands, key=lambda z: (abs(Fraction(float(z)) - exact),
                                           int(z.view(np.uint32)) & 1)))


@functools.cache
def _hard(fn: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The hard inputs of exp or exp2 and their correctly rounded fp32 values."""
    x = torch.tensor(HARD[fn], dtype=torch.float32)
    return x, torch.tensor([correctly_rounded(float(v), fn == "exp2") for v in x])


def _misses(evaluate, fn: str) -> list[tuple[float, float]]:
    """(x, correct value) for the hard inputs on which `evaluate(x, base2)` is wrong."""
    x, want = _hard(fn)
    got = evaluate(x, fn == "exp2")
    return [(float(a), float(w)) for a, g, w in zip(x, got, want, strict=True) if g != w]


@functools.cache
def float64_fixes(base2: bool) -> list[tuple[float, float]]:
    """The hard inputs whose fp32 exp (exp2) the torch path's float64 one (the correctly
    rounded flashnum.numerics.elementary.exp, then rounded to fp32 again) rounds wrongly,
    with the right values: the same list on every machine."""
    def evaluate(x, b2):
        return (elementary.exp2(x.double()) if b2 else elementary.exp(x.double())).float()
    return _misses(evaluate, "exp2" if base2 else "exp")


def fix_float64(x: torch.Tensor, p: torch.Tensor, base2: bool) -> None:
    """Correct p = fp32(exp(x)) in place on the hard inputs float64 misses (float64_fixes)."""
    for h, v in float64_fixes(base2):
        p.masked_fill_(x == h, v)


def source(fixes: dict[str, list[tuple[float, float]]] | None = None) -> str:
    """native.c with its constants, and corrections for the hard inputs it misses, filled in."""
    text = _SRC.read_text()
    for name, value in _constants().items():
        text = text.replace(f"@{name}@", value)
    for fn in ("exp", "exp2"):
        stmts = " ".join(f"r = xf == {float(h).hex()}f ? {float(v).hex()}f : r;"
                         for h, v in (fixes or {}).get(fn, []))
        text = text.replace(f"@FIX_{fn.upper()}@", stmts)
    return text


def _open(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    f = lib.fn_exp_rows
    f.restype = None
    f.argtypes = [ctypes.c_void_p, ctypes.c_float] + [ctypes.c_void_p] * 3 + [
        ctypes.c_int64] * 2 + [ctypes.c_int] * 3
    g = lib.fn_rescale_add
    g.restype = None
    g.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2 + [ctypes.c_int]
    h = lib.fn_round_bf16
    h.restype = None
    h.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64, ctypes.c_int]
    st = lib.fn_fa2_state
    st.restype = ctypes.c_int
    st.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64, ctypes.c_int]
    lib.fn_fused_forward.restype = None
    lib.fn_fused_forward.argtypes = [ctypes.c_void_p, ctypes.c_int]  # flashnum.engine.fused
    lib.fn_fused_forward_v4.restype = ctypes.c_int
    lib.fn_fused_forward_v4.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.fn_exp_site.restype = None
    lib.fn_exp_site.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] + [ctypes.c_int] * 2
    return lib


def _kernel_misses(lib: ctypes.CDLL) -> dict[str, list[tuple[float, float]]]:
    def evaluate(x, base2):
        p = torch.empty_like(x)
        lib.fn_exp_rows(x.data_ptr(), 1.0, None, p.data_ptr(), None, 1, x.numel(), int(base2),
                        0, 1)
        return p
    return {fn: _misses(evaluate, fn) for fn in ("exp", "exp2")}


# where native.c's exp kernels end and the fused loops (long to compile) begin
_FUSED_PART = "/* " + "-" * 87 + "\n   The fused forward"


def _probe_fixes(flag_sets, how) -> dict[str, list[tuple[float, float]]]:
    """The corrections exp_round needs for the hard inputs, found on a build of native.c's
    first part alone (its exp kernels: seconds to compile, where the whole file takes a
    minute); every operation is the IEEE one written (-ffp-contract=off), so exp_round
    gives the same values wherever it is compiled, and _build checks the full library."""
    text = source()
    lib = ctypes.CDLL(str(build.shared_library("native_probe", text[: text.index(_FUSED_PART)],
                                               flag_sets, **how)))
    f = lib.fn_exp_rows
    f.restype = None
    f.argtypes = [ctypes.c_void_p, ctypes.c_float] + [ctypes.c_void_p] * 3 + [
        ctypes.c_int64] * 2 + [ctypes.c_int] * 3
    return _kernel_misses(lib)


def _build() -> ctypes.CDLL:
    """Compile (flashnum.numerics.build: once per source, flags, compiler, CPU and torch) with
    corrections for the hard inputs exp_round misses (_probe_fixes), then check them."""
    torch_lib = Path(torch.__file__).parent / "lib"
    # rpath to torch's lib: its libgomp (already loaded) serves our OpenMP loops
    how = dict(libs=[f"-Wl,-rpath,{torch_lib}"], extra=(torch.__version__, repr(HARD)))
    flag_sets = [_GCC_TUNE + _FLAGS, _FLAGS]  # GCC's tuning, else the compiler's own
    # accumulate.c first: the fused loops' dots and sums are its chains and cascade
    text = accumulate.source() + source(_probe_fixes(flag_sets, how))
    lib = _open(build.shared_library("native", text, flag_sets, **how))
    missed = _kernel_misses(lib)
    if any(missed.values()):
        raise OSError(f"kernel not correctly rounded on {missed}")
    return lib


def _load():
    global _lib, _why
    if _lib is not None or _why is not None:
        return _lib
    with _lock:
        if _lib is not None or _why is not None:
            return _lib
        if os.environ.get("FLASHNUM_NATIVE", "1") == "0":
            _why = "disabled by FLASHNUM_NATIVE=0"
        elif platform.machine().lower() not in ("x86_64", "amd64"):
            _why = f"no kernel for {platform.machine()} (x86-64 only)"
        else:
            try:
                _lib = _build()
            except (OSError, subprocess.SubprocessError) as e:
                _why = f"not built: {e}"
    return _lib


def library() -> ctypes.CDLL | None:
    """The loaded kernel library (built on first call), or None (see status())."""
    return _load()


def available() -> bool:
    """Whether the kernel is built and loaded (builds it on the first call)."""
    return _load() is not None


def status() -> str:
    """One line: which exp path the engine's fp32 fast path takes, and why."""
    return "native C kernel" if available() else f"torch path ({_why})"


def set_enabled(flag: bool) -> None:
    """Turn the kernel on or off for this process (tests compare the two paths)."""
    global _lib, _why
    with _lock:
        _lib, _why = None, (None if flag else "disabled by set_enabled(False)")


def exp_rows(s: torch.Tensor, m: torch.Tensor | None, p: torch.Tensor,
             pc: torch.Tensor | None = None, cast: str | None = None,
             base2: bool = False, scale: float = 1.0) -> bool:
    """p = fp32(exp(s * scale - m[..., None])) (exp2 if base2), pc = cast(p); False if
    unavailable. The product and the difference are each rounded to fp32 (scale must be
    an fp32 value; 1 adds nothing).

    s, p, pc: contiguous float32 of one shape (..., n); m: contiguous float32 (...) or
    None (x = s). p may be s. Returns False, writing nothing, when the kernel is not
    available or the arguments are not of that form.
    """
    lib = _load()
    if lib is None or cast not in CASTS or not (_rows_of(s, m) and _rows_of(p, None)):
        return False
    if p.shape != s.shape or (cast is not None and not (
            pc is not None and _rows_of(pc, None) and pc.shape == s.shape)):
        return False
    n = s.shape[-1]
    if s.numel():
        lib.fn_exp_rows(s.data_ptr(), scale, m.data_ptr() if m is not None else None,
                        p.data_ptr(),
                        pc.data_ptr() if pc is not None else None, s.numel() // n, n,
                        int(base2), CASTS[cast], _threads(s.numel()))
    return True


def _rows_of(x: torch.Tensor, m: torch.Tensor | None) -> bool:
    """x a contiguous float32 CPU tensor (..., n); m, if given, contiguous float32 (...)."""
    ok = x.dtype is torch.float32 and x.is_contiguous() and x.is_cpu and x.dim() > 0
    if m is not None:
        ok = ok and m.dtype is torch.float32 and m.is_contiguous() and (
            m.numel() * x.shape[-1] == x.numel())
    return ok


def _threads(numel: int) -> int:
    # small tiles are not worth waking the thread pool for
    return torch.get_num_threads() if numel >= 1 << 15 else 1


def rescale_add(o: torch.Tensor, alpha: torch.Tensor, pv: torch.Tensor) -> bool:
    """o = o * alpha[..., None] + pv in place, two fp32 roundings; False if unavailable.

    The accumulator update of an fa2 step in one pass (torch: o.mul_(alpha).add_(pv)).
    """
    lib = _load()
    if lib is None or not (_rows_of(o, alpha) and _rows_of(pv, None) and pv.shape == o.shape):
        return False
    n = o.shape[-1]
    if o.numel():
        lib.fn_rescale_add(o.data_ptr(), alpha.data_ptr(), pv.data_ptr(), o.numel() // n, n,
                           _threads(o.numel()))
    return True


def fa2_state(m: torch.Tensor, m_blk: torch.Tensor, n_rescales: torch.Tensor,
              m_safe: torch.Tensor, alpha: torch.Tensor, base2: bool = False) -> bool | None:
    """One fa2 step's softmax state, in place; None (nothing written) if unavailable.

    m becomes max(m, m_blk); n_rescales (int64) counts the rows whose finite m grew;
    m_safe is the new m where finite, else 0; alpha = fp32(exp(fl(m_old - m_safe))).
    Returns whether every new m is finite. All contiguous, one value per row.
    """
    lib = _load()
    ts = (m, m_blk, m_safe, alpha)
    if lib is None or not all(_rows_of(t.view(-1), None) for t in ts):
        return None
    if n_rescales.dtype is not torch.int64 or not n_rescales.is_contiguous() or not all(
            t.numel() == m.numel() for t in (*ts, n_rescales)):
        return None
    return bool(lib.fn_fa2_state(m.data_ptr(), m_blk.data_ptr(), n_rescales.data_ptr(),
                                 m_safe.data_ptr(), alpha.data_ptr(), m.numel(), int(base2)))


def round_bf16(x: torch.Tensor) -> torch.Tensor | None:
    """bf16(x) as a new float32 tensor (torch's x.to(bfloat16).to(float32)); None if unavailable."""
    lib = _load()
    if lib is None or not _rows_of(x, None):
        return None
    y = torch.empty_like(x)
    if x.numel():
        lib.fn_round_bf16(x.data_ptr(), y.data_ptr(), x.numel(), _threads(x.numel()))
    return y


__all__ = ["available", "status", "exp_rows", "set_enabled", "source", "CASTS", "HARD",
           "correctly_rounded", "float64_fixes", "fix_float64", "rescale_add",
           "round_bf16", "fa2_state"]
