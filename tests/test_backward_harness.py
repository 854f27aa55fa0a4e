"""The backward experiment runner (flashnum.harness.backward): grids, stored rows, resume."""

import pytest

from flashnum.harness import backward, store


def test_every_backward_experiment_expands_with_unique_case_ids():
    for name in ("bwd_bf16_sweep", "bwd_order"):
        cases = backward.expand(backward.load_conf(name))
        ids = [c["case_id"] for c in cases]
        assert len(ids) == len(set(ids)) > 0
    assert len(backward.expand(backward.load_conf("bwd_bf16_sweep"))) >= 1000


def test_unknown_experiment_and_axis_are_refused(capsys):
    with pytest.raises(ValueError, match="nope"):
        backward.load_conf("nope")
    with pytest.raises(SystemExit) as e:
        backward.main(["nope"])
    assert e.value.code == 2 and "nope" in capsys.readouterr().err
    with pytest.raises(ValueError, match="colour"):
        backward.expand({"grid": [{"name": "x", "colour": ["red"]}]})


def test_a_run_stores_one_row_per_case_and_resumes(tmp_path, monkeypatch):
    conf = {"experiment": "bwd_tiny", "base": {"seq_len": 32, "head_dim": 16, "orders": 1},
            "grid": [{"name": "t", "policy": ["fa2", "naive"], "seed": [0]}]}
    monkeypatch.setattr(backward, "load_conf", lambda name: conf)
    assert backward.main(["bwd_tiny", f"store.root={tmp_path}"]) == 0
    df = store.load(tmp_path / "bwd_tiny")
    assert len(df) == 2 and set(df.policy) == {"fa2", "naive"}
    assert df.held_dq.all() and df.held_dk.all() and df.held_dv.all()
    assert (df.err_dq > 0).all() and (df.dq_spread >= 0).all()
    backward.main(["bwd_tiny", f"store.root={tmp_path}"])  # nothing left to run
    assert len(store.load(tmp_path / "bwd_tiny")) == 2
    summ = backward.summary(tmp_path / "bwd_tiny")
    assert list(summ.policy) == ["fa2", "naive"] and summ.held_dq.all()
