"""The results store: append-only parts, atomic files, resume, compaction, one row per case."""

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pyarrow.parquet as pq
import pytest

import flashnum.stored as store_command  # the command line, python -m flashnum.stored
from flashnum import store
from flashnum.store import owners


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


def test_a_missing_table_is_reported_at_once_not_retried_as_a_race(tmp_path, monkeypatch):
    # a FileNotFoundError from a compaction's race is read again; "no table at all" is not
    # (the figures ask for thirty missing tables in a fresh folder)
    listed = []
    files = store._files
    monkeypatch.setattr(store, "_files", lambda d: listed.append(d) or files(d))
    with pytest.raises(FileNotFoundError):
        store.load("nothing_here", root=tmp_path)
    assert len(listed) == 1


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


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def tmp_name(pid: int, name: str) -> str:
    """A temporary file's name as process `pid` of this host writes it (owners.tag)."""
    tag = owners.tag().split("-")
    return f".tmp-{tag[0]}-{pid}-0-{tag[3]}-{name}"


def test_stray_temporary_files_are_never_read_and_removed_once_their_writer_is_dead(tmp_path):
    store.write_part(tmp_path, rows(["a"]))
    dead, live = dead_pid(), os.getpid()
    killed_part = tmp_path / store.PARTS / tmp_name(dead, "part-1.parquet")
    killed_part.write_bytes(b"PAR1 truncated")
    (tmp_path / tmp_name(dead, "results.parquet")).write_bytes(b"garbage")
    in_flight = tmp_path / store.PARTS / tmp_name(live, "part-2.parquet")
    in_flight.write_bytes(b"PAR1 being written")  # a live writer's: never touched
    old_form = tmp_path / ".tmp-0123456789abcdef-manifest.json"  # the earlier naming
    old_form.write_text("{")
    os.utime(old_form, (time.time() - 2 * owners.STALE_S,) * 2)
    assert list(store.load(tmp_path).case_id) == ["a"]
    store.compact(tmp_path)
    left = sorted(p.name for p in tmp_path.rglob(".tmp-*"))
    assert left == [in_flight.name]


def test_an_empty_or_dead_lock_of_the_earlier_protocol_is_removed_and_blocks_nothing(tmp_path):
    for text in ("", f"{os.uname().nodename} {dead_pid()}"):  # crashed before writing; dead
        store.write_part(tmp_path, rows(["a"]))
        lock = tmp_path / owners.OLD_LOCK
        lock.write_text(text)
        assert store.compact(tmp_path) == 1
        assert not lock.exists() and not list((tmp_path / store.PARTS).glob("part-*"))


def test_the_lock_is_dropped_by_the_kernel_when_its_holder_dies(tmp_path):
    # a process that takes the lock and is killed holding it: the next writer gets it
    code = ("import os, signal, sys; from flashnum.store import owners\n"
            f"with owners.locked({str(tmp_path)!r}):\n"
            "    print('held', flush=True); os.kill(os.getpid(), signal.SIGKILL)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60)
    assert p.stdout == "held\n" and p.returncode == -signal.SIGKILL
    store.write_part(tmp_path, rows(["a"]))
    assert store.compact(tmp_path) == 1


def test_load_returns_every_row_written_and_the_grid_view_on_request(tmp_path):
    store.write_part(tmp_path, rows(["a", "b", "c"]))
    store.write_grid(tmp_path, ["a", "c"])  # a later, smaller grid
    assert list(store.load(tmp_path).case_id) == ["a", "b", "c"]
    assert list(store.load(tmp_path, grid=True).case_id) == ["a", "c"]
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


# ---------------------------------------------------------------------------
# the command line


def test_the_store_command_takes_key_value_and_a_bare_name(tmp_path, capsys):
    store.write_part(tmp_path / "e", rows(["a"]))
    assert store_command.main(["e", f"store.root={tmp_path}", "compact=true"]) == 0
    out = capsys.readouterr().out
    assert "compacted: 1 rows" in out and "1 rows, 3 columns" in out
    assert store_command.main([f"experiment={tmp_path / 'e'}"]) == 0


@pytest.mark.parametrize("argv, says", [
    (["e", "compact=maybe"], "bad value 'maybe' for compact: expected boolean"),
    (["e", "colour=red"], "unknown key 'colour'; valid: action, compact, experiment, store"),
    (["e", "action=fix"], "unknown action 'fix'; valid: show, check, repair"),
    ([], "which experiment?"),
    (["e", "--compact"], "'--compact' is not key=value"),
])
def test_a_bad_store_command_is_one_line_and_exit_status_2(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        store_command.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and says in err, err
    assert err.startswith("flashnum.stored: error: ")


# ---------------------------------------------------------------------------
# claims: who computes a case now


def test_a_case_is_claimed_once_while_its_owner_lives_then_by_anyone(tmp_path):
    mine = owners.claim(tmp_path, ["a", "b"], "r1")
    assert mine == ["a", "b"] and owners.claim(tmp_path, ["a", "c"], "r2") == ["c"]
    dead = f"{owners.host()} {dead_pid()} 0 r0"
    (tmp_path / owners.CLAIMS / "a").write_text(dead)  # its owner died computing it
    assert owners.claim(tmp_path, ["a"], "r2") == ["a"]
    owners.release(tmp_path, ["a", "b", "c"])
    assert not list((tmp_path / owners.CLAIMS).iterdir())


def test_tidying_a_dead_owners_claim_spares_one_taken_over_meanwhile(tmp_path):
    claim = tmp_path / owners.CLAIMS / "a"
    claim.parent.mkdir()
    claim.write_text(f"{owners.host()} {dead_pid()} 0 r0")
    (found, held), = owners.stale(tmp_path)
    assert found == claim
    claim.write_text(owners.me("r2"))  # another run took it over before the clean-up
    owners.tidy(tmp_path)  # judged stale from what it held before: left alone
    owners._take_stale(claim, held)
    assert claim.read_text() == owners.me("r2") and not list(claim.parent.glob(".stale-*"))
