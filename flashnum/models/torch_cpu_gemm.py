"""The library GEMMs of torch's CPU flash kernel (flashnum.models.torch_cpu), called where
the kernel calls them: MKL's own sgemm / gemm_bf16bf16f32 / gemm_f16f16f32 inside the
libtorch_cpu torch loaded (through ctypes, so the summation order is the library's by
construction), one thread per task as in the kernel's parallel loop (_one_thread), and
the packed path: oneDNN's brgemm on VNNI-packed K and V (bf16 with AMX, fp16 with
AMX-FP16) where the kernel's need_pack holds. Where MKL's symbols are missing, the
operands are widened to fp32 and torch.matmul sums them.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch


@functools.cache
def _mkl():
    """MKL's Fortran GEMMs inside the libtorch_cpu torch loaded, or None."""
    lib_dir = Path(torch.__file__).parent / "lib"
    try:
        lib = ctypes.CDLL(str(lib_dir / "libtorch_cpu.so"))
        fns = {"fp32": lib.sgemm_, "bf16": lib.gemm_bf16bf16f32_, "fp16": lib.gemm_f16f16f32_}
    except (OSError, AttributeError):
        return None
    for f in fns.values():
        f.restype = None
    return fns


@functools.cache
def _omp_set_num_threads():
    """The address of omp_set_num_threads in the OpenMP runtime torch (and MKL) use, or None."""
    lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
    try:
        return ctypes.cast(lib.omp_set_num_threads, ctypes.c_void_p).value
    except AttributeError:
        return None


def mkl_available() -> bool:
    return _mkl() is not None


def _gemm(prec, trans_a, trans_b, m, n, k, a, lda, b, ldb, beta, c, ldc):
    """Column-major C (m x n) = op(A) op(B) + beta C through the library, as cpublas::gemm."""
    fns = _mkl()
    ci = ctypes.c_int
    one, bet = ctypes.c_float(1.0), ctypes.c_float(beta)
    fns[prec](ctypes.c_char_p(trans_a), ctypes.c_char_p(trans_b), ctypes.byref(ci(m)),
              ctypes.byref(ci(n)), ctypes.byref(ci(k)), ctypes.byref(one),
              ctypes.c_void_p(a.data_ptr()), ctypes.byref(ci(lda)),
              ctypes.c_void_p(b.data_ptr()), ctypes.byref(ci(ldb)), ctypes.byref(bet),
              ctypes.c_void_p(c.data_ptr()), ctypes.byref(ci(ldc)))


@functools.cache
def _thread_setters():
    """(omp_set_num_threads, MKL_Set_Num_Threads_Local) of the runtimes torch loaded, or
    None."""
    lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
    try:
        omp, mkl = lib.omp_set_num_threads, lib.MKL_Set_Num_Threads_Local
    except AttributeError:
        return None
    omp.argtypes, omp.restype = [ctypes.c_int], None
    mkl.argtypes, mkl.restype = [ctypes.c_int], ctypes.c_int
    return omp, mkl


class _one_thread:
    """The library calls of the calling thread on one thread while the model runs, as each
    task of the kernel's parallel loop runs its GEMMs sequentially; restored after. It sets
    this thread's OpenMP team size and MKL's thread-local count, not torch.set_num_threads:
    that one also switches MKL's dynamic threading off for the rest of the process, after
    which torch's own kernels split their fp32 GEMMs differently (measured on the backward).
    MKL's own local thread setting alone leaves its OpenMP team spinning (15x the CPU time
    per GEMM here), hence both. active=False leaves everything as it is."""

    def __init__(self, active: bool = True):
        self.active = active

    def __enter__(self):
        if not self.active:
            return
        setters = _thread_setters()
        self.old = torch.get_num_threads()
        if setters is None:
            torch.set_num_threads(1)
            return
        setters[0](1)
        self.mkl_old = setters[1](1)

    def __exit__(self, *exc):
        if not self.active:
            return
        setters = _thread_setters()
        if setters is None:
            torch.set_num_threads(self.old)
            return
        setters[0](self.old)
        setters[1](self.mkl_old)


def _qk(prec, q, k, s) -> None:
    """s (qB, kvB) fp32 = q (qB, d) @ k (kvB, d)^T, as the kernel calls
    gemm(T, N, kvB, qB, d, 1, k, d, q, d, 0, s, kvB). q, k are views into the inputs and s
    a view into the thread's buffer: MKL's result can depend on the operands' alignment."""
    qb, d = q.shape
    kvb = k.shape[0]
    if _mkl() is None:
        s.copy_(torch.matmul(q.float(), k.float().T))
        return
    _gemm(prec, b"T", b"N", kvb, qb, d, k, d, q, d, 0.0, s, kvb)


def _pv(prec, p, v, o, first: bool) -> None:
    """o (qB, d) fp32 <- p (qB, kvB) @ v (kvB, d) + (0 if first else 1) o, as the kernel
    calls gemm(N, N, d, qB, kvB, 1, v, d, p, kvB, beta, o, d)."""
    qb, kvb = p.shape
    d = v.shape[-1]
    if _mkl() is None:
        pv = torch.matmul(p.float(), v.float())
        o.copy_(pv if first else pv + o)
        return
    _gemm(prec, b"N", b"N", d, qb, kvb, v, d, p, kvb, 0.0 if first else 1.0, o, d)


# ---------------------------------------------------------------------------
# the packed path: oneDNN's brgemm on VNNI-packed K and V (bf16 on AMX machines)

_SCALAR_TYPE = {"bf16": 15, "fp16": 5}  # c10::ScalarType of BFloat16, Half


@functools.cache
def _brgemm():
    """(could_pack, brgemm, brgemm_release) of at::native::cpublas in libtorch_cpu, or None."""
    lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
    names = {"bf16": "_ZN2at6native7cpublas6brgemmEllllllbPKN3c108BFloat16ES5_Pfb",
             "fp16": "_ZN2at6native7cpublas6brgemmEllllllbPKN3c104HalfES5_Pfb"}
    try:
        could = lib._ZN2at6native7cpublas10could_packEN3c1010ScalarTypeE
        release = lib._ZN2at6native7cpublas14brgemm_releaseEb
        fns = {p: getattr(lib, n) for p, n in names.items()}
    except AttributeError:
        return None
    could.argtypes, could.restype = [ctypes.c_int8], ctypes.c_bool
    release.argtypes, release.restype = [ctypes.c_bool], None
    i64, vp = ctypes.c_int64, ctypes.c_void_p
    for f in fns.values():
        f.argtypes = [i64] * 6 + [ctypes.c_bool, vp, vp, vp, ctypes.c_bool]
        f.restype = None
    return could, fns, release


def need_pack(prec, bh, nq, nk, d, qs, causal, threads) -> bool:
    """flash_attention_kernel_impl's could_pack (bf16/fp16 where cpublas::could_pack says
    so: oneDNN's AMX brgemm) and cpu_flash_attention's need_pack: both lengths at least 64
    (bf16) or 16 (fp16), and the GEMM work per thread at least 4x (bf16) or 1x (fp16) the
    packing work."""
    lib = _brgemm()
    if prec not in _SCALAR_TYPE or lib is None or not lib[0](_SCALAR_TYPE[prec]):
        return False
    thresh = 64 if prec == "bf16" else 16
    if nk < thresh or nq < thresh:
        return False
    pack_size = float(bh * nk * d)
    q_slice = -(-nq // qs)
    qs_per_thread = float((bh * q_slice + threads - 1) // threads)  # integer division
    gemm_size = qs_per_thread * qs * (min(nq, nk) if causal else nk) * d
    return gemm_size / pack_size >= (4 if prec == "bf16" else 1)


def pack_vnni2(src: torch.Tensor) -> torch.Tensor:
    """at::vec::pack_vnni2: [K, N] -> [K/2, N, 2] (pairs of rows interleaved), K padded to
    even with a zero row, flattened."""
    k, n = src.shape
    if k % 2:
        src = torch.cat([src, src.new_zeros(1, n)])
    return src.reshape(-1, 2, n).transpose(1, 2).reshape(-1)


class _Packed:
    """The kernel's reordered K and V (need_pack): key_reorder [bh, eheadSize, Nk], each key
    block at n * eheadSize, the block's K^T packed; value_reorder [bh, kv_padding_size, d],
    each block at (n / kvS) * ekvS * d, the block's V packed (odd blocks padded to even)."""

    def __init__(self, k3, v3, ks):
        bh, nk, d = k3.shape
        self.ehead = d + d % 2
        self.eks = ks + ks % 2
        tail = (nk - 1) % ks + 1
        self.kv_padding = (nk - 1) // ks * self.eks + tail + tail % 2
        self.key = torch.empty(bh, self.ehead * nk, dtype=k3.dtype)
        self.value = torch.empty(bh, self.kv_padding * d, dtype=k3.dtype)
        for h in range(bh):
            for n in range(0, nk, ks):
                kvb = min(ks, nk - n)
                kt = pack_vnni2(k3[h, n : n + kvb].T.contiguous())
                self.key[h, n * self.ehead : n * self.ehead + kt.numel()] = kt
                vt = pack_vnni2(v3[h, n : n + kvb])
                p0 = n // ks * self.eks * d
                self.value[h, p0 : p0 + vt.numel()] = vt


def _brgemm_call(prec, m, n, k, lda, ldb, ldc, add_c, a, b, c) -> None:
    """cpublas::brgemm(M, N, K, ld_a, ld_b, ld_c, add_C, A, B (VNNI), C): C (+)= A B."""
    _brgemm()[1][prec](m, n, k, lda, ldb, ldc, add_c, a.data_ptr(), b.data_ptr(),
                        c.data_ptr(), True)
