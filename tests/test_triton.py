"""Specification of the Triton kernel (flashnum.backends.triton).

On a CPU these run Triton's interpreter (TRITON_INTERPRET=1, set by the module);
tests marked `gpu` need CUDA and skip without it. What is specified:

- with the engine's arithmetic put into the interpreter (a correctly rounded exp
  and torch's row sum), the kernel equals the engine bit for bit: every rounding
  happens at the same site, in fp16, bf16, fp32 and tf32, causal, ragged, every order;
- with the interpreter as it is, the ulp distribution of kernel - engine, and why;
- the invariants on the kernel's own numbers: final m is the row max of its logits,
  l >= 1, the trace follows the order, fully masked rows give 0;
- bf16 and tf32 rounding on the bits equals the reference casts at the boundaries;
- bad arguments raise one ValueError that names the valid choices.
"""

import importlib.util
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import flashnum
from flashnum.numerics.formats import FORMATS

if importlib.util.find_spec("triton") is None:  # not importorskip: it would import triton
    pytest.skip("the kernel needs triton (pip install -e '.[triton]')", allow_module_level=True)
from flashnum.backends import triton as tf  # noqa: E402
from flashnum.backends import triton_kernel as tk  # noqa: E402
from flashnum.numerics.tiling import causal_visible, key_block_order, n_blocks  # noqa: E402

# triton as the kernel module imported it (TRITON_INTERPRET set first on a CPU)
triton, tl = tk.triton, tk.tl

interpreter_only = pytest.mark.skipif(not tf.INTERPRET, reason="checks the CPU interpreter path")
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def qkv(lead, nq, nk, d, dv=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(*lead, nq, d, generator=g),
        torch.randn(*lead, nk, d, generator=g),
        torch.randn(*lead, nk, dv or d, generator=g),
    )


@pytest.fixture
def engine_arithmetic(monkeypatch):
    """The interpreter with the engine's exp (correctly rounded) and row sum (torch's).

    These are the two places where Triton's interpreter and the engine compute the
    same rounding site differently (numpy's float32 exp is not correctly rounded;
    np.sum and torch.sum add in different orders). Everything else (dots for
    d <= 192, casts, the recurrence) must then agree bit for bit.
    """
    from triton.runtime import interpreter as it

    def cr(f64):
        return lambda self, a: self.unary_op(a, lambda x: f64(x.astype(np.float64)).astype(x.dtype))

    def torch_sum(self, input):
        x = torch.from_numpy(np.ascontiguousarray(input.handle.data))
        return self.to_tensor(x.sum(self.axis, keepdim=self.keep_dims).numpy(), input.dtype)

    monkeypatch.setattr(it.InterpreterBuilder, "create_exp", cr(np.exp))
    monkeypatch.setattr(it.InterpreterBuilder, "create_exp2", cr(np.exp2))
    monkeypatch.setattr(it.ReduceOps, "sum", torch_sum)


# ---------------------------------------------------------------------------
# the same roundings at the same sites as the engine

CASES = [  # (lead, nq, nk, d, dv, block_m, block_n, order, causal, variant)
    ((2, 2), 40, 40, 32, 32, 16, 16, "forward", False, "fa2"),
    ((3,), 50, 70, 48, 24, 16, 32, "reverse", True, "exp2"),  # padded d, dv; ragged
    ((2,), 70, 40, 32, 32, 32, 16, [2, 0, 1], True, "fa2"),  # Nq > Nk: masked rows
    ((2,), 64, 100, 64, 64, 32, 16, "random", False, "fa2"),
    ((2,), 64, 100, 128, 16, 64, 32, "max_descending", True, "exp2"),
    ((2,), 70, 90, 32, 32, 32, 32, "partial_first", True, "fa2"),  # per query block
]


@interpreter_only
@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32", "tf32"])
def test_bit_exact_with_engine_arithmetic(engine_arithmetic, precision):
    for i, (lead, nq, nk, d, dv, bm, bn, order, causal, variant) in enumerate(CASES):
        q, k, v = qkv(lead, nq, nk, d, dv, seed=i)
        kw = dict(precision=precision, block_m=bm, block_n=bn, order=order, causal=causal,
                  variant=variant, seed=5, trace=True)
        r = tf.attention_triton(q, k, v, **kw)
        e = flashnum.attention(q, k, v, **kw)
        case = f"case {i}: {kw}"
        for name in ("out", "m", "l", "lse", "masked", "n_rescales"):
            assert torch.equal(getattr(r, name), getattr(e, name)), f"{name} differs, {case}"
        for name in ("m", "l", "order"):
            assert torch.equal(getattr(r.trace, name), getattr(e.trace, name)), case


@interpreter_only
def test_l_from_cast_p_bit_exact(engine_arithmetic):
    q, k, v = qkv((2,), 48, 80, 32, seed=7)
    pol = flashnum.make_policy("fa2", "bf16").with_sites(l_from="p_cast")
    r = tf.attention_triton(q, k, v, policy=pol, block_m=16, block_n=32, causal=True)
    e = flashnum.attention(q, k, v, policy=pol, block_m=16, block_n=32, causal=True)
    assert torch.equal(r.out, e.out) and torch.equal(r.l, e.l)
    default = tf.attention_triton(q, k, v, precision="bf16", block_m=16, block_n=32, causal=True)
    assert not torch.equal(default.l, r.l)  # the knob reaches the kernel


@interpreter_only
@pytest.mark.parametrize("p_cast", ["tf32", "bf16", "fp16"])
def test_p_cast_narrower_than_fp32_inputs_bit_exact(engine_arithmetic, p_cast):
    q, k, v = qkv((1,), 40, 50, 16, seed=8)
    pol = flashnum.make_policy("fa2", "fp32").with_sites(p_cast=p_cast)
    r = tf.attention_triton(q, k, v, policy=pol, block_m=16, block_n=16)
    e = flashnum.attention(q, k, v, policy=pol, block_m=16, block_n=16)
    assert torch.equal(r.out, e.out) and torch.equal(r.l, e.l)


# ---------------------------------------------------------------------------
# the interpreter as it is: ulp distribution of kernel - engine


@interpreter_only
@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32"])
def test_ulp_distribution_vs_engine(precision):
    """kernel - engine in ulps of the output format, the interpreter unpatched.

    The differences come only from numpy's float32 exp (<= 2 ulp from correctly
    rounded on 39% of arguments, measured) and np.sum's order (the patched test above
    is bit exact). `scaled` counts ulps at softmax(S) @ |V|, the magnitude every
    rounding of P, l, o is relative to; `elem` counts ulps at |out|, which cancellation
    can make far smaller. Measured by `python -m flashnum.run experiment=triton_interpreter`
    (this case, seeds 0, 1, 2, variants fa2 and exp2):
      fp16  elem <=1: 99.972-100 %, max 1-34  | scaled max 0.25-0.5
      bf16  elem <=1: 99.996-100 %, max 0-2   | scaled max 0-0.25
      fp32  elem <=1: 56.9-65.1 %, max 4e3-1.3e6 | scaled <=1: 99.79-99.90 %, max 2-2.5
    fp16/bf16: one P-cast flip moves out by <= 2u |P||V|/l, the output rounding by one
    more ulp, so scaled < 3 ulp is proven; the issue's criterion (>= 99.9 % within 1,
    all within 2) is asserted on the scaled unit and >= 99.9 % within 1 on the elementwise.
    fp32: P and alpha differ by <= 2 fp32 ulp each, so a first-order bound is ~9 scaled
    ulp; asserted: the measured figures rounded outward (>= 99.7 % within 1, max <= 3).
    """
    q, k, v = qkv((2, 2), 96, 110, 64, seed=0)
    c = tf.compare_with_engine(q, k, v, precision=precision, block_m=32, block_n=32)
    assert c["m_equal"] and c["masked_equal"]
    elem, scaled = c["elem"], c["scaled"]
    if precision in ("fp16", "bf16"):
        assert scaled["le1"] >= 0.999 and scaled["max"] <= 2, c
        assert elem["le1"] >= 0.999, c
    else:
        assert scaled["le1"] >= 0.997 and scaled["max"] <= 3, c
        assert elem["le0"] < 0.5  # fp32 output: most elements feel the exp differences


# ---------------------------------------------------------------------------
# invariants on the kernel's own numbers


def kernel_logits(q, k, scale, causal):
    """scale * Q K^T as the interpreter forms it: numpy fp32 dot, fp32 scale, fp32 product."""
    a = q.to(torch.float16).float().numpy()  # the fp16 policy: inputs rounded to fp16
    b = k.to(torch.float16).float().numpy()
    s = torch.from_numpy(np.matmul(a, np.swapaxes(b, -1, -2))) * torch.tensor(scale).float()
    if causal:
        s = s.masked_fill(~causal_visible(s.shape[-2], s.shape[-1]), -math.inf)
    return s.double()


@interpreter_only
@pytest.mark.parametrize("order", ["forward", "reverse", "random"])
def test_state_invariants(order):
    nq, nk, bn = 70, 45, 16  # Nq > Nk, causal: the first 25 rows see no key; ragged tails
    q, k, v = qkv((2,), nq, nk, 32, seed=3)
    r = tf.attention_triton(q, k, v, precision="fp16", block_m=32, block_n=bn, order=order,
                            causal=True, trace=True, seed=11)
    s = kernel_logits(q, k, 1 / math.sqrt(32), causal=True)
    # final m is the row max of the kernel's logits; masked rows keep -inf, l 0, out 0
    assert torch.equal(r.m, s.amax(-1))
    masked = torch.arange(nq) < nq - nk
    assert torch.equal(r.masked, masked.expand(2, nq))
    assert bool((r.l[:, ~masked] >= 1).all())  # the max term contributes exp(0) = 1
    assert bool((r.l[:, masked] == 0).all()) and bool((r.out[:, masked] == 0).all())
    # the trace: step t holds the state after the t-th key block in processing order
    perm = key_block_order(order, n_blocks(nq, 32), n_blocks(nk, bn), seed=11)
    assert torch.equal(r.trace.order, perm.expand(2, -1, -1))
    tiles = torch.nn.functional.pad(s, (0, n_blocks(nk, bn) * bn - nk), value=-math.inf)
    tile_max = tiles.reshape(2, nq, -1, bn).amax(-1)  # (2, nq, n_kb)
    row_perm = perm.repeat_interleave(32, 0)[:nq]  # each row's query-block order
    expect = torch.cummax(tile_max.gather(-1, row_perm.expand(2, -1, -1)), -1).values
    assert torch.equal(r.trace.m, expect.transpose(-1, -2))
    assert torch.equal(r.trace.m[..., -1, :], r.m) and torch.equal(r.trace.l[..., -1, :], r.l)
    tm = r.trace.m
    grew = (tm[..., 1:, :] > tm[..., :-1, :]) & torch.isfinite(tm[..., :-1, :])
    assert torch.equal(r.n_rescales, grew.sum(-2))


@interpreter_only
def test_causal_is_bottom_right_and_matches_float64_attention():
    """fp32 kernel vs float64 attention on the same inputs, Nq != Nk both ways.

    Oracle of flash-attention's tests: |kernel - ref| <= 2 |torch fp32 standard - ref|
    """
    for nq, nk in ((33, 50), (50, 33)):
        q, k, v = qkv((2,), nq, nk, 32, seed=nq)
        r = tf.attention_triton(q, k, v, precision="fp32", block_m=16, block_n=16, causal=True)
        vis = causal_visible(nq, nk)
        s64 = (q.double() @ k.double().transpose(-1, -2) / math.sqrt(32)).masked_fill(
            ~vis, -math.inf)
        ref = torch.softmax(s64, -1).nan_to_num(0.0) @ v.double()
        s32 = (q @ k.transpose(-1, -2) / math.sqrt(32)).masked_fill(~vis, -math.inf)
        std = (torch.softmax(s32, -1).nan_to_num(0.0) @ v).double()
        assert (r.out - ref).abs().max() <= 2 * (std - ref).abs().max()
        assert torch.equal(r.masked, ~vis.any(-1).expand(2, nq))


@interpreter_only
def test_backend_dispatch_and_result_fields():
    q, k, v = qkv((1, 2), 20, 30, 16, seed=1)
    a = flashnum.attention(q, k, v, precision="bf16", backend="triton", block_m=16, block_n=16,
                           variant="exp2")
    b = tf.attention_triton(q, k, v, precision="bf16", block_m=16, block_n=16, variant="exp2")
    assert a.backend == "triton" and torch.equal(a.out, b.out)
    assert a.out.dtype == torch.float64 and a.out.shape == (1, 2, 20, 16)
    assert FORMATS["bf16"].representable(a.out)
    # exp2: m, l in base-2 units; lse back in natural log
    assert torch.equal(a.lse, a.m / tf.LOG2E + torch.log(a.l))


# ---------------------------------------------------------------------------
# rounding on the bits (the interpreter fix-ups; also run on a GPU)


@triton.jit
def _round_kernel(X, Y, N, DROP: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + i, mask=i < N)
    tl.store(Y + i, tk._round_rne(x, DROP), mask=i < N)


def boundary_values():
    f32 = np.finfo(np.float32)
    edges = [
        0.0, -0.0, 1.0, 1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 1 + 2**-11, 1 + 3 * 2**-11,
        2 - 2**-23, float(f32.max), -float(f32.max), 3.3895314e38,  # bf16 overflow threshold
        float(f32.tiny), float(f32.tiny) * (1 - 2**-7), 2.0**-149, 2.0**-140 * 1.5,
        math.inf, -math.inf,
    ]
    g = torch.Generator().manual_seed(0)
    wide = torch.randn(20000, generator=g) * torch.exp2(torch.randint(-140, 127, (20000,),
                                                                     generator=g).float())
    return torch.cat([torch.tensor(edges, dtype=torch.float32), wide.float()])


@pytest.mark.parametrize("fmt,drop", [("bf16", 16), ("tf32", 13)])
def test_round_rne_on_bits_equals_reference(fmt, drop):
    x = boundary_values()
    dev = "cpu" if tf.INTERPRET else "cuda"
    y = torch.empty_like(x, device=dev)
    _round_kernel[(triton.cdiv(x.numel(), 1024),)](x.to(dev), y, x.numel(), DROP=drop,
                                                   BLOCK=1024)
    expect = FORMATS[fmt].round(x.double())  # correctly rounded, nearest even, from exact x
    assert torch.equal(y.cpu().double(), expect)
    nan = torch.tensor([math.nan], device=dev)
    out = torch.empty_like(nan)
    _round_kernel[(1,)](nan, out, 1, DROP=drop, BLOCK=16)
    assert bool(torch.isnan(out).all())


@interpreter_only
def test_the_interpreter_needs_the_bf16_fixups():
    """Triton 3.9's interpreter: bf16 dots multiply raw bit patterns, fp32 -> bf16 truncates.

    If this fails, Triton has fixed the interpreter and EMULATE's bf16 work-arounds
    can be revisited (they stay correct, only unnecessary).
    """
    @triton.jit
    def k(A, B, C, P, R, N: tl.constexpr):
        i = tl.arange(0, N)
        a = tl.load(A + i[:, None] * N + i[None, :])
        b = tl.load(B + i[:, None] * N + i[None, :])
        tl.store(C + i[:, None] * N + i[None, :], tl.dot(a, b))
        tl.store(R + i, tl.load(P + i).to(tl.bfloat16))

    a, b = qkv((), 16, 16, 16)[:2]
    a, b = a.bfloat16(), b.bfloat16()
    c = torch.empty(16, 16)
    p = torch.full((16,), 1 + 3 * 2**-9)  # nearest bf16 is 1 + 2^-7 (round up)
    r = torch.empty(16, dtype=torch.bfloat16)
    k[(1,)](a, b, c, p, r, N=16)
    assert (c - a.float() @ b.float()).abs().max() > 1e3
    assert bool((r.float() == 1.0).all())  # truncated


# ---------------------------------------------------------------------------
# bad arguments: one clear ValueError each


def _bad(**over):
    lead, nq, nk, d, dv = (1,), 20, 20, 16, 16
    d, dv = over.pop("d", d), over.pop("dv", dv)
    q, k, v = qkv(lead, nq, nk, d, dv)
    if over.pop("mixed", False):
        k = k.double()
    if over.pop("fp8_tensor", False):
        q, k, v = (x.to(torch.float8_e4m3fn) for x in (q, k, v))
    kw = dict(precision="fp16", block_m=16, block_n=16)
    kw.update(over)
    return q, k, v, kw


BAD = [
    (dict(d=12), "head dim d=12.*16..256"),
    (dict(d=512), "head dim d=512.*16..256"),
    (dict(dv=320), "value dim dv=320"),
    (dict(block_n=48), "block_n=48.*16, 32, 64, 128"),
    (dict(block_m=256), "block_m=256.*16, 32, 64, 128"),
    (dict(mixed=True), "dtypes differ"),
    (dict(precision="fp8_e4m3"), "fp8.*needs a CUDA GPU"),
    (dict(fp8_tensor=True), "fp8.*needs a CUDA GPU"),
    (dict(policy="lowp"), "lowp.*m='fp16'.*presets fa2"),
    (dict(policy="naive"), "structure='standard'"),
    (dict(policy="exact"), "inputs='exact'"),
    (dict(precision="fp64"), "inputs='fp64'"),
    (dict(variant="fa1"), "variant 'fa1'.*fa2, exp2"),
    (dict(variant="lazy"), "variant 'lazy'"),
    (dict(rounding="stochastic"), "rounding 'stochastic'.*nearest"),
    (dict(precision="fp32", input_precision="bogus"), "input_precision 'bogus'.*ieee, tf32"),
    (dict(precision="fp32", input_precision="tf32"), "contradicts the policy's qk_acc='fp32'"),
    (dict(precision="tf32", input_precision="ieee"), "contradicts the policy's qk_acc='tf32'"),
]


@pytest.mark.parametrize("over,message", BAD, ids=[m.split(".*")[0] for _, m in BAD])
def test_bad_arguments(over, message):
    q, k, v, kw = _bad(**dict(over))
    if not tf.INTERPRET and "GPU" in message:
        pytest.skip("fp8 runs on a GPU")
    with pytest.raises(ValueError, match=message):
        tf.attention_triton(q, k, v, **kw)


@interpreter_only
@pytest.mark.slow  # two fresh interpreters that import triton
@pytest.mark.parametrize("env,code,message", [
    ({"TRITON_INTERPRET": "0"}, "import flashnum.backends.triton", "Set TRITON_INTERPRET=1"),
    ({}, "import triton.language; import flashnum.backends.triton",
     "imported before TRITON_INTERPRET=1"),
], ids=["interpret-off", "triton-first"])
def test_import_rule_on_cpu(env, code, message):
    """Without a GPU the import fails clearly unless the interpreter can be used.
    (This test process itself is the case that works: the kernel module came first.)"""
    base = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run([sys.executable, "-c", code], env=dict(base, CUDA_VISIBLE_DEVICES="", **env),
                       capture_output=True, text=True,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert p.returncode != 0 and message in p.stderr


# ---------------------------------------------------------------------------
# on a GPU


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("variant", ["fa2", "exp2"])
def test_gpu_kernel_vs_engine(precision, variant):
    # ex2.approx.f32 and the MMA's own summation order replace the interpreter's
    # numpy exp and sequential sums; the fp16/bf16 proof (scaled < 3 ulp) still holds
    q, k, v = qkv((2, 4), 256, 300, 64, seed=2)
    c = tf.compare_with_engine(q.cuda(), k.cuda(), v.cuda(), precision=precision,
                               block_m=64, block_n=64, variant=variant, causal=True)
    assert c["masked_equal"]
    assert c["scaled"]["max"] < 3, c


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("precision", ["fp8_e4m3", "fp8_e5m2"])
def test_gpu_fp8_runs(precision):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 dots need sm_89 or newer")
    q, k, v = qkv((1, 2), 128, 128, 64)
    r = tf.attention_triton(q, k, v, precision=precision, block_m=64, block_n=64)
    assert bool(torch.isfinite(r.out).all()) and FORMATS["bf16"].representable(r.out)


@interpreter_only
def test_max_orders_rank_tiles_over_real_rows_only():
    """The last query block is ragged (rows 16..19 real, 20..31 padding): its order must
    come from the real rows' logits (all < 0 here), not from the padding's (0)."""
    g = torch.Generator().manual_seed(0)
    nq, nk, d = 20, 64, 16
    q = torch.rand(1, nq, d, generator=g) + 0.5
    k = -(torch.rand(1, nk, d, generator=g) + 0.5) * torch.linspace(0.2, 2, nk)[:, None]
    v = torch.randn(1, nk, d, generator=g)
    r = tf.attention_triton(q, k, v, precision="fp32", block_m=16, block_n=16,
                            order="max_ascending", trace=True)
    # the logits fall with the key index, so ascending block maxima is blocks 3, 2, 1, 0
    assert r.trace.order.tolist() == [[[3, 2, 1, 0], [3, 2, 1, 0]]]
