"""bound_backward returns, bit for bit, the values stored in tests/data/bound_backward_fixture.pt
(written by tests/data/make_bound_backward_fixture.py): a faster evaluation must not change a
single value. The bound's float64 evaluation sums, multiplies and exponentiates in
flashnum's own order (flashnum.numerics.accumulate, elementary), so the values are the
same bits on every machine and the check is bit equality everywhere."""

import importlib.util
from pathlib import Path

import pytest
import torch

DATA = Path(__file__).parent / "data"
_spec = importlib.util.spec_from_file_location(
    "make_fixture", DATA / "make_bound_backward_fixture.py")
_make = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_make)
FIXTURE = torch.load(DATA / "bound_backward_fixture.pt")


@pytest.mark.parametrize("entry", FIXTURE, ids=lambda e: "-".join(map(str, e["case"])))
def test_the_bound_and_its_terms_equal_the_stored_values_bit_for_bit(entry):
    got, want = _make.case_values(entry["case"], entry["inputs"]), entry["values"]
    for g in ("dq", "dk", "dv"):
        assert torch.equal(got[g], want[g]), g
    for g in ("dq", "dk", "dv"):
        assert got["max"][g] == want["max"][g], g
        for site, term in want["terms"][g].items():
            assert got["terms"][g][site] == term, (g, site)
    assert got["dominant_site"] == want["dominant_site"]
