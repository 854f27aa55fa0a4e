"""bound_backward returns, bit for bit, the values stored in tests/data/bound_backward_fixture.pt
(written by tests/data/make_bound_backward_fixture.py from the evaluation as it stood before it
was restructured for speed): a faster evaluation must not change a single value.

The stored values were computed with torch 2.13 on an AVX-512 CPU; torch's vectorised exp,
log and its BLAS may round differently on another instruction set, so there the check is to
bound_backward's own evaluation slack (EVAL_SLACK = 2^-30 relative, which the bound carries
for its float64 evaluation) instead of bit equality."""

import importlib.util
import math
from pathlib import Path

import pytest
import torch

from flashnum.analysis.bounds_backward import EVAL_SLACK

DATA = Path(__file__).parent / "data"
_spec = importlib.util.spec_from_file_location(
    "make_fixture", DATA / "make_bound_backward_fixture.py")
_make = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_make)
FIXTURE = torch.load(DATA / "bound_backward_fixture.pt")
SAME_MACHINE = (torch.backends.cpu.get_cpu_capability() == "AVX512"
                and torch.__version__.startswith("2.13"))


def _close(a, b) -> bool:
    if SAME_MACHINE:
        return a == b
    return a == b or math.isclose(a, b, rel_tol=EVAL_SLACK)


@pytest.mark.parametrize("entry", FIXTURE, ids=lambda e: "-".join(map(str, e["case"])))
def test_the_bound_and_its_terms_equal_the_stored_values_bit_for_bit(entry):
    got, want = _make.case_values(entry["case"], entry["inputs"]), entry["values"]
    for g in ("dq", "dk", "dv"):
        if SAME_MACHINE:
            assert torch.equal(got[g], want[g]), g
        else:
            assert torch.allclose(got[g], want[g], rtol=EVAL_SLACK, atol=0.0), g
    for g in ("dq", "dk", "dv"):
        assert _close(got["max"][g], want["max"][g]), g
        for site, term in want["terms"][g].items():
            assert _close(got["terms"][g][site], term), (g, site)
    if SAME_MACHINE:
        assert got["dominant_site"] == want["dominant_site"]
