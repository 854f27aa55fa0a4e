"""flashnum's own order for every dot product and sum: the same bits on every machine.

    from flashnum.numerics.accumulate import dot, rowsum
    c = dot(a, b, "fp32")    # (..., M, K) @ (..., K, N): each entry one FMA chain over k from +0
    c = product_dot(a, b, bf16_round, "fp32")   # each product rounded, then summed in order
    s = rowsum(x, "fp64")    # sum over the last dim in ATen's cascade order, 4 lanes (fp64)

A library GEMM or reduction sums in an order of its own choosing: MKL, oneDNN and ATen
pick it by CPU family, vector width, thread count, shape and memory layout, so their
bits move from one machine to the next. Every accumulation flashnum emulates, and every
float64 reference, metric and bound, is instead defined here, element by element:

    dot      c_ij = +0, then c_ij = fma(a_ik, b_kj, c_ij) for k = 0, 1, ..., K-1, every
             fma rounded once in the accumulator's format (fp32 or fp64). This is what
             MKL's sgemm computes for the engine's tile shapes on Intel CPUs, so the
             tables computed there keep their bits.
    rowsum   ATen's cascade_sum order with a fixed lane count L (8 in fp32, 4 in fp64:
             torch's 256-bit vectors, which its AVX-512 build also sums with): four
             interleaved L-lane accumulators with the cascade's levels, their sum, the
             tail values one by one, the lanes one by one, added to the output's +0.

Both orders are computed by accumulate.c (compiled once, flashnum.numerics.build) on the
best path of the CPU, AVX-512, AVX2 or scalar, all three the same chains: the vector code
only runs independent chains side by side (`isa()`; FLASHNUM_SIMD=avx512|avx2|scalar
chooses one, for tests and for a machine's benchmark). Without a compiler the same
orders run in plain torch, slower: the fp32 chain by round-to-odd in float64 (exact), the
fp64 chain by Boldo and Melquiond's emulated FMA (exact while no product falls below
2^-969, where Dekker's product loses its error term), the cascade on torch's elementwise
adds. tests/test_accumulate.py checks the paths against each other and against exact
rational arithmetic.
"""

from __future__ import annotations

import ctypes
import functools
import os
import subprocess
import threading
from pathlib import Path

import torch

from flashnum.numerics import build

ACCS = ("fp32", "fp64")
ISAS = {"scalar": 0, "avx2": 1, "avx512": 2}
LANES = {"fp32": 8, "fp64": 4}  # the cascade's L
_SRC = Path(__file__).with_name("accumulate.c")
_FLAGS = ["-O3", "-fopenmp", "-ffp-contract=off", "-fno-trapping-math", "-fno-math-errno",
          "-fPIC", "-shared"]
_DTYPE = {"fp32": torch.float32, "fp64": torch.float64}

_lock = threading.Lock()
_lib: list = []  # [the library] once built, [None] if it cannot be
_why = ""


def source() -> str:
    """accumulate.c, the text the engine's fused loops are compiled after too."""
    return _SRC.read_text()


def _open(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    for name in ("fn_chain_f32", "fn_chain_f64"):
        f = getattr(lib, name)
        f.restype = None
        f.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 10 + [ctypes.c_int] * 2
    for name in ("fn_rowsum_float", "fn_rowsum_double"):
        f = getattr(lib, name)
        f.restype = None
        f.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2 + [ctypes.c_int]
    lib.fn_best_isa.restype = ctypes.c_int
    return lib


def torch_openmp() -> dict:
    """build.shared_library's link arguments that make a library share torch's OpenMP
    runtime (its libgomp, already loaded): one thread pool for both. The cache key takes
    torch's version, not its folder, so that every environment shares one build."""
    torch_lib = Path(torch.__file__).parent / "lib"
    return dict(libs=[f"-Wl,-rpath,{torch_lib}"], extra=(torch.__version__,))


def library() -> ctypes.CDLL | None:
    """accumulate.c's library (built on first call), or None (status() says why)."""
    global _why
    if not _lib:
        with _lock:
            if not _lib:
                try:
                    _lib.append(_open(build.shared_library(
                        "accumulate", source(), [_FLAGS], **torch_openmp())))
                except (OSError, subprocess.SubprocessError) as e:
                    _why = str(e)
                    _lib.append(None)
    return _lib[0]


@functools.cache
def isa() -> str:
    """The path accumulate.c runs here: FLASHNUM_SIMD if set (and this CPU runs it), else
    the best of avx512, avx2, scalar; "torch" without the library."""
    lib = library()
    if lib is None:
        return "torch"
    best = {v: k for k, v in ISAS.items()}[lib.fn_best_isa()]
    want = os.environ.get("FLASHNUM_SIMD", "").strip().lower() or best
    if want not in ISAS:
        raise ValueError(f"FLASHNUM_SIMD={want!r}; valid: {', '.join(ISAS)}")
    if ISAS[want] > ISAS[best]:
        raise ValueError(f"FLASHNUM_SIMD={want!r}, but this CPU runs at most {best!r}")
    return want


def status() -> str:
    """One line: which path computes the dots and sums, and if torch's, why."""
    return f"accumulate.c, {isa()}" if isa() != "torch" else f"torch ({_why})"


def _threads(work: int) -> int:
    # small products are not worth waking the thread pool for
    return torch.get_num_threads() if work >= 1 << 18 else 1


# -- dot --------------------------------------------------------------------------------


def dot(a: torch.Tensor, b: torch.Tensor, acc: str = "fp32") -> torch.Tensor:
    """a @ b, broadcast over the leading dims as torch.matmul does, accumulated in `acc`
    (fp32 or fp64) as one FMA chain over k from +0 per entry. The operands are taken in
    the accumulator's dtype (their values must be exact there); the result has it too."""
    if acc not in ACCS:
        raise ValueError(f"unknown accumulator {acc!r}; valid: {', '.join(ACCS)}")
    dt = _DTYPE[acc]
    a, b = a.to(dt), b.to(dt)
    if a.dim() < 2 or b.dim() < 2 or a.shape[-1] != b.shape[-2]:
        raise ValueError(f"cannot multiply {tuple(a.shape)} by {tuple(b.shape)}")
    lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    a3 = _batch(a.expand(*lead, M, K))
    b3 = _batch(b.expand(*lead, K, N))
    if b3.stride(-1) != 1:
        b3 = b3.contiguous()
    out = torch.empty(a3.shape[0], M, N, dtype=dt)
    lib = library() if out.numel() else None
    if lib is not None and isa() != "torch":
        fn = lib.fn_chain_f32 if acc == "fp32" else lib.fn_chain_f64
        fn(a3.data_ptr(), b3.data_ptr(), out.data_ptr(), a3.shape[0], M, N, K,
           a3.stride(0), a3.stride(1), a3.stride(2), b3.stride(0), b3.stride(1),
           out.stride(0), ISAS[isa()], _threads(out.numel() * K))
    elif out.numel():
        out.copy_(_chain_torch(a3, b3, acc))
    return out.reshape(*lead, M, N)


def product_dot(a: torch.Tensor, b: torch.Tensor, round_product, acc: str = "fp32"):
    """a @ b with each product rounded before its sum (tinygrad's bf16 dot, a policy's
    qk_product / pv_product site): c = +0, then c = fl_acc(c + round_product(a_k b_k))
    for k = 0, 1, ..., K-1, in order. Each a_k b_k is formed in float64 (exact for
    operands of up to 26 significant bits, fp32's 24 included); round_product takes it
    and returns it rounded into a format whose numbers `acc` holds exactly, so that each
    add rounds once. Broadcast over the leading dims as `dot` is."""
    if acc not in ACCS:
        raise ValueError(f"unknown accumulator {acc!r}; valid: {', '.join(ACCS)}")
    if a.dim() < 2 or b.dim() < 2 or a.shape[-1] != b.shape[-2]:
        raise ValueError(f"cannot multiply {tuple(a.shape)} by {tuple(b.shape)}")
    dt = _DTYPE[acc]
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    c = torch.zeros(*lead, a.shape[-2], b.shape[-1], dtype=dt)
    for k in range(a.shape[-1]):
        c = c + round_product(a64[..., :, k, None] * b64[..., k, None, :]).to(dt)
    return c


def _batch(x: torch.Tensor) -> torch.Tensor:
    """(..., R, C) as (batch, R, C) with one batch stride (a view where one exists)."""
    r, c = x.shape[-2:]
    if x.dim() == 2:
        return x.unsqueeze(0)
    try:
        return x.view(-1, r, c)
    except RuntimeError:
        return x.reshape(-1, r, c)  # a copy: the leading dims have no common stride


def _chain_torch(a: torch.Tensor, b: torch.Tensor, acc: str) -> torch.Tensor:
    """The chain in torch's elementwise float64 operations (see the module docstring)."""
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    c = torch.zeros(a.shape[0], a.shape[1], b.shape[2], dtype=torch.float64)
    for k in range(a.shape[2]):
        x, y = a64[:, :, k, None], b64[:, None, k, :]
        c = _fma32_fast(x, y, c) if acc == "fp32" else _fma64(x, y, c)
    return c.to(_DTYPE[acc])


# the low 29 bits of a float64 below fp32's last: a value is an fp32 midpoint when they
# are exactly its half ulp (normal fp32 range; below 2^-125 the grid is coarser)
_LOW29, _HALF29 = (1 << 29) - 1, 1 << 28


def _fma32_fast(x, y, c):
    """_fma32 where it is needed only: fl64(x y + c) rounded once more to fp32 differs from
    the single rounding only when fl64 lands exactly on an fp32 midpoint (double rounding),
    or where fp32 is subnormal; those entries, rare, take the round-to-odd sum."""
    s = torch.addcmul(c, x, y)  # x y is exact in float64: one rounding, like p + c
    bits = s.view(torch.int64)
    odd = ((bits & _LOW29) == _HALF29) | (s.abs() < 2.0 ** -125)
    r = s.to(torch.float32).to(torch.float64)
    if bool(odd.any()):
        x, y, c = torch.broadcast_tensors(x, y, c)
        r[odd] = _fma32(x[odd], y[odd], c[odd])
    return r


def _two_sum(x, y):
    s = x + y
    bb = s - x
    return s, (x - (s - bb)) + (y - bb)


def _odd(s, e):
    """s = fl(x + y) with error e made the round-to-odd sum: the neighbour toward e where s
    is inexact and its last bit even (Boldo and Melquiond 2008)."""
    bits = s.view(torch.int64)
    step = torch.where((e > 0) == (s > 0), 1, -1)
    fix = (e != 0) & (bits & 1 == 0) & torch.isfinite(s)
    return torch.where(fix, bits + step, bits).view(torch.float64)


def _fma32(x, y, c):
    """fl32(x y + c) for fp32 values held in float64: x y is exact there, the sum rounded
    to odd at 53 bits, then to nearest at 24 (53 >= 24 + 2: no double rounding)."""
    p = x * y
    s, e = _two_sum(p, c)
    return _odd(s, e).to(torch.float32).to(torch.float64)


_SPLIT = 134217729.0  # 2^27 + 1, Veltkamp's splitter


def _fma64(x, y, c):
    """fl64(x y + c): Dekker's exact product, then Boldo and Melquiond's emulated FMA
    (TwoSum with c, the low parts summed to odd, one rounding to nearest)."""
    uh = x * y
    t = _SPLIT * x
    xh = t - (t - x)
    t = _SPLIT * y
    yh = t - (t - y)
    xl, yl = x - xh, y - yh
    ul = ((xh * yh - uh) + xh * yl + xl * yh) + xl * yl
    th, tl = _two_sum(c, uh)
    v = _odd(*_two_sum(tl, ul))
    z = th + v
    # Dekker's terms are NaN where the product overflows or is not finite: take x y + c
    return torch.where(torch.isfinite(z), z, uh + c)


# -- rowsum -----------------------------------------------------------------------------


def rowsum(x: torch.Tensor, acc: str = "fp32") -> torch.Tensor:
    """Sum over the last dim in the cascade order (module docstring), in `acc`."""
    if acc not in ACCS:
        raise ValueError(f"unknown accumulator {acc!r}; valid: {', '.join(ACCS)}")
    dt = _DTYPE[acc]
    x = x.to(dt)
    n = x.shape[-1] if x.dim() else 1
    flat = x.reshape(-1, n).contiguous()
    out = torch.empty(flat.shape[0], dtype=dt)
    lib = library() if flat.numel() else None
    if lib is not None and isa() != "torch":
        fn = lib.fn_rowsum_float if acc == "fp32" else lib.fn_rowsum_double
        fn(flat.data_ptr(), out.data_ptr(), flat.shape[0], n, _threads(flat.numel()))
    else:
        out.copy_(_cascade_torch(flat, LANES[acc]) if n else torch.zeros_like(out))
    return out.reshape(x.shape[:-1])


def _cascade_torch(x: torch.Tensor, lanes: int) -> torch.Tensor:
    """accumulate.c's cascade for every row of x (rows, n) at once, in torch's adds."""
    rows, n = x.shape
    L = lanes if n >= lanes else 1
    size = n // L
    size_ilp = size // 4
    lp = max(4, _ceil_log2(size_ilp) // 4)
    step, mask = 1 << lp, (1 << lp) - 1
    groups = x[:, : size_ilp * 4 * L].reshape(rows, size_ilp, 4, L)
    acc = [torch.zeros(rows, 4, L, dtype=x.dtype) for _ in range(4)]
    i = 0
    while i + step <= size_ilp:
        for _ in range(step):
            acc[0] = acc[0] + groups[:, i]
            i += 1
        for a in range(1, 4):
            acc[a] = acc[a] + acc[a - 1]
            acc[a - 1] = torch.zeros_like(acc[a - 1])
            if i & (mask << (a * lp)):
                break
    for t in range(i, size_ilp):
        acc[0] = acc[0] + groups[:, t]
    for a in range(1, 4):
        acc[0] = acc[0] + acc[a]
    vecs = acc[0]  # (rows, 4, L)
    lane = vecs[:, 0]
    for v in range(size_ilp * 4, size):
        lane = lane + x[:, v * L : (v + 1) * L]
    for k in range(1, 4):
        lane = lane + vecs[:, k]
    zero = torch.zeros(rows, dtype=x.dtype)
    if L == 1:
        return zero + lane[:, 0]
    r = zero
    for k in range(size * L, n):
        r = r + x[:, k]
    for e in range(L):
        r = r + lane[:, e]
    return zero + r


def _ceil_log2(x: int) -> int:
    return 1 if x <= 2 else (x - 1).bit_length()


# -- means ------------------------------------------------------------------------------


def mean(x: torch.Tensor, dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """The float64 mean over `dim` (every entry: None), its sum the cascade over those
    entries in row-major order, divided by their count (torch's mean, in one order)."""
    x = x.to(torch.float64)
    if dim is None:
        return rowsum(x.reshape(-1), "fp64") / max(1, x.numel())
    dims = sorted(d % x.dim() for d in ((dim,) if isinstance(dim, int) else dim))
    rest = [d for d in range(x.dim()) if d not in dims]
    moved = x.permute(*rest, *dims)
    n = 1
    for d in dims:
        n *= x.shape[d]
    return rowsum(moved.reshape(*moved.shape[: len(rest)], n), "fp64") / max(1, n)


def std(x: torch.Tensor) -> torch.Tensor:
    """The sample standard deviation (n - 1) of every entry, in two passes: the mean, then
    the cascade sum of squared deviations."""
    x = x.to(torch.float64).reshape(-1)
    dev = x - mean(x)
    return (rowsum(dev * dev, "fp64") / (x.numel() - 1)).sqrt()


__all__ = ["ACCS", "ISAS", "dot", "rowsum", "mean", "std", "isa", "status", "library", "source",
           "torch_openmp"]
