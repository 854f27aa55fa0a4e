"""Oracles that share no code with the engine: the running max, FA2 and standard attention
written here in a few lines of plain torch.

- The final running max m of every row is the exact row max of the logits, bit for bit.
  The inputs are integers and the scale a power of two, so every logit is a small dyadic
  number: exact in float64 here, and exact in every format the engine rounds it to, in
  any summation order. The exact max is then computed here in float64 with this
  module's own causal rule; nothing of flashnum.engine (its logits, tiles, roundings) is
  consulted. Adversarial inputs: ties across key blocks, the max in the last block,
  causal with fully masked rows, logits near fp16's overflow; every order and variant,
  and the Triton kernel.
- An FA2 forward loop (the Triton tutorial's: fp32 dots and state, P cast to the inputs'
  type before P @ V) written here equals the engine's `fa2` policy bit for bit.
- flash-attn's oracle, with its reference attention in plain torch in the dtype:
  max|fa2 - exact| <= 2 max|standard attention in the dtype - exact|.
"""

import importlib.util
import math

import pytest
import torch

import flashnum

ORDERS = ["forward", "reverse", "random", "max_ascending", "max_descending"]
VARIANTS = ["fa2", "fa1", "exp2", "lazy", "qiu_yao"]
U = {"fp16": 2.0**-11, "bf16": 2.0**-8, "fp32": 2.0**-24}  # unit roundoffs (IEEE / bf16 spec)
LOG2E = 1 / math.log(2)


def visible(nq, nk):
    """Bottom-right causal mask (flash-attn >= 2.1): query i sees key j iff j <= i + nk - nq."""
    i = torch.arange(nq)[:, None]
    j = torch.arange(nk)[None, :]
    return j <= i + (nk - nq)


def exact_logits(q, k, scale, causal):
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    if causal:
        s = s.masked_fill(~visible(q.shape[-2], k.shape[-2]), -math.inf)
    return s


def integers(shape, lo, hi, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(lo, hi + 1, shape, generator=g).double()


# -- adversarial integer inputs: (q, k, v, scale, causal); d = 8, |q.k| <= 72 ------------

def ties_across_blocks(bn=8, seed=0):
    q, k, v = integers((2, 24, 8), -2, 3, seed), integers((2, 40, 8), -3, 2, seed + 1), \
        integers((2, 40, 8), -4, 4, seed + 2)
    k[:, [1, 1 + bn, -2]] = 3.0  # one max key repeated in three key blocks
    return q.abs(), k, v, 0.25, False


def late_max(bn=8, seed=0):
    q, k, v = integers((2, 24, 8), 0, 3, seed), integers((2, 37, 8), -3, 1, seed + 1), \
        integers((2, 37, 8), -4, 4, seed + 2)
    k[:, -1] = 3.0  # the max of every row sits in the last (ragged) key block
    return q, k, v, 0.125, False


def causal_masked(bn=8, seed=0):
    q, k, v = (integers((2, n, 8), -3, 3, seed + i) for i, n in enumerate((30, 20, 20)))
    return q, k, v, 0.5, True  # 10 rows see no key


def near_fp16_overflow(bn=8, seed=0):
    # q.k = 4 * 128 * 88 = 45056 (exact in fp16 and bf16); times log2(e): 65002 < 65504
    q = torch.full((1, 16, 4), 128.0, dtype=torch.float64)
    k = 88.0 * torch.sign(integers((1, 24, 4), -1, 1, seed) + 0.5)
    k[:, 5] = 88.0
    v = integers((1, 24, 4), -4, 4, seed + 1)
    return q, k, v, 1.0, False


INPUTS = [ties_across_blocks, late_max, causal_masked, near_fp16_overflow]


def qiu_yao_max(s, bn, beta=2.0, window=1e-3):
    """Qiu & Yao's block max: where >= 2 logits of a block lie within `window` of its max,
    beta * max (max > 0) or 0 (max < 0); the row's m is the largest adjusted block max."""
    best = torch.full(s.shape[:-1], -math.inf, dtype=torch.float64)
    for j in range(0, s.shape[-1], bn):
        blk = s[..., j:j + bn]
        bmax = blk.amax(-1)
        near = (blk >= (bmax - window)[..., None]).sum(-1) >= 2
        adj = torch.where(bmax > 0, beta * bmax, torch.zeros_like(bmax))
        bmax = torch.where(near & (bmax != 0) & torch.isfinite(bmax), adj, bmax)
        best = torch.maximum(best, bmax)
    return best


def check_state(res, s, variant, precision, bn, tau=8.0):
    """m against the exact row max of s; l, masked rows and the trace."""
    M = s.amax(-1)  # -inf for a fully masked row
    seen = torch.isfinite(M)
    m = res.m.double()
    if variant in ("fa2", "fa1", "naive"):
        assert torch.equal(m, M)
    elif variant == "lazy":  # an earlier block's max, at most tau below the row max
        assert torch.equal(m[~seen], M[~seen])
        assert bool(((m[seen] <= M[seen]) & (m[seen] >= M[seen] - tau)).all())
        assert bool((s == m[..., None]).any(-1)[seen].all())  # m is one of the logits
    elif variant == "qiu_yao":
        assert torch.equal(m, qiu_yao_max(s, bn))
    elif variant == "exp2":  # m = fl_m(fl_s(q.k * fl_s(scale log2 e))): three roundings,
        # the scale's on the fp32 carrier two (fp32, then the logits' format)
        u = U[precision]
        slack = ((1 + u) ** 3 * (1 + 2.0**-24) - 1) * (M * LOG2E).abs()
        assert torch.equal(m[~seen], M[~seen])
        assert bool(((m - M * LOG2E).abs()[seen] <= slack[seen]).all())
    l = res.l.double()
    assert bool((l[seen] > 0).all()) and bool(torch.isfinite(l[seen]).all())
    assert bool((l[~seen] == 0).all()) and torch.equal(res.masked, ~seen)
    assert bool(torch.isfinite(res.out).all()) and bool((res.out[~seen] == 0).all())
    if res.trace is not None:
        tm = res.trace.m
        assert bool((tm[..., 1:, :] >= tm[..., :-1, :]).all())
        assert torch.equal(tm[..., -1, :], res.m)


@pytest.mark.parametrize("make", INPUTS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32"])
def test_the_final_max_is_the_exact_row_max_in_every_order_and_variant(make, precision):
    bn = 8
    q, k, v, scale, causal = make(bn)
    s = exact_logits(q, k, scale, causal)
    # qiu_yao at logits near 45000: beta * max = 90112 puts every P below fp32's range
    # (l = 0) and overflows an fp16 m: the adjustment's own limit, not the recurrence's
    variants = [x for x in VARIANTS if not (x == "qiu_yao" and make is near_fp16_overflow)]
    for policy, orders in (("fa2", ORDERS), ("lowp", ["forward", "max_descending"])):
        for variant in variants:
            for order in orders:
                res = flashnum.attention(q, k, v, precision=precision, policy=policy,
                                         block_m=8, block_n=bn, order=order, variant=variant,
                                         causal=causal, scale=scale, trace=True, seed=1)
                check_state(res, s, variant, precision, bn)
    naive = flashnum.attention(q, k, v, precision=precision, policy="naive", causal=causal,
                               scale=scale)
    check_state(naive, s, "naive", precision, bn)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                    reason="the kernel needs triton (pip install -e '.[triton]'; make test "
                           "installs it)")
@pytest.mark.parametrize("make", INPUTS, ids=lambda f: f.__name__)
def test_the_kernels_final_max_is_the_exact_row_max(make):
    bn = 16  # the kernel's smallest tile
    q, k, v, scale, causal = make(bn)
    # the kernel needs d >= 16: zero columns change no logit
    q, k, v = (torch.nn.functional.pad(x, (0, 16 - x.shape[-1])) for x in (q, k, v))
    s = exact_logits(q, k, scale, causal)
    # the interpreter is slow: each precision with one order (the emulator test has all)
    for precision, order in (("fp16", "forward"), ("bf16", "reverse")):
        for variant in ("fa2", "exp2"):
            res = flashnum.attention(q, k, v, precision=precision, policy="fa2", block_m=16,
                                     block_n=bn, order=order, variant=variant, causal=causal,
                                     scale=scale, backend="triton")
            check_state(res, s, variant, precision, bn)


# -- FA2 in a few lines of plain torch ------------------------------------------------

def fa2_loop(q, k, v, block_n, low):
    """FA2 forward as the Triton tutorial writes it: q, k, v in `low`, fp32 dots, max, exp
    (correctly rounded: float64 then one rounding), l and o; P cast to `low` before P @ V;
    o / l in fp32, then cast to `low`."""
    q, k, v = (x.to(low).float() for x in (q, k, v))
    scale = torch.tensor(1 / math.sqrt(q.shape[-1]), dtype=torch.float32)
    m = torch.full(q.shape[:-1], -math.inf)
    l = torch.zeros(q.shape[:-1])
    o = torch.zeros(*q.shape[:-1], v.shape[-1])
    for j in range(0, k.shape[-2], block_n):
        s = (q @ k[..., j:j + block_n, :].transpose(-1, -2)) * scale
        m_new = torch.maximum(m, s.amax(-1))
        p = torch.exp((s - m_new[..., None]).double()).float()
        alpha = torch.exp((m - m_new).double()).float()
        l = l * alpha + p.sum(-1)
        o = o * alpha[..., None] + p.to(low).float() @ v[..., j:j + block_n, :]
        m = m_new
    return (o / l[..., None]).to(low), m, l


@pytest.mark.parametrize("low", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(64, 256, 64, 64), (37, 100, 16, 16), (8, 33, 32, 32)])
def test_the_engines_fa2_equals_a_plain_torch_fa2_loop_bit_for_bit(low, shape):
    nq, nk, d, bn = shape
    g = torch.Generator().manual_seed(nq)
    q, k, v = (torch.randn(2, 3, n, d, generator=g).to(low).float() for n in (nq, nk, nk))
    out, m, l = fa2_loop(q, k, v, bn, low)
    precision = "bf16" if low is torch.bfloat16 else "fp16"
    for block_m in (16, 64):
        res = flashnum.attention(q, k, v, precision=precision, policy="fa2", block_m=block_m,
                                 block_n=bn)
        assert torch.equal(res.out, out.double())
        assert torch.equal(res.m, m.double()) and torch.equal(res.l, l.double())


# -- flash-attn's oracle, with its reference in plain torch ------------------------------

def standard_in(q, k, v, dtype):
    """Standard attention in `dtype`, as flash-attn's attention_ref (upcast=False) runs it:
    S, softmax(S) and P @ V each a torch op in the dtype."""
    q, k, v = (x.to(dtype) for x in (q, k, v))
    s = (q / math.sqrt(q.shape[-1])) @ k.transpose(-1, -2)
    return (torch.softmax(s, dim=-1).to(v.dtype) @ v).double()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_flash_attention_oracle_fa2_error_at_most_twice_plain_torch_standard(dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 4, n, 64, generator=g, dtype=torch.float64) for n in (128, 512, 512))
    exact = torch.softmax(q @ k.transpose(-1, -2) / 8.0, -1) @ v  # float64: error ~1e-16
    precision = "fp16" if dtype is torch.float16 else "bf16"
    fa2 = flashnum.attention(q, k, v, precision=precision, policy="fa2").out
    assert (fa2 - exact).abs().max() <= 2 * (standard_in(q, k, v, dtype) - exact).abs().max()
