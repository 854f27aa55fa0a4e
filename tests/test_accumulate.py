"""flashnum's own order for dots and row sums (flashnum.numerics.accumulate): the same bits on
every path, every thread count and every memory layout, and the order it states.

Oracles: a dot is checked against exact rational arithmetic (Fractions: each fma the exact
a b + c rounded once, nearest-even, by integer arithmetic), a row sum against a scalar
Python rendering of ATen's cascade written here from SumKernel.cpp's description; the C
paths (AVX-512, AVX2, scalar: as many as this CPU runs) and the torch fallback against
them and each other.
"""

import math
from fractions import Fraction

import pytest
import torch

from flashnum.numerics import accumulate as acc

FORMAT = {"fp32": (24, -126, 127), "fp64": (53, -1022, 1023)}


def round_rational(x: Fraction, acc_name: str) -> float:
    """x rounded to nearest (ties to even) into fp32 / fp64, as an exact Python float."""
    p, emin, emax = FORMAT[acc_name]
    if x == 0:
        return 0.0
    sign = -1 if x < 0 else 1
    a = abs(x)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    if Fraction(2) ** e > a:
        e -= 1
    ulp = Fraction(2) ** (max(e, emin) - (p - 1))
    n = round(a / ulp)  # Fraction rounding: half to even
    v = n * ulp
    if v >= Fraction(2) ** (emax + 1):
        return sign * math.inf
    return sign * float(v)


def chain_oracle(a: torch.Tensor, b: torch.Tensor, acc_name: str) -> torch.Tensor:
    M, K = a.shape
    N = b.shape[1]
    out = torch.zeros(M, N, dtype=torch.float64)
    A = [[Fraction(x) for x in row] for row in a.double().tolist()]
    B = [[Fraction(x) for x in row] for row in b.double().tolist()]
    sa, sb = torch.signbit(a).tolist(), torch.signbit(b).tolist()
    for i in range(M):
        for j in range(N):
            c = 0.0  # +0
            for k in range(K):
                exact = A[i][k] * B[k][j] + Fraction(c)
                if exact != 0:
                    c = round_rational(exact, acc_name)
                else:  # IEEE: an exact zero sum is +0 unless both terms are -0
                    neg_product = A[i][k] * B[k][j] == 0 and sa[i][k] != sb[k][j]
                    c = -0.0 if neg_product and math.copysign(1.0, c) < 0 else 0.0
            out[i, j] = c
    return out


def wide(g, *shape, dtype=torch.float32):
    """Values over many binades (any other summation order shows) with zeros of both signs."""
    x = torch.randn(*shape, generator=g, dtype=torch.float64) * torch.exp(
        5 * torch.randn(*shape, generator=g, dtype=torch.float64))
    x = x.to(dtype)
    flat = x.view(-1)
    flat[:: 7] = 0.0
    flat[3 :: 11] = -0.0
    return x


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int32) if x.dtype is torch.float32 else x.view(torch.int64)


def paths():
    """The C paths this CPU runs, and the torch fallback."""
    best = acc.library().fn_best_isa() if acc.library() else -1
    return [name for name, k in acc.ISAS.items() if k <= best] + ["torch"]


def dot_on(path, a, b, acc_name, threads=1):
    if path == "torch":
        return acc._chain_torch(a[None], b[None], acc_name)[0]
    lib = acc.library()
    a3, b3 = a.contiguous()[None], b.contiguous()[None]
    out = torch.empty(1, a.shape[0], b.shape[1], dtype=a.dtype)
    fn = lib.fn_chain_f32 if acc_name == "fp32" else lib.fn_chain_f64
    fn(a3.data_ptr(), b3.data_ptr(), out.data_ptr(), 1, a.shape[0], b.shape[1], a.shape[1],
       a3.stride(0), a3.stride(1), a3.stride(2), b3.stride(0), b3.stride(1), out.stride(0),
       acc.ISAS[path], threads)
    return out[0]


@pytest.mark.parametrize("acc_name", ["fp32", "fp64"])
@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 5, 7), (9, 17, 33), (2, 40, 3), (7, 3, 130)])
def test_every_path_is_one_fma_chain_from_plus_zero(acc_name, shape):
    M, K, N = shape
    g = torch.Generator().manual_seed(M * 100 + K * 10 + N)
    dt = torch.float32 if acc_name == "fp32" else torch.float64
    a, b = wide(g, M, K, dtype=dt), wide(g, K, N, dtype=dt)
    want = chain_oracle(a, b, acc_name).to(dt)
    for path in paths():
        got = dot_on(path, a, b, acc_name)
        assert torch.equal(bits(got), bits(want)), path


@pytest.mark.parametrize("acc_name", ["fp32", "fp64"])
def test_the_paths_agree_on_large_products_at_any_thread_count(acc_name):
    g = torch.Generator().manual_seed(5)
    dt = torch.float32 if acc_name == "fp32" else torch.float64
    a, b = wide(g, 150, 300, dtype=dt), wide(g, 300, 200, dtype=dt)
    want = dot_on("scalar", a, b, acc_name)
    for path in paths():
        for threads in (1, 2):
            if path == "torch" and threads == 2:
                continue
            assert torch.equal(bits(dot_on(path, a, b, acc_name, threads)), bits(want))


def test_layout_broadcast_and_offsets_do_not_change_a_bit():
    g = torch.Generator().manual_seed(7)
    a, b = wide(g, 4, 33, 20), wide(g, 20, 45)
    want = torch.stack([acc.dot(a[i].contiguous(), b.contiguous()) for i in range(4)])
    assert torch.equal(bits(acc.dot(a, b)), bits(want))  # b broadcast over the batch
    at = a.transpose(-1, -2).contiguous().transpose(-1, -2)  # column-major A
    assert torch.equal(bits(acc.dot(at, b)), bits(want))
    big = wide(g, 4, 40, 60)
    off = big[:, 3:36, 5:25]  # a storage offset and non-unit strides
    off.copy_(a)
    assert torch.equal(bits(acc.dot(off, b.T.contiguous().T)), bits(want))
    bb = b.expand(4, 20, 45)  # a stride-0 batch dim
    assert torch.equal(bits(acc.dot(a, bb)), bits(want))


def cascade_oracle(row: list[float], lanes: int, dtype) -> float:
    """ATen's cascade_sum with vectorized_inner_sum, L lanes, in the accumulator's dtype
    (numpy-free scalar code: every + rounded in fp32 / fp64 by torch scalars)."""
    def add(x, y):
        return float(torch.tensor(x, dtype=dtype) + torch.tensor(y, dtype=dtype))
    n = len(row)
    L = lanes if n >= lanes else 1
    size, size_ilp = n // L, (n // L) // 4
    lp = max(4, (1 if size_ilp <= 2 else (size_ilp - 1).bit_length()) // 4)
    step, mask = 1 << lp, (1 << lp) - 1
    accs = [[[0.0] * L for _ in range(4)] for _ in range(4)]
    i = 0
    while i + step <= size_ilp:
        for _ in range(step):
            for k in range(4):
                for e in range(L):
                    accs[0][k][e] = add(accs[0][k][e], row[(i * 4 + k) * L + e])
            i += 1
        for a in range(1, 4):
            for k in range(4):
                for e in range(L):
                    accs[a][k][e] = add(accs[a][k][e], accs[a - 1][k][e])
                    accs[a - 1][k][e] = 0.0
            if i & (mask << (a * lp)):
                break
    for t in range(i, size_ilp):
        for k in range(4):
            for e in range(L):
                accs[0][k][e] = add(accs[0][k][e], row[(t * 4 + k) * L + e])
    for a in range(1, 4):
        for k in range(4):
            for e in range(L):
                accs[0][k][e] = add(accs[0][k][e], accs[a][k][e])
    for v in range(size_ilp * 4, size):
        for e in range(L):
            accs[0][0][e] = add(accs[0][0][e], row[v * L + e])
    for k in range(1, 4):
        for e in range(L):
            accs[0][0][e] = add(accs[0][0][e], accs[0][k][e])
    if L == 1:
        return add(0.0, accs[0][0][0])
    r = 0.0
    for k in range(size * L, n):
        r = add(r, row[k])
    for e in range(L):
        r = add(r, accs[0][0][e])
    return add(0.0, r)


@pytest.mark.parametrize("acc_name", ["fp32", "fp64"])
@pytest.mark.parametrize("n", [1, 3, 4, 7, 8, 9, 31, 33, 64, 100, 129, 600, 2100])
def test_the_row_sum_is_the_stated_cascade_on_every_path(acc_name, n):
    g = torch.Generator().manual_seed(n)
    dt = torch.float32 if acc_name == "fp32" else torch.float64
    x = wide(g, 3, n, dtype=dt)
    want = torch.tensor([cascade_oracle(r, acc.LANES[acc_name], dt) for r in x.tolist()],
                        dtype=dt)
    assert torch.equal(bits(acc.rowsum(x, acc_name)), bits(want))
    assert torch.equal(bits(acc._cascade_torch(x, acc.LANES[acc_name])), bits(want))
    assert torch.equal(bits(acc.rowsum(x.T.contiguous().T, acc_name)), bits(want))  # layout


@pytest.mark.skipif(torch.backends.cpu.get_cpu_capability() not in ("AVX512", "AVX2", "DEFAULT")
                    or not torch.__version__.startswith("2."),
                    reason="the cascade is ATen's on x86 (256-bit Vectorized): other builds "
                           "may sum in another order, which flashnum does not follow")
@pytest.mark.parametrize("n", [5, 8, 100, 4096, 70000])
def test_the_cascade_is_what_torch_sums_contiguous_rows_with_here(n):
    # why the stored tables kept their bits: the engine's fp32 row sums were torch's
    g = torch.Generator().manual_seed(n)
    for dt, name in ((torch.float32, "fp32"), (torch.float64, "fp64")):
        x = wide(g, 4, n, dtype=dt)
        assert torch.equal(acc.rowsum(x, name), x.sum(-1))


def test_means_and_std_follow_the_same_sum():
    g = torch.Generator().manual_seed(1)
    x = wide(g, 3, 5, 7, dtype=torch.float64)
    flat = x.reshape(-1)
    assert float(acc.mean(x)) == float(acc.rowsum(flat, "fp64") / flat.numel())
    m = acc.mean(x, (-1, -2))
    want = torch.stack([acc.rowsum(x[i].reshape(-1), "fp64") / 35 for i in range(3)])
    assert torch.equal(m, want)
    dev = flat - acc.mean(flat)
    assert float(acc.std(x)) == float((acc.rowsum(dev * dev, "fp64") / (flat.numel() - 1)).sqrt())


def test_a_bad_accumulator_or_shape_is_one_line():
    with pytest.raises(ValueError, match="unknown accumulator 'fp16'; valid: fp32, fp64"):
        acc.dot(torch.ones(2, 2), torch.ones(2, 2), "fp16")
    with pytest.raises(ValueError, match=r"cannot multiply \(2, 3\) by \(2, 2\)"):
        acc.dot(torch.ones(2, 3), torch.ones(2, 2))


def test_a_step_whose_float64_sum_is_an_fp32_midpoint_is_rounded_once():
    # (1 + 2^-23) + (2^-24 (1 + 2^-23)) (1 - 2^-23) = 1 + 2^-23 + 2^-24 - 2^-70: just below
    # the midpoint of 1 + 2^-23 and 1 + 2^-22, so fp32 keeps 1 + 2^-23; float64 first
    # rounds it onto the midpoint, and ties-to-even would then give 1 + 2^-22. The second
    # row, 1 + 2^-24 + 2^-70, is the mirror case just above the midpoint of 1 and 1 + 2^-23
    u = 2.0 ** -23
    a = torch.tensor([[1 + u, 2.0 ** -24 * (1 + u)], [1 + u, -(2.0 ** -24) * (1 + u)]],
                     dtype=torch.float32)
    b = torch.tensor([[1.0], [1 - u]], dtype=torch.float32)
    want = chain_oracle(a, b, "fp32").to(torch.float32)
    assert want[:, 0].tolist() == [1 + u, 1 + u]
    for path in paths():
        assert torch.equal(bits(dot_on(path, a, b, "fp32")), bits(want)), path
