"""The native exp kernel: an accelerator that must change no bit of any result.

Its claims (flashnum/engine/native.py): P = fp32(exp(s - m)) and its bf16 cast equal the torch
path's on every float32 input, and are correctly rounded. experiment exp_exhaustive checks
every input; these tests check a spread sample, the hard inputs that exhaustive run
found, the special values, whole engine runs with the kernel on and off, and the
fallback when it cannot be built.
"""

import math
import os
import subprocess
import sys
from contextlib import contextmanager

import numpy as np
import pytest
import torch

import flashnum
from flashnum.engine import native
from flashnum.engine.arith import Arith
from flashnum.numerics.formats import get_format
from flashnum.numerics.policy import make_policy

needs_kernel = pytest.mark.skipif(not native.available(), reason=f"{native.status()}")

def torch_path(x, base2=False):
    """What the engine computes without the kernel (Arith.exp on the fp32 carrier)."""
    arith = Arith(make_policy("fa2", "bf16"), "nearest", 0, torch.float32)
    with kernel_off():
        return arith.exp(x, get_format("fp32"), base2)


@contextmanager
def kernel_off():
    native.set_enabled(False)
    try:
        yield
    finally:
        native.set_enabled(True)


def kernel(x, m=None, base2=False):
    p, pc = torch.empty_like(x), torch.empty_like(x)
    assert native.exp_rows(x, m, p, pc, "bf16", base2)
    return p, pc


def spread(lo, hi, step=4099):
    """Every step-th float32 between lo <= 0 <= hi, by bit pattern."""
    pos = torch.arange(0, int(np.float32(hi).view(np.int32)) + 1, step, dtype=torch.int64)
    neg = torch.arange(int(np.float32(-0.0).view(np.uint32)),
                       int(np.float32(lo).view(np.uint32)) + 1, step, dtype=torch.int64)
    return torch.cat([pos, neg]).to(torch.int32).view(torch.float32)


@needs_kernel
@pytest.mark.parametrize("base2,lo,hi", [(False, -104.0, 89.0), (True, -151.0, 129.0)])
def test_kernel_equals_the_torch_path_across_the_whole_range(base2, lo, hi):
    # ~1.1 million inputs spread over every binade where exp is neither 0 nor inf
    x = spread(lo, hi)
    p, pc = kernel(x, base2=base2)
    ref = torch_path(x, base2)
    assert torch.equal(p, ref)
    assert torch.equal(pc, ref.bfloat16().float())  # torch's cast: one round to nearest even


@needs_kernel
@pytest.mark.parametrize("base2", [False, True])
def test_hard_inputs_are_correctly_rounded_by_both_paths(base2):
    # the inputs within 4 float64 ulps of an fp32 rounding boundary; float64 alone
    # rounds exp2(0.0029695758130401373) wrongly in torch (SLEEF) and
    # exp2(-0.029743773862719536) wrongly in both: each path corrects what it misses
    x = torch.tensor(native.HARD["exp2" if base2 else "exp"], dtype=torch.float32)
    want = torch.tensor([native.correctly_rounded(float(v), base2) for v in x])
    assert torch.equal(kernel(x, base2=base2)[0], want)
    assert torch.equal(torch_path(x, base2), want)


def test_float64_alone_is_not_enough_for_exp2():
    # why the corrections exist: exp2(-0.029743773862719536) lies 0.066 float64 ulps from
    # an fp32 midpoint, and a float64 evaluation lands on the wrong side of it
    x = -0.029743773862719536
    assert float(torch.exp2(torch.tensor(x, dtype=torch.float64)).float()) != (
        native.correctly_rounded(x, True))


@needs_kernel
def test_a_sample_is_correctly_rounded():
    g = torch.Generator().manual_seed(0)
    x = torch.cat([-torch.rand(300, generator=g) * 104, torch.rand(100, generator=g) * 89])
    for base2 in (False, True):
        p, _ = kernel(x, base2=base2)
        assert [float(v) for v in p] == [native.correctly_rounded(float(v), base2) for v in x]


@needs_kernel
def test_special_values_match_the_torch_path():
    fmax = float(np.finfo(np.float32).max)
    x = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), -104.0, -103.97,
                      -103.9, -87.4, 88.72, 88.73, 89.0, 89.5, -150.0, -149.5, -151.0, 129.0,
                      128.0, 127.9999, fmax, -fmax, 1e-45, -1e-45])
    for base2 in (False, True):
        p, pc = kernel(x, base2=base2)
        ref = torch_path(x, base2)
        assert torch.equal(torch.isnan(p), torch.isnan(ref))
        assert torch.equal(torch.nan_to_num(p), torch.nan_to_num(ref))
        assert torch.equal(torch.nan_to_num(pc), torch.nan_to_num(ref.bfloat16().float()))


@needs_kernel
def test_the_subtraction_of_m_is_one_fp32_rounding():
    # x = s - m is the fp32 difference (the site s - m), not the exact one
    g = torch.Generator().manual_seed(1)
    s = torch.randn(512, 64, generator=g) * 30
    m = s.amax(-1) + torch.rand(512, generator=g)
    p, pc = kernel(s, m)
    ref = torch_path(s - m[:, None])
    assert torch.equal(p, ref)
    assert torch.equal(pc, ref.bfloat16().float())


@needs_kernel
def test_p_may_overwrite_s_and_odd_row_lengths_work():
    g = torch.Generator().manual_seed(2)
    for n in (1, 3, 17, 65):
        s = -torch.rand(37, n, generator=g) * 20
        ref = torch_path(s)
        assert native.exp_rows(s, None, s)
        assert torch.equal(s, ref)


@needs_kernel
def test_bf16_rounding_equals_torchs_cast_on_every_4099th_bit_pattern():
    # the exhaustive version (all 2^32) is the experiment exp_exhaustive
    x = torch.arange(0, 1 << 32, 4099, dtype=torch.int64).to(torch.int32).view(torch.float32)
    y, ref = native.round_bf16(x), x.bfloat16().float()
    assert torch.equal(torch.isnan(y), torch.isnan(ref))
    assert torch.equal(torch.nan_to_num(y), torch.nan_to_num(ref))


@needs_kernel
@pytest.mark.parametrize("base2", [False, True])
def test_the_state_update_is_the_torch_ops_of_an_fa2_step(base2):
    # m, m_blk over finite values, -inf (masked so far), +inf (overflow) and NaN
    vals = [-math.inf, -3.5, 0.0, 2.25, 7.0, math.inf, math.nan]
    pairs = torch.tensor([(a, b) for a in vals for b in vals] * 3, dtype=torch.float32)
    pairs[len(vals) ** 2:] += torch.randn(2 * len(vals) ** 2, 2, generator=torch.Generator()
                                          .manual_seed(4))
    m, m_blk = pairs[:, 0].contiguous(), pairs[:, 1].contiguous()
    n = torch.arange(len(m), dtype=torch.int64)
    arith = Arith(make_policy("fa2", "bf16"), "nearest", 0, torch.float32)
    # the torch ops of engine._flash's guarded branch
    m_new = torch.maximum(m, m_blk)
    n_want = n + ((m_new > m) & torch.isfinite(m))
    safe_want = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
    with kernel_off():
        alpha_want = arith.exp(m - safe_want, get_format("fp32"), base2)
    m_k, n_k, safe, alpha = m.clone(), n.clone(), torch.empty_like(m), torch.empty_like(m)
    finite = native.fa2_state(m_k, m_blk, n_k, safe, alpha, base2)
    assert finite is False  # inf and NaN among the new maxima
    assert torch.equal(torch.isnan(m_k), torch.isnan(m_new))
    assert torch.equal(torch.nan_to_num(m_k), torch.nan_to_num(m_new))
    assert torch.equal(n_k, n_want) and torch.equal(safe, safe_want)
    assert torch.equal(torch.isnan(alpha), torch.isnan(alpha_want))
    assert torch.equal(torch.nan_to_num(alpha), torch.nan_to_num(alpha_want))
    ok = native.fa2_state(torch.zeros(5), torch.ones(5), torch.zeros(5, dtype=torch.int64),
                          torch.empty(5), torch.empty(5), base2)
    assert ok is True


def test_unsupported_arguments_are_declined_not_miscomputed():
    s = torch.zeros(4, 8)
    assert not native.exp_rows(s.double(), None, s)  # float64 input
    assert not native.exp_rows(s.t(), None, torch.empty(8, 4))  # not contiguous
    assert not native.exp_rows(s, None, s, torch.empty(4, 8), "fp16")  # a cast it lacks
    assert native.round_bf16(s.double()) is None
    m = torch.zeros(4)
    assert native.fa2_state(m, m, torch.zeros(4), m, m) is None  # counts must be int64


@pytest.mark.parametrize("policy,precision", [("fa2", "bf16"), ("fa2", "fp16"), ("fa2", "fp32"),
                                              ("fa2", "fp8_e4m3")])
@pytest.mark.parametrize("variant", ["fa2", "exp2", "lazy"])
@pytest.mark.parametrize("causal", [False, True])
def test_engine_results_do_not_depend_on_the_kernel(policy, precision, variant, causal):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 130, 32, generator=g) * 2 for _ in range(3))
    kw = dict(precision=precision, policy=policy, variant=variant, causal=causal, trace=True,
              block_m=32, block_n=32)
    on = flashnum.attention(q, k, v, **kw)
    with kernel_off():
        off = flashnum.attention(q, k, v, **kw)
    for a, b in [(on.out, off.out), (on.m, off.m), (on.l, off.l), (on.trace.l, off.trace.l)]:
        assert torch.equal(a, b)


def _status_in_subprocess(env):
    code = "from flashnum.engine import native; print(native.status())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, **env}, check=True)
    return r.stdout.strip()


def test_the_kernel_can_be_turned_off():
    assert _status_in_subprocess({"FLASHNUM_NATIVE": "0"}) == (
        "torch path (disabled by FLASHNUM_NATIVE=0)")


def test_without_a_compiler_the_engine_falls_back_and_says_why(tmp_path):
    env = {"CC": str(tmp_path / "no-such-cc"), "FLASHNUM_CACHE": str(tmp_path)}
    assert _status_in_subprocess(env).startswith("torch path (not built:")
