"""One runner: every table's case ids come from one function (flashnum.harness.grid.
hash_id), every grid is expanded by one function (flashnum.harness.grid.points), the store
alone writes result tables, and the stored ids are what that function gives today (so a
rerun resumes and compares against the shipped rows)."""

import inspect
import re
from pathlib import Path

import pandas as pd
import pytest

from flashnum import store
from flashnum.harness import backward
from flashnum.harness.grid import hash_id
from flashnum.reproduce import REPRODUCTIONS, case_ids

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "flashnum"
# sha256 truncated to 16 hex digits elsewhere keys a compiled binary, not a row
NOT_CASE_IDS = {"flashnum/numerics/build.py"}
# parquet files that are not result tables: an audit report's own table and the kernel
# table's list of audited cases, both beside the table the store writes
NOT_TABLES = {"flashnum/audit/report.py", "flashnum/audit/kernel_table.py"}


def sources():
    for p in sorted(PKG.rglob("*.py")):
        yield p.relative_to(REPO).as_posix(), p.read_text()


def test_one_function_computes_case_ids():
    hashing = {name for name, text in sources() if "hexdigest()[:16]" in text}
    assert hashing - NOT_CASE_IDS == {"flashnum/harness/grid.py"}
    grid = (PKG / "harness" / "grid.py").read_text()
    assert grid.count("hexdigest()[:16]") == 1  # in hash_id, which case_id calls


def test_one_function_expands_the_forward_and_the_backward_grids():
    from flashnum.harness import grid

    assert backward.points is grid.points
    for expand in (grid.expand, backward.expand):
        body = inspect.getsource(expand)
        assert "points(" in body and "product(" not in body


def test_a_backward_slice_with_an_unknown_axis_says_so_as_a_forward_one_does():
    conf = {"experiment": "bwd_x", "grid": [{"name": "s", "policy": ["fa2"], "polcy": ["x"]}]}
    with pytest.raises(ValueError) as e:
        backward.expand(conf)
    assert str(e.value).startswith("unknown grid axis 'polcy' (in grid slice 's'); valid: ")


def test_a_single_value_is_a_list_of_one_in_every_grid():
    one = {"experiment": "bwd_x", "grid": [{"name": "s", "policy": "fa2", "seed": [0, 1]}]}
    lists = {"experiment": "bwd_x", "grid": [{"name": "s", "policy": ["fa2"], "seed": [0, 1]}]}
    assert [c["case_id"] for c in backward.expand(one)] == \
        [c["case_id"] for c in backward.expand(lists)]


def test_one_module_writes_the_tables():
    writers = {name for name, text in sources()
               if re.search(r"\.to_parquet\(|pq\.write_table\(", text)}
    assert writers - NOT_TABLES == {"flashnum/store/__init__.py"}


def test_the_backward_ids_stored_are_the_ones_the_one_function_gives():
    conf = backward.load_conf("bwd_order")
    ids = {c["case_id"] for c in backward.expand(conf)}
    assert ids == set(store.load(REPO / "experiments" / "bwd_order").case_id)


@pytest.mark.parametrize("name", REPRODUCTIONS)
def test_the_reproduction_ids_stored_are_the_ones_the_one_function_gives(name):
    df = pd.read_parquet(REPO / "experiments" / f"repro_{name}" / "results.parquet")
    assert case_ids(f"repro_{name}", df.drop(columns="case_id")) == list(df.case_id)


@pytest.mark.parametrize("name", ["kernel_audit", "kernel_audit_backward", "kernel_table"])
def test_the_audit_ids_stored_are_the_one_functions_hash_of_their_readable_key(name):
    # an audit table keeps its readable key in columns (target, precision, the case's id)
    df = store.load(REPO / "experiments" / name)
    key = ["target", "precision"] + (["id"] if name != "kernel_table" else [])
    assert [hash_id([name, *k]) for k in df[key].itertuples(index=False)] == list(df.case_id)


def test_the_spaced_form_is_json_dumps_default_and_the_plain_form_has_no_spaces():
    import hashlib
    import json

    obj = {"b": [1, 2.5], "a": "x"}
    spaced = hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]
    plain = hashlib.sha256(b'{"a":"x","b":[1,2.5]}').hexdigest()[:16]
    assert hash_id(obj, spaced=True) == spaced and hash_id(obj) == plain != spaced


@pytest.mark.parametrize("name", sorted(p.stem for p in (REPO / "conf" / "table").glob("*.yaml")))
def test_a_table_experiment_keys_its_rows_by_its_columns_that_are_not_measures(name):
    from flashnum.harness import tables

    conf = tables.load_conf(name)
    assert callable(tables.function(conf["table"]))
    df = store.load(REPO / "experiments" / name)
    assert set(conf["measures"]) < set(df.columns)
    assert tables.row_ids(name, df.drop(columns="case_id"), conf["measures"]) == list(df.case_id)


def test_a_table_that_runs_a_third_partys_file_stops_in_one_line_without_it(tmp_path):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "FLASHNUM_QIU_YAO"}
    p = subprocess.run([sys.executable, "-m", "flashnum.run", "experiment=qiu_yao_agreement",
                        f"store.root={tmp_path}"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=120)
    assert p.returncode == 2 and not p.stdout
    line, = p.stderr.splitlines()
    assert "set FLASHNUM_QIU_YAO=PATH" in line and "the stored table stays" in line
    assert list(tmp_path.iterdir()) == []  # nothing written


@pytest.mark.slow
def test_a_rerun_of_any_kind_compares_with_a_stored_table_and_fails_on_one_changed_number(
        tmp_path):
    # compare_with= is not only the sweeps': a table experiment (and a reproduction, an
    # audit, head statistics, which share flashnum.run.compared) checks the rows it
    # wrote against ROOT/NAME, exit 1 on the first changed bit
    import subprocess
    import sys

    def rerun(*extra):
        return subprocess.run([sys.executable, "-m", "flashnum.run", "experiment=ties_bias",
                               f"store.root={tmp_path / 'now'}", *extra], capture_output=True,
                              text=True, cwd=tmp_path, timeout=600)

    same = rerun(f"compare_with={REPO / 'experiments'}")
    assert same.returncode == 0, same.stderr
    assert "identical to the stored results" in same.stdout
    stored = store.load(REPO / "experiments" / "ties_bias")
    (tmp_path / "changed" / "ties_bias").mkdir(parents=True)
    i = stored.index[stored["total"].abs() > 0][0]  # a finite, nonzero number
    stored.loc[i, "total"] = float(stored.loc[i, "total"]) * (1 + 2**-40)
    stored.to_parquet(tmp_path / "changed" / "ties_bias" / "results.parquet")
    differ = rerun(f"compare_with={tmp_path / 'changed'}")
    assert differ.returncode == 1, differ.stderr
    assert "total: 1 rows differ" in differ.stdout
    itself = rerun(f"compare_with={tmp_path / 'now'}")
    assert itself.returncode == 2 and "is the store this run writes to" in itself.stderr
