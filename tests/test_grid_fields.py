"""Case fields added after tables were stored (num_splits, split_precision, causal_align,
variant_params) leave every stored case_id as it was, and split-KV decoding runs through
the normal harness."""

import hashlib
import json
import math
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from flashnum import store
from flashnum.harness.config import check
from flashnum.harness.grid import CASE_FIELDS, CONF, OPTIONAL, columns, expand
from flashnum.harness.run import run

REPO = Path(__file__).resolve().parents[1]
STORED = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")
                if not p.stem.startswith("bwd_") and (REPO / "experiments" / p.stem).is_dir())


def cfg_of(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def old_case_id(case) -> str:
    """The case_id as computed before the optional fields existed (an independent copy)."""
    d = {k: v for k, v in asdict(case).items()
         if k not in ("num_splits", "split_precision", "causal_align", "variant_params")}
    text = json.dumps(d, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@pytest.mark.parametrize("name", STORED)
def test_every_stored_row_of_a_shipped_experiment_keeps_its_case_id(name):
    stored = set(store.load(REPO / "experiments" / name).case_id)
    cases = expand(cfg_of(f"experiment={name}"))
    ids = {c.case_id for c in cases if c.num_splits == 1}
    assert stored <= {c.case_id for c in cases}
    if name != "splitkv_decode":
        assert stored == ids  # the grid is exactly what is stored, every id unchanged
        assert ids == {old_case_id(c) for c in cases}


def test_stored_experiments_exist_to_check():
    assert {"bf16_sweep", "fp16_sweep", "block_order", "precision_bits"} <= set(STORED)


def test_a_field_at_its_default_is_left_out_of_the_hash_and_in_it_otherwise():
    case = expand(cfg_of("experiment=smoke"))[0]
    assert case.num_splits == OPTIONAL["num_splits"] and case.case_id == old_case_id(case)
    split = replace(case, num_splits=8)
    assert split.case_id != case.case_id
    assert replace(split, split_precision="bf16").case_id != split.case_id


def test_split_precision_is_inert_with_one_split_and_makes_no_new_case():
    cases = expand(cfg_of("grid=[{num_splits:[1,4],split_precision:[fp32,bf16]}]"))
    assert sorted((c.num_splits, c.split_precision) for c in cases) == [
        (1, "fp32"), (4, "bf16"), (4, "fp32")]


def test_results_carry_the_optional_columns_only_where_the_grid_sets_them():
    assert columns(expand(cfg_of("experiment=bf16_sweep"))) == CASE_FIELDS
    cols = columns(expand(cfg_of("experiment=splitkv_decode")))
    assert cols == CASE_FIELDS + ("num_splits", "split_precision")


@pytest.mark.parametrize("override, named", [
    ("num_splits=0", "num_splits"), ("split_precision=fp7", "split_precision"),
    ("grid=[{num_splits:[2,-1]}]", "num_splits")])
def test_a_bad_split_setting_is_one_line_naming_it(override, named):
    cfg = cfg_of(override)
    with pytest.raises(ValueError, match=named) as e:
        check(cfg)
        expand(cfg)
    assert "\n" not in str(e.value)


def test_a_split_kv_grid_runs_through_the_harness_with_its_invariants(tmp_path):
    cfg = cfg_of("experiment=splitkv_decode", f"store.root={tmp_path}", "progress=false",
                 "n_jobs=1", "grid=[{seq_len_q:[4],seq_len_k:[1024],num_splits:[1,3,16],"
                 "split_precision:[fp32,bf16]}]")
    out = run(cfg)
    df = out["table"].set_index(["num_splits", "split_precision"]).sort_index()
    assert out["counts"]["failed"] == 0 and len(df) == 5
    assert df.m_ok.all() and df.l_ok.all() and df.ref_ok.all()
    # the bound models one split: finite and held there, not given for more
    one = df.loc[(1, "fp32")]
    assert math.isfinite(one.bound) and one.max_abs_err <= one.bound
    assert df.drop(index=(1, "fp32")).bound.isna().all()
    # bf16 partials cost more than fp32 ones at 16 splits (the partials' rounding,
    # 2^-9 against 2^-24 relative, sits above the bf16 P V products' own error)
    assert df.loc[(16, "bf16")].max_abs_err > df.loc[(16, "fp32")].max_abs_err
    # one split through the harness is the plain engine: the same row as without the field
    plain = run(cfg_of("experiment=splitkv_decode", f"store.root={tmp_path / 'p'}",
                       "progress=false", "n_jobs=1",
                       "grid=[{seq_len_q:[4],seq_len_k:[1024]}]"))["table"].iloc[0]
    assert plain.max_abs_err == one.max_abs_err and "num_splits" not in plain.index


def test_a_block_scaled_or_truncating_site_gets_no_bound_rather_than_a_wrong_one(tmp_path):
    cfg = cfg_of("experiment=block_scaled", f"store.root={tmp_path}", "progress=false",
                 "n_jobs=1", "shape.seq_len_k=128", "shape.heads=1",
                 "grid=[{policy_sites:[{p_cast: mxfp4, out: fp64},{pv_acc: fp22},"
                 "{p_cast: 'fp8_e4m3*256'},{p_cast: fp8_e4m3}]}]")
    df = run(cfg)["table"].set_index("policy_sites")
    assert len(df) == 4 and df.m_ok.all() and df.l_ok.all()
    assert df.loc[json.dumps({"p_cast": "fp8_e4m3"}, separators=(",", ":"))].bound_holds
    assert df.bound.isna().sum() == 3
