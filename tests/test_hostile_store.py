"""Hostile files in a store: each one a run, `check` and `repair` would trip on.

For every file flashnum never writes (a table without case_id, as the table or as a part;
a part that is another table; a manifest whose runs are not records, or that is not
flashnum's; a claim or a run mark that is not UTF-8; a folder where the lock or a part
should be): the run stops before computing, in one line naming the file and the repair
(exit status 2); `check` lists it (exit 2); `repair` moves it to quarantine/ byte for
byte, keeps every readable row and leaves a store the next run resumes. A folder that
is not a store is refused by check and repair in one line, its files untouched.

Oracles: exit statuses and the lines on stderr; the bytes of the moved files; the set of
case_ids load() gives before and after (every readable row kept, no foreign row merged).
"""

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import flashnum.stored as store_command
from flashnum import store
from flashnum.harness import run as runmod
from flashnum.store import manifest, owners
from flashnum.store.paths import CONF

SMOKE = ["experiment=smoke", "grid.0.seed=[0]", "progress=false", "n_jobs=1"]
PART = "parts/part-00000000000000000001-1-x-abcdef12.parquet"


def cfg_of(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides))


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A finished store of 8 of the grid's 16 cases."""
    root = tmp_path_factory.mktemp("stored")
    runmod.run(cfg_of(*SMOKE, "max_cases=8", f"store.root={root}"))
    return root / "smoke"


@pytest.fixture
def exp(stored, tmp_path):
    exp = tmp_path / "smoke"
    shutil.copytree(stored, exp)
    return exp


def _table(path: Path, df: pd.DataFrame) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(path)


DAMAGE = {  # name -> (what it does to the store, the file to blame, its why)
    "results without case_id": (
        lambda e: _table(e / "results.parquet", pd.DataFrame({"a": [1, 2]})),
        "results.parquet", "no case_id column"),
    "part without case_id": (
        lambda e: _table(e / PART, pd.DataFrame({"a": [1.0, 2.0]})), PART, "no case_id column"),
    "part of another table": (
        lambda e: _table(e / PART, pd.DataFrame({"case_id": ["z"], "foo": [1]})), PART,
        "no column but case_id in common"),
    "manifest of non-records": (
        lambda e: (e / "manifest.json").write_text('{"runs": [1, "x", null]}'),
        "manifest.json", "run 0 is 1, not a record"),
    "manifest not flashnum's": (
        lambda e: (e / "manifest.json").write_text('{"name": "mine", "version": 3}'),
        "manifest.json", "not a flashnum manifest"),
    "claim not UTF-8": (
        lambda e: (e / "claims" / "abc").write_bytes(b"\xff\xfe\x00"), "claims/abc",
        "not UTF-8"),
    "run mark not UTF-8": (
        lambda e: (e / ".runs" / "abc").write_bytes(b"\xff\xfe\x00"), ".runs/abc",
        "not UTF-8"),
    "lock is a folder": (
        lambda e: ((e / ".lock").unlink(missing_ok=True), (e / ".lock").mkdir()), ".lock",
        "not a lock file"),
    "part is a folder": (lambda e: (e / PART).mkdir(parents=True), PART, "a folder"),
}


def _ids(exp: Path) -> set:
    return set(store.load(exp).case_id) if store._files(exp) else set()


def _snapshot(p: Path):
    return p.read_bytes() if p.is_file() else sorted(x.name for x in p.iterdir())


@pytest.mark.parametrize("name", sorted(DAMAGE))
def test_a_hostile_store_file_stops_the_run_in_one_line_and_repair_quarantines_it(
        exp, name, capsys):
    damage, rel, why = DAMAGE[name]
    (exp / "claims").mkdir(exist_ok=True)
    (exp / ".runs").mkdir(exist_ok=True)
    readable = set(store.load(exp).case_id) - (
        set() if rel != "results.parquet" else set(pd.read_parquet(exp / rel).case_id))
    damage(exp)
    bad = exp / rel
    before = _snapshot(bad)
    root = f"store.root={exp.parent}"

    with pytest.raises(SystemExit) as e:  # the run: one line, before computing anything
        runmod.main([*SMOKE, "max_cases=10", root])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1, err
    assert str(bad) in err and why in err and "flashnum.stored repair smoke" in err, err
    assert _snapshot(bad) == before

    assert store_command.main(["check", "smoke", root]) == 1  # check: the same file
    err = capsys.readouterr().err
    assert str(bad) in err and why in err, err

    assert store_command.main(["repair", "smoke", root]) == 0
    out = capsys.readouterr().out
    assert f"quarantined {rel}" in out, out
    moved = [p for p in (exp / store.QUARANTINE).iterdir() if p.name.endswith(bad.name)]
    assert len(moved) == 1 and _snapshot(moved[0]) == before  # byte for byte
    assert _ids(exp) == readable  # every readable row, no foreign one
    assert store_command.main(["check", "smoke", root]) == 0
    capsys.readouterr()
    out = runmod.run(cfg_of(*SMOKE, "max_cases=10", root))  # and the next run resumes
    assert out["counts"]["failed"] == 0
    assert _ids(exp) >= readable and len(_ids(exp)) >= 10


def test_show_of_a_table_without_case_id_is_one_line_naming_the_repair(exp, capsys):
    _table(exp / "results.parquet", pd.DataFrame({"a": [1, 2]}))
    with pytest.raises(SystemExit) as e:
        store_command.main(["smoke", f"store.root={exp.parent}"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "no case_id column" in err, err


def test_check_and_repair_refuse_a_folder_that_is_not_a_store_touching_nothing(
        tmp_path, capsys):
    folder = tmp_path / "mine"
    folder.mkdir()
    files = {"manifest.json": b'{"name": "mine"}\n', "grid.json": b'{"a": 1}\n',
             "results.parquet": b"not parquet"}
    for f, data in files.items():
        (folder / f).write_bytes(data)
    for action in ("check", "repair"):
        with pytest.raises(SystemExit) as e:
            store_command.main([action, "mine", f"store.root={tmp_path}"])
        err = capsys.readouterr().err
        assert e.value.code == 2 and err.count("\n") == 1, err
        assert "is not a flashnum store" in err, err
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == files  # untouched


def test_a_store_root_where_no_folder_can_be_made_is_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        runmod.main([*SMOKE, "max_cases=1", "store.root=/proc/self"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "cannot make the folder /proc/self/smoke" in err, err
    assert "Traceback" not in err


# -- fuzz: whatever a manifest or an owner file holds, a record or one StoreError --------

JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 99) | st.text(max_size=6),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(
                        st.sampled_from(["runs", "history", "experiment", "repairs", "run_id",
                                         "counts", "end_time", "git", "x"]), c, max_size=4),
                    max_leaves=10)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(man=JSON)
def test_a_fuzzed_manifest_reads_as_runs_of_records_or_is_one_store_error(
        tmp_path_factory, man):
    path = tmp_path_factory.mktemp("m") / "manifest.json"
    path.write_text(json.dumps(man))
    try:
        runs = manifest.runs(path)
    except store.StoreError as e:
        assert str(path) in str(e) and "\n" not in str(e)
        return
    for r in runs:  # what reconcile and the summaries read of a record
        assert isinstance(r, dict)
        assert isinstance(r.get("run_id") or "", str) and isinstance(r.get("counts") or {}, dict)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=40), where=st.sampled_from(["claims", ".runs"]))
def test_a_fuzzed_owner_file_is_tidied_or_one_store_error(tmp_path_factory, data, where):
    exp = tmp_path_factory.mktemp("o")
    (exp / where).mkdir()
    (exp / where / "abc").write_bytes(data)
    try:
        owners.tidy(exp)
    except store.StoreError as e:
        assert "abc" in str(e) and "\n" not in str(e)
