"""The benchmarks' timing helper (flashnum.harness.timing): what it records of the machine,
how its timer interleaves and takes the best, and the JSON it writes."""

import json
import time

import pytest

from flashnum.harness import timing


def test_the_timer_runs_the_callables_round_robin_after_the_warmup():
    log = []
    timing.interleaved({"a": lambda: log.append("a"), "b": lambda: log.append("b")},
                       repeat=3, warmup=1)
    assert log == ["a", "b"] * 4


def test_each_figure_is_the_best_of_its_runs_in_wall_and_cpu_time():
    naps = iter([0.03, 0.01, 0.02])
    got = timing.interleaved({"nap": lambda: time.sleep(next(naps)), "spin": lambda: None},
                             repeat=3)
    nap = got["nap"]
    assert len(nap["wall_runs_s"]) == len(nap["cpu_runs_s"]) == 3
    assert nap["wall_s"] == min(nap["wall_runs_s"]) and nap["cpu_s"] == min(nap["cpu_runs_s"])
    # sleeping takes wall time, not CPU time: the runs follow the naps 0.03, 0.01, 0.02
    assert all(w >= n for w, n in zip(nap["wall_runs_s"], (0.03, 0.01, 0.02), strict=True))
    assert nap["wall_s"] >= 0.01
    assert nap["cpu_s"] < 0.01


def test_busy_work_is_counted_in_cpu_time_and_in_wall_time():
    def spin(seconds=0.02):  # busy for 0.02 s of this process's CPU time
        t = time.process_time()
        while time.process_time() - t < seconds:
            pass

    assert timing.best(spin, 2, clock="cpu") >= 0.02
    assert timing.best(spin, 2, clock="wall") >= 0.02


@pytest.mark.parametrize("call, words", [
    (lambda: timing.interleaved({"f": lambda: None}, repeat=0), "repeat=0"),
    (lambda: timing.best(lambda: None, 1, clock="gpu"), "'wall' or 'cpu'"),
])
def test_bad_arguments_are_named_with_the_valid_choices(call, words):
    with pytest.raises(ValueError, match=words):
        call()


def test_the_machine_facts_name_cpu_cores_load_and_torch():
    m = timing.facts(["bench/bench_x.py", "--quick"])
    assert m["command"] == "python bench/bench_x.py --quick"
    assert m["cpu_model"] and isinstance(m["cpu_simd_flags"], list)
    assert 1 <= m["cores"] <= m["cpus"]
    assert len(m["load_average_before"]) == 3
    import torch

    assert m["torch"] == torch.__version__ and m["threads"] == torch.get_num_threads()


def test_the_command_names_a_script_by_its_path_in_the_repository():
    script = timing.REPO / "bench" / "bench_engine.py"
    assert timing.command([str(script), "--n", "1 2"]) == "python bench/bench_engine.py --n '1 2'"
    assert timing.command(["/elsewhere/x.py"]) == "python /elsewhere/x.py"


def test_the_result_is_written_with_its_command_and_the_load_after(tmp_path):
    res = timing.facts(["bench/bench_x.py"])
    path = timing.write(tmp_path / "sub" / "x.json", {**res, "ratio": 1.5})
    got = json.loads(path.read_text())
    assert got["command"] == "python bench/bench_x.py" and got["ratio"] == 1.5
    assert len(got["load_average_after"]) == 3 and got["cpu_model"] == res["cpu_model"]


def test_cpu_time_counts_the_children_that_have_ended():
    import subprocess
    import sys

    before = timing.cpu_time()
    subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\n"
                    "while time.process_time() - t < 0.2: pass"], check=True)
    assert timing.cpu_time() - before >= 0.2


def test_a_result_keeps_the_load_it_recorded_after_its_timed_part(tmp_path):
    res = {**timing.facts(["bench/bench_x.py"]), "load_average_after": [9.0, 9.0, 9.0]}
    got = json.loads(timing.write(tmp_path / "x.json", res).read_text())
    assert got["load_average_after"] == [9.0, 9.0, 9.0]
