"""A run into a scratch store compared with a stored table: identical rows say so, and any
value that differs (by one ulp) is listed; the timings are not compared."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from flashnum import store
from flashnum.harness.config import check
from flashnum.harness.run import run
from flashnum.store.compare import against, differences, report
from flashnum.store.manifest import cpu_class
from flashnum.store.paths import CONF


def table():
    return pd.DataFrame(dict(case_id=["a", "b", "c"], max_abs_err=[1e-3, 2e-3, math.nan],
                             m_ok=[True, True, False], dominant_site=["o", None, "p"],
                             wall_s=[0.1, 0.2, 0.3]))


def test_identical_rows_are_reported_identical_whatever_their_order_and_timings():
    now, stored = table(), table().iloc[::-1]
    now["wall_s"] = [9.0, 9.0, 9.0]  # the machine, not the numerics
    text, same = report(now, stored, "experiments/x")
    assert same and differences(now, stored) == []
    assert text.startswith("3 computed now, identical to the stored results in every numeric "
                           "column") and "not compared: wall_s" in text


def test_a_one_ulp_difference_is_listed_with_its_row_count_and_an_example():
    now = table()
    now.loc[1, "max_abs_err"] = np.nextafter(2e-3, 1.0)
    now.loc[2, "dominant_site"] = "s"
    text, same = report(now, table(), "experiments/x")
    assert not same
    (d1, d2) = differences(now, table())
    assert (d1.column, d1.rows, d1.example) == ("max_abs_err", 1, "b")
    assert (d2.column, d2.rows, d2.example) == ("dominant_site", 1, "c")
    assert "2 column(s) differ" in text and "max_abs_err: 1 rows differ (e.g. b" in text


def test_a_column_or_a_case_the_stored_table_lacks_is_a_difference():
    now = table().assign(bound_finite=True)
    (d,) = differences(now, table())
    assert d.column == "bound_finite" and "not in the stored table" in d.line()
    extra = pd.concat([table(), table().iloc[:1].assign(case_id="z")])
    text, same = report(extra, table(), "experiments/x")
    assert not same and "not stored, e.g. z" in text


def cfg_of(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_a_run_into_a_scratch_store_compares_what_it_computed_with_the_stored_rows(
        tmp_path, capsys):
    tiny = ["experiment=smoke", "progress=false", "n_jobs=1", "max_cases=3"]
    shipped, scratch = tmp_path / "shipped", tmp_path / "scratch"
    run(cfg_of(*tiny, f"store.root={shipped}"))
    capsys.readouterr()
    out = run(cfg_of(*tiny, f"store.root={scratch}", f"compare_with={shipped}"))
    text = capsys.readouterr().out
    assert out["reproduces"] is True and out["counts"]["run"] == 3
    assert "3 run now" in text
    assert "3 computed now, identical to the stored results in every numeric column" in text

    df = store.load(shipped / "smoke")  # the stored table, one value off by one ulp
    df.loc[0, "rmse"] = np.nextafter(df.loc[0, "rmse"], math.inf)
    (shipped / "smoke" / store.RESULTS).unlink()
    store.write_part(shipped / "smoke", df.to_dict("records"))
    out = run(cfg_of(*tiny, f"store.root={scratch}", f"compare_with={shipped}",
                     "recompute=true"))
    text = capsys.readouterr().out
    assert out["reproduces"] is False
    assert f"rmse: 1 rows differ (e.g. {df.case_id[0]}" in text


def test_compare_with_the_store_being_written_is_refused():
    with pytest.raises(ValueError, match="compare_with=experiments is the store this run"):
        check(cfg_of("compare_with=experiments"))


def _stored_on(tmp_path, name, cls, df):
    d = tmp_path / name
    d.mkdir()
    store.write_part(d, df.to_dict("records"), None)
    store.compact(d)
    (d / store.MANIFEST).write_text(json.dumps(
        {"experiment": name, "runs": [{"run_id": "r", "machine": {"cpu_class": cls}}]}))
    return d


def test_a_kernel_table_stored_on_another_cpu_class_is_not_compared_and_says_so(tmp_path):
    here = cpu_class()
    now = table()
    other = table().assign(max_abs_err=[9.0, 9.0, 9.0])
    text, same = against(now, _stored_on(tmp_path, "kernel_table", "AuthenticAMD x", other))
    assert same and "measures a real kernel" in text and "AuthenticAMD x" in text
    assert here in text and "compared only on its CPU class" in text
    text, same = against(now, _stored_on(tmp_path, "kernel_audit", here, other))
    assert not same and "max_abs_err: 3 rows differ" in text  # same class: compared


def test_torch_s_own_columns_and_triton_rows_are_compared_on_their_cpu_class_only(tmp_path):
    now = table().assign(torch_err_dq=[1.0, 2.0, 3.0], backend=["emulate", "triton", "emulate"])
    stored = now.copy()
    stored["torch_err_dq"] = [1.5, 2.5, 3.5]  # torch's autograd on another CPU
    stored.loc[1, "max_abs_err"] = 7.0  # a Triton row: the interpreter's numpy matmul
    text, same = against(now, _stored_on(tmp_path, "bwd_sweep", "AuthenticAMD x", stored))
    assert same and "torch_err_dq, 1 Triton row(s)" in text
    stored.loc[0, "max_abs_err"] = 5.0  # an emulated row differs: always a difference
    text, same = against(now, _stored_on(tmp_path, "bwd_sweep2", "AuthenticAMD x", stored))
    assert not same and "max_abs_err: 1 rows differ" in text
    text, same = against(now, _stored_on(tmp_path, "bwd_sweep3", cpu_class(), now.assign(
        torch_err_dq=[1.5, 2.0, 3.0])))
    assert not same and "torch_err_dq: 1 rows differ" in text  # same class: compared
