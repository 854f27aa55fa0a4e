"""The results store: append-only parts, atomic files, resume, compaction, one row per case."""

import json
import os

import pandas as pd
import pyarrow.parquet as pq
import pytest

from flashnum.harness import store


def rows(ids, value=1.0):
    return [{"case_id": c, "max_abs_err": value, "policy": "fa2"} for c in ids]


def test_a_part_is_written_whole_and_load_gives_its_rows(tmp_path):
    store.write_part(tmp_path, rows(["b", "a"]))
    df = store.load(tmp_path)
    assert list(df.case_id) == ["a", "b"]  # sorted by case_id: the order does not depend on runs
    assert not list(tmp_path.rglob(".tmp-*"))


def test_no_rows_write_no_file(tmp_path):
    assert store.write_part(tmp_path, []) is None
    assert not (tmp_path / store.PARTS).exists()


def test_a_missing_table_names_the_folder_and_the_command(tmp_path):
    with pytest.raises(FileNotFoundError, match="experiment=nothing_here"):
        store.load(tmp_path / "nothing_here")


def test_later_rows_of_a_case_win_and_no_case_appears_twice(tmp_path):
    store.write_part(tmp_path, rows(["a", "b"], 1.0))
    store.write_part(tmp_path, rows(["b"], 2.0))  # b computed again (recompute=true)
    df = store.load(tmp_path)
    assert df.set_index("case_id").max_abs_err.to_dict() == {"a": 1.0, "b": 2.0}
    assert store.done_ids(tmp_path) == {"a", "b"}


def test_compaction_keeps_the_table_and_removes_the_parts(tmp_path):
    store.write_part(tmp_path, rows(["c", "a"], 1.0))
    store.write_part(tmp_path, rows(["b", "a"], 3.0))
    before = store.load(tmp_path)
    assert store.compact(tmp_path) == 3
    assert not list((tmp_path / store.PARTS).glob("*.parquet"))
    pd.testing.assert_frame_equal(store.load(tmp_path), before)
    assert pq.read_metadata(tmp_path / store.RESULTS).num_rows == 3
    store.write_part(tmp_path, rows(["d"]))  # appending after a compaction
    assert store.compact(tmp_path) == 4


def test_a_compaction_killed_after_its_rename_leaves_no_duplicate(tmp_path):
    store.write_part(tmp_path, rows(["a", "b"]))
    parts = list((tmp_path / store.PARTS).glob("*.parquet"))
    table = store.load(tmp_path)
    store._write_table(table, tmp_path / store.RESULTS)  # renamed, parts not yet removed
    assert parts[0].exists()
    df = store.load(tmp_path)
    assert list(df.case_id) == ["a", "b"]
    assert store.compact(tmp_path) == 2


def test_a_stray_temporary_file_is_never_read(tmp_path):
    store.write_part(tmp_path, rows(["a"]))
    (tmp_path / store.PARTS / ".tmp-dead-part-1.parquet").write_bytes(b"PAR1 truncated")
    (tmp_path / ".tmp-dead-results.parquet").write_bytes(b"garbage")
    assert list(store.load(tmp_path).case_id) == ["a"]
    store.compact(tmp_path)
    assert not list(tmp_path.glob(".tmp-*"))  # compaction clears its own strays


def test_a_held_lock_stops_a_second_compaction_and_a_stale_one_does_not(tmp_path):
    store.write_part(tmp_path, rows(["a"]))
    lock = tmp_path / store.LOCK
    lock.write_text(f"{os.uname().nodename} {os.getpid()}")  # a live compaction: this process
    assert store.compact(tmp_path) == -1
    lock.write_text(f"{os.uname().nodename} 999999999")  # its process is gone
    assert store.compact(tmp_path) == 1
    assert not lock.exists()


def test_load_shows_the_grid_last_run_unless_asked_for_all_rows(tmp_path):
    store.write_part(tmp_path, rows(["a", "b", "c"]))
    store.write_grid(tmp_path, ["a", "c"])
    assert list(store.load(tmp_path).case_id) == ["a", "c"]
    assert list(store.load(tmp_path, all_rows=True).case_id) == ["a", "b", "c"]
    assert json.loads((tmp_path / store.GRID).read_text())["n"] == 2


def test_a_name_resolves_under_a_root(tmp_path):
    store.write_part(tmp_path / "exp1", rows(["a"]))
    assert len(store.load("exp1", root=tmp_path)) == 1
    assert store.experiment_dir("exp1", root=tmp_path) == tmp_path / "exp1"


def test_json_is_replaced_atomically(tmp_path):
    path = tmp_path / "manifest.json"
    store.write_json(path, {"a": 1})
    store.write_json(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    assert not list(tmp_path.glob(".tmp-*"))


# ---------------------------------------------------------------------------
# replace: a table recomputed whole


def test_replace_makes_the_new_rows_the_whole_table_and_appends_the_manifest(tmp_path):
    store.write_part(tmp_path / "repro_x", rows(["a", "b", "c"], 1.0))
    store.compact(tmp_path / "repro_x")
    store.write_part(tmp_path / "repro_x", rows(["d"], 1.0))  # a part not yet compacted
    rec = {"run_id": "r1", "command": {"module": "flashnum.reproduce", "overrides": ["x"]}}
    path = store.replace("repro_x", pd.DataFrame(rows(["c", "a"], 2.0)), rec, root=tmp_path)
    assert path == tmp_path / "repro_x"
    df = store.load(path)
    assert list(df.case_id) == ["a", "c"] and set(df.max_abs_err) == {2.0}
    assert not list((path / store.PARTS).glob("part-*")) and not list(path.rglob(".tmp-*"))
    man = json.loads((path / store.MANIFEST).read_text())
    assert [r["run_id"] for r in man["runs"]] == ["r1"] and man["experiment"] == "repro_x"


def test_replace_refuses_a_table_without_one_row_per_case(tmp_path):
    with pytest.raises(ValueError, match="one row per case_id"):
        store.replace(tmp_path / "x", pd.DataFrame(rows(["a", "a"])))
    assert not (tmp_path / "x").exists()


def test_replace_refuses_while_another_process_compacts_and_takes_its_part_back(tmp_path):
    exp = tmp_path / "x"
    exp.mkdir()
    (exp / store.LOCK).write_text(f"otherhost {os.getpid()}")
    with pytest.raises(RuntimeError, match="being compacted"):
        store.replace(exp, pd.DataFrame(rows(["a"])))
    assert not list((exp / store.PARTS).glob("part-*"))  # its own part taken back


# ---------------------------------------------------------------------------
# the command line


def test_the_store_command_takes_key_value_and_a_bare_name(tmp_path, capsys):
    store.write_part(tmp_path / "e", rows(["a"]))
    assert store.main(["e", f"store.root={tmp_path}", "compact=true"]) == 0
    out = capsys.readouterr().out
    assert "compacted: 1 rows" in out and "1 rows, 3 columns" in out
    assert store.main([f"experiment={tmp_path / 'e'}"]) == 0


@pytest.mark.parametrize("argv, says", [
    (["e", "compact=maybe"], "bad value 'maybe' for compact: expected boolean"),
    (["e", "colour=red"], "unknown key 'colour'; valid: compact, experiment, store"),
    ([], "which experiment?"),
    (["e", "--compact"], "'--compact' is not key=value"),
])
def test_a_bad_store_command_is_one_line_and_exit_status_2(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        store.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and says in err, err
    assert err.startswith("flashnum.store: error: ")
