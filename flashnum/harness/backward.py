"""Backward-pass experiments: grids of emulated backward cases, stored like the forward's.

    python -m flashnum.run experiment=bwd_bf16_sweep          # conf/experiment/<name>.yaml
    python -m flashnum.run experiment=bwd_order limit=20      # the first 20 cases only
    python -m flashnum.run experiment=bwd_order summary=true  # the stored table, summarised
    python -m flashnum.run experiment=bwd_seqlen_growth where=precision:fp16  # a subset
    python -m flashnum.run experiment=bwd_seqlen_growth n_jobs=2  # on two processes
    python -m flashnum.run experiment=bwd_order num_shards=8 shard=0 progress=false
    python -m flashnum.harness.backward bwd_order             # the same (an alias)
    (key=value options, flashnum.harness.cli: limit, batch, summary, where, n_jobs, progress,
    num_shards and shard, store.root, compare_with: a store root whose rows the rows computed
    now must equal; the keys the forward runner takes, with the same meaning)
    df = flashnum.store.load("bwd_order")

An experiment file has `experiment`, `description`, a `base` case and `grid`: a list of
slices, each mapping axes to lists of values (the product of the lists; other axes from
`base`). Axes: policy, precision, seq_len (Nq = Nk), head_dim, block_n (the key-block
size, block_m = block_n; its column is `block`, and `block` still reads as the key),
dq_order, distribution (flashnum.inputs.distributions, drawn on the precision's grid;
`captured` takes `capture: {path: FILE, call: i}`, a flashnum.capture call whose shape,
causal flag and recorded dO replace seq_len (then Nq), head_dim and
the Gaussian dO, its file's sha256 in the case's key), causal, seed, forward_variant
(the forward that makes O and LSE: fa2, or qiu_yao for Qiu & Yao's max adjustment),
orders (bwd_order: how many random dQ orders besides forward and reverse; 0 = none),
terms (per-site bound terms), reference (certified, or fp64 where the certified one is
too slow: large N), bound (false skips the a-priori bound; its cost:
bench/bound_backward_time.py), attribution (true: the case's row holds the per-site
attribution table instead, flashnum.analysis.attribution_backward, in columns
`<value>.<gradient>.<metric>.<site>`; `attribution_rows` gives it back tidy).

Each case stores, per gradient g in dq, dk, dv: err_g = max|g - ref| against the
certified reference (flashnum.reference_backward), ref_g = max|ref|, torch_err_g (torch
autograd of standard attention on tensors of the precision, for bf16 and fp16), rule_g =
err_g <= 2 torch_err_g (flash-attn's acceptance rule), bound_g (the a-priori bound's
largest entry, flashnum.analysis.bounds_backward; inf: vacuous somewhere), held_g (every
entry within its bound), dominant_g; ds_rowsum = max_i |sum_j dS_ij| and ds_abs = max_i
sum_j |dS_ij| of the computed dS; for orders > 0, dq_spread = max |dQ(order) -
dQ(forward)| over the orders; ref_method (the reference used) and, with a certified
reference, ref64_err_g = max|fp64 reference - certified| (what the fp64 reference errs
by, where both ran). Cases that share their inputs run as one task (inputs, reference
and torch's gradients made once), tasks on n_jobs processes with one torch thread each
(flashnum.harness.scheduler), so a row does not depend on how many run. Cases are keyed
by a hash of their axes (reference and bound only when not at their defaults, so that
the earlier tables keep their keys); a rerun computes only missing cases. Each run that
writes rows appends a record to the experiment's manifest.json
(flashnum.store.manifest). With several seq_len, summary=true also prints the growth
fits (`growth`): err ~ N^alpha per policy, precision, distribution, gradient and seed.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from flashnum import store
from flashnum.analysis.bounds_backward import bound_backward
from flashnum.api import attention_backward
from flashnum.harness.config import StoreConf
from flashnum.harness.grid import hash_id, in_shard, points
from flashnum.harness.scheduler import execute, n_workers
from flashnum.inputs.distributions import make
from flashnum.numerics.tiling import causal_visible
from flashnum.reference import reference_backward
from flashnum.store import compare, manifest, owners
from flashnum.store.paths import CONF as CONF_ROOT

CONF = CONF_ROOT / "experiment"
AXES = ("policy", "precision", "seq_len", "head_dim", "block", "dq_order", "distribution",
        "causal", "seed", "forward_variant", "orders", "terms", "reference", "bound",
        "attribution", "capture")
DEFAULT = dict(policy="fa2", precision="bf16", seq_len=64, head_dim=32, block=16,
               dq_order="forward", distribution="gaussian", causal=False, seed=0,
               forward_variant="fa2", orders=0, terms=False, reference="certified", bound=True,
               attribution=False, capture="")
# in a case's key (and row) only when not at their default
LATER_AXES = ("reference", "bound", "attribution", "capture")
GRADS = ("dq", "dk", "dv")
TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def load_conf(name: str) -> dict:
    """The experiment conf/experiment/<name>.yaml, or the YAML file `name` (a user's own,
    from python -m flashnum.run --config-dir DIR): its table is named after the file."""
    from omegaconf import OmegaConf

    path = Path(name) if name.endswith(".yaml") else CONF / f"{name}.yaml"
    if not path.is_file():
        valid = sorted(p.stem for p in CONF.glob("*.yaml") if "base" in OmegaConf.load(p))
        raise ValueError(f"unknown backward experiment {name!r}; valid: {', '.join(valid)}")
    conf = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    return {**conf, "experiment": path.stem}


def _block_n(d: dict, where: str) -> dict:
    """`block_n` (the key-block size, the forward's key; block_m = block_n) as the axis
    `block` that case keys and rows hold; `block`, the older spelling, still reads."""
    if "block_n" not in d:
        return d
    if "block" in d:
        raise ValueError(f"block_n and block both set (in {where}); valid: block_n only")
    return {("block" if k == "block_n" else k): v for k, v in d.items()}


def expand(conf: dict) -> list[dict]:
    """Every case of the grid, each once, in order."""
    base = {**DEFAULT, **_block_n(conf.get("base", {}), "base")}
    cases, seen = [], set()
    # the forward sweeps' grid expansion
    for sl, where, point in points(conf["grid"], (*AXES, "block_n")):
        case = {**base, **_block_n(dict(point), where), "slice": sl.get("name", "")}
        _captured(case)
        if case["policy"] == "naive":  # autograd of standard attention: no blocks, order
            case.update(block=base["block"], dq_order="forward")
        cid = case_id(case)
        if cid not in seen:
            seen.add(cid)
            cases.append({**case, "case_id": cid})
    return cases


def _captured(case: dict) -> None:
    """distribution captured: `capture` (the distribution's params: path, call, head_ids,
    rows) as canonical JSON with the file's sha256; seq_len (Nq), head_dim and causal from
    the call (flashnum.inputs.distributions.captured_case)."""
    from flashnum.inputs.distributions import captured_case

    cap = case["capture"]
    if case["distribution"] != "captured":
        if cap:
            raise ValueError(f"capture is for distribution captured, not "
                             f"{case['distribution']!r}")
        return
    if not isinstance(cap, (dict, str)) or not cap:
        raise ValueError(f"distribution captured needs capture: {{path: FILE, call: i}}, got "
                         f"{cap!r}")
    params, shape = captured_case(json.loads(cap) if isinstance(cap, str) else dict(cap),
                                  case["seed"], block_m=int(case["block"]),
                                  block_n=int(case["block"]), backward=True)
    case.update(capture=json.dumps(params, sort_keys=True), seq_len=shape["seq_len_q"],
                head_dim=shape["head_dim"], causal=bool(case["causal"] or shape["causal"]))


def case_id(case: dict) -> str:
    key = {a: case[a] for a in AXES if a not in LATER_AXES or case[a] != DEFAULT[a]}
    return hash_id(key, spaced=True)


def inputs(case: dict):
    """q, k, v from the catalogue and dO Gaussian, all on the precision's grid; a captured
    call's own q, k, v and (when recorded) dO, rounded to that grid."""
    from flashnum.numerics.formats import get_format

    grid = case["precision"] if case["precision"] in ("bf16", "fp16", "fp32") else "none"
    if case["distribution"] == "captured":
        inp = make("captured", block_n=case["block"], seed=case["seed"],
                   **json.loads(case["capture"]))
        if grid != "none":  # what the kernel stores: the reference sees the same numbers
            fmt = get_format(grid)
            inp.q, inp.k, inp.v = fmt.round(inp.q), fmt.round(inp.k), fmt.round(inp.v)
    else:
        inp = make(case["distribution"], seq_len_q=case["seq_len"], head_dim=case["head_dim"],
                   block_n=case["block"], seed=case["seed"],
                   **_grid_kw(case["distribution"], grid))
    do = inp.do
    if do is None:
        g = torch.Generator().manual_seed(10_000 + case["seed"])
        do = torch.randn(inp.q.shape[:-1] + inp.v.shape[-1:], generator=g, dtype=torch.float64)
    if grid != "none":
        do = get_format(grid).round(do)
    return inp, do


def _grid_kw(name: str, grid: str) -> dict:
    from flashnum.inputs.distributions import params

    # distributions whose property lives in exact values keep their own ("common") grid
    return {} if params(name).get("grid") == "common" else {"grid": grid}


def run_case(case: dict) -> dict:
    if case["attribution"]:
        return run_attribution(case)
    t0 = time.perf_counter()
    inp, do = _inputs_once(case)
    q, k, v = inp.q, inp.k, inp.v
    causal = case["causal"] or inp.causal
    kw = dict(policy=case["policy"], precision=case["precision"], block_m=case["block"],
              block_n=case["block"], causal=causal, scale=inp.scale)
    ref = reference_backward(q, k, v, do, causal=causal, scale=inp.scale,
                             method=case["reference"])
    ref64 = reference_backward(q, k, v, do, causal=causal, scale=inp.scale, method="fp64",
                               cache=False) if case["reference"] == "certified" else None
    fwd = None
    if case["forward_variant"] != "fa2":
        from flashnum.api import attention

        fwd = attention(q, k, v, precision=case["precision"], policy=case["policy"],
                                 block_m=case["block"], block_n=case["block"], causal=causal,
                                 scale=inp.scale, variant=case["forward_variant"])
    given = {} if fwd is None else dict(out=fwd.out, lse=fwd.lse)
    g = attention_backward(q, k, v, do, dq_order=case["dq_order"], measure_ds=True, **kw,
                           **given)
    b = bound_backward(q, k, v, do, terms=case["terms"], **kw) if case["bound"] else None
    row = {**_axes(case), "slice": case["slice"], "case_id": case["case_id"],
           "causal_effective": causal, "ref_uncertain": ref.info.get("uncertain", 0),
           "ref_method": ref.method}
    base = _torch_autograd(q, k, v, do, causal, inp.scale, case["precision"], _input_key(case))
    for name in GRADS:
        x, r = getattr(g, name), getattr(ref, name)
        err = (x - r).abs()
        row[f"err_{name}"] = float(err.max())
        row[f"ref_{name}"] = float(r.abs().max())
        row[f"ref64_err_{name}"] = (math.nan if ref64 is None else
                                    float((getattr(ref64, name) - r).abs().max()))
        row[f"bound_{name}"] = math.nan if b is None else b["max"][name]
        # an infinite bound entry covers anything, a NaN error (inf - inf) included
        row[f"held_{name}"] = None if b is None else bool(((err <= b[name])
                                                           | b[name].isinf()).all())
        row[f"dominant_{name}"] = "" if b is None else b["dominant_site"].get(name, "")
        t = math.nan if base is None else float((base[name] - r).abs().max())
        row[f"torch_err_{name}"] = t
        row[f"rule_{name}"] = bool(row[f"err_{name}"] <= 2 * t) if base is not None else None
    row["ds_rowsum"] = float(g.ds_rowsum.abs().max())
    row["dq_spread"] = _spread(q, k, v, do, g, kw, given, case) if case["orders"] else math.nan
    row["wall_s"] = time.perf_counter() - t0
    return row


def _axes(case: dict) -> dict:
    """The case's axes for its row: capture only where set (tables before it keep their
    columns)."""
    return {a: case[a] for a in AXES if a != "capture" or case[a]}


ATTRIBUTION_VALUES = ("format", "err_only", "err_without", "total", "share", "saved",
                      "bound_term", "bound_share")


def run_attribution(case: dict) -> dict:
    """The case's per-site attribution (flashnum.analysis.attribution_backward), one row."""
    from flashnum.analysis.attribution_backward import attribute_backward

    t0 = time.perf_counter()
    inp, do = inputs(case)
    causal = case["causal"] or inp.causal
    ref = reference_backward(inp.q, inp.k, inp.v, do, causal=causal, scale=inp.scale,
                             method=case["reference"])
    t = attribute_backward(inp.q, inp.k, inp.v, do, precision=case["precision"],
                           policy=case["policy"], ref=ref, bound_terms=case["bound"],
                           block_m=case["block"], block_n=case["block"], causal=causal,
                           scale=inp.scale, dq_order=case["dq_order"])
    row = {**_axes(case), "slice": case["slice"], "case_id": case["case_id"],
           "ref_method": ref.method, "ref_uncertain": ref.info.get("uncertain", 0)}
    for r in t.to_dict("records"):
        for val in ATTRIBUTION_VALUES:
            row[f"{val}.{r['grad']}.{r['metric']}.{r['site']}"] = r[val]
    row["wall_s"] = time.perf_counter() - t0
    return row


def attribution_rows(df):
    """The stored attribution cases as a tidy table: one row per (case, gradient, metric,
    site) with the case's axes and flashnum.analysis.attribution_backward's columns."""
    import pandas as pd

    cols = [c for c in df.columns if c.count(".") == 3 and c.split(".")[0] in ATTRIBUTION_VALUES]
    keys = sorted({tuple(c.split(".")[1:]) for c in cols})
    head = [c for c in df.columns if c not in cols]
    parts = []
    for g, m, site in keys:
        part = df[head].copy()
        part["grad"], part["metric"], part["site"] = g, m, site
        for val in ATTRIBUTION_VALUES:
            part[val] = df.get(f"{val}.{g}.{m}.{site}")
        parts.append(part[part["err_only"].notna()])
    return pd.concat(parts, ignore_index=True)


def _spread(q, k, v, do, g, kw, given, case) -> float:
    """max |dQ(order) - dQ(forward)| over reverse and `orders` seeded random orders."""
    n_kb = max(1, math.ceil(k.shape[-2] / case["block"]))  # key blocks
    ref = attention_backward(q, k, v, do, dq_order="forward", **kw, **given).dq
    spread = 0.0
    perms = ["reverse"] + [torch.randperm(n_kb, generator=torch.Generator().manual_seed(s))
                           for s in range(case["orders"])]
    for perm in perms:
        dq = attention_backward(q, k, v, do, dq_order=perm, **kw, **given).dq
        spread = max(spread, float((dq - ref).abs().max()))
    return spread


_INPUTS_LAST: dict = {}  # the last case's inputs: the cases of one task share them


def _inputs_once(case: dict):
    """inputs(case), made once for consecutive cases with the same inputs (late_max's
    fixed-order logits cost seconds at N = 8192)."""
    key = _input_key(case)
    if key not in _INPUTS_LAST:
        _INPUTS_LAST.clear()
        _INPUTS_LAST[key] = inputs(case)
    return _INPUTS_LAST[key]


def _input_key(case: dict) -> tuple:
    """The axes the inputs (and torch's autograd of them) depend on."""
    return tuple(case[a] for a in ("precision", "seq_len", "head_dim", "block", "distribution",
                                   "causal", "seed", "capture"))


_TORCH_LAST: dict = {}  # the last input's torch gradients: the policies of one input share them


def _torch_autograd(q, k, v, do, causal, scale, precision, key=None):
    """Standard attention's gradients by torch autograd on tensors of the precision."""
    dtype = TORCH_DTYPES.get(precision)
    if dtype is None:
        return None
    if key is not None and key in _TORCH_LAST:
        return _TORCH_LAST[key]
    _TORCH_LAST.clear()
    if key is not None:
        _TORCH_LAST[key] = _torch_grads(q, k, v, do, causal, scale, dtype)
        return _TORCH_LAST[key]
    return _torch_grads(q, k, v, do, causal, scale, dtype)


def _torch_grads(q, k, v, do, causal, scale, dtype):
    q, k, v = (x.detach().to(dtype).requires_grad_() for x in (q, k, v))
    sc = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * sc
    if causal:
        s = s.masked_fill(~causal_visible(*s.shape[-2:]), -math.inf)
    (torch.softmax(s, -1).nan_to_num() @ v).backward(do.to(dtype))
    return {n: x.grad.double() for n, x in zip(GRADS, (q, k, v), strict=True)}


def summary(name_or_path, root=None):
    """One row per (slice, policy, precision, forward_variant): cases, whether every bound
    held, flash-attn's rule, median error / max|ref| and error / bound per gradient, the
    dQ order spread over dQ's error, and the most frequent dominant site."""
    df = store.load(name_or_path, root, grid=True)
    keys = ["slice", "policy", "precision", "forward_variant"]
    out = []
    for key, grp in df.groupby(keys, sort=True):
        row = dict(zip(keys, key, strict=True), cases=len(grp))
        for g in GRADS:
            row[f"held_{g}"] = bool(grp[f"held_{g}"].all())
            rule = grp[f"rule_{g}"].dropna()
            row[f"rule_{g}"] = f"{int(rule.astype(bool).sum())}/{len(rule)}"
            row[f"rel_err_{g}"] = float((grp[f"err_{g}"] / grp[f"ref_{g}"]).median())
            row[f"err/bound_{g}"] = float((grp[f"err_{g}"] / grp[f"bound_{g}"]).max())
            dom = grp[f"dominant_{g}"].replace("", None).dropna()
            row[f"dominant_{g}"] = dom.mode().iloc[0] if len(dom) else ""
        spread = (grp["dq_spread"] / grp["err_dq"]).dropna()
        row["spread/err_dq_median"] = float(spread.median()) if len(spread) else math.nan
        row["spread/err_dq_max"] = float(spread.max()) if len(spread) else math.nan
        out.append(row)
    import pandas as pd

    return pd.DataFrame(out)


def attribution_summary(name_or_path, root=None):
    """Per (policy, gradient, site): the median over cases of the site's share of the
    error (max_abs and rmse, from the reruns) and of the bound's terms, the median fraction
    of the error that making the site exact saves, and in how many cases it was the site
    with the largest share; sites with a median share under 1% left out."""
    import pandas as pd

    df = attribution_rows(store.load(name_or_path, root, grid=True))
    wide = df.pivot_table(index=["case_id", "policy", "grad", "site"], columns="metric",
                          values=["share", "saved"], aggfunc="first")
    wide.columns = [f"{v}_{m}" for v, m in wide.columns]
    wide = wide.reset_index().merge(
        df[df.metric == "max_abs"][["case_id", "grad", "site", "bound_share"]],
        on=["case_id", "grad", "site"])
    top = df[df.metric == "max_abs"].sort_values("share").groupby(["case_id", "grad"]).tail(1)
    tops = top.groupby(["policy", "grad", "site"]).size().rename("top_in")
    out = wide.groupby(["policy", "grad", "site"]).agg(
        cases=("case_id", "nunique"), share_max_abs=("share_max_abs", "median"),
        share_rmse=("share_rmse", "median"), saved_max_abs=("saved_max_abs", "median"),
        bound_share=("bound_share", "median")).join(tops).fillna({"top_in": 0})
    out = out[out.share_max_abs.ge(0.01) | out.share_rmse.ge(0.01)]
    return pd.DataFrame(out.reset_index()).sort_values(
        ["policy", "grad", "share_rmse"], ascending=[True, True, False])


def growth(name_or_path, root=None):
    """Growth fits: alpha of err_g / max|g| ~ N^alpha (least squares in log-log over
    seq_len; relative, since the gradients shrink with N) per (policy, precision,
    distribution, gradient) and seed, and alpha_abs of err_g alone; one row per group
    with the median, min and max alpha over seeds, the median alpha_abs, the median
    relative error at the smallest and largest N, and the references used (with the
    largest relative error of the fp64 reference against the certified one, where both
    ran)."""
    import numpy as np
    import pandas as pd

    df = store.load(name_or_path, root, grid=True)
    out = []
    for (pol, prec, dist), grp in df.groupby(["policy", "precision", "distribution"],
                                             sort=True):
        for g in GRADS:
            alphas, alphas_abs = [], []
            for _, s in grp.groupby("seed"):
                n, e = s["seq_len"].to_numpy(float), s[f"err_{g}"].to_numpy(float)
                r = s[f"ref_{g}"].to_numpy(float)
                ok = (e > 0) & np.isfinite(e) & (r > 0)
                if len(np.unique(n[ok])) >= 2:
                    alphas.append(float(np.polyfit(np.log(n[ok]), np.log(e[ok] / r[ok]), 1)[0]))
                    alphas_abs.append(float(np.polyfit(np.log(n[ok]), np.log(e[ok]), 1)[0]))
            rel = grp[f"err_{g}"] / grp[f"ref_{g}"]
            lo, hi = grp["seq_len"].min(), grp["seq_len"].max()
            ref64 = (grp[f"ref64_err_{g}"] / grp[f"ref_{g}"]).dropna() if (
                f"ref64_err_{g}" in grp) else pd.Series(dtype=float)
            out.append(dict(policy=pol, precision=prec, distribution=dist, grad=g,
                            seeds=len(alphas), alpha=float(np.median(alphas)) if alphas
                            else math.nan, alpha_min=min(alphas, default=math.nan),
                            alpha_max=max(alphas, default=math.nan),
                            alpha_abs=float(np.median(alphas_abs)) if alphas_abs else math.nan,
                            n_min=int(lo),
                            n_max=int(hi), rel_err_n_min=float(rel[grp.seq_len == lo].median()),
                            rel_err_n_max=float(rel[grp.seq_len == hi].median()),
                            refs="+".join(sorted(grp["ref_method"].dropna().unique()))
                            if "ref_method" in grp else "certified",
                            ref64_rel_err_max=float(ref64.max()) if len(ref64) else math.nan))
    return pd.DataFrame(out)


@dataclass
class Args:
    experiment: str = "bwd_order"
    limit: int | None = None  # run at most this many cases
    batch: int = 25  # cases per stored part
    summary: bool = False  # print the stored table's summary instead of running
    where: str | None = None  # only the cases with these axis values: precision:fp16+seed:0
    n_jobs: int = 1  # worker processes; 0: every core this process may use; 1: in-process
    progress: bool = True  # the progress bar (false: one line per finished task)
    num_shards: int = 1  # split the grid by case hash, as the forward runner does; this
    shard: int = 0  # run computes shard `shard` of `num_shards`
    store: StoreConf = field(default_factory=StoreConf)
    # a store root (e.g. experiments): after the run, compare the rows computed now with the
    # rows stored there (flashnum.store.compare, as the forward runner); exit status 1 if any
    # differ
    compare_with: str | None = None


def _check_args(cfg) -> None:
    load_conf(cfg.experiment)
    if cfg.limit is not None and cfg.limit < 0:
        raise ValueError(f"limit must be >= 0, got {cfg.limit}")
    if cfg.batch < 1:
        raise ValueError(f"batch must be >= 1, got {cfg.batch}")
    if cfg.n_jobs < 0:
        raise ValueError(f"n_jobs must be >= 0, got {cfg.n_jobs}; valid: 0 (all cores), 1, 2, ...")
    if cfg.num_shards < 1 or not 0 <= cfg.shard < cfg.num_shards:
        raise ValueError(f"shard={cfg.shard} num_shards={cfg.num_shards}; valid: "
                         f"num_shards >= 1 and 0 <= shard < num_shards")
    if cfg.compare_with is not None and cfg.compare_with == cfg.store.root:
        raise ValueError(f"compare_with={cfg.compare_with} is the store this run writes to; "
                         "valid: another store root (e.g. store.root=scratch)")
    _where(cfg.where)


def _where(text: str | None) -> dict:
    """where=axis:value+axis:value as {axis: value as a string}."""
    if not text:
        return {}
    out = {}
    for part in text.split("+"):
        axis, sep, value = part.partition(":")
        if not sep or axis not in (*AXES, "block_n"):
            raise ValueError(f"where must be axis:value[+axis:value] with an axis of "
                             f"{', '.join(AXES)}, block_n; got {part!r}")
        out["block" if axis == "block_n" else axis] = value
    return out


def _run(cfg) -> int:
    conf = load_conf(cfg.experiment)
    root = cfg.store.root
    if cfg.summary:
        import pandas as pd

        with pd.option_context("display.width", 250, "display.max_columns", 40):
            df = store.load(conf["experiment"], root, grid=True)
            if df["attribution"].any() if "attribution" in df else False:
                print(attribution_summary(conf["experiment"], root).to_string(index=False))
                return 0
            print(summary(conf["experiment"], root).T.to_string())
            if df["seq_len"].nunique() > 2:
                print(growth(conf["experiment"], root).to_string(index=False))
        return 0
    torch.set_num_threads(1)  # small cases: one thread is fastest on a shared machine
    cases = expand(conf)
    grid = [c["case_id"] for c in cases]
    exp_dir = store.experiment_dir(conf["experiment"], root)
    for line in store.tidy(exp_dir):  # what a killed run left: its files, its record
        print(line, flush=True)
    done = store.done_ids(exp_dir) if store._files(exp_dir) else set()
    where = _where(cfg.where)
    cases = [c for c in cases if all(str(c[a]) == v for a, v in where.items())
             and in_shard(c["case_id"], cfg.shard, cfg.num_shards)]
    # seeds in turn across every slice: a run stopped early covers the whole grid thinly;
    # within a seed the largest N first, so that parallel workers end together
    todo = sorted((c for c in cases if c["case_id"] not in done),
                  key=lambda c: (c["seed"], -c["seq_len"]))
    todo = todo[: cfg.limit]
    shard = f" (shard {cfg.shard} of {cfg.num_shards})" if cfg.num_shards > 1 else ""
    print(f"{conf['experiment']}: {len(cases)} cases{shard}, {len(todo)} to run", flush=True)
    if not todo:  # a run that writes no rows leaves the manifest as it was
        return 0
    exp_dir.mkdir(parents=True, exist_ok=True)
    store.write_grid(exp_dir, grid)
    sharded = cfg.num_shards > 1
    mpath = exp_dir / (f"manifest.shard-{cfg.shard}-of-{cfg.num_shards}.json" if sharded
                       else store.MANIFEST)
    overrides = [f"experiment={cfg.experiment}"] + ([f"limit={cfg.limit}"] if cfg.limit else []) \
        + ([f"where={cfg.where}"] if cfg.where else []) \
        + ([f"num_shards={cfg.num_shards}", f"shard={cfg.shard}"] if sharded else [])
    shards = dict(shard=cfg.shard, num_shards=cfg.num_shards) if sharded else {}
    rec = manifest.record("flashnum.run", overrides, config=dict(conf),
                          counts=dict(grid=len(cases), done_before=len(done), run=0), **shards)
    t0 = time.perf_counter()
    with store.running(exp_dir, rec["run_id"]):
        manifest.begin(mpath, conf["experiment"], rec)
        tasks = [(_run_task, t) for t in _tasks(todo)]
        out = execute(tasks, (str(exp_dir), cfg.batch, rec["run_id"]), n_workers(cfg),
                      progress=cfg.progress)
        rec.update(wall_s=time.perf_counter() - t0, counts={**rec["counts"], "run": out["rows"]})
        manifest.finish(mpath, conf["experiment"], rec, wrote_rows=out["rows"] > 0)
    if out["skipped"]:
        print(f"{len(out['skipped'])} cases were in flight in another run and left to it",
              flush=True)
    try:
        if not sharded:  # shards leave their parts: one compaction, after all of them
            store.compact(exp_dir)
    except store.StoreFull as e:
        print(f"flashnum.harness.backward: warning: {e}", file=sys.stderr, flush=True)
    if cfg.compare_with:  # the rows computed now against the stored ones
        now = store.load(exp_dir)
        now = now[now["case_id"].isin({c["case_id"] for c in todo})]
        text, same = compare.against(now, Path(cfg.compare_with) / conf["experiment"])
        print(text, flush=True)
        return 0 if same else 1
    return 0


def _tasks(todo: list[dict]) -> list[list[dict]]:
    """The cases grouped by their inputs, groups in the order of their first case."""
    groups: dict = {}
    for c in todo:
        groups.setdefault(_input_key(c), []).append(c)
    return list(groups.values())


def _run_task(cases: list[dict], exp_dir: str, batch: int, run_id: str | None = None) -> dict:
    """Run one task's cases in turn, storing a part every `batch` rows and at its end.
    Only the cases it claims (flashnum.store.owners): another run may have the rest."""
    mine = set(owners.claim(exp_dir, [c["case_id"] for c in cases], run_id)) if run_id \
        else {c["case_id"] for c in cases}
    busy = [c["case_id"] for c in cases if c["case_id"] not in mine]
    done = store.done_ids(exp_dir) if run_id and mine else set()
    todo = [c for c in cases if c["case_id"] in mine - done]
    rows, n = [], 0
    try:
        for i, case in enumerate(todo, 1):
            rows.append(run_case(case))
            if len(rows) >= batch or i == len(todo):
                store.write_part(exp_dir, rows, run_id)
                owners.release(exp_dir, [r["case_id"] for r in rows] if run_id else [])
                n, rows = n + len(rows), []
    finally:
        owners.release(exp_dir, mine if run_id else [])
    return {"n": len(cases), "rows": n, "failures": [], "skipped": busy}


def main(argv=None) -> int:
    from flashnum.harness.cli import main_of

    return main_of("flashnum.harness.backward", Args, _run, argv, positional="experiment",
                   check=_check_args, doc=__doc__)


if __name__ == "__main__":  # an alias: python -m flashnum.run experiment=NAME
    from flashnum.harness.cli import alias, named

    alias(named())
