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
finished task appends its rows to experiments/<name>/ (flashnum.harness.store); a rerun
skips every case_id already there, `recompute=true` runs them again.

Invariants (m_ok, l_ok): flashnum.analysis.invariants.
Errors in the config stop before any work with one line on stderr and exit code 2.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import re
import sys
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor, as_completed
from datetime import datetime, timezone
from pathlib import Path

import hydra
import numpy as np
from omegaconf import OmegaConf

from flashnum.analysis.bounds import accounting, accounting_phrase
from flashnum.analysis.invariants import invariants
from flashnum.harness import manifest, store
from flashnum.harness.config import check, register
from flashnum.harness.grid import CASE_FIELDS, CONF, Case, expand, select
from flashnum.numerics.policy import make_policy

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


def _num(x) -> float:
    import torch

    if isinstance(x, torch.Tensor):
        x = x.detach().to(torch.float64)
        return float(x.max()) if x.numel() else math.nan
    return float(x) if x is not None else math.nan


def run_case(case: Case, inp, ref_of, experiment: str, opts: dict) -> dict:
    """One results row. `ref_of(q, k, v, causal, scale)` gives the (cached) reference."""
    import flashnum
    from flashnum.analysis import bounds, metrics

    t0 = time.perf_counter()
    causal = bool(case.causal or inp.causal)
    eng_prec, pol = policy_of(case)
    q, k, v = inp.q, inp.k, inp.v
    if pol is not None:  # what the kernel stores: the reference sees the same numbers
        fin = pol.fmt("inputs")
        q, k, v = fin.round(q), fin.round(k), fin.round(v)
    ref = ref_of(q, k, v, causal, inp.scale)
    t1 = time.perf_counter()
    kw = dict(block_m=case.block_m, block_n=case.block_n, order=case.order,
              variant=case.variant, causal=causal, scale=inp.scale, rounding=case.rounding,
              seed=case.seed, backend=case.backend, mp_bits=case.mp_bits, tau=case.tau,
              beta=case.beta)
    flash = pol is None or pol.structure == "flash"
    trace = opts["trace"] and case.backend == "emulate" and flash
    res = flashnum.attention(q, k, v, precision=eng_prec, policy=pol if pol else "exact",
                             trace=trace, **kw)
    attention_s = time.perf_counter() - t1
    naive_out = None
    if opts["naive_ratio"] and pol is not None and pol.structure == "flash":
        naive = policy_of(case, "naive")[1]
        naive_out = flashnum.attention(q, k, v, precision=eng_prec, policy=naive,
                                       **{**kw, "backend": "emulate"}).out
    out_fmt = pol.out if pol is not None else "fp64"
    row = {"experiment": experiment, "case_id": case.case_id}
    row.update({f: getattr(case, f) for f in CASE_FIELDS})
    row["causal"] = causal
    summ = metrics.summary(res.out, ref.out, out_fmt, naive_out=naive_out)
    row.update({key: _num(val) for key, val in summ.items()})
    row.update(bound=math.nan, bound_prob=math.nan, dominant_site=None, bound_terms=None)
    if opts["bound"] and pol is not None:
        try:
            # q, k, v are already in the inputs format and the reference saw them:
            # the input rounding contributes nothing here, so the bound must not charge it
            b = bounds.bound(q, k, v, policy=pol.without("inputs"), block_n=case.block_n,
                             n_rescales=res.n_rescales, causal=causal, scale=inp.scale,
                             variant=case.variant, rounding=case.rounding, tau=case.tau,
                             beta=case.beta, prob=opts["bound_prob"])
            terms = {s: _num(t) for s, t in (b.get("terms") or {}).items()}
            row.update(bound=_num(b["bound"]), bound_prob=_num(b.get("bound_prob")),
                       dominant_site=b.get("dominant_site"),
                       bound_terms=json.dumps(terms, sort_keys=True))
        except (ValueError, NotImplementedError):
            pass  # no bound for this policy or variant: the row says NaN
    # an infinite bound is vacuous: it neither held nor failed (bound_holds None)
    row["bound_finite"], row["bound_holds"] = bounds.verdict(row["bound"], row["max_abs_err"])
    err_bound = ref.err_bound[~ref.masked] if ref.masked.any() else ref.err_bound
    row["reference_method"] = ref.method
    row["ref_err_bound"] = _num(err_bound) if err_bound.numel() else 0.0
    row["ref_ok"] = bool(row["ref_err_bound"] <= opts["ok_ratio"] * row["max_abs_err"])
    m_ok, l_ok = invariants(case, pol, eng_prec, q, k, res, ref, causal, inp.scale,
                            opts.get("m_exact", True))
    row.update(m_ok=m_ok, l_ok=l_ok)
    row["n_rescales_max"] = int(res.n_rescales.max()) if res.n_rescales.numel() else 0
    row["nonfinite_rows"] = int(res.nonfinite.sum()) if res.nonfinite is not None else 0
    row["attention_s"] = attention_s
    row["wall_s"] = time.perf_counter() - t0
    return row


def _inputs(case: Case, cache: dict):
    from flashnum.inputs.distributions import make

    key = case.block_n  # make() may place structure per key block
    if key not in cache:
        cache[key] = make(case.distribution, batch=case.batch, heads=case.heads,
                          seq_len_q=case.seq_len_q, seq_len_k=case.seq_len_k,
                          head_dim=case.head_dim, seed=case.seed, block_n=case.block_n,
                          **case.params)
    return cache[key]


def _ref_of(opts: dict):
    """The reference of a case: certified while affordable, else fp64 (cached by input)."""
    from flashnum.reference import reference

    def ref_of(q, k, v, causal, scale):
        n = q.numel() // q.shape[-1] * k.shape[-2]  # batch * heads * Nq * Nk logits
        method = "certified" if n <= opts["certified_max_logits"] else "fp64"
        # one process per core already: the reference must not start its own pool
        return reference(q, k, v, causal=causal, scale=scale, method=method,
                         bits=opts["bits"], workers=1)

    return ref_of


def run_group(cases: list[Case], experiment: str, exp_dir: str, opts: dict) -> dict:
    """Run cases that share their inputs; append their rows as one part. In a worker."""
    import torch

    torch.set_num_threads(1)
    rows, failures, cache = [], [], {}
    t0 = time.perf_counter()
    for case in cases:
        try:
            rows.append(run_case(case, _inputs(case, cache), _ref_of(opts), experiment, opts))
        except Exception as e:  # one bad case must not sink the sweep: report it
            failures.append((case.case_id, f"{type(e).__name__}: {e}".splitlines()[0]))
    store.write_part(exp_dir, rows)
    return dict(n=len(cases), rows=len(rows), failures=failures,
                seconds=time.perf_counter() - t0)


def run_search_group(cases: list[Case], experiment: str, exp_dir: str, opts: dict) -> dict:
    """worst_case: one inputs.search.worst_case per case, then a full row for its inputs."""
    import torch

    from flashnum.inputs.distributions import make
    from flashnum.inputs.search import worst_case

    torch.set_num_threads(1)
    rows, failures = [], []
    t0 = time.perf_counter()
    for case in cases:
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
    store.write_part(exp_dir, rows)
    return dict(n=len(cases), rows=len(rows), failures=failures,
                seconds=time.perf_counter() - t0)


# ---------------------------------------------------------------------------
# the sweep


def _cost(case: Case) -> float:
    n = case.batch * case.heads * case.seq_len_q * case.seq_len_k * case.head_dim
    w = {"triton": 40.0, "mp": 2000.0}.get(case.backend, 1.0)
    w *= {"uniform": 20.0, "lowp": 2.0}.get(case.policy, 1.0)
    return n * w * (64.0 / case.block_n) ** 0.5


def tasks_of(cases: list[Case], n_workers: int) -> list[tuple]:
    """(function, cases) tasks: cases grouped by inputs, big groups split so that every
    worker has work, one task per search case; searches first, then largest first."""
    groups: dict = defaultdict(list)
    plain = [c for c in cases if not c.is_search]
    for c in plain:
        groups[c.input_key()].append(c)
    chunk = max(1, math.ceil(len(plain) / (3 * max(1, n_workers))))
    tasks = [g[i : i + chunk] for g in groups.values() for i in range(0, len(g), chunk)]
    tasks = sorted(tasks, key=lambda t: -sum(_cost(c) for c in t))
    return [(run_search_group, [c]) for c in cases if c.is_search] + [
        (run_group, t) for t in tasks]


def _n_workers(cfg) -> int:
    if cfg.n_jobs > 0:
        return cfg.n_jobs
    try:
        n = len(os.sched_getaffinity(0))  # honours SLURM's cpus_per_task
    except AttributeError:
        n = os.cpu_count() or 1
    try:
        from hydra.core.hydra_config import HydraConfig

        if "joblib" in str(HydraConfig.get().launcher.get("_target_", "")):
            return 1  # joblib already runs one job per core
    except (ValueError, AttributeError):
        pass
    return n


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _manifest_path(exp_dir: Path, cfg) -> Path:
    if cfg.num_shards == 1:
        return exp_dir / store.MANIFEST
    return exp_dir / f"manifest.shard-{cfg.shard}-of-{cfg.num_shards}.json"


def _overrides() -> list:
    try:
        from hydra.core.hydra_config import HydraConfig

        # store.root is where the rows went (the manifest lies there), not how to compute them
        return [o for o in HydraConfig.get().overrides.task if not o.startswith("store.root=")]
    except ValueError:
        return []


def root_dir(cfg) -> Path:
    root = Path(cfg.store.root)
    if not root.is_absolute():
        try:
            from hydra.utils import get_original_cwd

            root = Path(get_original_cwd()) / root
        except ValueError:
            root = Path.cwd() / root
    return root


def run(cfg) -> dict:
    """Run (or resume) the experiment the config describes; returns counts and the table."""
    t_start = time.perf_counter()
    started = _now()
    cases_all = expand(cfg)
    cases = select(cases_all, cfg.shard, cfg.num_shards)
    if cfg.max_cases is not None:
        cases = cases[: cfg.max_cases]
    exp_dir = root_dir(cfg) / cfg.experiment
    done = set() if cfg.recompute else store.done_ids(exp_dir)
    todo = [c for c in cases if c.case_id not in done]
    n_workers = max(1, min(_n_workers(cfg), len(todo)))
    shard = f" (shard {cfg.shard} of {cfg.num_shards}: {len(cases)})" if cfg.num_shards > 1 else ""
    print(f"{cfg.experiment}: {len(cases_all)} cases in the grid{shard}; "
          f"{len(cases) - len(todo)} already in {exp_dir}; running {len(todo)} "
          f"on {n_workers} worker{'s' if n_workers > 1 else ''}", flush=True)
    counts = dict(grid=len(cases_all), selected=len(cases), done_before=len(cases) - len(todo),
                  run=0, failed=0)
    if cfg.dry_run:
        return dict(counts=counts, cases=cases)
    mpath = _manifest_path(exp_dir, cfg)
    exp_dir.mkdir(parents=True, exist_ok=True)
    # a record only for a run that computes: one that finds every case stored (or whose
    # every case fails) leaves the manifest byte for byte as it was
    rec = manifest.record("flashnum.run", _overrides(), shard=cfg.shard,
                          num_shards=cfg.num_shards, n_workers=n_workers, start_time=started,
                          counts=counts, config=OmegaConf.to_container(cfg, resolve=True)
                          ) if todo else None
    prior = manifest.begin(mpath, cfg.experiment, rec) if rec else None
    store.write_grid(exp_dir, [c.case_id for c in cases_all])

    opts = dict(trace=cfg.checks.trace, naive_ratio=cfg.checks.naive_ratio, bound=cfg.checks.bound,
                bound_prob=cfg.checks.bound_prob, m_exact=cfg.checks.m_exact,
                certified_max_logits=cfg.reference.certified_max_logits, bits=cfg.reference.bits,
                ok_ratio=cfg.reference.ok_ratio)
    tasks = tasks_of(todo, n_workers)
    failures = _execute(tasks, cfg.experiment, str(exp_dir), opts, n_workers, cfg.progress)
    counts.update(run=len(todo) - len(failures), failed=len(failures))
    wall = time.perf_counter() - t_start
    if cfg.num_shards == 1:
        store.compact(exp_dir)  # shards leave their parts: one compaction, after all of them
    if rec:
        rec.update(wall_s=wall, counts=counts)
        manifest.finish(mpath, cfg.experiment, rec, prior, wrote_rows=counts["run"] > 0)
    ids = {c.case_id for c in cases}
    df = store.load(exp_dir, all_rows=True) if store._files(exp_dir) else None
    df = df[df["case_id"].isin(ids)].reset_index(drop=True) if df is not None else None
    print(summary(df, cfg, counts, wall, n_workers, failures), flush=True)
    return dict(counts=counts, table=df, failures=failures, wall_s=wall)


def _init_worker() -> None:
    import signal

    import torch

    torch.set_num_threads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle


def _execute(tasks, experiment, exp_dir, opts, n_workers, progress) -> list:
    from tqdm import tqdm

    total = sum(len(t) for _, t in tasks)
    failures: list = []
    # a terminal gets a live bar; a log file one line every 30 s
    bar = tqdm(total=total, unit="case", disable=not progress or total == 0, file=sys.stderr,
               dynamic_ncols=True, smoothing=0.05,
               mininterval=0.1 if sys.stderr.isatty() else 30.0)
    if n_workers <= 1:
        import torch

        n_threads = torch.get_num_threads()
        try:
            for fn, t in tasks:
                r = fn(t, experiment, exp_dir, opts)
                failures += r["failures"]
                bar.update(r["n"])
        finally:
            torch.set_num_threads(n_threads)
            bar.close()
        return failures
    # spawn, not fork: a forked torch may hang in its thread pool; children inherit the env
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(n_workers, mp_context=ctx, initializer=_init_worker)
    finished = False
    try:
        futures = [pool.submit(fn, t, experiment, exp_dir, opts) for fn, t in tasks]
        for f in as_completed(futures):
            r = f.result()
            failures += r["failures"]
            bar.update(r["n"])
            if failures:
                bar.set_postfix(failed=len(failures))
        finished = True
    finally:
        if not finished:
            # interrupted: stop the workers now (a part is written whole or not at all);
            # otherwise they would finish every queued task before the process can exit
            for proc in list(getattr(pool, "_processes", {}).values()):
                proc.terminate()
        pool.shutdown(wait=finished, cancel_futures=True)
        bar.close()
    return failures


# ---------------------------------------------------------------------------
# the summary


def growth(df, x: str, y: str = "max_abs_err", by: str = "policy") -> dict:
    """Fitted exponent of y ~ x^slope per `by`: log-log least squares within groups.

    Rows are grouped by every case field except x (so a group differs only in x:
    same distribution, seed, tiling, ...); the slope pools the within-group
    variation (a fixed-effects fit), so axes that differ between slices do not
    leak into it. Returns {value of by: (slope, number of groups used, points)}.
    """
    out = {}
    if df is None or not len(df) or x not in df or y not in df:
        return out
    skip = {x, "seq_len_q"} if x == "seq_len_k" else {x}
    keys = [f for f in CASE_FIELDS if f not in skip and f != by and f in df]
    for val, sub in df.groupby(by, sort=True):
        sub = sub[(sub[y] > 0) & np.isfinite(sub[y])]
        if not len(sub):
            continue
        lx, ly = np.log(sub[x].astype(float)), np.log(sub[y].astype(float))
        g = sub[keys].astype(str).agg("|".join, axis=1) if keys else np.zeros(len(sub))
        n_x = lx.groupby(g).transform("nunique")
        use = n_x > 1
        if not use.any():
            continue
        dx = (lx - lx.groupby(g).transform("mean"))[use]
        dy = (ly - ly.groupby(g).transform("mean"))[use]
        den = float((dx * dx).sum())
        if den > 0:
            out[val] = (float((dx * dy).sum() / den), int(g[use].nunique()), int(use.sum()))
    return out


def summary(df, cfg, counts, wall, n_workers, failures) -> str:
    lines = [f"== {cfg.experiment}: {counts['grid']} cases in the grid, {counts['selected']} "
             f"selected, {counts['done_before']} already done, {counts['run']} run now, "
             f"{counts['failed']} failed; wall {wall:.1f} s on {n_workers} worker(s)"]
    for cid, msg in failures[:5]:
        lines.append(f"  failed {cid}: {msg}")
    if df is None or not len(df):
        return "\n".join(lines)
    n = len(df)
    meth = df["reference_method"].value_counts().to_dict()
    lines.append(f"reference: {', '.join(f'{k} {v}' for k, v in sorted(meth.items()))} rows; "
                 f"err_bound <= {cfg.reference.ok_ratio:g} x the error in "
                 f"{int(df['ref_ok'].sum())}/{n} rows (max err_bound "
                 f"{df['ref_err_bound'].max():.2g}; max err_bound / error "
                 f"{(df['ref_err_bound'] / df['max_abs_err']).replace(np.inf, np.nan).max():.2g})")
    bad = df[~df["ref_ok"].astype(bool)]
    if len(bad):
        lines.append(f"  FLAG: {len(bad)} rows whose reference is not far below their error "
                     f"(e.g. {bad['case_id'].iloc[0]}): read their errors as upper bounds only")
    acc = accounting(df["bound"], df["bound_holds"])
    lines.append(f"invariants: m_ok {int(df['m_ok'].sum())}/{n}, l_ok {int(df['l_ok'].sum())}/{n};"
                 f" a-priori bound {accounting_phrase(acc)} rows")
    cols = [c for c in ("case_id", "precision", "policy", "distribution", "seq_len_k", "block_n",
                        "order", "variant", "backend", "max_abs_err", "max_ulp_err", "bound")
            if c in df and df[c].nunique() > 0]
    worst = df.sort_values("max_abs_err", ascending=False).head(cfg.worst)
    lines.append(f"worst {len(worst)} cases by max_abs_err:")
    lines.append(_table(worst[cols]))
    rows = []
    for y in ("max_abs_err", "normwise_rel_err"):
        gn, gb = growth(df, "seq_len_k", y), growth(df, "block_n", y)
        for pol in sorted(set(gn) | set(gb)):
            a, b = gn.get(pol), gb.get(pol)
            rows.append(dict(error=y, policy=pol,
                             slope_N=f"{a[0]:+.2f} ({a[1]} groups)" if a else "-",
                             slope_block_n=f"{b[0]:+.2f} ({b[1]} groups)" if b else "-"))
    if rows:
        import pandas as pd

        lines.append("growth: error ~ N^slope_N and ~ block_n^slope_block_n (log-log least "
                     "squares within groups differing only in N = seq_len_k, or in block_n)")
        lines.append(_table(pd.DataFrame(rows)))
    return "\n".join(lines)


def _table(df) -> str:
    def fmt(x):
        if isinstance(x, float):
            return f"{x:.3g}"
        return str(x)

    return df.to_string(index=False, formatters={c: fmt for c in df.columns})


# ---------------------------------------------------------------------------
# the command line: check everything first, then hand over to Hydra


class ConfigError(Exception):
    pass


def _options(group: str) -> list[str]:
    from hydra.core.global_hydra import GlobalHydra

    try:
        opts = list(GlobalHydra.instance().config_loader().get_group_options(group))
    except Exception:
        opts = []
    d = CONF / group
    opts += [p.stem for p in d.glob("*.yaml")] if d.is_dir() else []
    if group == "distribution":
        from flashnum.inputs.distributions import DISTRIBUTIONS

        opts += list(DISTRIBUTIONS)
    return sorted(set(opts))


def _schema_keys(key: str) -> list[str]:
    from flashnum.harness.config import Config

    node = OmegaConf.structured(Config)
    parent = key.rsplit(".", 1)[0] if "." in key else ""
    sub = OmegaConf.select(node, parent) if parent else node
    return sorted(sub.keys()) if hasattr(sub, "keys") else []


def explain(exc: BaseException) -> str:
    """One line for a Hydra / OmegaConf / validation error: the bad value and the choices."""
    msgs = []
    e = exc
    while e is not None and len(msgs) < 4:
        msgs.append(str(e))
        e = e.__cause__ or e.__context__
    text = "\n".join(msgs)
    m = re.search(r"Could not (?:find|load) '([^']+)'", text)
    if m:
        group, _, name = m.group(1).rpartition("/")
        if group:
            what = group.replace("hydra/", "hydra/")
            return f"unknown {what} {name!r}; valid: {', '.join(_options(group))}"
        return f"config {name!r} not found"
    m = re.search(r"Key '([^']+)' (?:is )?not in", text) or re.search(
        r"Could not override '([^']+)'", text)
    if m:
        full = re.search(r"full_key: (\S+)", text)
        key = full.group(1) if full else m.group(1)
        parent = key.rsplit(".", 1)[0]
        if parent.split(".")[-1] in ("sites", "params", "search"):  # open mappings
            return f"{key} is not set yet; add it with +{key}=VALUE"
        valid = _schema_keys(key)
        return f"unknown key {key!r}; valid: {', '.join(valid)}" if valid else (
            f"unknown key {key!r}")
    m = re.search(r"Value '([^']*)' (?:of type '\w+' )?could not be converted to (\w+)", text)
    if m:
        full = re.search(r"full_key: (\S+)", text)
        key = full.group(1) if full else "?"
        return f"bad value {m.group(1)!r} for {key}: expected {m.group(2).lower()}"
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(exc).__name__)
    return first


def _first_values(overrides: list[str]) -> list[str]:
    """The overrides with each sweep (a,b / range(..) / choice(..)) cut to its first value."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    out = []
    for o in OverridesParser.create().parse_overrides(overrides):
        if o.is_sweep_override():
            try:
                first = next(iter(o.sweep_string_iterator()))
            except Exception:
                continue
            out.append(f"{o.get_key_element()}={first}")
        else:
            out.append(o.input_line)
    return out


def precheck(overrides: list[str]):
    """Compose and check the config as Hydra will; ConfigError(one line) when it is bad."""
    from hydra import compose, initialize_config_dir

    try:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3",
                                   job_name="flashnum.harness.run"):
            try:
                cfg = compose("config", overrides=_first_values(overrides),
                              return_hydra_config=True)
            except Exception as e:
                raise ConfigError(explain(e)) from None
            try:
                check(cfg)
                expand(cfg)
            except ValueError as e:
                raise ConfigError(str(e).splitlines()[0]) from None
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(explain(e)) from None
    return cfg


def _fail(msg: str, code: int = 2):
    print(f"flashnum.harness.run: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(code)


@hydra.main(version_base="1.3", config_path=str(CONF), config_name="config")
def _hydra_main(cfg) -> None:
    try:
        check(cfg)
        expand(cfg)
    except ValueError as e:
        _fail(str(e).splitlines()[0])
    try:
        result = run(cfg)
    except KeyboardInterrupt:
        _fail("interrupted: finished cases are stored; run the same command to resume", 130)
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if result.get("failures") and HydraConfig.get().mode == RunMode.RUN:
        sys.exit(1)


def main() -> None:
    from hydra._internal.utils import get_args_parser

    args, _ = get_args_parser().parse_known_args()
    if not (args.help or args.hydra_help or args.info or args.shell_completion or args.cfg):
        try:
            precheck(args.overrides)
        except ConfigError as e:
            _fail(str(e))
    _hydra_main()


if __name__ == "__main__":
    # run the importable module, not __main__: workers and submitit jobs unpickle
    # functions by module name, and `__main__` is another module in their process
    from flashnum.harness.run import main as _main

    _main()
