"""The worst-case search: it beats the gaussian baseline, what it saves replays bitwise,
and a run with a fixed evaluation count is reproducible. Small shapes (N = 128, d = 16)."""

import pytest
import torch

from flashnum.inputs.distributions import make
from flashnum.inputs.search import evaluate, load_worst, replay, worst_case

SMALL = dict(policy="fa2", precision="bf16", seq_len=128, head_dim=16, block_n=32,
             block_m=32, budget_s=60.0)


@pytest.fixture(scope="module")
def found(tmp_path_factory):
    out = tmp_path_factory.mktemp("worst")
    return worst_case(**SMALL, seed=1, max_evals=24, save=out)


def test_search_beats_gaussian_and_respects_the_v_bound(found):
    from flashnum.inputs.search import prepare

    assert found.n_evals == 24
    # the baseline (seed 1) is in the screen, so >= would hold for free: the result must
    # beat gaussian inputs of other seeds too, each scored by the same objective
    kw = dict(policy="fa2", precision="bf16", block_m=32, block_n=32, order="forward",
              variant="fa2")
    gauss = [evaluate(prepare(make("gaussian", seq_len_q=128, head_dim=16, block_n=32,
                                   seed=s), "bf16", "fa2"), kw, "max_abs") for s in range(2, 7)]
    assert found.error > max(gauss + [found.baseline])
    assert found.family != "gaussian"
    assert found.screen["gaussian"] == found.baseline  # the screen reruns the baseline
    assert float(found.inputs.v.abs().max()) <= found.bound
    # the history is the running best: increasing, ending at the result
    errs = [e for _, _, e in found.history]
    assert errs == sorted(errs) and errs[-1] == found.error


def test_saved_case_replays_bitwise(found):
    r = replay(found.path)
    assert r["error"] == found.error == r["saved_error"]
    inp = load_worst(found.path)
    assert all(torch.equal(a, b) for a, b in zip(inp.tensors(), found.inputs.tensors(),
                                                 strict=True))
    again = make("worst_case", path=found.path)
    assert torch.equal(again.v, found.inputs.v) and again.params["source"] == found.family


def test_objective_reference_agrees_with_certified(found):
    # the search scores with a plain fp64 softmax; its error (< 1e-12, search.py) must
    # not move the result: the certified reference gives the same error to 1e-12
    assert found.verified, "the found case was not re-verified against flashnum.reference"
    assert abs(found.verified["certified"] - found.error) <= 1e-12
    assert abs(found.verified["fp64"] - found.error) <= 1e-12


def test_same_seed_same_search(found, tmp_path):
    again = worst_case(**SMALL, seed=1, max_evals=24, save=False, verify=False)
    assert again.error == found.error and again.params == found.params
    assert torch.equal(again.inputs.q, found.inputs.q)
    assert torch.equal(again.inputs.v, found.inputs.v)


def test_evaluate_rejects_unknown_metric_and_reference():
    inp = make("gaussian", seq_len_q=32, head_dim=16)
    kw = dict(policy="fa2", precision="bf16", block_m=32, block_n=32, order="forward",
              variant="fa2")
    with pytest.raises(ValueError, match="unknown metric 'l7'; valid: max_abs, rmse"):
        evaluate(inp, kw, "l7")
    with pytest.raises(ValueError, match="unknown reference 'exactish'; valid: torch64"):
        evaluate(inp, kw, "max_abs", "exactish")
    with pytest.raises(ValueError, match="budget_s must be > 0"):
        worst_case(budget_s=0)


def _p_cast_error_over_scale(name, seed=0):
    """max |out - exact| / (P|V|) with only FA2's P cast to bf16 rounded, in units of u."""
    import flashnum
    from flashnum.inputs.search import prepare, reference_out
    from flashnum.numerics.policy import make_policy

    inp = prepare(make(name, seq_len_q=256, seed=seed), "bf16", "fa2")
    res = flashnum.attention(inp.q, inp.k, inp.v, precision="bf16",
                             policy=make_policy("fa2", "bf16").only("p_cast"))
    s = inp.softmax_scale * inp.q @ inp.k.transpose(-1, -2)
    scale = torch.softmax(s, -1) @ inp.v.abs()
    return float(((res.out - reference_out(inp)).abs() / scale).max()) / 2.0**-8


def test_the_found_structure_makes_the_p_cast_error_coherent():
    # each cast P_hat = P (1 + d), |d| <= u, and l sums the uncast P, so
    # |sum (P_hat - P) v| / l <= u P|V|: the bound 1 u is proven (all else exact here).
    # Gaussian inputs average the signs away (measured 0.19-0.23 u at N = 256, seeds 0-2);
    # the plateau structure (identical keys after the peak, one-signed V) nearly attains
    # the bound (0.85-0.91 u): over three seeds each, every plateau beats every gaussian
    plateau = [_p_cast_error_over_scale("plateau", s) for s in range(3)]
    gaussian = [_p_cast_error_over_scale("gaussian", s) for s in range(3)]
    assert max(plateau + gaussian) <= 1.0 + 1e-9
    assert min(plateau) > 2 * max(gaussian)


def test_plateau_peak_first_beats_peak_last():
    # peak in the last block: every earlier P is exp(0) = 1 at its own block max, exact
    kw = dict(policy="fa2", precision="bf16", block_m=64, block_n=64, order="forward",
              variant="fa2")
    from flashnum.inputs.search import prepare

    def ulps(seed, **params):
        inp = prepare(make("plateau", seq_len_q=256, seed=seed, **params), "bf16", "fa2")
        return evaluate(inp, kw, "max_ulp")

    # measured at seed 0: 1.24 and 0.69 ulps of bf16 (N = 256); over three seeds each,
    # every peak-first case beats every peak-last one
    first = [ulps(s) for s in range(3)]
    last = [ulps(s, peak_block=-1) for s in range(3)]
    assert min(first) > max(last)
