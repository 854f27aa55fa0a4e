"""Native code built in one place: a C source compiled into a shared library, cached, and
a line saying what was loaded or why not.

    from flashnum.numerics import build
    so = build.shared_library("torch_cpu", src, [["-O3", "-march=native", ...]], libs=["-lm"])
    build.report()      # {"torch_cpu": "built: ~/.cache/flashnum/torch_cpu-<key>.so", ...}

A library is compiled once per cache key: the source text, the flags, the compiler (its
path and `--version`), the CPU (model and feature flags) and any text the caller adds
(torch's version, say; never a path of one environment, so that every virtual environment
on the machine shares one build). So different nodes of a cluster that share a home
folder never load each other's -march=native build: a node with other CPU flags gets
another file. The cache is $FLASHNUM_CACHE, else ~/.cache/flashnum.

One build per machine: the builder holds an flock on `.<name>-<key>.lock` in the cache
while it compiles (and removes it after), and a process that finds it held waits for it
(saying so once) and then loads what it built, so a sweep's workers, or two terminals,
never compile the same library twice. The first compilation in a process says so on stderr, once:
"flashnum: compiling flashnum's C kernels (once per machine, ...)". The file is written
under a temporary name and renamed into place, so a killed builder leaves nothing half
written. `python -m flashnum.compile` builds every library ahead (flashnum.models.libraries).

`flag_sets` lists alternatives tried in order (GCC-only tuning first, say): the first that
compiles is kept. When none does, BuildError carries the compiler's own message, and the
caller's fallback reports it (report(), flashnum.engine.native.status()).
FLASHNUM_NATIVE=0 turns every native library off.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

_REPORT: dict[str, str] = {}
_SAID: set[str] = set()  # the lines this process has printed (each once)
ANNOUNCE = ("flashnum: compiling flashnum's C kernels (once per machine, about 2 minutes "
            "on 2 cores; `python -m flashnum.compile` does it ahead) into {cache}")


class BuildError(OSError):
    """A library that was not built; str() says why (the compiler's message included)."""


def cache_dir() -> Path:
    return Path(os.environ.get("FLASHNUM_CACHE") or Path.home() / ".cache" / "flashnum")


def compiler() -> str | None:
    """$CC, else cc, else gcc on the PATH; None without one."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def cpu() -> str:
    """The CPU as the cache key sees it: the machine, the model name and the feature flags
    (/proc/cpuinfo on Linux, the first processor's; elsewhere platform.processor())."""
    seen = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "flags", "Features", "CPU part") and key not in seen:
                seen[key] = " ".join(value.split())
            if not line.strip() and seen:
                break  # the first processor's block is enough
    except OSError:
        pass
    return "\n".join([platform.machine(), platform.processor(),
                      *(f"{k}: {v}" for k, v in sorted(seen.items()))])


def _version(cc: str) -> str:
    try:
        return subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    except OSError as e:
        raise BuildError(f"compiler {cc} does not run: {e}") from None


def key(src: str, flag_sets: list[list[str]], cc: str, extra: tuple[str, ...] = ()) -> str:
    """16 hex digits of sha256 over everything that decides the binary."""
    parts = [src, *(" ".join(f) for f in flag_sets), cc, _version(cc), cpu(), *extra]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def shared_library(name: str, src: str, flag_sets: list[list[str]], *,
                   libs: tuple[str, ...] | list[str] = (), extra: tuple[str, ...] = ()) -> Path:
    """The cached shared library `name`-<key>.so built from the C source text `src`;
    BuildError (with the compiler's message) when it cannot be built."""
    if os.environ.get("FLASHNUM_NATIVE", "1") == "0":
        raise _failed(name, "disabled by FLASHNUM_NATIVE=0")
    cc = compiler()
    if cc is None:
        raise _failed(name, "no C compiler (set CC)")
    try:
        so = cache_dir() / f"{name}-{key(src, flag_sets, cc, tuple(extra))}.so"
    except BuildError as e:
        raise _failed(name, str(e)) from None
    if so.exists():
        _REPORT[name] = f"cached: {so}"
        return so
    try:
        so.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _failed(name, f"cannot make the cache {so.parent}: {e.strerror}") from None
    with _one_builder(so.parent / f".{so.stem}.lock"):
        if so.exists():  # another process built it while this one waited
            _REPORT[name] = f"cached: {so}"
            return so
        say(ANNOUNCE.format(cache=so.parent))
        return _compile(name, src, flag_sets, cc, libs, so)


def _compile(name, src, flag_sets, cc, libs, so: Path) -> Path:
    """Try each flag set in turn; the first that compiles is renamed into place as so."""
    with tempfile.TemporaryDirectory(dir=so.parent, prefix=f".{name}-") as tmp:
        c_file, out = Path(tmp) / f"{name}.c", Path(tmp) / f"{name}.so"
        c_file.write_text(src)
        why = ""
        for flags in flag_sets:
            r = subprocess.run([cc, *flags, str(c_file), "-o", str(out), *libs],
                               capture_output=True, text=True)
            if r.returncode == 0:
                os.replace(out, so)  # atomic: a reader sees the whole file or none
                _REPORT[name] = f"built: {so}"
                return so
            why = (r.stderr or r.stdout).strip()
    lines = why.splitlines()
    raise _failed(name, f"{cc} failed: " + " | ".join(lines[-3:] if lines else ["no output"]))


@contextmanager
def _one_builder(path: Path):
    """Hold an flock on path while inside: one builder of a library per machine; another
    process asking for it waits (saying so, once) and then finds it built. Where the file
    system has no locks, builders still agree on the file (the atomic rename)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say("flashnum: waiting for another process compiling flashnum's C kernels")
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass  # no flock here (some network file systems)
        yield
    finally:
        # removed while held, after the library's rename: a process that locks a new file
        # of this name afterwards finds the library built (a waiter on this one does too)
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:  # ours, not a later builder's
                os.unlink(path)
        except OSError:
            pass
        os.close(fd)  # closing drops the lock


def say(line: str) -> None:
    """Print line on stderr once per process (the build's announcements)."""
    if line not in _SAID:
        _SAID.add(line)
        print(line, file=sys.stderr, flush=True)


def _failed(name: str, why: str) -> BuildError:
    _REPORT[name] = f"not built: {why}"
    return BuildError(why)


def report() -> dict[str, str]:
    """Per library asked for in this process: where it was loaded from, or why not."""
    return dict(_REPORT)


__all__ = ["BuildError", "cache_dir", "compiler", "cpu", "key", "report", "say",
           "shared_library"]
