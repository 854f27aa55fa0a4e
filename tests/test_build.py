"""Native code is built in one place (flashnum.numerics.build): cached per source, flags,
compiler and CPU, so that nodes with different CPUs sharing a home folder never load each
other's -march=native build; a build that fails says why in the compiler's own words."""

import os
import subprocess
import sys

import pytest

from flashnum.numerics import build

needs_cc = pytest.mark.skipif(build.compiler() is None, reason="no C compiler")
SRC = "int flashnum_answer(void) { return 42; }\n"
FLAGS = [["-O2", "-fPIC", "-shared"]]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHNUM_CACHE", str(tmp_path))
    monkeypatch.delenv("FLASHNUM_NATIVE", raising=False)
    return tmp_path


def test_the_cpu_is_described_by_its_model_and_feature_flags():
    text = build.cpu()
    if os.path.exists("/proc/cpuinfo") and "flags" in open("/proc/cpuinfo").read():
        assert "flags: " in text and "model name: " in text


@needs_cc
def test_the_key_changes_with_the_cpu_the_source_the_flags_and_the_compiler(monkeypatch):
    cc = build.compiler()
    base = build.key(SRC, FLAGS, cc)
    assert build.key(SRC, FLAGS, cc) == base
    assert build.key(SRC + "\n", FLAGS, cc) != base
    assert build.key(SRC, [["-O3", "-fPIC", "-shared"]], cc) != base
    assert build.key(SRC, FLAGS, cc, ("torch 2",)) != base
    monkeypatch.setattr(build, "cpu", lambda: "x86_64\nflags: fpu sse2")  # another node
    assert build.key(SRC, FLAGS, cc) != base


@needs_cc
def test_a_library_is_built_once_and_another_cpu_gets_its_own_file(cache, monkeypatch):
    so = build.shared_library("answer", SRC, FLAGS)
    assert so.parent == cache and so.is_file()
    assert build.report()["answer"] == f"built: {so}"
    stamp = so.stat().st_mtime_ns
    assert build.shared_library("answer", SRC, FLAGS) == so and so.stat().st_mtime_ns == stamp
    assert build.report()["answer"] == f"cached: {so}"
    monkeypatch.setattr(build, "cpu", lambda: "x86_64\nflags: fpu sse2")
    other = build.shared_library("answer", SRC, FLAGS)
    assert other != so and other.is_file()
    assert sorted(p.name for p in cache.iterdir()) == sorted([so.name, other.name])


@needs_cc
def test_the_first_flag_set_that_compiles_is_kept(cache):
    so = build.shared_library("answer", SRC, [["-fno-such-flag-anywhere"], *FLAGS])
    assert so.is_file()


@needs_cc
def test_a_failed_build_carries_the_compilers_message(cache):
    with pytest.raises(build.BuildError, match="flashnum-test-says-no"):
        build.shared_library("broken", '#error "flashnum-test-says-no"\n', FLAGS)
    assert "flashnum-test-says-no" in build.report()["broken"]
    assert not any(cache.glob("broken-*.so"))


def test_flashnum_native_0_turns_every_library_off(cache, monkeypatch):
    monkeypatch.setenv("FLASHNUM_NATIVE", "0")
    with pytest.raises(build.BuildError, match="disabled by FLASHNUM_NATIVE=0"):
        build.shared_library("answer", SRC, FLAGS)


def test_both_native_libraries_fall_back_saying_what_the_compiler_said(tmp_path):
    cc = tmp_path / "cc"
    cc.write_text('#!/bin/sh\necho "cc: error: this compiler refuses" >&2\nexit 1\n')
    cc.chmod(0o755)
    code = ("from flashnum.engine import native\nfrom flashnum.models import torch_cpu\n"
            "print(torch_cpu.why()); print(native.status())")
    env = {**os.environ, "CC": str(cc), "FLASHNUM_CACHE": str(tmp_path / "cache")}
    env.pop("FLASHNUM_NATIVE", None)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       check=True)
    why_c, native = r.stdout.strip().splitlines()
    assert "this compiler refuses" in why_c
    assert native.startswith("torch path (not built:") and "this compiler refuses" in native
