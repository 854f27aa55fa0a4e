"""The catalogue keeps its promises: each distribution's claimed property, reproducibility
and clear errors. Shapes are small (N <= 512) so the file runs in a few seconds."""

import hashlib
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flashnum.inputs.distributions import (
    DISTRIBUTIONS,
    FROM_FILE,
    Inputs,
    describe,
    logits,
    make,
    params,
)
from flashnum.inputs.draws import COMMON
from flashnum.numerics.formats import get_format

BF16, FP16 = get_format("bf16"), get_format("fp16")
SHAPE = dict(batch=1, heads=2, seq_len_q=256, head_dim=64, block_n=64)
CATALOGUE = [n for n in DISTRIBUTIONS if n not in FROM_FILE]


def _rounded(inp: Inputs, fmt) -> Inputs:
    """The inputs as the engine sees them after rounding to a policy's `inputs` format."""
    return Inputs(fmt.round(inp.q), fmt.round(inp.k), fmt.round(inp.v), inp.causal,
                  inp.name, inp.params, inp.scale)


def _block_max(s, block_n):
    nk = s.shape[-1]
    nb = math.ceil(nk / block_n)
    s = torch.nn.functional.pad(s, (0, nb * block_n - nk), value=-math.inf)
    return s.reshape(*s.shape[:-1], nb, block_n).amax(-1)


def _digest(inp: Inputs) -> str:
    h = hashlib.sha256()
    for t in inp.tensors():
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


# -- every entry ----------------------------------------------------------------------


def test_at_least_sixteen_named_generators_with_docstrings():
    assert len(CATALOGUE) >= 16
    for name in DISTRIBUTIONS:
        assert len(describe(name)) > 80, name  # says what it stresses and where from


@pytest.mark.parametrize("name", CATALOGUE)
def test_shapes_dtype_finite_and_resolved_params(name):
    inp = make(name, **{**SHAPE, "batch": 2, "heads": 1}, seed=3)
    b, h, n, d = 2, 1, 256, 64
    assert inp.q.dtype == inp.k.dtype == inp.v.dtype == torch.float64
    assert inp.q.shape == (b, h, n, d)
    assert inp.k.shape[:2] == (b, h) and inp.k.shape[-1] == d and inp.v.shape == inp.k.shape
    assert all(bool(torch.isfinite(t).all()) for t in inp.tensors())
    assert inp.name == name and set(params(name)) <= set(inp.params)


@pytest.mark.parametrize("name", CATALOGUE)
def test_same_seed_bitwise_identical_other_seed_different(name):
    a, b = make(name, **SHAPE, seed=11), make(name, **SHAPE, seed=11)
    assert all(torch.equal(x, y) for x, y in zip(a.tensors(), b.tensors(), strict=True))
    c = make(name, **SHAPE, seed=12)
    assert _digest(a) != _digest(c)


def test_bitwise_identical_in_a_fresh_process():
    # a fresh interpreter has a different str-hash salt and a fresh global RNG
    names = ["gaussian", "ties", "heavy_tail", "ramp"]
    code = (
        "from flashnum.inputs.distributions import make; import hashlib\n"
        f"for n in {names!r}:\n"
        "    h = hashlib.sha256()\n"
        "    for t in make(n, seq_len_q=128, seed=5).tensors():\n"
        "        h.update(t.contiguous().numpy().tobytes())\n"
        "    print(h.hexdigest())\n"
    )
    torch.manual_seed(1234)  # the global RNG must not matter
    here = [_digest(make(n, seq_len_q=128, seed=5)) for n in names]
    root = Path(__file__).resolve().parents[1]
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, cwd=root).stdout.split()
    assert here == there


@pytest.mark.parametrize("name", [n for n in CATALOGUE if params(n).get("grid") == "common"])
def test_common_grid_is_exact_in_bf16_and_fp16(name):
    inp = make(name, **SHAPE)
    for t in inp.tensors():
        assert BF16.representable(t) and FP16.representable(t)


def test_common_format_is_inside_bf16_and_fp16():
    x = torch.randn(20000, dtype=torch.float64) * torch.exp2(torch.randint(-30, 18, (20000,)))
    y = COMMON.round(x)
    y = y[torch.isfinite(y)]
    assert torch.equal(BF16.round(y), y) and torch.equal(FP16.round(y), y)
    assert COMMON.max == 65280.0 and BF16.representable(torch.tensor([COMMON.max]))


# -- the claimed properties, checked after rounding to bf16 and to fp16 ------------------


@pytest.mark.parametrize("fmt", [BF16, FP16], ids=["bf16", "fp16"])
def test_late_max_argmax_in_last_block(fmt):
    inp = _rounded(make("late_max", **SHAPE), fmt)
    bm = _block_max(logits(inp), 64)
    assert bool((bm[..., -1] > bm[..., :-1].amax(-1)).all())
    assert int(logits(inp).argmax(-1).min()) >= 3 * 64


@pytest.mark.parametrize("fmt", [BF16, FP16], ids=["bf16", "fp16"])
def test_early_max_argmax_in_first_block(fmt):
    inp = _rounded(make("early_max", **SHAPE), fmt)
    assert int(logits(inp).argmax(-1).max()) < 64


@pytest.mark.parametrize("fmt", [BF16, FP16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("n, block_n", [(256, 64), (512, 16), (200, 32)])
def test_ramp_block_maxima_strictly_increase(fmt, n, block_n):
    inp = make("ramp", batch=1, heads=2, seq_len_q=n, block_n=block_n)
    bm = _block_max(logits(_rounded(inp, fmt)), block_n)
    inc = bm[..., 1:] - bm[..., :-1]
    assert float(inc.min()) >= inp.params["margin"]  # a rescale at every block, every row


def test_ramp_with_more_than_256_blocks_stays_exact():
    # block index > 255 needs the second bias channel: still exact on the common grid
    inp = make("ramp", seq_len_q=300, head_dim=16, block_n=1, logit_std=0.01)
    bm = logits(_rounded(inp, BF16))
    assert float((bm[..., 1:] - bm[..., :-1]).min()) > 0


@pytest.mark.parametrize("fmt", [BF16, FP16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("n_ties, layout", [(2, "random"), (3, "adjacent"), (2, "adjacent")])
def test_ties_every_row_max_attained_at_least_n_ties_times(fmt, n_ties, layout):
    inp = make("ties", **SHAPE, n_ties=n_ties, layout=layout)
    s = logits(_rounded(inp, fmt))
    n_max = (s == s.amax(-1, keepdim=True)).sum(-1)
    assert int(n_max.min()) >= n_ties
    # Qiu & Yao's setting: V mostly negative
    assert float((inp.v < 0).double().mean()) > 0.9


def test_ties_are_spread_over_blocks_with_random_layout():
    inp = make("ties", **SHAPE)
    s = logits(inp)[0, 0]
    at_max = (s == s.amax(-1, keepdim=True)).nonzero()
    blocks_per_row = torch.zeros(256, dtype=torch.long)
    for i, j in at_max.tolist():
        blocks_per_row[i] |= 1 << (j // 64)
    multi = sum(bin(int(b)).count("1") >= 2 for b in blocks_per_row)
    assert multi > 128  # most rows see their tied maxima in different key blocks


def test_fa3_outliers_rate_within_binomial_bound():
    # with a huge outlier std every outlier is visible: |x| > 100 has probability
    # P(|N(0,1)| > 0.01) = 0.992 for an outlier and ~0 for an N(0,1) entry
    p, inp = 0.001, make("fa3_outliers", **SHAPE, outlier_std=1e4)
    n = sum(t.numel() for t in inp.tensors())
    hits = sum(int((t.abs() > 100).sum()) for t in inp.tensors())
    mean = n * p * (1 - math.erf(0.01 / math.sqrt(2)))
    assert abs(hits - mean) <= 5 * math.sqrt(mean * (1 - p))  # 5 sigma binomial bound


def test_fa3_outliers_default_std_tail():
    # default N(0,1) + N(0,100) Bernoulli(0.001): P(|x| > 6) = p P(|N(0,101)| > 6) + ~2e-9
    p, inp = 0.001, make("fa3_outliers", batch=4, heads=4, seq_len_q=256)
    n = sum(t.numel() for t in inp.tensors())
    hits = sum(int((t.abs() > 6).sum()) for t in inp.tensors())
    mean = n * (p * (1 - math.erf(6 / math.sqrt(2 * 101))) + 2e-9)
    assert abs(hits - mean) <= 5 * math.sqrt(mean)


@pytest.mark.parametrize("fmt", [BF16, FP16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("position", [0, 200])
def test_sink_is_every_rows_argmax(fmt, position):
    inp = make("sink", **SHAPE, position=position)
    s = logits(_rounded(inp, fmt))
    assert bool((s.argmax(-1) == position).all())
    others = torch.cat([s[..., :position], s[..., position + 1 :]], -1)
    assert float((s[..., position] - others.amax(-1)).min()) >= inp.params["margin"]


@pytest.mark.parametrize("fmt", [BF16, FP16], ids=["bf16", "fp16"])
def test_flat_logits_all_equal(fmt):
    inp = make("flat", **SHAPE, level=2.0)
    s = logits(_rounded(inp, fmt))
    assert bool((s == s.flatten()[0]).all()) and float(s.flatten()[0]) == 2.0


def test_masked_has_fully_masked_rows_bottom_right():
    inp = make("masked", **SHAPE)
    s = logits(inp)
    n_masked = inp.params["n_masked"]
    assert inp.causal and n_masked == 64 and inp.k.shape[-2] == 256 - 64
    dead = torch.isinf(s).all(-1)
    assert bool(dead[..., :n_masked].all()) and not bool(dead[..., n_masked:].any())
    assert bool(torch.isfinite(s[..., -1, :]).all())  # the last query sees every key
    inp2 = make("masked", seq_len_q=100, seq_len_k=90)
    assert inp2.params["n_masked"] == 10


def test_near_overflow_logits_and_values():
    inp = make("near_overflow", **SHAPE)
    s = logits(inp)
    assert abs(float(s.mean()) - 11.0) < 0.1 and float(s.max()) > math.log(65504) - 1
    assert float(inp.v.min()) > 0.8 * 60000 and float(inp.v.max()) <= 65504
    # fp16 accumulator overflow: two keys with P ~ 1 already exceed fp16's max
    assert float(inp.v[..., :2, :].sum(-2).min()) > 65504


def test_cancellation_outputs_near_zero():
    inp = make("cancellation", **SHAPE, delta=0.0)
    p = torch.softmax(logits(inp), -1)
    out = p @ inp.v
    assert float(out.abs().max()) < 1e-12 * float((p @ inp.v.abs()).max())
    v = make("cancellation", **SHAPE).v  # every value comes with its exact negation
    assert torch.equal(v.sort(-2).values, (-v).sort(-2).values)


def test_outlier_channels_are_large_in_q_and_k():
    inp = make("outlier_channels", **SHAPE, n_channels=2, magnitude=10.0)
    ch = inp.params["channels"]
    rms = inp.q.pow(2).mean((0, 1, 2)).sqrt()
    assert len(ch) == 2 and float(rms[ch].min()) > 5.0  # ~10: magnitude x N(0, 1)
    others = [c for c in range(64) if c not in ch]
    assert float(rms[others].max()) < 2.0


def test_underflow_p_reaches_below_fp16_subnormals():
    inp = make("underflow", **SHAPE)
    s = logits(inp)
    gap = s - s.amax(-1, keepdim=True)
    assert float(gap.min()) < math.log(FP16.min_subnormal) and float(gap.max()) == 0.0


def test_plateau_non_peak_keys_identical():
    inp = make("plateau", **SHAPE, n_peak=2)
    s = logits(inp)
    rest = [j for j in range(256) if j not in inp.params["peaks"]]
    assert bool((s[..., rest] == s[..., rest[:1]]).all())


# -- bad input: one clear ValueError naming the valid choices --------------------------


def test_unknown_name_lists_the_catalogue():
    with pytest.raises(ValueError, match="unknown distribution 'gausian'.*valid:.*gaussian"):
        make("gausian")


def test_unknown_param_lists_valid_params():
    with pytest.raises(ValueError, match="unknown parameter.*gapp.*valid: gap, logit_std"):
        make("late_max", gapp=3.0)


@pytest.mark.parametrize(
    "name, kw, match",
    [
        ("ties", dict(n_ties=1), "n_ties must be an int >= 2"),
        ("ties", dict(layout="diagonal"), "unknown layout 'diagonal'; valid: random, adjacent"),
        ("gaussian", dict(grid="bf17"), "unknown grid 'bf17'; valid: none, common, fp64"),
        ("fa3_outliers", dict(p=1.5), "p must be in"),
        ("masked", dict(seq_len_k=300), "seq_len_k < seq_len_q"),
        ("sink", dict(position=256), r"position must be an int in \[0, 256\)"),
        ("late_max", dict(block_n=256), "needs >= 2 key blocks"),
        ("gaussian", dict(seq_len_q=0), "seq_len_q must be an int >= 1"),
        ("worst_case", dict(), "worst_case needs path="),
    ],
)
def test_bad_params(name, kw, match):
    with pytest.raises(ValueError, match=match):
        make(name, **kw)


def test_every_distribution_has_a_config_with_its_defaults():
    import yaml

    root = Path(__file__).resolve().parents[1] / "conf" / "distribution"
    for name in DISTRIBUTIONS:
        conf = yaml.safe_load((root / f"{name}.yaml").read_text())
        assert conf["name"] == name
        if name != "worst_case":  # its only parameter, the path, has no default
            assert conf["params"] == params(name), name


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_ties_survive_the_engines_own_logits(precision):
    # the engine forms S with fp32 BLAS dots; identical key rows must still tie exactly
    from flashnum.engine import logits as engine_logits

    inp = make("ties", seq_len_q=200, head_dim=64)
    s = engine_logits(inp.q, inp.k, precision=precision, policy="fa2")
    assert int((s == s.amax(-1, keepdim=True)).sum(-1).min()) >= 2


def test_dot_logits_sums_every_logit_in_the_same_fixed_order():
    """Each logit is ((0 + q0 k0) + q1 k1) + ... + q_{d-1} k_{d-1}, then times the scale,
    whatever the shape: the oracle sums in plain Python floats (IEEE doubles), one entry
    at a time. 70,000 keys make the row bands of dot_logits split the 5 query rows."""
    from flashnum.inputs.draws import dot_logits

    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 1, 5, 16, generator=g, dtype=torch.float64)
    k = torch.randn(1, 1, 70_000, 16, generator=g, dtype=torch.float64) * 1e3
    s = dot_logits(q, k, 0.3)
    for i, j in [(0, 0), (1, 3), (2, 69_999), (3, 35_000), (4, 12_345)]:
        acc = 0.0
        for t in range(16):
            acc += float(q[0, 0, i, t]) * float(k[0, 0, j, t])
        assert float(s[0, 0, i, j]) == acc * 0.3
