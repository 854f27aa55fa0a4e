"""tinygrad's scaled_dot_product_attention as an audit target, on tinygrad's CPU device.

    from flashnum.audit.targets_tinygrad import tinygrad_sdpa, toolchain
    out = tinygrad_sdpa(q, k, v, causal=True)        # torch (B, H, N, d) in, torch out
    toolchain()                                      # "" where it runs, else what to install

  tinygrad_sdpa  Tensor.scaled_dot_product_attention (tinygrad 0.14, mixin/rand.py):
                 S = q.matmul(k^T, dtype=fp32) / sqrt(d), the causal mask added as -inf
                 (tril: top-left aligned), S cast to the input dtype, softmax in it
                 (e = exp(s - max), P = e / sum(e)), P @ v in the input dtype. What the
                 generated kernels do with each value is flashnum.models.tinygrad's
                 docstring. Its backward is tinygrad's autograd (Tensor.gradient), on the
                 same device.

tinygrad's CPU device compiles every kernel, and its own queue programs, with clang
(`$CC`, else `clang`, called with `--target=x86_64-none-unknown-elf`): gcc does not take
that flag, and the LLVM renderer does not help (the queue programs still need clang).
bf16 needs clang >= 19 (`__bf16` arithmetic). Where no clang is on PATH, the ziglang
package's clang (`python -m ziglang cc`) runs in its place through a short wrapper
written into flashnum's cache and put on PATH as `clang`, never into $CC (which
flashnum's own C builds read): it maps the target flag to zig's triple and turns off the
debug sections, whose relocations tinygrad's ELF loader does not take. tinygrad's own
compile cache is kept apart from the user's (CACHEDB in flashnum's cache): an entry
compiled by one compiler is never loaded for another.

tinygrad's SDPA takes no scale: a scale other than 1/sqrt(d) is refused.

    python -m flashnum.audit.targets_tinygrad    # model tinygrad's share of equal outputs
"""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from flashnum.numerics.build import cache_dir

INSTALL = "pip install 'flashnum[tinygrad]' (tinygrad and ziglang, whose clang it compiles with)"
MIN_CLANG = 19  # __bf16 arithmetic in C (tinygrad renders bf16 kernels with it)
_WRAPPER = """#!/bin/sh
# clang for tinygrad's CPU device, run as zig's: its --target=ARCH-none-unknown-elf is
# zig's ARCH-freestanding-none; -g0: no debug sections (their relocations are absolute)
for a in "$@"; do case "$a" in
  --target=*-none-unknown-elf) t=${{a#--target=}}
    set -- "$@" -target "${{t%%-*}}-freestanding-none";;
  *) set -- "$@" "$a";; esac; shift; done
exec "{python}" -m ziglang cc -g0 "$@"
"""


def _clang_major(cc: str) -> int | None:
    """The major version of the clang `cc` (None: it does not run or is not clang)."""
    try:
        text = subprocess.run([cc, "--version"], capture_output=True, text=True,
                              timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    words = text.split()
    if "clang" not in words or "version" not in words:
        return None
    try:
        return int(words[words.index("version") + 1].split(".")[0])
    except (IndexError, ValueError):
        return None


def _zig_wrapper() -> str:
    """The wrapper that runs ziglang's clang (written once into flashnum's cache)."""
    path = cache_dir() / "tinygrad" / "bin" / "clang"  # its folder goes on PATH
    text = _WRAPPER.format(python=sys.executable)
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}")
        tmp.write_text(text)
        tmp.chmod(0o755)
        tmp.replace(path)
    return str(path)


def compiler() -> tuple[str, str]:
    """(the clang tinygrad will call, "" or why it cannot): $CC, else clang on PATH, else
    ziglang's clang through the wrapper."""
    cc = os.environ.get("CC") or shutil.which("clang")
    if cc is None and importlib.util.find_spec("ziglang") is not None:
        cc = _zig_wrapper()
    if cc is None:
        return "", f"no clang for tinygrad's CPU device: {INSTALL}, or clang >= {MIN_CLANG} on PATH"
    major = _clang_major(cc)
    if major is None or major < MIN_CLANG:
        return cc, (f"tinygrad's CPU device needs clang >= {MIN_CLANG}, {cc} is "
                    f"{'not clang' if major is None else f'clang {major}'}: {INSTALL}")
    return cc, ""


def toolchain() -> str:
    """"" where tinygrad's CPU device can compile here, else one line: what to install."""
    if importlib.util.find_spec("tinygrad") is None:
        return f"tinygrad is not installed: {INSTALL}"
    return compiler()[1]


def use_toolchain() -> str:
    """Put tinygrad's compiler on PATH for this process and the ones it starts (a
    reproducer run in a fresh interpreter inherits it); "" done, else what to install."""
    why = toolchain()
    if not why:
        _tinygrad()
    return why


def _tinygrad():
    """The tinygrad package, its compiler and its cache set before its first import (it
    reads CACHEDB on import, and CC or `clang` on PATH in each compile worker). The zig
    wrapper goes on PATH as `clang`, never into $CC: flashnum's own C builds
    (flashnum.numerics.build) read $CC and keep their compiler."""
    if "tinygrad" not in sys.modules:
        cc, why = compiler()
        if why:
            raise ValueError(why)
        if not os.environ.get("CC") and shutil.which("clang") is None:
            os.environ["PATH"] = str(Path(cc).parent) + os.pathsep + os.environ.get("PATH", "")
        os.environ.setdefault("CACHEDB", str(cache_dir() / "tinygrad" / "cache.db"))
    import tinygrad

    return tinygrad


def to_tinygrad(x: torch.Tensor):
    """A torch CPU tensor as a tinygrad Tensor of the same dtype on the CPU device (bf16
    through its bits: numpy has no bf16)."""
    tg = _tinygrad()
    x = x.detach().to("cpu").contiguous()
    if x.dtype == torch.bfloat16:
        bits = tg.Tensor(x.view(torch.int16).numpy(), device="CPU")
        return bits.bitcast(tg.dtypes.bfloat16)
    return tg.Tensor(x.numpy(), device="CPU")


def to_torch(t) -> torch.Tensor:
    """A tinygrad Tensor as a torch CPU tensor of the same dtype."""
    tg = _tinygrad()
    if t.dtype == tg.dtypes.bfloat16:
        bits = t.bitcast(tg.dtypes.int16).numpy()
        return torch.from_numpy(np.ascontiguousarray(bits)).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(t.numpy()))


def _check_scale(d: int, scale) -> None:
    if scale is not None and not math.isclose(float(scale), 1.0 / math.sqrt(d), rel_tol=1e-12):
        raise ValueError(f"tinygrad's scaled_dot_product_attention takes no scale: scale={scale!r}"
                         f"; valid: None or 1/sqrt(d) = {1.0 / math.sqrt(d)!r}")


class _TinygradAttention(torch.autograd.Function):
    """tinygrad's SDPA under torch autograd: the forward realised on tinygrad's CPU device,
    the backward tinygrad's Tensor.gradient of the same graph built again (measured:
    the gradient of a tensor already realised comes back wrong, off by O(1), silently)."""

    @staticmethod
    def forward(ctx, q, k, v, causal):
        tq, tk, tv = (to_tinygrad(x).contiguous().realize() for x in (q, k, v))
        ctx.inputs, ctx.causal = (tq, tk, tv), bool(causal)
        return to_torch(tq.scaled_dot_product_attention(tk, tv, is_causal=ctx.causal).realize())

    @staticmethod
    def backward(ctx, do):
        tq, tk, tv = ctx.inputs
        out = tq.scaled_dot_product_attention(tk, tv, is_causal=ctx.causal)
        grads = out.gradient(tq, tk, tv, gradient=to_tinygrad(do.contiguous()))
        return (*(to_torch(g.realize()) for g in grads), None)


def tinygrad_sdpa(q, k, v, causal=False, scale=None):
    """tinygrad's Tensor.scaled_dot_product_attention (see the module docstring); q, k, v
    (B, H, N, d) torch tensors of one dtype, out the same."""
    _check_scale(q.shape[-1], scale)
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        return _TinygradAttention.apply(q, k, v, causal)
    tq, tk, tv = (to_tinygrad(x) for x in (q, k, v))
    return to_torch(tq.scaled_dot_product_attention(tk, tv, is_causal=bool(causal)).realize())


GRID = [(n, d, causal) for n in (77, 128, 256) for d in (64, 128) for causal in (False, True)]


def model_share(precision: str, grid=GRID, seed: int = 0) -> tuple[int, int]:
    """(outputs equal bit for bit, outputs) of model tinygrad against the kernel over
    `grid` ((N, d, causal) each; B 1, H 2, Gaussian inputs from `seed`)."""
    from flashnum.models.tinygrad import forward

    dtype, bits = {"fp32": (torch.float32, torch.int32),
                   "bf16": (torch.bfloat16, torch.int16)}[precision]
    g = torch.Generator().manual_seed(seed)
    equal = total = 0
    for n, d, causal in grid:
        q, k, v = (torch.randn(1, 2, n, d, generator=g).to(dtype) for _ in range(3))
        out = tinygrad_sdpa(q, k, v, causal=causal)
        model = forward(q, k, v, precision=precision, causal=causal).out.to(dtype)
        equal += int((out.view(bits) == model.view(bits)).sum())
        total += out.numel()
    return equal, total


if __name__ == "__main__":  # python -m flashnum.audit.targets_tinygrad: the model's share
    for prec in ("fp32", "bf16"):
        eq, n = model_share(prec)
        print(f"model tinygrad vs the kernel, {prec}: {eq} of {n} outputs equal ({eq / n:.6f}); "
              f"N 77, 128, 256; d 64, 128; causal and not")
