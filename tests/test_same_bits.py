"""Same bits on every machine: the stored tables' emulated results, references, metrics and bounds
recompute identically when every library path another CPU might take is forced here.

Another CPU's BLAS, oneDNN, ATen reductions and vector libm sum and round in orders of their
own; switching instruction sets on one machine does not show it (the libraries keep most of
their orders). So the runs below replace the libraries instead (tests/orders/perturb.py:
every torch GEMM, einsum and reduction sums in reversed order, float64 exp and log return a
neighbouring double, numpy's matmul reverses its sums; in every process of the run), and
force flashnum's own paths: accumulate.c's AVX2 and scalar chains instead of AVX-512, the
torch path instead of the fused loops, no compiler at all. Shards of the shipped
experiments rerun that way must equal experiments/ in every column but the timings (and the
columns that measure the machine's own torch: flashnum.store.compare).

At 576772c, before flashnum had its own orders, the perturbed runs of the first three shards
below differed from that commit's stored tables in 15 columns each (every error measure,
the bound, its terms and the reference's error bound; 19, 11 and 4 of 19, 11 and 4 rows),
the fp32 sweep's emulated output itself in 10 of its 11 rows (max_abs_err).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from bits import same_bits  # tests/bits.py

import flashnum
from flashnum.numerics import accumulate

REPO = Path(__file__).resolve().parents[1]
ORDERS = REPO / "tests" / "orders"

# shards that between them reach every preset (fa2, naive, lowp, uniform, exact, p<bits>,
# tf32, mp), the block-scaled and split-KV paths, every key order, captured inputs and the
# backward's three structures
QUICK = [
    "bf16_sweep num_shards=120 shard=7 progress=false",
    "fp32_sweep num_shards=40 shard=3 progress=false",
    "precision_bits num_shards=40 shard=5 progress=false",
    "block_scaled num_shards=20 shard=3 progress=false",
    "block_order num_shards=40 shard=1 progress=false",
    "bwd_bf16_sweep limit=8",
]
BROAD = QUICK + [
    "fp16_sweep num_shards=20 shard=3 progress=false",
    "block_size num_shards=20 shard=3 progress=false",
    "splitkv_decode num_shards=5 shard=3 progress=false",
    "seqlen_growth num_shards=60 shard=3 progress=false",
    "trained_model num_shards=30 shard=3 progress=false",
    "worst_case num_shards=36 shard=3 progress=false",
    "bwd_order limit=10",
    "bwd_trained_model limit=10",
    "input_transforms",
    "ties_bias",
    "trained_model_stats",
]
TINY = [  # without a compiler every chain runs in torch's elementwise operations: slow
    "bf16_sweep num_shards=300 shard=7 progress=false",
    "precision_bits num_shards=60 shard=5 progress=false",
    "bwd_bf16_sweep limit=3",
]


def rerun(tmp_path, specs, **env) -> str:
    e = dict(os.environ, **env)
    e["PYTHONPATH"] = os.pathsep.join([str(ORDERS), str(REPO), e.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, str(ORDERS / "rerun.py"), str(tmp_path / "scratch"),
                        str(REPO / "experiments"), *specs], capture_output=True, text=True,
                       env=e, cwd=REPO, timeout=3000)  # a conf's capture path is the checkout's
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return r.stdout


def _needs(isa: str):
    return pytest.mark.skipif(
        accumulate.library() is None or accumulate.library().fn_best_isa() < accumulate.ISAS[isa],
        reason=f"this CPU does not run accumulate.c's {isa} path")


@_needs("avx2")
def test_perturbed_libraries_and_the_avx2_path_recompute_the_stored_rows(tmp_path):
    out = rerun(tmp_path, QUICK, FLASHNUM_TEST_ORDERS="1", FLASHNUM_SIMD="avx2")
    assert out.count(": identical") == len(QUICK), out


def test_the_torch_path_with_scalar_chains_recomputes_the_stored_rows(tmp_path):
    out = rerun(tmp_path, QUICK, FLASHNUM_FUSED="0", FLASHNUM_SIMD="scalar",
                FLASHNUM_TEST_ORDERS="1")
    assert out.count(": identical") == len(QUICK), out


@pytest.mark.slow
def test_perturbed_libraries_recompute_a_broad_selection(tmp_path):
    out = rerun(tmp_path, BROAD, FLASHNUM_TEST_ORDERS="1")
    assert out.count(": identical") == len(BROAD), out


@pytest.mark.slow
def test_without_a_compiler_the_stored_rows_recompute(tmp_path):
    out = rerun(tmp_path, TINY, FLASHNUM_NATIVE="0", FLASHNUM_TEST_ORDERS="1")
    assert out.count(": identical") == len(TINY), out


# -- in process: threads and memory layout ----------------------------------------------


def _inputs(d=8, n=150):
    g = torch.Generator().manual_seed(d * 1000 + n)
    return [torch.randn(2, 3, n, d, generator=g) * 3 for _ in range(4)]


def _views(x):
    """x, and the same values as a transposed view, a view with a storage offset and odd
    strides, and a float64 copy."""
    t = x.transpose(-1, -2).contiguous().transpose(-1, -2)
    big = torch.zeros(*x.shape[:-1], x.shape[-1] * 2 + 3)
    off = big[..., 3 :: 2]
    off.copy_(x)
    return {"contiguous": x, "transposed": t, "offset": off, "float64": x.double()}


CALLS = [dict(precision=p, policy=pol) for p in ("bf16", "fp16", "fp32", "tf32")
         for pol in ("fa2", "naive", "lowp")] + [
    dict(precision="fp32", policy="exact"), dict(precision="bf16", policy="fa2", order="random"),
    dict(precision="bf16", policy="fa2", causal=True), dict(precision="p6", policy="uniform")]


@pytest.mark.parametrize("d", [2, 64])
@pytest.mark.parametrize("kw", CALLS, ids=lambda kw: "-".join(map(str, kw.values())))
def test_layout_and_threads_change_no_bit_of_the_forward(kw, d):
    # head dims 2-8 with a non-unit-stride last dimension once took another BLAS kernel
    q, k, v, _ = _inputs(d)
    kw = dict(kw, block_m=32, block_n=32)
    want = flashnum.attention(q, k, v, **kw)
    threads = torch.get_num_threads()
    try:
        for n_threads in (1, 2):
            torch.set_num_threads(n_threads)
            for name, qq in _views(q).items():
                got = flashnum.attention(qq, _views(k)[name], _views(v)[name], **kw)
                assert same_bits(got.out, want.out), (name, n_threads)
                assert same_bits(got.m, want.m) and same_bits(got.l, want.l), (name, n_threads)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("policy", ["fa2", "naive", "lowp"])
def test_layout_and_threads_change_no_bit_of_the_backward(policy):
    q, k, v, do = _inputs(4, 90)
    kw = dict(precision="bf16", policy=policy, block_m=16, block_n=16)
    want = flashnum.attention_backward(q, k, v, do, **kw)
    threads = torch.get_num_threads()
    try:
        for n_threads in (1, 2):
            torch.set_num_threads(n_threads)
            for name in ("transposed", "offset"):
                got = flashnum.attention_backward(
                    *(_views(x)[name] for x in (q, k, v, do)), **kw)
                for g in ("dq", "dk", "dv"):
                    assert same_bits(getattr(got, g), getattr(want, g)), (name, n_threads, g)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("method", ["fp64", "certified"])
def test_references_are_functions_of_the_values_alone(method):
    q, k, v, _ = _inputs(8, 70)
    want = flashnum.reference(q, k, v, method=method, cache=False)
    for name in ("transposed", "offset"):
        got = flashnum.reference(*(_views(x)[name] for x in (q, k, v)), method=method,
                                 cache=False)
        assert same_bits(got.out, want.out) and same_bits(got.err_bound, want.err_bound), name
