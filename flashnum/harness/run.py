"""Run a named experiment: grid -> cases -> results table -> printed summary.

    python -m flashnum.run experiment=bf16_sweep
    python -m flashnum.run experiment=bf16_sweep n_jobs=1 progress=false
    python -m flashnum.run experiment=block_order recompute=true
    python -m flashnum.run precision=fp16 policy=lowp distribution=late_max shape.seq_len_q=512
    python -m flashnum.run experiment=bf16_sweep dry_run=true        # grid size only
    python -m flashnum.run -m experiment=bf16_sweep num_shards=4 'shard=range(4)' \\
        hydra/launcher=submitit_slurm hydra.launcher.partition=cpu   # see docs/experiments.md

Every case (flashnum.harness.grid) goes through one data flow, each arrow a plain function:

    inputs = distributions.make(case)                  seeded, bitwise reproducible
    truth  = reference(inputs rounded to the policy's input format)
             "certified" while batch*heads*Nq*Nk <= reference.certified_max_logits,
             else "fp64" with its a-priori err_bound, checked per row (ref_ok)
    result = flashnum.attention(inputs, case)          trace=True on the emulator
    row    = metrics.summary + bounds.bound + invariants (m_ok, l_ok) + timings

The reference sees the inputs as the kernel stores them (rounded to the policy's
`inputs` format), so the error is the algorithm's own, not the quantisation of Q,
K, V (as flashnum.inputs.search measures it). Cases sharing their inputs run together in
one task, so each reference is computed once; tasks run on every core, one torch
thread per process (so results do not depend on the number of workers). Each
finished task appends its rows to experiments/<name>/ (flashnum.store); a rerun
skips every case_id already there, `recompute=true` runs them again.

Invariants (m_ok, l_ok): flashnum.analysis.invariants. The config is composed once and
its grid expanded once (precheck); errors in it stop before any work with one line on
stderr and exit code 2 (flashnum.harness.cli). A multirun (-m) goes through hydra.main,
which composes each job. Beside this module: the scheduler (tasks, workers, Ctrl-C:
flashnum.harness.scheduler) and the printed summary (flashnum.harness.summary).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import hydra
import torch
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_original_cwd
from omegaconf import OmegaConf

from flashnum import store
from flashnum.analysis import bounds, metrics
from flashnum.analysis.invariants import invariants
from flashnum.api import attention
from flashnum.harness import cli, experiments, scheduler, summary
from flashnum.harness.cli import ConfigError
from flashnum.harness.config import check, register
from flashnum.harness.grid import CASE_FIELDS, CONF, Case, columns, expand, select
from flashnum.inputs.distributions import make
from flashnum.numerics.formats import Exact, Format
from flashnum.numerics.policy import SITES, make_policy
from flashnum.reference import reference
from flashnum.store import compare, manifest, owners
from flashnum.store.files import make_dir

PROG = "flashnum.run"
register()


# ---------------------------------------------------------------------------
# one case


def policy_of(case: Case, policy: str | None = None):
    """(precision for the engine, Policy) of a case; (mp, None) for the mp recurrence.

    make_policy names the policy (p<bits> and uniform included); the case's site
    overrides apply on top. `policy` replaces the case's policy (the naive baseline
    of naive_ratio); the naive baseline of a uniform case is standard attention with
    every site in the precision.
    """
    if case.precision == "mp":
        return "mp", None
    name = policy or case.policy
    if case.policy == "uniform" and name == "naive":
        pol = make_policy("uniform", case.precision).with_sites(name="naive",
                                                                 structure="standard")
    else:
        pol = make_policy(name, case.precision)
    if case.sites:
        pol = pol.with_sites(name=pol.name, **case.sites)
    return case.precision, pol


def plain_formats(pol) -> bool:
    """Whether every site is a plain rounding (formats.Format or exact), as bounds.bound
    assumes: not a block-scaled, statically scaled or truncating format."""
    return all(type(pol.fmt(s)) in (Format, Exact) for s in SITES)


def _num(x) -> float:
    if isinstance(x, torch.Tensor):
        x = x.detach().to(torch.float64)
        return float(x.max()) if x.numel() else math.nan
    return float(x) if x is not None else math.nan


def run_case(case: Case, inp, ref_of, experiment: str, opts: dict,
             memo: dict | None = None) -> dict:
    """One results row. `ref_of(q, k, v, causal, scale)` gives the (cached) reference.

    memo: a dict kept across the cases that share `inp` (run_group keeps one per input):
    the inputs rounded to each format, the naive baseline, and what the bound and the
    invariants compute from the rounded inputs alone (flashnum.analysis.memo) are computed
    once there: none of them depends on the tiling."""
    t0 = time.perf_counter()
    memo = {} if memo is None else memo
    causal = bool(case.causal or inp.causal)
    if case.causal and case.causal_align == "top_left":
        causal = "top_left"  # torch's is_causal (flashnum.numerics.tiling.visible)
    eng_prec, pol = policy_of(case)
    q, k, v = inp.q, inp.k, inp.v
    fin = pol.fmt("inputs") if pol is not None else None
    if pol is not None:  # what the kernel stores: the reference sees the same numbers
        if ("inputs", fin) not in memo:
            memo["inputs", fin] = (fin.round(q), fin.round(k), fin.round(v))
        q, k, v = memo["inputs", fin]
    ref = ref_of(q, k, v, causal, inp.scale)
    t1 = time.perf_counter()
    kw = dict(block_m=case.block_m, block_n=case.block_n, order=case.order,
              variant=case.variant_object, causal=causal, scale=inp.scale,
              rounding=case.rounding, seed=case.seed, backend=case.backend,
              mp_bits=case.mp_bits)
    split = dict(num_splits=case.num_splits, split_precision=case.split_precision)
    flash = pol is None or pol.structure == "flash"
    # a split run's trace steps are the splits, each with its own max: not monotone
    trace = opts["trace"] and case.backend == "emulate" and flash and case.num_splits == 1
    res = attention(q, k, v, precision=eng_prec, policy=pol if pol else "exact",
                    trace=trace, **kw, **split)
    attention_s = time.perf_counter() - t1
    naive_out = None
    if opts["naive_ratio"] and pol is not None and pol.structure == "flash":
        # standard attention has no tiles: one baseline serves every tiling of this input
        key = ("naive", fin, eng_prec, case.policy, case.policy_sites, causal, inp.scale,
               case.variant_object, case.rounding, case.seed)
        if key not in memo:
            naive = policy_of(case, "naive")[1]
            memo[key] = attention(q, k, v, precision=eng_prec, policy=naive,
                                  **{**kw, "backend": "emulate"}).out
        naive_out = memo[key]
    out_fmt = pol.out if pol is not None else "fp64"
    row = {"experiment": experiment, "case_id": case.case_id}
    row.update({f: getattr(case, f) for f in opts.get("columns", CASE_FIELDS)})
    row["causal"] = bool(causal)
    summ = metrics.summary(res.out, ref.out, out_fmt, naive_out=naive_out)
    row.update({key: _num(val) for key, val in summ.items()})
    row.update(bound=math.nan, bound_prob=math.nan, dominant_site=None, bound_terms=None)
    # the a-priori bound models one split (no stored partials, no merge) and plain
    # round-to-nearest formats: none for more splits, block-scaled, scaled or truncating
    # sites (a bound on them would be a wrong finite number)
    if opts["bound"] and pol is not None and case.num_splits == 1 and plain_formats(pol):
        row.update(_bound(case, pol, q, k, v, res, causal, inp.scale, opts,
                          memo.setdefault(("rows", fin), {})))
    # an infinite bound is vacuous: it neither held nor failed (bound_holds None)
    row["bound_finite"], row["bound_holds"] = bounds.verdict(row["bound"], row["max_abs_err"])
    err_bound = ref.err_bound[~ref.masked] if ref.masked.any() else ref.err_bound
    row["reference_method"] = ref.method
    row["ref_err_bound"] = _num(err_bound) if err_bound.numel() else 0.0
    row["ref_ok"] = bool(row["ref_err_bound"] <= opts["ok_ratio"] * row["max_abs_err"])
    m_ok, l_ok = invariants(case, pol, eng_prec, q, k, res, ref, causal, inp.scale,
                            rows=memo.setdefault(("rows", fin), {}))
    row.update(m_ok=m_ok, l_ok=l_ok)
    row["n_rescales_max"] = int(res.n_rescales.max()) if res.n_rescales.numel() else 0
    row["nonfinite_rows"] = int(res.nonfinite.sum()) if res.nonfinite is not None else 0
    row["attention_s"] = attention_s
    row["wall_s"] = time.perf_counter() - t0
    return row


def _bound(case: Case, pol, q, k, v, res, causal, scale, opts: dict, rows: dict) -> dict:
    """The row's bound columns (flashnum.analysis.bounds.bound), {} where none applies."""
    try:
        # q, k, v are already in the inputs format and the reference saw them:
        # the input rounding contributes nothing here, so the bound must not charge it
        b = bounds.bound(q, k, v, policy=pol.without("inputs"), block_n=case.block_n,
                         n_rescales=res.n_rescales, causal=causal, scale=scale,
                         variant=case.variant_object, rounding=case.rounding,
                         prob=opts["bound_prob"], rows=rows)
    except (ValueError, NotImplementedError):
        return {}  # no bound for this policy or variant: the row says NaN
    terms = {s: _num(t) for s, t in (b.get("terms") or {}).items()}
    return dict(bound=_num(b["bound"]), bound_prob=_num(b.get("bound_prob")),
                dominant_site=b.get("dominant_site"),
                bound_terms=json.dumps(terms, sort_keys=True))


def _inputs(case: Case, cache: dict):
    """(inputs, memo) of a case whose group shares `cache`: make() may place structure per
    key block, so it draws once per block_n; a draw equal to an earlier one (most
    distributions ignore block_n) takes that one's tensors and memo (run_case's)."""
    key = case.block_n
    if key not in cache:
        inp = make(case.distribution, batch=case.batch, heads=case.heads,
                   seq_len_q=case.seq_len_q, seq_len_k=case.seq_len_k,
                   head_dim=case.head_dim, seed=case.seed, block_n=case.block_n,
                   **case.params)
        cache[key] = next(((dataclasses.replace(inp, q=old.q, k=old.k, v=old.v), memo)
                           for old, memo in cache.values() if _same_draw(old, inp)),
                          (inp, {}))
    return cache[key]


def _same_draw(a, b) -> bool:
    return (a.causal == b.causal and a.scale == b.scale and a.q.shape == b.q.shape
            and a.k.shape == b.k.shape and a.v.shape == b.v.shape
            and all(torch.equal(x, y) for x, y in ((a.q, b.q), (a.k, b.k), (a.v, b.v))))


def _ref_of(opts: dict):
    """The reference of a case: certified while affordable, else fp64 (cached by input)."""
    def ref_of(q, k, v, causal, scale):
        n = q.numel() // q.shape[-1] * k.shape[-2]  # batch * heads * Nq * Nk logits
        method = "certified" if n <= opts["certified_max_logits"] else "fp64"
        # one process per core already: the reference must not start its own pool
        return reference(q, k, v, causal=causal, scale=scale, method=method,
                         bits=opts["bits"], workers=1)

    return ref_of


def claimed(cases: list, exp_dir: str, opts: dict, key=lambda c: c.case_id):
    """(the cases this process now owns, the case_ids another live run has in flight).

    Claims first, then the stored rows read again: a case another run finished since this
    run started is not computed twice (its claim is released only after its part is
    renamed into place); recompute=true computes them again all the same. Without a
    run_id (a run without a manifest) no claims.
    """
    if not opts.get("run_id"):
        return cases, []
    mine = set(owners.claim(exp_dir, [key(c) for c in cases], opts["run_id"]))
    busy = [key(c) for c in cases if key(c) not in mine]
    done = store.done_ids(exp_dir) if mine and not opts.get("recompute") else set()
    owners.release(exp_dir, mine & done)
    return [c for c in cases if key(c) in mine - done], busy


def run_group(cases: list[Case], experiment: str, exp_dir: str, opts: dict) -> dict:
    """Run cases that share their inputs; append their rows as one part. In a worker."""
    torch.set_num_threads(1)
    rows, failures, cache = [], [], {}
    t0 = time.perf_counter()
    todo, busy = claimed(cases, exp_dir, opts)
    try:
        for case in todo:
            try:
                inp, memo = _inputs(case, cache)
                rows.append(run_case(case, inp, _ref_of(opts), experiment, opts, memo))
            except Exception as e:  # one bad case must not sink the sweep: report it
                failures.append((case.case_id, f"{type(e).__name__}: {e}".splitlines()[0]))
        store.write_part(exp_dir, rows, opts.get("run_id"))
    finally:
        owners.release(exp_dir, [c.case_id for c in todo] if opts.get("run_id") else [])
    return dict(n=len(cases), rows=len(rows), failures=failures, skipped=busy,
                seconds=time.perf_counter() - t0)


def run_search_group(cases: list[Case], experiment: str, exp_dir: str, opts: dict) -> dict:
    """worst_case: one inputs.search.worst_case per case, then a full row for its inputs."""
    # imported here: the search pulls in scipy.stats and scipy.optimize (about 2 s of
    # start-up), which every other case and every shard's process can do without
    from flashnum.inputs.search import worst_case

    torch.set_num_threads(1)
    rows, failures = [], []
    t0 = time.perf_counter()
    todo, busy = claimed(cases, exp_dir, opts)
    for case in todo:
        try:
            search = dict(case.params["search"])
            eng_prec, pol = policy_of(case)
            res = worst_case(policy=case.policy, precision=case.precision,
                             seq_len=case.seq_len_q, head_dim=case.head_dim,
                             block_n=case.block_n, block_m=case.block_m, order=case.order,
                             seed=case.seed, variant=case.variant, batch=case.batch,
                             heads=case.heads, save=str(Path(exp_dir) / "inputs"), **search)
            inp = make("worst_case", path=res.path)
            row = run_case(case, inp, _ref_of(opts), experiment, opts)
            s = res.summary()
            row.update(search_error=s["error"], search_baseline=s["baseline"],
                       search_ratio=s["ratio"], search_ratio_v=s["ratio_v"],
                       search_family=s["family"], search_params=json.dumps(s["params"],
                       sort_keys=True, default=str), search_n_evals=s["n_evals"],
                       search_certified=_num(s["certified"]), search_s=s["elapsed_s"],
                       inputs_path=os.path.relpath(res.path, exp_dir))
            rows.append(row)
        except Exception as e:
            failures.append((case.case_id, f"{type(e).__name__}: {e}".splitlines()[0]))
    try:
        store.write_part(exp_dir, rows, opts.get("run_id"))
    finally:
        owners.release(exp_dir, [c.case_id for c in todo] if opts.get("run_id") else [])
    return dict(n=len(cases), rows=len(rows), failures=failures, skipped=busy,
                seconds=time.perf_counter() - t0)


# ---------------------------------------------------------------------------
# the sweep


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _manifest_path(exp_dir: Path, cfg) -> Path:
    if cfg.num_shards == 1:
        return exp_dir / store.MANIFEST
    return exp_dir / f"manifest.shard-{cfg.shard}-of-{cfg.num_shards}.json"


def _overrides(given: list | None) -> list:
    """The command's overrides for the manifest: given, or a multirun job's own."""
    if given is None:
        try:
            given = list(HydraConfig.get().overrides.task)
        except ValueError:  # no Hydra app running (run(cfg) called from Python)
            given = []
    # store.root is where the rows went (the manifest lies there), not how to compute them
    return [o for o in given if not o.startswith("store.root=")]


def root_dir(cfg, path: str | None = None) -> Path:
    """store.root (or `path`), relative paths taken from the directory the run started in."""
    root = Path(path or cfg.store.root)
    if not root.is_absolute():
        try:
            root = Path(get_original_cwd()) / root
        except ValueError:
            root = Path.cwd() / root
    return root


def run(cfg, cases: list[Case] | None = None, overrides: list[str] | None = None) -> dict:
    """Run (or resume) the experiment the config describes; returns counts and the table.

    cases: the config's grid when the caller has expanded it already (expand(cfg));
    overrides: the command line's, recorded in the manifest.
    """
    t_start = time.perf_counter()
    started = _now()
    cases_all = expand(cfg) if cases is None else cases
    cases = select(cases_all, cfg.shard, cfg.num_shards)
    if cfg.max_cases is not None:
        cases = cases[: cfg.max_cases]
    exp_dir = root_dir(cfg) / cfg.experiment
    for line in store.tidy(exp_dir):  # what a killed run left: its files, its record
        print(line, flush=True)
    done = set() if cfg.recompute else store.done_ids(exp_dir)
    todo = [c for c in cases if c.case_id not in done]
    n_workers = max(1, min(scheduler.n_workers(cfg), len(todo)))
    shard = f" (shard {cfg.shard} of {cfg.num_shards}: {len(cases)})" if cfg.num_shards > 1 else ""
    print(f"{cfg.experiment}: {len(cases_all)} cases in the grid{shard}; "
          f"{len(cases) - len(todo)} already in {exp_dir}; running {len(todo)} "
          f"on {n_workers} worker{'s' if n_workers > 1 else ''}", flush=True)
    counts = dict(grid=len(cases_all), selected=len(cases), done_before=len(cases) - len(todo),
                  run=0, failed=0)
    if cfg.dry_run:
        return dict(counts=counts, cases=cases)
    mpath = _manifest_path(exp_dir, cfg)
    make_dir(exp_dir)  # a folder that cannot be made (store.root=/proc/self) is one line
    # a record only for a run that computes: one that finds every case stored (or whose
    # every case fails) leaves the manifest as it was
    rec = manifest.record("flashnum.run", _overrides(overrides), shard=cfg.shard,
                          num_shards=cfg.num_shards, n_workers=n_workers, start_time=started,
                          counts=counts, config=OmegaConf.to_container(cfg, resolve=True)
                          ) if todo else None
    failures, skipped = [], []
    with store.running(exp_dir, rec["run_id"] if rec else None):
        if rec:
            manifest.begin(mpath, cfg.experiment, rec)
        store.write_grid(exp_dir, [c.case_id for c in cases_all])
        opts = dict(trace=cfg.checks.trace, naive_ratio=cfg.checks.naive_ratio,
                    bound=cfg.checks.bound, bound_prob=cfg.checks.bound_prob,
                    certified_max_logits=cfg.reference.certified_max_logits,
                    bits=cfg.reference.bits, ok_ratio=cfg.reference.ok_ratio,
                    columns=columns(cases_all), run_id=rec["run_id"] if rec else None,
                    recompute=cfg.recompute)
        tasks = [(run_search_group if t[0].is_search else run_group, t)
                 for t in scheduler.tasks_of(todo, n_workers)]
        out = scheduler.execute(tasks, (cfg.experiment, str(exp_dir), opts), n_workers,
                                cfg.progress)
        failures, skipped = out["failures"], out["skipped"]
        counts.update(run=out["rows"], failed=len(failures), in_flight_elsewhere=len(skipped))
        wall = time.perf_counter() - t_start
        if rec:  # completed before the compaction: a kill there leaves a true record
            rec.update(wall_s=wall, counts=counts)
            manifest.finish(mpath, cfg.experiment, rec, wrote_rows=counts["run"] > 0)
    if skipped:
        print(f"{len(skipped)} cases were in flight in another run and left to it",
              flush=True)
    if cfg.num_shards == 1:  # shards leave their parts: one compaction, after all of them
        try:
            store.compact(exp_dir)
        except store.StoreFull as e:
            print(f"{PROG}: warning: {e}", file=sys.stderr, flush=True)
        except OSError as e:
            if e.errno not in cli.WRITE_ERRORS:
                raise
            print(f"{PROG}: warning: not compacted ({e.strerror}: {e.filename}); the rows "
                  f"stay in parts/", file=sys.stderr, flush=True)
    ids = {c.case_id for c in cases}
    df = store.load(exp_dir) if store._files(exp_dir) else None
    df = df[df["case_id"].isin(ids)].reset_index(drop=True) if df is not None else None
    print(summary.summary(df, cfg, counts, wall, n_workers, failures), flush=True)
    result = dict(counts=counts, table=df, failures=failures, wall_s=wall)
    if cfg.compare_with:  # the rows computed now against the stored ones
        now_ids = {c.case_id for c in todo} - {cid for cid, _ in failures}
        now = df[df["case_id"].isin(now_ids)] if df is not None else None
        text, result["reproduces"] = compare.against(
            now, root_dir(cfg, cfg.compare_with) / cfg.experiment)
        print(text, flush=True)
    return result


# ---------------------------------------------------------------------------
# the command line: check everything first, compose once, expand once


def precheck(overrides: list[str], dirs=()):
    """Compose conf/ with the overrides and check it; ConfigError(one line) when bad.

    dirs: the user's config folders (--config-dir, hydra.searchpath), searched as Hydra's
    search path. A multirun's sweeps are cut to their first values (each job is checked
    again). Returns (cfg, cases): the config composed once and its grid expanded once.
    """
    overrides = cli.first_values(overrides)
    if dirs:
        overrides = [o for o in overrides if not o.startswith("hydra.searchpath=")]
        overrides.append(f"hydra.searchpath=[{','.join(f'file://{d}' for d in dirs)}]")
    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3",
                                   job_name="flashnum.run"):
            cfg = compose("config", overrides=overrides)
    except Exception as e:
        raise ConfigError(cli.explain(e)) from None
    named(cfg, choice_of(overrides))
    return cfg, _checked(cfg)


def named(cfg, choice: str | None) -> None:
    """The table's name: name= when given, else the experiment's file name (a renamed copy
    of a shipped experiment writes its own table), else single."""
    cfg.experiment = cfg.get("name") or choice or cfg.experiment


def choice_of(overrides: list[str]) -> str | None:
    """The experiment=NAME of the overrides (the last one), or None."""
    names = [o.split("=", 1)[1] for o in overrides if o.startswith("experiment=")]
    return names[-1] if names else None


def user_dirs(args) -> list[str]:
    """The user's config folders, absolute: --config-dir and hydra.searchpath's file:// ones."""
    dirs = [args.config_dir] if args.config_dir else []
    for o in args.overrides:
        if o.startswith("hydra.searchpath="):
            items = o.split("=", 1)[1].strip("[]")
            dirs += [i.strip().removeprefix("file://") for i in items.split(",")
                     if i.strip() and "://" not in i.strip().removeprefix("file://")]
    return [str(Path(d).resolve()) for d in dirs]


def _checked(cfg) -> list[Case]:
    """check(cfg) and its grid, or ConfigError with the first line of what is wrong."""
    try:
        check(cfg)
        return expand(cfg)
    except ValueError as e:
        raise ConfigError(str(e).splitlines()[0]) from None


def _go(cfg, cases, overrides) -> dict:
    try:
        with cli.sigterm_stops():
            return run(cfg, cases, overrides)
    except KeyboardInterrupt as e:
        cli.stopped(PROG, e, "finished cases are stored; run the same command to resume")
    except store.StoreError as e:
        cli.store_failed(PROG, e)
    except OSError as e:
        if e.errno not in cli.WRITE_ERRORS:
            raise
        cli.store_failed(PROG, e)


@hydra.main(version_base="1.3", config_path=str(CONF), config_name="config")
def _hydra_main(cfg) -> None:
    """One job of a multirun (Hydra composes each job's config)."""
    try:
        named(cfg, HydraConfig.get().runtime.choices.get("experiment"))
        cases = _checked(cfg)
    except ConfigError as e:
        cli.fail(PROG, str(e))
    _go(cfg, cases, None)


def compared(name: str, overrides: list[str], runner) -> int:
    """runner(overrides) for a kind whose runner has no `compare_with=` (flashnum/run.py
    routes them): a table, head statistics, a reproduction, an audit or the attribution
    table. With compare_with=ROOT,
    every row of the run's store (store.root=, experiments by default) is then compared
    with ROOT/name by flashnum.store.compare, as the sweeps do; the exit status is then
    the comparison's: 1 if any non-timing column differs."""
    other = [o.split("=", 1)[1] for o in overrides if o.startswith("compare_with=")]
    rest = [o for o in overrides if not o.startswith("compare_with=")]
    if not other:
        return runner(rest)
    root = Path(next((o.split("=", 1)[1] for o in reversed(rest)
                      if o.startswith("store.root=")), "experiments"))
    if root.resolve() == Path(other[-1]).resolve():
        cli.fail(PROG, f"compare_with={other[-1]} is the store this run writes to; "
                       "give another store.root=")
    code = runner(rest)
    if code not in (0, 1):  # stopped (bad input): nothing to compare
        return code
    # exit 1 from an audit means a kernel broke a rule, not that the run failed; with
    # compare_with= the question is whether the table reproduces, so its answer decides
    try:
        now = store.load(root / name)
    except FileNotFoundError:
        now = None
    text, same = compare.against(now, Path(other[-1]) / name)
    print(text, flush=True)
    return 0 if same else 1


def main(argv: list[str] | None = None) -> int:
    """python -m flashnum.run [key=value ...] for a forward sweep: one run composes conf/
    once and runs it; -m (multirun) and Hydra's own flags (--help, --cfg, --info) go
    through hydra.main. flashnum/run.py routes every other kind to its runner first."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = cli.hydra_args(argv)
    dirs = user_dirs(args)
    choice = choice_of(args.overrides)
    if choice is not None:
        for c in choice.split(","):
            try:
                exp = experiments.find(c, dirs)
            except ValueError as e:
                cli.fail(PROG, str(e))
            if exp is None:
                cli.fail(PROG, experiments.unknown(c, experiments.names(dirs)))
            if exp.kind != "forward":
                cli.fail(PROG, f"experiment {c} is kind {exp.kind}; valid here: forward "
                               f"(python -m flashnum.run experiment={c} routes it)")
    if args.help or args.hydra_help or args.info or args.shell_completion or args.cfg:
        _hydra_main()
        return 0
    try:
        cfg, cases = precheck(args.overrides, dirs)
        store.check_root(root_dir(cfg))
    except (ConfigError, store.StoreError) as e:
        cli.fail(PROG, str(e))
    if args.multirun:
        _hydra_main()
        return 0
    task = [o for o in args.overrides if not o.lstrip("+~").startswith("hydra")]
    result = _go(cfg, cases, task)
    return 1 if result.get("failures") or result.get("reproduces") is False else 0


if __name__ == "__main__":  # an alias of python -m flashnum.run, the router of every kind
    cli.alias(lambda argv: argv)
