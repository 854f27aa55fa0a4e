"""The backward experiment runner (flashnum.harness.backward): grids, stored rows, resume."""

import json
import math

import pandas as pd
import pytest

from flashnum import store
from flashnum.harness import backward


def test_every_backward_experiment_expands_with_unique_case_ids():
    for name in ("bwd_bf16_sweep", "bwd_order", "bwd_seqlen_growth"):
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


@pytest.mark.slow
def test_rows_do_not_depend_on_how_many_processes_run_them(tmp_path, monkeypatch):
    """Two worker processes (one task per input: seed 0, seed 1) store every value
    bit for bit as one in-process run does; only the timing differs."""
    conf = {"experiment": "bwd_tiny", "base": {"seq_len": 48, "head_dim": 16, "orders": 1},
            "grid": [{"name": "t", "policy": ["fa2", "lowp"], "seed": [0, 1],
                      "distribution": ["late_max"]}]}
    monkeypatch.setattr(backward, "load_conf", lambda name: conf)
    tables = []
    for n in (1, 2):
        root = tmp_path / f"n{n}"
        assert backward.main(["bwd_tiny", f"store.root={root}", f"n_jobs={n}"]) == 0
        df = store.load(root / "bwd_tiny").sort_values("case_id", ignore_index=True)
        tables.append(df.drop(columns="wall_s"))
        runs = json.loads((root / "bwd_tiny" / store.MANIFEST).read_text())["runs"]
        assert runs[-1]["counts"]["run"] == 4
    assert len(tables[0]) == 4
    pd.testing.assert_frame_equal(tables[0], tables[1])


def test_the_stored_backward_tables_keep_their_case_ids():
    # reference and bound joined the axes later: at their defaults they stay out of the key
    for name in ("bwd_bf16_sweep", "bwd_order", "bwd_seqlen_growth", "bwd_attribution"):
        ids = {c["case_id"] for c in backward.expand(backward.load_conf(name))}
        assert set(store.load(name).case_id) == ids


def test_a_run_records_its_command_and_code_in_the_manifest(tmp_path, monkeypatch):
    conf = {"experiment": "bwd_tiny", "base": {"seq_len": 32, "head_dim": 16},
            "grid": [{"name": "t", "policy": ["fa2"], "seed": [0]}]}
    monkeypatch.setattr(backward, "load_conf", lambda name: conf)
    backward.main(["bwd_tiny", f"store.root={tmp_path}"])
    path = tmp_path / "bwd_tiny" / store.MANIFEST
    runs = json.loads(path.read_text())["runs"]
    assert len(runs) == 1 and runs[0]["end_time"] is not None
    assert runs[0]["command"] == {"module": "flashnum.run",
                                  "overrides": ["experiment=bwd_tiny"]}
    assert runs[0]["counts"]["run"] == 1 and "commit" in runs[0]["git"]
    before = path.read_bytes()
    backward.main(["bwd_tiny", f"store.root={tmp_path}"])  # nothing to run: file untouched
    assert path.read_bytes() == before


def test_growth_fits_the_exponent_per_seed_with_the_fp64_reference_past_the_certified(
        tmp_path, monkeypatch):
    conf = {"experiment": "bwd_tiny", "base": {"head_dim": 16, "block": 16},
            "grid": [{"name": "c", "seq_len": [32], "seed": [0, 1]},
                     {"name": "f", "seq_len": [64], "seed": [0, 1], "reference": ["fp64"],
                      "bound": [False]}]}
    monkeypatch.setattr(backward, "load_conf", lambda name: conf)
    backward.main(["bwd_tiny", f"store.root={tmp_path}"])
    df = store.load(tmp_path / "bwd_tiny")
    cert, f64 = df[df.seq_len == 32], df[df.seq_len == 64]
    assert set(cert.ref_method) == {"certified"} and set(f64.ref_method) == {"fp64"}
    assert f64.bound_dq.isna().all() and f64.held_dq.isna().all()
    assert f64.ref64_err_dq.isna().all()
    # the fp64 reference errs far below the bf16 backward's error it stands in for
    for g in backward.GRADS:
        assert (cert[f"ref64_err_{g}"] < 1e-6 * cert[f"err_{g}"]).all()
    fit = backward.growth(tmp_path / "bwd_tiny")
    dq = fit[fit.grad == "dq"].iloc[0]
    def rel(s, n):
        row = df[(df.seed == s) & (df.seq_len == n)]
        return row.err_dq.item() / row.ref_dq.item()

    alphas = [math.log2(rel(s, 64) / rel(s, 32)) for s in (0, 1)]
    assert dq.seeds == 2 and dq.refs == "certified+fp64"
    assert dq.alpha_min == pytest.approx(min(alphas)) and dq.alpha_max == pytest.approx(max(alphas))


def test_an_attribution_case_stores_its_table_in_one_row_and_gives_it_back_tidy(
        tmp_path, monkeypatch):
    conf = {"experiment": "bwd_tiny", "base": {"seq_len": 32, "head_dim": 16,
                                               "attribution": True},
            "grid": [{"name": "a", "policy": ["fa2"], "seed": [0]}]}
    monkeypatch.setattr(backward, "load_conf", lambda name: conf)
    backward.main(["bwd_tiny", f"store.root={tmp_path}"])
    df = store.load(tmp_path / "bwd_tiny")
    assert len(df) == 1
    tidy = backward.attribution_rows(df)
    assert set(tidy.metric) == {"max_abs", "rmse"} and set(tidy.grad) == set(backward.GRADS)
    assert "forward" in set(tidy.site) and (tidy.case_id == df.case_id[0]).all()
    summ = backward.attribution_summary(tmp_path / "bwd_tiny")
    dv = summ[(summ.grad == "dv")]
    assert "p_cast" in set(dv.site) and "ds_cast" not in set(dv.site)


def test_where_runs_only_the_cases_with_those_axis_values(tmp_path, monkeypatch):
    conf = {"experiment": "bwd_tiny", "base": {"seq_len": 32, "head_dim": 16, "bound": False},
            "grid": [{"name": "t", "policy": ["fa2", "naive"], "seed": [0]}]}
    monkeypatch.setattr(backward, "load_conf", lambda name: conf)
    backward.main(["bwd_tiny", "where=policy:naive+seed:0", f"store.root={tmp_path}"])
    assert list(store.load(tmp_path / "bwd_tiny").policy) == ["naive"]
    with pytest.raises(ValueError, match="colour"):
        backward._where("colour:red")


def test_the_attribution_shares_quoted_in_the_docs_are_the_stored_tables():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "backward.md").read_text()
    summ = backward.attribution_summary("bwd_attribution")
    names = {"out": "output cast", "ds_cast": "dS cast", "forward": "forward",
             "p_cast": "P cast"}
    for grad, sites in (("dq", ("out", "ds_cast", "forward")),
                        ("dk", ("ds_cast", "out", "forward")), ("dv", ("out", "p_cast"))):
        head = f"| fa2 d{grad[1].upper()}"
        row = next(line for line in doc.splitlines() if line.startswith(head))
        for site in sites:
            r = summ[(summ.policy == "fa2") & (summ.grad == grad) & (summ.site == site)].iloc[0]
            assert f"{names[site]} {r.share_max_abs:.2f}" in row, (grad, site, row)
    tidy = backward.attribution_rows(store.load("bwd_attribution"))
    sink = tidy[(tidy.policy == "fa2") & (tidy.metric == "max_abs") & (tidy.site == "forward")
                & (tidy.distribution == "sink")]
    for grad in ("dq", "dk"):
        share = sink[sink.grad == grad].share.median()
        assert f"{share:.2f}" in doc, (grad, share)


def test_the_growth_exponents_in_the_docs_are_the_stored_tables():
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "backward.md").read_text()
    sec = doc[doc.index("### Growth with N"):doc.index("### Per-site attribution")]
    fit = backward.growth("bwd_seqlen_growth")
    rows = 0
    for prec, block in re.findall(r"(?m)^(bf16|fp16):\n\n(.*?)\n\n", sec, re.S):
        # the table's rows: its block markers, header and rule left out
        for line in [ln for ln in block.splitlines() if ln.startswith("|")][2:]:
            pol, dist, _, *cells = (c.strip() for c in line.strip("|").split("|"))
            for g, cell in zip(backward.GRADS, cells, strict=True):
                r = fit[(fit.policy == pol) & (fit.precision == prec)
                        & (fit.distribution == dist) & (fit.grad == g)].iloc[0]
                assert cell == f"{r.alpha:.2f} [{r.alpha_min:.2f}, {r.alpha_max:.2f}]", line
            rows += 1
    assert rows == 18
