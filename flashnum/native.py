"""A fused C kernel for the engine's hottest site: P = fp32(exp(s - m)) and its cast.

The emulator's model of the exp site is "evaluate in float64, round once to fp32"
(flashnum.engine.Arith.exp). In torch that takes five passes over every logit tile
(subtract, widen, exp, narrow, cast) and torch's float64 exp (MKL VML) is slow; this
kernel does the same arithmetic in one pass (flashnum/native.c, derivation and error
bound in its header):

    exp_rows(s, m, p, pc=None, base2=False)   # p = fp32(exp(s - m[:, None])), pc = cast(p)

It is an accelerator, never a different model: on every float32 input the fp32
value equals the torch path's, and both are the correctly rounded exp
(`python bench/exp_exhaustive.py` checks all 2.2e9 inputs; tests check a sample and
the hard cases). So a result never depends on whether the kernel was used.

Built on first use with the system C compiler (cc, or $CC) into a cache directory
($FLASHNUM_CACHE, else ~/.cache/flashnum), linked against the OpenMP runtime torch
already loaded so that both share one thread pool. Without a compiler, on a CPU
other than x86-64, or with FLASHNUM_NATIVE=0, `available()` is False, `status()`
says why, and the engine takes the torch path.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

_SRC = Path(__file__).with_name("native.c")
# -ffp-contract=off: every operation is the IEEE one written (no FMA), at any vector
# width; -fno-trapping-math only lets selects vectorise (no operation changes)
_FLAGS = ["-O3", "-fopenmp", "-ffp-contract=off", "-fno-trapping-math", "-fno-math-errno",
          "-fPIC", "-shared"]
# GCC's generic tuning refuses vector gathers (the table lookup); try these first
_GCC_TUNE = ["-mtune-ctrl=use_gather_2parts,use_gather_4parts,use_gather"]
CASTS = {None: 0, "bf16": 1}  # the P casts the kernel rounds itself

_lock = threading.Lock()
_lib = None
_why = None  # why the kernel is not available (None: not tried yet or available)


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


def source() -> str:
    """native.c with its constants filled in."""
    text = _SRC.read_text()
    for name, value in _constants().items():
        text = text.replace(f"@{name}@", value)
    return text


def _cache_dir() -> Path:
    root = os.environ.get("FLASHNUM_CACHE") or Path.home() / ".cache" / "flashnum"
    return Path(root)


def _build() -> ctypes.CDLL:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise OSError("no C compiler (set CC)")
    src = source()
    torch_lib = Path(torch.__file__).parent / "lib"
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256("\0".join([src, " ".join(_FLAGS + _GCC_TUNE), version, str(torch_lib)]).encode())
    out = _cache_dir() / f"native-{key.hexdigest()[:16]}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            c_file, so = Path(tmp) / "native.c", Path(tmp) / "native.so"
            c_file.write_text(src)
            # rpath to torch's lib: its libgomp (already loaded) serves our OpenMP loops
            cmd = [cc, *_FLAGS, str(c_file), "-o", str(so), f"-Wl,-rpath,{torch_lib}"]
            r = subprocess.run(cmd[:1] + _GCC_TUNE + cmd[1:], capture_output=True, text=True)
            if r.returncode != 0:  # not GCC: its own tuning
                r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                raise OSError(f"{cc} failed: {r.stderr.strip().splitlines()[-1:]}")
            os.replace(so, out)  # atomic: concurrent builders agree on the file
    lib = ctypes.CDLL(str(out))
    f = lib.fn_exp_rows
    f.restype = None
    f.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 2 + [ctypes.c_int] * 3
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
             base2: bool = False) -> bool:
    """p = fp32(exp(s - m[..., None])) (exp2 if base2), pc = cast(p); False if unavailable.

    s, p, pc: contiguous float32 of one shape (..., n); m: contiguous float32 (...) or
    None (x = s). p may be s. Returns False, writing nothing, when the kernel is not
    available or the arguments are not of that form.
    """
    lib = _load()
    if lib is None or cast not in CASTS:
        return False
    ok = s.dtype is torch.float32 and p.dtype is torch.float32 and s.is_contiguous()
    ok = ok and p.is_contiguous() and p.shape == s.shape and s.device.type == "cpu"
    if m is not None:
        ok = ok and m.dtype is torch.float32 and m.is_contiguous() and m.numel() * (
            s.shape[-1] if s.dim() else 1) == s.numel()
    if cast is not None:
        ok = ok and pc is not None and pc.dtype is torch.float32 and pc.is_contiguous()
        ok = ok and pc.shape == s.shape
    if not ok:
        return False
    n = s.shape[-1] if s.dim() else 1
    rows = s.numel() // n if n else 0
    if rows == 0:
        return True
    # small tiles are not worth waking the thread pool for
    nt = torch.get_num_threads() if s.numel() >= 1 << 15 else 1
    lib.fn_exp_rows(s.data_ptr(), m.data_ptr() if m is not None else None, p.data_ptr(),
                    pc.data_ptr() if pc is not None else None, rows, n, int(base2),
                    CASTS[cast], nt)
    return True


__all__ = ["available", "status", "exp_rows", "set_enabled", "source", "CASTS"]
