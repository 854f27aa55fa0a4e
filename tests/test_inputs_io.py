"""Saved inputs: they come back bit for bit, and a file cannot run code when loaded."""

from pathlib import Path

import pytest
import torch

from flashnum.inputs.distributions import make
from flashnum.inputs.io import load_inputs, save_inputs

REPO = Path(__file__).resolve().parents[1]
RAN = []


class _Payload:
    """What a malicious pickle carries: unpickling it would call RAN.append."""

    def __reduce__(self):
        return (RAN.append, ("ran",))


def test_tensors_and_metadata_round_trip_bit_for_bit(tmp_path):
    g = torch.Generator().manual_seed(0)
    t = {"q": torch.randn(1, 2, 8, 4, generator=g, dtype=torch.float64),
         "v": torch.randn(3, generator=g).to(torch.bfloat16)}
    meta = {"scale": None, "x": 0.1 + 0.2, "nan": float("nan"), "nested": {"a": [1, 2.5]}}
    back, m = load_inputs(save_inputs(tmp_path / "a.pt", t, meta))
    assert set(back) == set(t)
    for name in t:
        assert back[name].dtype == t[name].dtype and torch.equal(back[name], t[name])
    assert m["x"] == 0.1 + 0.2 and m["scale"] is None and m["nested"] == {"a": [1, 2.5]}
    assert m["nan"] != m["nan"]


def test_a_pickle_with_code_in_it_is_refused_without_running_it(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"q": torch.zeros(1), "meta": _Payload()}, path)
    with pytest.raises(ValueError, match="is not a flashnum inputs file"):
        load_inputs(path)
    assert RAN == []


def test_a_file_of_another_format_is_refused_in_one_line(tmp_path):
    path = tmp_path / "plain.pt"
    torch.save({"q": torch.zeros(1)}, path)
    with pytest.raises(ValueError, match=r"format None, expected 'flashnum.inputs/1'"):
        load_inputs(path)


def test_metadata_that_is_not_json_is_refused_when_saving(tmp_path):
    with pytest.raises(TypeError, match="JSON only"):
        save_inputs(tmp_path / "b.pt", {"q": torch.zeros(1)}, {"f": object()})


def test_the_stored_worst_cases_load_and_replay_as_a_distribution():
    files = sorted((REPO / "experiments" / "worst_case" / "inputs").glob("*.pt"))
    assert files
    for f in files:
        t, meta = load_inputs(f)
        inp = make("worst_case", path=str(f))
        assert torch.equal(inp.q, t["q"]) and torch.equal(inp.v, t["v"])
        assert inp.params["source"] == meta["name"]
        assert meta["summary"]["error"] > meta["summary"]["baseline"]
