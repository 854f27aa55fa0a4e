"""Sites are declared once (flashnum.numerics.policy.FORWARD_SITES, BACKWARD_SITES): the
policies' fields, the presets and the documented lists follow the declaration, and a path
that implements only some formats at a site refuses the others in one place."""

import dataclasses
import re
from pathlib import Path

import pytest

from flashnum.numerics import policy as P

DOCS = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def documented(section: str) -> list[tuple[str, str]]:
    """(name, what it holds) of each `- `name`: ...` line of a list in docs/architecture.md's
    "Sites" section: the forward's list (section "forward") or the backward's."""
    text = DOCS.read_text().split("\n## Sites\n", 1)[1].split("\n## ", 1)[0]
    fwd, bwd = text.split("The backward", 1)
    return re.findall(r"^- `(\w+)`: (.+)$", fwd if section == "forward" else bwd, re.M)


def test_the_documented_site_lists_are_the_declaration():
    assert documented("forward") == [(x.name, x.holds) for x in P.FORWARD_SITES]
    assert documented("backward") == [(x.name, x.holds) for x in P.BACKWARD_SITES]


def test_the_module_docstring_lists_every_declared_site_in_order():
    listed = P.__doc__.split("declares them", 1)[1].split("`l_from`", 1)[0]
    assert re.findall(r"^    (\w+) {2,}", listed, re.M) == list(P.SITES)


def test_a_policy_has_one_field_per_declared_site_then_its_options():
    assert [f.name for f in dataclasses.fields(P.Policy)] == [
        *P.SITES, "structure", "l_from", "name"]
    assert [f.name for f in dataclasses.fields(P.BackwardPolicy)] == [
        *P.BWD_SITES, "structure", "forward", "name"]
    assert P.Policy().sites() == dict.fromkeys(P.SITES, "exact")


# The presets as the papers and kernels describe them, written out here (not read from the
# declaration): FA2 keeps the softmax state in fp32 and casts P to the input dtype;
# standard attention (naive) rounds S and P to the dtype; lowp stores every value in it.
NO_PRODUCT = dict(qk_product="exact", pv_product="exact")  # every preset's dots: FMA chains
FA2_BF16 = dict(NO_PRODUCT, inputs="bf16", qk_acc="fp32", s="fp32", m="fp32", p="fp32",
                p_cast="bf16", pv_acc="fp32", l_acc="fp32", l="fp32", o="fp32", div="fp32",
                out="bf16")
NAIVE_FP16 = dict(NO_PRODUCT, inputs="fp16", qk_acc="fp32", s="fp16", m="fp32", p="fp32",
                  p_cast="fp16", pv_acc="fp32", l_acc="fp32", l="fp32", o="fp32", div="fp32",
                  out="fp16")
LOWP_TF32 = dict(NO_PRODUCT, inputs="fp32", qk_acc="tf32", s="fp32", m="fp32", p="fp32",
                 p_cast="fp32", pv_acc="tf32", l_acc="fp32", l="fp32", o="fp32", div="fp32",
                 out="fp32")
LOWP_FP8 = dict(NO_PRODUCT, inputs="fp8_e4m3", qk_acc="fp32", s="fp8_e4m3", m="fp8_e4m3",
                p="fp8_e4m3", p_cast="fp8_e4m3", pv_acc="fp32", l_acc="fp32", l="fp8_e4m3",
                o="fp8_e4m3", div="fp8_e4m3", out="bf16")


@pytest.mark.parametrize("name,precision,sites,structure", [
    ("fa2", "bf16", FA2_BF16, "flash"), ("naive", "fp16", NAIVE_FP16, "standard"),
    ("lowp", "tf32", LOWP_TF32, "flash"), ("lowp", "fp8_e4m3", LOWP_FP8, "flash")])
def test_the_presets_are_the_declared_roles(name, precision, sites, structure):
    pol = P.make_policy(name, precision)
    assert pol.sites() == sites and pol.structure == structure and pol.name == name


def test_the_backward_presets_are_the_declared_roles():
    fa2 = P.make_backward_policy("fa2", "bf16")
    assert fa2.sites() == dict(lse="fp32", do="bf16", qk_acc="fp32", s="fp32", p="fp32",
                               p_cast="bf16", dv_acc="fp32", dv="fp32", dp_acc="fp32",
                               dp="fp32", delta="fp32", ds="fp32", ds_cast="bf16",
                               dk_acc="fp32", dk="fp32", dq_acc="fp32", dq="fp32", out="bf16")
    naive = P.make_backward_policy("naive", "fp16")  # s, p, p_cast: the forward's
    assert (naive.s, naive.p, naive.p_cast, naive.dp) == ("fp16", "fp32", "fp16", "fp16")
    lowp = P.make_backward_policy("lowp", "bf16")
    assert {lowp.lse, lowp.dv, lowp.dq, lowp.ds} == {"bf16"} and lowp.dq_acc == "fp32"


def test_a_path_refuses_the_formats_it_does_not_implement_in_one_place():
    pol = P.make_policy("fa2", "bf16").with_sites(m="bf16", l="fp16", name="mine")
    with pytest.raises(ValueError, match=r"policy 'mine' cannot run on the kernel \(m='bf16', "
                                         r"l='fp16'\); it implements m fp32; l fp32"):
        P.check_sites(pol, {"m": ("fp32",), "l": ("fp32",)}, "the kernel")
    P.check_sites(P.make_policy("fa2", "bf16"), {"m": ("fp32",), "l": ("fp32",)}, "the kernel")


def test_the_triton_kernel_refuses_through_the_declaration():
    triton = pytest.importorskip("flashnum.backends.triton")
    assert set(triton.KERNEL_SITES) <= set(P.SITES)
    pol = P.make_policy("lowp", "bf16")
    with pytest.raises(ValueError, match="cannot run on the triton kernel .*s='bf16'"):
        triton._kernel_spec(pol, None)


@pytest.mark.parametrize("cls, kind", [(P.Policy, "policy"),
                                       (P.BackwardPolicy, "backward policy")])
def test_a_site_given_no_format_is_one_line_naming_it_and_the_formats(cls, kind):
    with pytest.raises(ValueError) as e:
        cls(s="bf17")
    assert str(e.value).startswith(f"{kind} site s='bf17' is not a format; valid: fp64, fp32")
