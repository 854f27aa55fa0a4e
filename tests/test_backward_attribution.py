"""Per-site attribution of the backward's error (flashnum.analysis.attribution_backward).

Oracles: the data flow of Algorithm 2 (which sites can reach which gradient) and single-
site policies run directly through the emulator; the reference is the certified one.
"""

import pytest
import torch

from flashnum.analysis.attribution_backward import attribute_backward, rounded_backward_sites
from flashnum.api import attention_backward
from flashnum.numerics.policy import BackwardPolicy, Policy, make_backward_policy
from flashnum.reference import reference_backward

FLOAT64_LEVEL = 1e-12  # an exact run differs from the reference by float64 roundings only


def inputs(n=48, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, n, d, generator=g).bfloat16().double() for _ in range(4))


@pytest.fixture(scope="module")
def fa2_table():
    q, k, v, do = inputs()
    return attribute_backward(q, k, v, do, policy="fa2", block_m=16, block_n=16)


def err(t, site, grad, metric="max_abs", col="err_only"):
    return t[(t.site == site) & (t.grad == grad) & (t.metric == metric)][col].item()


def test_every_rounded_site_and_the_forward_gets_a_row_per_gradient_and_metric(fa2_table):
    pol = make_backward_policy("fa2", "bf16")
    sites = rounded_backward_sites(pol)
    assert "forward" in sites and "p_cast" in sites
    assert set(fa2_table.site) == set(sites)
    assert len(fa2_table) == len(sites) * 3 * 2
    for _, grp in fa2_table.groupby(["grad", "metric"]):
        assert grp.share.sum() == pytest.approx(1.0)
        assert grp.total.nunique() == 1


def test_sites_downstream_of_dv_leave_dv_exact(fa2_table):
    # dV = P^T dO reads neither dP, D, dS nor the dQ/dK accumulators
    for site in ("dp_acc", "dp", "delta", "ds", "ds_cast", "dk_acc", "dk", "dq_acc", "dq"):
        assert err(fa2_table, site, "dv") < FLOAT64_LEVEL


def test_the_p_cast_reaches_dv_only_because_flash_forms_ds_from_the_fp32_p(fa2_table):
    assert err(fa2_table, "p_cast", "dv") > 1e-4
    assert err(fa2_table, "p_cast", "dq") < FLOAT64_LEVEL
    assert err(fa2_table, "p_cast", "dk") < FLOAT64_LEVEL


def test_a_policy_rounding_one_site_attributes_its_whole_error_to_that_site():
    q, k, v, do = inputs(seed=1)
    pol = BackwardPolicy(forward=Policy(name="exact"), ds_cast="bf16", name="ds_cast only")
    t = attribute_backward(q, k, v, do, policy=pol, block_m=16, block_n=16, bound_terms=False)
    assert set(t.site) == {"ds_cast"}
    ref = reference_backward(q, k, v, do)
    direct = attention_backward(q, k, v, do, policy=pol, block_m=16, block_n=16)
    want = float((direct.dq - ref.dq).abs().max())
    assert err(t, "ds_cast", "dq") == want == err(t, "ds_cast", "dq", col="total")
    assert err(t, "ds_cast", "dq", col="share") == 1.0
    assert err(t, "ds_cast", "dq", col="err_without") < FLOAT64_LEVEL


def test_the_bound_terms_sit_beside_the_measured_shares(fa2_table):
    t = fa2_table[fa2_table.metric == "max_abs"]
    assert (t.bound_term >= 0).all()
    for _, grp in t.groupby("grad"):
        assert grp.bound_share.sum() == pytest.approx(1.0)
    # the bound's p_cast term is 0 for dQ and dK, as the measured error is
    assert err(fa2_table, "p_cast", "dq", col="bound_term") == 0.0


def test_an_unknown_site_is_refused():
    q, k, v, do = inputs(n=16)
    with pytest.raises(ValueError, match="nope"):
        attribute_backward(q, k, v, do, sites=["nope"])
