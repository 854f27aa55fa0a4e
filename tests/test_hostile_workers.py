"""Processes a run starts: none outlives its runner, and the C kernels are built once.

A runner SIGKILLed the moment its first worker exists (the spawn window, before the worker
has imported torch) leaves no worker running: the worker dies within a second and never
loads torch. A library two processes ask for at once is compiled once (the other waits,
saying so), announced on stderr; its cache key holds no path of the virtual environment;
a cold first run says it is compiling, once, and its workers load that one build.

Oracles: /proc (who is alive, what a process has mapped); a compiler wrapper written here
that logs each compilation; the files of the cache.
"""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from flashnum.numerics import build

REPO = Path(__file__).resolve().parents[1]
needs_cc = pytest.mark.skipif(build.compiler() is None, reason="no C compiler")
needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="no /proc")


def _children(pid: int) -> list[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
                cmd = Path(f"/proc/{d}/cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"spawn_main" in cmd:
                out.append(int(d))
    return out


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _has_torch(pid: int) -> bool:
    try:
        return "libtorch_cpu" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@needs_proc
def test_a_runner_killed_as_its_workers_spawn_leaves_none_running(tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "flashnum.run", "experiment=smoke",
                          f"store.root={tmp_path}", "n_jobs=2", "progress=false"], cwd=REPO,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    kids: list[int] = []
    while not kids and time.monotonic() < deadline and p.poll() is None:
        kids = _children(p.pid)
        time.sleep(0.002)
    assert kids, "the runner spawned no worker"
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    t0, torch_loaded = time.monotonic(), set()
    while any(_alive(k) for k in kids) and time.monotonic() - t0 < 15:
        torch_loaded |= {k for k in kids if _has_torch(k)}
        time.sleep(0.005)
    lived = time.monotonic() - t0
    assert lived < 1.0, f"workers {kids} lived {lived:.2f} s after their runner's SIGKILL"
    assert not torch_loaded, f"workers {sorted(torch_loaded)} went on to import torch"


SRC = "int flashnum_answer(void) { return 42; }\n"

BUILDER = textwrap.dedent("""
    import sys
    from flashnum.numerics import build
    print(build.shared_library("answer", sys.argv[1], [["-O2", "-fPIC", "-shared"]]))
    print(build.report()["answer"])
""")


@needs_cc
def test_two_processes_asking_for_one_library_compile_it_once(tmp_path):
    log = tmp_path / "compiled.log"
    cc = tmp_path / "cc"  # the real compiler, slowed down and counted
    cc.write_text(f"#!/bin/sh\nif [ \"$1\" != --version ]; then echo x >> {log}; sleep 2; fi\n"
                  f"exec {build.compiler()} \"$@\"\n")
    cc.chmod(0o755)
    env = {**os.environ, "CC": str(cc), "FLASHNUM_CACHE": str(tmp_path / "cache")}
    env.pop("FLASHNUM_NATIVE", None)
    procs = [subprocess.Popen([sys.executable, "-c", BUILDER, SRC], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert log.read_text().count("x") == 1  # one compilation for two processes
    stderr = "".join(e for _, e in outs)
    assert stderr.count("compiling flashnum's C kernels (once per machine") == 1, stderr
    assert "waiting for another process compiling" in stderr, stderr
    assert len({o.splitlines()[0] for o, _ in outs}) == 1  # the same file for both
    assert sorted(x.name for x in (tmp_path / "cache").iterdir()) == [
        Path(outs[0][0].splitlines()[0]).name]  # no lock or temporary file left


KEYS = textwrap.dedent("""
    from flashnum.numerics import build
    seen = []
    real = build.shared_library
    def recording(name, src, flags, **kw):
        seen.append((name, kw.get("extra", ()), kw.get("libs", ())))
        return real(name, src, flags, **kw)
    build.shared_library = recording
    from flashnum.engine import fused_backward, native
    native.available(), fused_backward.library()
    for name, extra, libs in seen:
        print(name, repr(extra))
""")


@needs_cc
def test_the_cache_key_holds_no_path_of_the_virtual_environment():
    r = subprocess.run([sys.executable, "-c", KEYS], capture_output=True, text=True,
                       timeout=600, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    names = {ln.split()[0] for ln in r.stdout.splitlines()}
    assert {"native", "fused_backward"} <= names, r.stdout
    for line in r.stdout.splitlines():
        assert sys.prefix not in line and "site-packages" not in line, line


@pytest.mark.slow
@needs_cc
def test_a_cold_first_run_says_it_is_compiling_once_and_its_workers_share_the_build(tmp_path):
    env = {**os.environ, "FLASHNUM_CACHE": str(tmp_path / "cache")}
    env.pop("FLASHNUM_NATIVE", None)
    r = subprocess.run([sys.executable, "-m", "flashnum.run", "experiment=smoke",
                        "max_cases=4", "n_jobs=2", "progress=false",
                        f"store.root={tmp_path / 'store'}"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stderr.count("compiling flashnum's C kernels (once per machine") == 1, r.stderr
    built = sorted(p.name.rsplit("-", 1)[0] for p in (tmp_path / "cache").glob("*.so"))
    assert built == ["accumulate", "fused_backward", "native", "native_probe", "torch_cpu"], built
