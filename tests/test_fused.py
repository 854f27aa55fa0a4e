"""The fused forward (flashnum.engine.fused) gives the torch path's bits on every call it
claims, and hands every other call to the torch path.

The oracle is the torch path itself (flashnum.engine.fast and recurrence, torch ops and
flashnum.numerics.accumulate's dots and sums), run on the same case with the fused path
switched off: the fused path shares none of its loop, only native.c's exp (checked on
every float32 input by the experiment exp_exhaustive) and accumulate.c's chains (checked
against exact rational arithmetic by tests/test_accumulate.py). Cases are drawn from
every shipped forward experiment's grid.
"""

import random

import pytest
import torch
from bits import same_bits  # tests/bits.py
from hydra import compose, initialize_config_dir

import flashnum
from flashnum.engine import fused, native
from flashnum.harness.grid import CONF, expand
from flashnum.harness.run import policy_of
from flashnum.inputs.distributions import DISTRIBUTIONS, make

pytestmark = pytest.mark.skipif(not native.available(), reason="no C compiler: no fused path")

EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")
                     if not p.stem.startswith("bwd_"))
PER_GRID = 6  # claimed cases drawn from each experiment
TRIES = 40  # cases tried per experiment (grids the path does not claim stay quick)
MAX_LOGITS = 1 << 22  # heads x Nq x Nk of a drawn case (the test stays quick)


def run(case, on: bool):
    """The case's attention call as the runner makes it, with the fused path on or off;
    also whether the fused path ran it."""
    inp = make(case.distribution, batch=case.batch, heads=case.heads, seq_len_q=case.seq_len_q,
               seq_len_k=case.seq_len_k, head_dim=case.head_dim, seed=case.seed,
               block_n=case.block_n, **case.params)
    prec, pol = policy_of(case)
    ran = []
    real = fused.fused_forward

    def spy(*a, **kw):
        out = real(*a, **kw)
        ran.append(out is not None)
        return out

    fused.set_enabled(on)
    try:
        fused.fused_forward, flashnum.engine.flash.fused_forward = spy, spy
        res = flashnum.attention(
            inp.q, inp.k, inp.v, precision=prec, policy=pol, block_m=case.block_m,
            block_n=case.block_n, order=case.order, variant=case.variant,
            causal=bool(case.causal or inp.causal), scale=inp.scale, rounding=case.rounding,
            seed=case.seed, tau=case.tau, beta=case.beta, trace=True)
    finally:
        fused.fused_forward = flashnum.engine.flash.fused_forward = real
        fused.set_enabled(True)
    return res, any(ran)


def drawn(name):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={name}"])
    cases = [c for c in expand(cfg) if c.backend == "emulate" and c.num_splits == 1
             and c.precision != "mp" and c.distribution in DISTRIBUTIONS
             and c.batch * c.heads * c.seq_len_q * c.seq_len_k <= MAX_LOGITS]
    random.Random(name).shuffle(cases)
    return cases


@pytest.mark.parametrize("name", EXPERIMENTS)
@pytest.mark.filterwarnings("ignore:.*overflow the inputs format:RuntimeWarning")
def test_cases_drawn_from_each_grid_are_bit_identical_with_the_fused_path_on_and_off(name):
    claimed = 0
    for case in drawn(name)[:TRIES]:
        on, ran = run(case, True)
        if not ran:
            continue  # not claimed: the torch path ran both times
        off, ran_off = run(case, False)
        assert not ran_off
        for f in ("out", "m", "l", "lse", "masked", "n_rescales", "nonfinite"):
            assert same_bits(getattr(on, f), getattr(off, f)), (case, f)
        assert same_bits(on.trace.m, off.trace.m) and same_bits(on.trace.l, off.trace.l), case
        assert torch.equal(on.trace.order, off.trace.order)
        claimed += 1
        if claimed == PER_GRID:
            break
    # the grids where fa2 runs on the fp32 carrier (bf16, fp16, fp32 inputs) are claimed
    # (splitkv_decode has 5 cases within MAX_LOGITS, all claimed)
    uses_it = {"bf16_sweep", "block_order", "block_size", "fp16_sweep", "fp32_sweep",
               "kernel_vs_emulator", "seqlen_growth", "smoke", "worst_case", "splitkv_decode",
               "trained_model"}
    if name in uses_it:
        assert claimed >= 5


@pytest.mark.parametrize("kw,why", [
    (dict(variant="fa1"), "variant fa1"),
    (dict(variant="qiu_yao"), "variant qiu_yao"),
    (dict(policy="uniform"), "not fp32"),
    (dict(policy="lowp", precision="fp8_e4m3"), "not fp32"),
    (dict(precision="fp8_e4m3"), "P cast to fp8_e4m3"),
    (dict(rounding="stochastic"), "not fp32"),
])
def test_what_it_does_not_claim_goes_to_the_torch_path_and_says_why(monkeypatch, kw, why):
    from flashnum.engine.arith import Arith, carrier
    from flashnum.engine.recurrence import Run
    from flashnum.engine.tiles import Tiles
    from flashnum.engine.variants import FA2
    from flashnum.numerics.policy import make_policy

    pol = make_policy(kw.get("policy", "fa2"), kw.get("precision", "bf16"))
    ar = Arith(pol, kw.get("rounding", "nearest"), 0, carrier(pol))
    run_ = Run(ar, variant=FA2(), f_diff=None, tall=True)
    x = torch.zeros(1, 2, 16, 8)
    tiles = Tiles(x, x, x, 32, 32)
    assert why in fused.claim(run_, tiles, kw.get("variant", "fa2"))
    monkeypatch.setattr(fused, "_enabled", False)
    assert fused.claim(run_, tiles, "fa2") == "disabled"


@pytest.mark.parametrize("policy,precision", [("fa2", "bf16"), ("lowp", "bf16"),
                                              ("lowp", "fp16")])
def test_the_engine_benchmark_case_is_claimed(policy, precision):
    # bench/bench_engine.py's case: bf16 fa2, 64 x 64 blocks, d = 64; and lowp's sites
    from flashnum.engine.arith import Arith, carrier
    from flashnum.engine.recurrence import Run
    from flashnum.engine.tiles import Tiles
    from flashnum.engine.variants import FA2
    from flashnum.numerics.policy import make_policy

    pol = make_policy(policy, precision)
    run_ = Run(Arith(pol, "nearest", 0, carrier(pol)), variant=FA2(), f_diff=None, tall=True)
    x = torch.zeros(8, 64, 64, 64)
    assert fused.claim(run_, Tiles(x, x, x, 4096, 4096), "fa2") is None


@pytest.mark.parametrize("d,block_n,block_m", [(16, 16, 16), (40, 48, 32), (64, 64, 64),
                                               (72, 80, 48), (128, 128, 64), (64, 256, 64)])
@pytest.mark.parametrize("precision,policy,variant", [("bf16", "fa2", "fa2"),
                                                      ("bf16", "lowp", "exp2"),
                                                      ("fp16", "lowp", "lazy"),
                                                      ("tf32", "fa2", "fa2"),
                                                      ("p10", "fa2", "exp2")])
def test_the_loop_s_own_tile_gemms_give_torch_s_bits_for_every_width(
        d, block_n, block_m, precision, policy, variant):
    # native.c's own tile GEMMs (AVX-512) hold up to 8 vectors of 16 columns, the last one
    # partial for widths that are not multiples of 16; wider blocks take the library's sgemm.
    # Ragged lengths, causal masking and a zero query row (a sum that starts from +0).
    g = torch.Generator().manual_seed(d + block_n)
    q, k, v = (torch.randn(1, 2, n, d, generator=g) * 3 for n in (200, 333, 333))
    q[0, 0, 5] = 0.0
    k[0, 1, 7, :4] = 3e-39  # subnormal operands (tf32 and p-bit rounding keep them)
    ran, real = [], fused.fused_forward

    def spy(*a, **kw):
        out = real(*a, **kw)
        ran.append(out is not None)
        return out

    outs = []
    for on in (True, False):
        fused.set_enabled(on)
        try:
            flashnum.engine.flash.fused_forward = spy
            outs.append(flashnum.attention(q, k, v, precision=precision, policy=policy,
                                           variant=variant, block_m=block_m, block_n=block_n,
                                           causal=True, trace=True))
        finally:
            flashnum.engine.flash.fused_forward = real
            fused.set_enabled(True)
    assert ran == [True, False]
    on, off = outs
    for f in ("out", "m", "l", "lse", "n_rescales"):
        assert same_bits(getattr(on, f), getattr(off, f)), f
    assert same_bits(on.trace.m, off.trace.m) and same_bits(on.trace.l, off.trace.l)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("base2", [False, True])
def test_the_narrow_exp_site_is_the_torch_path_s_on_every_input_of_its_format(precision,
                                                                              base2):
    # lowp rounds exp's argument into the format first, so its 2^16 values are every input
    # the C loop's exp site meets; Arith.exp (float64 exp, Format.round) is the oracle
    assert fused._exp_agrees(fused.SITES[precision], base2)


@pytest.mark.parametrize("isa", ["avx2", "scalar"])
@pytest.mark.parametrize("precision,policy", [("bf16", "lowp"), ("tf32", "fa2"), ("p6", "fa2"),
                                              ("fp16", "fa2")])
def test_the_avx2_and_scalar_loops_give_the_avx512_bits(monkeypatch, isa, precision, policy):
    # a CPU without AVX-512 runs fn_fused_forward with accumulate.c's AVX2 or scalar
    # chains (the GEMMs through memory): the same values as the AVX-512 panels and as
    # the torch path; tiles wider than 128 keys and an odd head dim included
    from flashnum.numerics import accumulate

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 3, 330, 40, generator=g) * 4 for _ in range(3))
    for bn in (32, 160):
        kw = dict(precision=precision, policy=policy, block_m=32, block_n=bn, trace=True)
        want = flashnum.attention(q, k, v, **kw)
        with monkeypatch.context() as mp:
            mp.setattr(accumulate, "isa", lambda: isa)
            other = flashnum.attention(q, k, v, **kw)
            fused.set_enabled(False)
            try:
                off = flashnum.attention(q, k, v, **kw)
            finally:
                fused.set_enabled(True)
        for f in ("out", "m", "l", "n_rescales"):
            assert same_bits(getattr(want, f), getattr(other, f)), (bn, f)
            assert same_bits(getattr(want, f), getattr(off, f)), (bn, f)
