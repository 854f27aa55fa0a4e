"""The runner: every shipped experiment composes, a run is resumable and reproducible,
bad configs stop with one line, the shards and the SLURM launcher config compose."""

import hashlib
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir

import flashnum
from flashnum import store
from flashnum.analysis.invariants import invariants
from flashnum.engine.variants import FA2, Exp2
from flashnum.harness.config import check
from flashnum.harness.grid import CASE_FIELDS, CONF, columns, expand, in_shard
from flashnum.harness.run import ConfigError, policy_of, precheck, run
from flashnum.harness.summary import growth
from flashnum.inputs.distributions import make
from flashnum.numerics.policy import PRODUCT_SITES, SITES, Policy, make_policy
from flashnum.store import manifest

REPO = Path(__file__).resolve().parents[1]
# the forward runner's experiments; bwd_* are the backward runner's (flashnum.harness.backward)
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")
                     if not p.stem.startswith("bwd_"))
TIMINGS = ["wall_s", "attention_s"]
# a small grid for the runs below: 2 inputs x 2 N x 2 seeds x 2 policies x 2 precisions
TINY = ["experiment=smoke", "grid.0.seed=[0,1]", "progress=false"]


def cfg_of(*overrides, hydra=False):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra)


def cli(*args, root, timeout=240, **kw):
    """python -m flashnum.run ARGS, results under root; returns the CompletedProcess/Popen."""
    cmd = [sys.executable, "-m", "flashnum.run", *args, f"store.root={root}",
           f"hydra.run.dir={root}/hydra", f"hydra.sweep.dir={root}/multirun"]
    if kw.pop("background", False):
        return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def results(root, name="smoke"):
    return store.load(Path(root) / name).drop(columns=TIMINGS)


# ---------------------------------------------------------------------------
# configs


def test_every_experiment_the_issue_names_is_shipped():
    named = {"bf16_sweep", "fp16_sweep", "fp32_sweep", "block_order", "block_size",
             "seqlen_growth", "precision_bits", "kernel_vs_emulator", "worst_case"}
    assert named <= set(EXPERIMENTS)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_composes_validates_and_expands(name):
    cfg = cfg_of(f"experiment={name}")
    check(cfg)
    cases = expand(cfg)
    assert cfg.experiment == name
    assert len(cases) >= 1
    assert len({c.case_id for c in cases}) == len(cases)  # each case once


def test_bf16_sweep_is_the_grid_the_issue_asks_for():
    cases = expand(cfg_of("experiment=bf16_sweep"))
    df = pd.DataFrame([asdict(c) for c in cases])
    assert len(df) >= 1000
    assert df.seq_len_k.max() == 8192
    assert set(df.precision) == {"bf16"}
    assert set(df.policy) == {"fa2", "naive", "lowp"}
    assert set(df.block_n) >= {16, 32, 64, 128}
    assert set(df.order) == {"forward", "reverse", "random", "max_ascending", "max_descending"}
    assert df.distribution.nunique() >= 8
    assert df.seed.nunique() >= 2


def test_case_id_is_sha256_of_the_canonical_json_of_the_case():
    case = expand(cfg_of("experiment=smoke"))[0]
    # fields added later (num_splits, split_precision, causal_align, variant_params) enter
    # only away from their defaults
    d = {k: v for k, v in asdict(case).items()
         if k not in ("num_splits", "split_precision", "causal_align", "variant_params")}
    text = json.dumps(d, sort_keys=True, separators=(",", ":"))
    assert case.case_id == hashlib.sha256(text.encode()).hexdigest()[:16]
    shuffled = type(case)(**dict(reversed(list(asdict(case).items()))))
    assert shuffled.case_id == case.case_id
    assert replace(case, seed=case.seed + 1).case_id != case.case_id


def test_inert_axes_do_not_make_new_cases():
    # standard attention has no tiles, tau matters only for lazy, mp has no policy
    grid = ("grid=[{policy:[naive],block_n:[16,32,64],order:[forward,reverse]},"
            "{variant:[fa2],tau:[2.0,8.0]},{precision:[mp],policy:[fa2,lowp],seq_len_q:[8]}]")
    cases = expand(cfg_of(grid))
    assert len(cases) == 3


def test_shards_split_the_grid_by_case_hash_into_disjoint_parts():
    ids = [c.case_id for c in expand(cfg_of("experiment=bf16_sweep"))]
    sizes = [sum(in_shard(i, s, 4) for i in ids) for s in range(4)]
    assert sum(sizes) == len(ids)
    assert min(sizes) > 0.2 * len(ids)  # a hash spreads the cases (expected 0.25 each)


@pytest.mark.parametrize("override, bad, valid", [
    ("precision=fp17", "'fp17'", "bf16, fp16"),
    ("tiling.block_n=0", "got 0", "positive integer"),
    ("tiling.block_n=abc", "'abc'", "integer"),
    ("distribution=nope", "'nope'", "gaussian"),
    ("experiment=nope", "'nope'", "bf16_sweep"),
    ("grid=[{distribution:[nope]}]", "'nope'", "late_max"),
    ("grid=[{colour:[red]}]", "'colour'", "block_n"),
    ("tiling.order=sideways", "'sideways'", "max_descending"),
    ("+policy.sites.p_cast=fp9", "'fp9'", "fp8_e4m3"),
    ("shape.colour=1", "'shape.colour'", "seq_len_q"),
])
def test_a_bad_config_is_one_line_naming_the_value_and_the_choices(override, bad, valid):
    with pytest.raises(ConfigError) as e:
        precheck([override])
    msg = str(e.value)
    assert "\n" not in msg and bad in msg and valid in msg


def test_the_command_line_stops_a_bad_config_with_exit_code_2_and_one_line(tmp_path):
    p = cli("precision=fp17", root=tmp_path, timeout=120)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0, p.stderr
    assert "unknown precision 'fp17'; valid:" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "single").exists()  # stopped before any work


ENTRY_POINTS = {  # module -> (a key it has, a bad value for it, the type it wants)
    "run": ("seed", "abc", "integer"),
    "reproduce": ("seed", "abc", "integer"),
    "worst_case": ("budget", "abc", "float"),
    "attribute": ("seq_len", "abc", "integer"),
    "figures": ("store.root", "[1,2]", "string"),
    "stored": ("compact", "maybe", "boolean"),
}


def _main_of(module):
    return importlib.import_module(f"flashnum.{module}").main


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_every_entry_point_stops_an_unknown_key_or_bad_value_with_one_line_and_status_2(
        module, capsys):
    key, bad, want = ENTRY_POINTS[module]
    for argv, says in ((["colour=red"], "unknown key 'colour'; valid: "),
                       ([f"{key}={bad}"], f"for {key}: expected {want}")):
        with pytest.raises(SystemExit) as e:
            _main_of(module)(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2, (module, argv, err)
        assert err.startswith(f"flashnum.{module}: error: ") and err.count("\n") == 1, err
        assert says in err, err


@pytest.mark.parametrize("module", [m for m in ENTRY_POINTS if m != "run"])
def test_every_entry_point_lists_its_keys_on_help(module, capsys):
    with pytest.raises(SystemExit) as e:
        _main_of(module)(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "key=value" in out and "store={'root': 'experiments'}" in out


def test_slurm_launcher_configs_compose_with_a_sharded_experiment():
    # hydra-submitit-launcher 1.2.0 + hydra-core 1.3: the plugin's own structured config
    # composes; ours (slurm.yaml) extends it with keys its 1.2.0 schema has
    for launcher in ("submitit_slurm", "slurm"):
        cfg = cfg_of("experiment=bf16_sweep", f"hydra/launcher={launcher}", "num_shards=16",
                     "shard=15", "hydra.launcher.partition=cpu", hydra=True)
        assert cfg.hydra.launcher._target_.endswith("submitit_launcher.SlurmLauncher")
        assert cfg.hydra.launcher.partition == "cpu" and cfg.shard == 15
    assert cfg.hydra.launcher.cpus_per_task == 8  # slurm.yaml's own setting
    cfg = cfg_of("hydra/launcher=joblib", hydra=True)
    assert cfg.hydra.launcher._target_.endswith("JoblibLauncher")


def test_a_same_named_launcher_yaml_is_what_breaks_submitit_1_2_0(tmp_path):
    # why conf/hydra/launcher/ has slurm.yaml and no submitit_slurm.yaml: Hydra 1.3
    # merges a yaml of that name into the plugin's schema, which lacks srun_args
    launcher = tmp_path / "hydra" / "launcher"
    launcher.mkdir(parents=True)
    (launcher / "submitit_slurm.yaml").write_text("timeout_min: 5\nsrun_args: [--exact]\n")
    with pytest.raises(Exception, match="submitit_slurm"):
        with pytest.warns(UserWarning):
            cfg_of(f"hydra.searchpath=[file://{tmp_path}]", "hydra/launcher=submitit_slurm",
                   hydra=True)


# ---------------------------------------------------------------------------
# policy names: the config and flashnum.attention accept the same ones


def test_attention_accepts_uniform_and_p_bits_policies_as_the_config_names_them():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 96, 32, generator=g, dtype=torch.float64) for _ in range(3))
    fp32 = dict(qk_acc="fp32", s="fp32", m="fp32", p="fp32", pv_acc="fp32", l_acc="fp32",
                l="fp32", o="fp32", div="fp32")
    spelled = {  # written out site by site, as policy.py's docstring defines them
        # uniform: every site but the products (its narrow dots round each product already)
        ("uniform", "bf16"): Policy(**{s: "bf16" for s in SITES if s not in PRODUCT_SITES}),
        ("uniform", "p11"): Policy(**{s: "p11" for s in SITES if s not in PRODUCT_SITES}),
        ("fa2", "p11"): Policy(inputs="p11", p_cast="p11", out="p11", **fp32),
        ("lowp", "p7"): Policy(inputs="p7", qk_acc="fp32", s="p7", m="p7", p="p7",
                               p_cast="p7", pv_acc="fp32", l_acc="fp32", l="p7", o="p7",
                               div="p7", out="p7"),
    }
    for (name, prec), pol in spelled.items():
        got = flashnum.attention(q, k, v, precision=prec, policy=name, block_n=32).out
        want = flashnum.attention(q, k, v, precision="fp32", policy=pol, block_n=32).out
        assert torch.equal(got, want), (name, prec)
    with pytest.raises(ValueError, match=r"unknown precision 'p99'; valid: .*p<bits>"):
        flashnum.attention(q, k, v, precision="p99")
    with pytest.raises(ValueError, match=r"unknown policy 'flat'; valid: fa2, .*uniform"):
        flashnum.attention(q, k, v, policy="flat")


def test_every_policy_the_config_accepts_is_a_policy_make_policy_builds():
    for name in ("fa2", "naive", "lowp", "exact", "uniform"):
        cfg = cfg_of(f"policy={name}", "precision.name=p9")
        case = expand(cfg)[0]
        prec, pol = policy_of(case)
        assert pol == make_policy(name, "p9")
        assert prec == "p9"


# ---------------------------------------------------------------------------
# invariants


def _one_case(policy):
    cfg = cfg_of("experiment=smoke", f"grid=[{{policy:[{policy}],distribution:[late_max]}}]")
    case = expand(cfg)[0]
    inp = make(case.distribution, seq_len_q=case.seq_len_q, seq_len_k=case.seq_len_k,
               head_dim=case.head_dim, block_n=case.block_n, seed=case.seed, **case.params)
    prec, pol = policy_of(case)
    q, k, v = (pol.fmt("inputs").round(x) for x in (inp.q, inp.k, inp.v))
    res = flashnum.attention(q, k, v, precision=prec, policy=pol, block_m=case.block_m,
                             block_n=case.block_n, trace=True)
    ref = flashnum.reference(q, k, v)
    return case, pol, prec, q, k, res, ref


@pytest.mark.parametrize("policy", ["fa2", "naive"])
def test_invariants_hold_on_a_run_and_catch_a_wrong_max_or_normaliser(policy):
    case, pol, prec, q, k, res, ref = _one_case(policy)
    assert invariants(case, pol, prec, q, k, res, ref, False, None) == (True, True)
    m = res.m.clone()
    # outside the proven logit error (fp32 logits: ~1e-5 here; bf16 logits: ~0.1)
    m[..., 3] = m[..., 3] + (1e-3 if policy == "fa2" else 0.25)
    assert invariants(case, pol, prec, q, k, replace(res, m=m, trace=None), ref, False,
                      None)[0] is False
    l = res.l.clone()
    l[..., 0] = 0.0
    assert invariants(case, pol, prec, q, k, replace(res, l=l), ref, False, None)[1] is False


def test_a_trace_whose_max_decreases_fails_m_ok():
    case, pol, prec, q, k, res, ref = _one_case("fa2")
    tm = res.trace.m.clone()
    tm[..., -2, :] = tm[..., -1, :] + 1.0  # the max fell at the last step
    bad = replace(res, trace=replace(res.trace, m=tm))
    assert invariants(case, pol, prec, q, k, bad, ref, False, None)[0] is False


def test_growth_recovers_the_exponent_within_groups():
    rng = np.random.default_rng(0)
    rows = []
    for dist, level in (("a", 1e-3), ("b", 1e-1)):  # very different levels per group
        for n in (256, 1024, 4096):
            rows.append(dict(policy="fa2", distribution=dist, seq_len_k=n, block_n=64,
                             max_abs_err=level * n**0.5 * (1 + 1e-9 * rng.random())))
    df = pd.DataFrame(rows)
    slope, groups, points = growth(df, "seq_len_k")["fa2"]
    assert abs(slope - 0.5) < 1e-6 and groups == 2 and points == 6


# ---------------------------------------------------------------------------
# runs (subprocesses, as a user runs them)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("full")
    p = cli(*TINY, "n_jobs=2", root=root)
    assert p.returncode == 0, p.stderr[-3000:]
    return root, p.stdout


def test_a_run_writes_one_row_per_case_a_manifest_and_a_summary(full_run):
    root, out = full_run
    cases = expand(cfg_of(*TINY))
    df = store.load(root / "smoke")
    assert sorted(df.case_id) == sorted(c.case_id for c in cases)
    need = ["experiment", "case_id", "backend", "precision", "policy", "variant",
            "distribution", "dist_params", "seq_len_q", "seq_len_k", "head_dim", "block_m",
            "block_n", "order", "causal", "seed", "max_abs_err", "rmse", "max_rel_err",
            "max_ulp_err", "mean_signed_err", "bound", "reference_method", "m_ok", "l_ok",
            "wall_s", "bound_prob", "dominant_site", "naive_ratio", "ref_err_bound", "ref_ok"]
    assert set(need) <= set(df.columns)
    assert df.m_ok.all() and df.l_ok.all() and df.ref_ok.all()
    assert set(df.reference_method) == {"certified"}  # 32 x 64 logits: affordable
    assert (df.max_abs_err <= df.bound).all()
    assert not list((root / "smoke" / store.PARTS).glob("*.parquet"))  # compacted
    man = manifest.runs(root / "smoke" / store.MANIFEST)[-1]
    assert man["git"]["commit"] and man["end_time"] >= man["start_time"]
    for pkg in ("python", "torch", "triton", "mpmath", "python-flint"):
        assert pkg in man["versions"]
    assert man["config"]["experiment"] == "smoke" and man["counts"]["run"] == len(cases)
    assert f"== smoke: {len(cases)} cases in the grid" in out and "worst" in out
    assert "growth: error ~ N^slope_N" in out


def test_a_killed_run_resumes_to_the_same_table_with_nothing_lost_or_doubled(
        full_run, tmp_path, capsys):
    root, _ = full_run
    parts = tmp_path / "smoke" / store.PARTS
    p = cli(*TINY, "n_jobs=1", root=tmp_path, background=True)
    deadline = time.time() + 180
    while len(list(parts.glob("part-*.parquet"))) < 2 and p.poll() is None:
        assert time.time() < deadline
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)  # the whole group, mid-run
    p.wait()
    p.stdout.close()
    p.stderr.close()
    files = sorted(parts.glob("part-*.parquet"))
    assert len(files) >= 2
    killed = pd.concat([pd.read_parquet(f) for f in files])  # every part is whole
    assert not killed.case_id.duplicated().any()
    assert killed[["max_abs_err", "rmse", "m_ok"]].notna().all().all()
    assert len(killed) < len(expand(cfg_of(*TINY)))  # it was stopped before the end
    # resume: the same config (in-process here: the function the command line runs)
    out = run(cfg_of(*TINY, "n_jobs=1", f"store.root={tmp_path}"))
    assert out["counts"]["done_before"] == len(killed) and not out["failures"]
    assert f"{len(killed)} already in" in capsys.readouterr().out
    pd.testing.assert_frame_equal(results(tmp_path), results(root))  # timings aside
    # recompute=true runs finished cases again, replacing their rows, adding none
    before = store.load(tmp_path / "smoke")
    out = run(cfg_of(*TINY, "n_jobs=1", "recompute=true", "max_cases=3",
                     f"store.root={tmp_path}"))
    assert out["counts"]["run"] == 3
    after = store.load(tmp_path / "smoke")
    assert (after.wall_s != before.wall_s).sum() == 3
    pd.testing.assert_frame_equal(after.drop(columns=TIMINGS), before.drop(columns=TIMINGS))


@pytest.mark.slow
def test_a_multirun_over_shards_merges_into_the_unsharded_table(full_run, tmp_path):
    root, _ = full_run
    r = cli("-m", *TINY, "n_jobs=1", "num_shards=2", "shard=0,1", root=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    exp = tmp_path / "smoke"
    assert (exp / "manifest.shard-0-of-2.json").exists()
    assert (exp / "manifest.shard-1-of-2.json").exists()
    assert not (exp / store.RESULTS).exists()  # shards leave their parts to the reader
    pd.testing.assert_frame_equal(results(tmp_path), results(root))
    assert set(results(tmp_path).columns) >= set(CASE_FIELDS)


def test_a_variant_is_written_with_its_parameters_in_the_config_and_in_a_grid():
    # `variant: {name: lazy, tau: 4}` is the case `variant=lazy tau=4`: same case id
    long = expand(cfg_of("variant={name:lazy,tau:4.0}"))
    short = expand(cfg_of("variant=lazy", "tau=4.0"))
    assert [c.case_id for c in long] == [c.case_id for c in short]
    assert (long[0].variant, long[0].tau) == ("lazy", 4.0)
    grid = expand(cfg_of("+grid=[{variant:[{name:lazy,tau:2.0},{name:qiu_yao,beta:3.0},fa2]}]"))
    assert [(c.variant, c.tau, c.beta) for c in grid] == [
        ("lazy", 2.0, 2.0), ("qiu_yao", 8.0, 3.0), ("fa2", 8.0, 2.0)]
    with pytest.raises(ValueError, match="unknown parameter 'beta' of variant 'lazy'; "
                                         "valid: tau"):
        expand(cfg_of("variant={name:lazy,beta:4.0}"))


def test_a_variant_parameter_without_an_axis_of_its_own_is_swept_through_the_variant():
    # exp2_scale has no config key: it reaches the case, its id and the run through the
    # variant alone; at its default the case is the one without it (stored ids kept)
    plain_exp2 = expand(cfg_of("variant=exp2"))
    at_default = expand(cfg_of("variant={name:exp2,exp2_scale:once}"))
    twice = expand(cfg_of("variant={name:exp2,exp2_scale:twice}"))
    assert [c.case_id for c in at_default] == [c.case_id for c in plain_exp2]
    assert twice[0].case_id != plain_exp2[0].case_id
    assert twice[0].variant_object == Exp2(exp2_scale="twice")
    assert plain_exp2[0].variant_params == "{}" and "variant_params" not in columns(plain_exp2)
    assert "variant_params" in columns(twice)
    grid = expand(cfg_of("+grid=[{variant:[{name:exp2,exp2_scale:twice},fa2]}]"))
    assert [c.variant_object for c in grid] == [Exp2(exp2_scale="twice"), FA2()]
    with pytest.raises(ValueError, match="unknown exp2_scale 'thrice'; valid: once, twice"):
        expand(cfg_of("variant={name:exp2,exp2_scale:thrice}"))
