"""The accuracy table of every attention kernel this machine runs (experiment kernel_table).

    python -m flashnum.run experiment=kernel_table          # -> experiments/kernel_table/
    python -m flashnum.run experiment=kernel_table          # the same (dispatched here)

conf/audit/kernel_table.yaml names the targets (flashnum.audit.targets), the precisions
and the budget. For every (target, precision) one row:

  status            ran; or "missing" (a package not installed here: `install` names it
                    and the extra that installs it, e.g. triton: pip install
                    'flashnum[triton]'); or "unsupported" (every case raised: the message)
  cases, kept       the audit's cases and how many kept every rule
  broken_<rule>     how many cases broke each rule (flashnum.audit.rules.RULES)
  worst_ratio       the largest err_max / fa_bound, with worst_case and worst_err: where
  ratio_std_median  median over cases of err_max / std_err_max: the kernel's error over
  ratio_std_max     standard attention's in the same dtype (and the largest)
  model             the flashnum model of the kernel (MODELS below), model_bitwise and
                    model_ulp1: the share of output elements equal to the kernel's bit for
                    bit and within one ulp of the dtype, over the cases it can model (rows
                    that see no key left out: the masked rule judges those)
  closest           the candidate (CANDIDATES) with the largest bitwise share, its
                    closest_bitwise and closest_ulp1
  time_s            the median wall time of one call (B 1, H 2, N 256, d 64, not causal,
                    after one warm-up call; three calls), on this machine
  lse_checked       whether the kernel returned a log-sum-exp the audit checked
  backward          whether the kernel is differentiable (all but ONNX Runtime's): then
                    the audit judges dQ, dK, dV too (broken_dq_rule, ...; flashnum.audit.
                    gradients) and grad_worst_ratio, grad_worst_case, grad_worst (which
                    gradient), grad_ratio_std_median; grad_model (GRAD_MODELS) and
                    grad_closest (of GRAD_CANDIDATES) with their bitwise and within-1-ulp
                    shares over every dQ, dK, dV entry (grad_closest_<g>_bitwise per
                    gradient); time_fwd_bwd_s (forward and backward of the same call).
                    A kernel whose every gradient raised as one with no backward on this
                    device (torch's FlexAttention on CPU) is backward False with
                    no_backward its one line, and its cases kept by the forward's rules

results.parquet holds the rows; cases.parquet every audited case (the
audit's table with target and precision); the manifest records every package version.
"""

from __future__ import annotations

import importlib.util
import math
import os
import statistics
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pandas as pd
import torch

from flashnum.audit.gradients import GRADS
from flashnum.audit.models import ORDER_WORDS, ROW, backward_kw
from flashnum.audit.rules import DTYPES, RULES
from flashnum.audit.standard import visible
from flashnum.audit.targets import GPU_COMMAND, TARGETS
from flashnum.engine.variants import FA2, variant_of
from flashnum.models import MODELS as REGISTERED

# every target's model, gradient model, packages and flags: flashnum.audit.targets.TARGETS
GRAD_CANDIDATES = ("naive", "naive@fp32", "fa2", "fa2:exp2", "fa2:fa2:32x32",
                   "fa2:exp2:32x32", "fa2:exp2:128x128", "lowp", "torch_cpu")
# the candidates a kernel is compared with; "policy[:variant[:block_n]]"
# (every registered kernel model too, and the tilings of a block-mask kernel: one key block
# of the row, 128-key tiles visited partial first: flashnum.audit.models, ROW and ORDERS)
CANDIDATES = tuple(dict.fromkeys((
    "naive", "fa2", "fa2:fa2:128", "fa2:exp2", "fa2:exp2:128", "lowp", "fa2:fa2:row",
    "fa2:fa2:128:partial_first", "fa2:exp2:128:partial_first", *REGISTERED)))
# packages whose versions the manifest records beside flashnum.store.manifest.versions()
PACKAGES = ("jax", "jaxlib", "onnx", "onnxruntime", "transformers", "ml_dtypes", "triton",
            "flash_attn")
def model_kwargs(spec: str) -> dict:
    """flashnum.attention keyword arguments of a model spec
    'policy[:variant[:block_n or block_mxblock_n or row[:order]]][@precision]' (row: one
    key block of the case's N keys, resolved by `tiled`; an order other than forward takes
    square tiles, a block mask's one BLOCK_SIZE; @fp32: the model computes in fp32 from the
    dtype's values and its results are rounded to the dtype, as torch's math backend widens
    bf16 and fp16 inputs; the key "compute" holds it)."""
    spec, _, compute = spec.partition("@")
    policy, *rest = spec.split(":")
    kw = dict(model=policy) if policy in REGISTERED else dict(policy=policy)
    if rest:
        kw["variant"] = rest[0]
    if len(rest) > 1 and rest[1] == ROW:
        kw["block_n"] = ROW
    elif len(rest) > 1:
        m, _, n = rest[1].rpartition("x")
        kw["block_n"] = int(n)
        if m:
            kw["block_m"] = int(m)
    if len(rest) > 2:
        kw["order"] = rest[2]
        kw.setdefault("block_m", kw["block_n"])
    if compute:
        kw["compute"] = compute
    return kw


def tiled(kw: dict, nk: int) -> dict:
    """model_kwargs' keywords on a case of nk keys (a block of the row: nk keys)."""
    if kw.get("block_n") != ROW:
        return kw
    return {**kw, "block_n": max(int(nk), 1),
            **({"block_m": max(int(nk), 1)} if kw.get("block_m") == ROW else {})}


def model_label(spec: str) -> str:
    """'fa2:exp2:128' -> 'fa2, variant exp2, block_n 128'."""
    kw = model_kwargs(spec)
    out = kw.get("model") or kw["policy"]
    if variant_of(kw.get("variant", FA2.name)) != FA2():
        out += f", variant {kw['variant']}"
    if kw.get("block_n") == ROW:
        out += ", one key block of the row"
    elif "block_m" in kw and "order" not in kw:
        out += f", blocks {kw['block_m']} x {kw['block_n']}"
    elif "block_n" in kw:
        out += f", block_n {kw['block_n']}"
    if kw.get("order", "forward") != "forward":
        out += f", {ORDER_WORDS.get(kw['order'], 'order ' + kw['order'])}"
    if "compute" in kw:
        out += f", computed in {kw['compute']}"
    return out


def _computed(kw: dict, precision: str, xs):
    """(precision, inputs) the model runs with: the dtype's values in the compute format."""
    if "compute" not in kw:
        return precision, xs
    dt = DTYPES[kw.pop("compute")]
    return {v: k for k, v in DTYPES.items()}[dt], [x.to(dt) for x in xs]


def model_grads(spec, q, k, v, do, *, precision, causal, alignment, scale):
    """The model's (dq, dk, dv) (float64) by flashnum.attention_backward under the kernel's
    causal alignment, or None for a model without a backward. Variant exp2 recomputes P
    in base 2 (exp2=True)."""
    from flashnum.api import attention_backward

    kw = tiled(model_kwargs(spec), k.shape[-2])
    if "model" in kw and REGISTERED[kw["model"]].backward is None:
        return None  # a model of a kernel with no backward
    kw.update(backward_kw(kw.get("variant", FA2.name)))
    dtype = DTYPES[precision]
    prec, (q, k, v, do) = _computed(kw, precision, (q, k, v, do))
    g = attention_backward(q, k, v, do, precision=prec, causal=alignment if causal else False,
                           scale=scale, **kw)
    if prec == precision:
        return g.dq, g.dk, g.dv
    return tuple(x.to(dtype).double() for x in (g.dq, g.dk, g.dv))


def model_out(spec, q, k, v, *, precision, causal, alignment, scale):
    """The model's output (float64) under the kernel's causal alignment (flashnum takes
    either by name; a model that cannot, torch_cpu bottom-right, raises ValueError)."""
    from flashnum.api import attention

    kw = tiled(model_kwargs(spec), k.shape[-2])
    dtype = DTYPES[precision]
    prec, (q, k, v) = _computed(kw, precision, (q, k, v))
    out = attention(q, k, v, precision=prec, causal=alignment if causal else False,
                    scale=scale, **kw).out
    return out if prec == precision else out.to(dtype).double()


def ulp_key(x: torch.Tensor, dtype) -> torch.Tensor:
    """Integers ordered as the floats of `dtype` are, one apart for neighbours (x is
    representable in dtype; +0 and -0 both 0)."""
    bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
    b = x.to(dtype).view(bits[dtype]).long()
    mag = (1 << 31) - 1 if dtype == torch.float32 else (1 << 15) - 1
    return torch.where(b < 0, -(b & mag), b)


def agreement(o: torch.Tensor, mo: torch.Tensor, dtype) -> tuple[int, int, int]:
    """(equal bit for bit, within one ulp of dtype, elements) of kernel o and model mo."""
    both = torch.isfinite(o) & torch.isfinite(mo)
    eq = (o == mo) | (o.isnan() & mo.isnan())
    near = eq | (both & ((ulp_key(torch.where(both, o, 0), dtype)
                          - ulp_key(torch.where(both, mo, 0), dtype)).abs() <= 1))
    return int(eq.sum()), int(near.sum()), o.numel()


MISSING = "missing"  # the status of a target whose package is not installed here


def missing(target: str) -> tuple[str, str] | None:
    """(status, what installs it) for a target that cannot run here, or None: "missing"
    and the target's install command for a package not installed (every target alike:
    triton, jax, onnx), "needs a GPU and flash-attn" for flash_attn."""
    t = TARGETS[target]
    lacking = [p for p in t.packages if importlib.util.find_spec(p) is None]
    if t.gpu_only and lacking:
        return "needs a GPU and flash-attn", GPU_COMMAND
    if lacking:
        return MISSING, f"{', '.join(lacking)}: {t.install}"
    why = t.lacking()  # a toolchain the kernel compiles with (tinygrad's clang)
    if why:
        return MISSING, why
    return None


def package_versions() -> dict:
    out = {}
    for pkg in PACKAGES:
        try:
            out[pkg] = version(pkg.replace("_", "-"))
        except PackageNotFoundError:
            out[pkg] = None
    return out


def _time_call(fn, precision) -> float:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 256, 64, generator=g).to(DTYPES[precision]) for _ in range(3))
    fn(q, k, v, causal=False, scale=None)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn(q, k, v, causal=False, scale=None)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _agreements(fn, case_list, precision, alignment, specs) -> dict[str, tuple[int, int, int]]:
    """spec -> (bitwise, within 1 ulp, elements) summed over the cases each can model."""
    dtype = DTYPES[precision]
    tot = {s: [0, 0, 0] for s in specs}
    for c in case_list:
        inp = c.inputs()
        q, k, v = (x.to(dtype) for x in (inp.q, inp.k, inp.v))
        try:
            got = fn(q, k, v, causal=c.causal, scale=inp.scale)
        except Exception:
            continue  # the audit's crash rule reports it
        o = (got[0] if isinstance(got, (tuple, list)) else got).detach().double()
        # rows that see no key are the masked rule's business, not a rounding: left out
        seen = visible(q.shape[-2], k.shape[-2], alignment).any(-1) if c.causal else None
        for s in specs:
            try:
                mo = model_out(s, q, k, v, precision=precision, causal=c.causal,
                               alignment=alignment, scale=inp.scale)
            except (ValueError, NotImplementedError):
                mo = None  # a model that does not take this case (its dtype, its mask)
            if mo is None:
                continue
            if seen is not None:
                o_s, mo = o[..., seen, :], mo[..., seen, :]
            for i, n in enumerate(agreement(o if seen is None else o_s, mo, dtype)):
                tot[s][i] += n
    return {s: tuple(t) for s, t in tot.items()}


def _grad_agreements(fn, case_list, precision, alignment, specs) -> dict:
    """spec -> {g: (bitwise, within 1 ulp, entries)} over the cases each can model: the
    kernel's dQ, dK, dV through autograd with the case's seeded dO
    (flashnum.audit.gradients.draw_do, as the audit draws it), beside the model's."""
    from flashnum.audit.gradients import draw_do

    dtype = DTYPES[precision]
    tot = {s: {g: [0, 0, 0] for g in GRADS} for s in specs}
    for c in case_list:
        inp = c.inputs()
        q, k, v = (x.to(dtype).detach().requires_grad_() for x in (inp.q, inp.k, inp.v))
        try:
            got = fn(q, k, v, causal=c.causal, scale=inp.scale)
            out = got[0] if isinstance(got, (tuple, list)) else got
            do = draw_do(c, out.shape, dtype)
            kg = torch.autograd.grad(out, (q, k, v), do)
        except Exception:
            continue  # the audit's grad_crash rule reports it
        q0, k0, v0 = (x.detach() for x in (q, k, v))
        for s in specs:
            try:
                mg = model_grads(s, q0, k0, v0, do, precision=precision, causal=c.causal,
                                 alignment=alignment, scale=inp.scale)
            except ValueError:
                mg = None
            if mg is None:
                continue
            for g, a, b in zip(GRADS, kg, mg, strict=True):
                for i, n in enumerate(agreement(a.double(), b, dtype)):
                    tot[s][g][i] += n
    return {s: {g: tuple(t) for g, t in d.items()} for s, d in tot.items()}


def _share(t) -> float:
    return t[0] / t[2] if t[2] else math.nan


def _grad_columns(t: pd.DataFrame) -> dict:
    """The gradient audit's summary: worst dQ/dK/dV error over its limit (and where), and
    the median over cases and gradients of the error over standard attention's."""
    out = {}
    best = None
    ratios = []
    for g in GRADS:
        if f"{g}_err_max" not in t:
            continue
        r = t[f"{g}_err_max"] / t[f"{g}_bound"]
        if r.notna().any():
            i = r.idxmax()
            if best is None or r[i] > best[0]:
                best = (float(r[i]), t.loc[i, "id"], g, float(t.loc[i, f"{g}_err_max"]))
        ratios += list((t[f"{g}_err_max"] / t[f"{g}_std_err_max"])
                       .replace([math.inf, -math.inf], math.nan).dropna())
    if best is not None:
        out.update(grad_worst_ratio=best[0], grad_worst_case=best[1], grad_worst=best[2],
                   grad_worst_err=best[3])
    if ratios:
        out["grad_ratio_std_median"] = float(statistics.median(ratios))
    return out


def _time_backward(fn, precision) -> float:
    """The median time of a forward and backward call; NaN for a kernel with no backward
    here (compiled flex attention on CPU refuses inputs that require grad)."""
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(1, 2, 256, 64, generator=g).to(DTYPES[precision]) for _ in range(3)]
    times = []
    for _ in range(3):
        q, k, v = (x.detach().requires_grad_() for x in xs)
        t0 = time.perf_counter()
        try:
            out = fn(q, k, v, causal=False, scale=None)
        except NotImplementedError:
            return math.nan
        out = out[0] if isinstance(out, (tuple, list)) else out
        out.backward(torch.ones_like(out))
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def _no_backward(t: pd.DataFrame, failed: pd.Series) -> bool:
    """Whether every case's gradient raised as a kernel with no backward does
    (flashnum.audit.gradients: "no backward: ...")."""
    if "message" not in t:
        return False
    return bool(failed.apply(lambda f: "grad_crash" in f).all()
                and t["message"].fillna("").astype(str).str.contains("no backward").any())


def _grad_models(fn, target, case_list, precision, alignment) -> dict:
    """The gradient columns of the target's gradient model and of the closest candidate
    (GRAD_CANDIDATES), pooled over dQ, dK, dV."""
    row = {}
    gmodel = TARGETS[target].grad_model
    gspecs = tuple(dict.fromkeys(((gmodel,) if gmodel else ()) + GRAD_CANDIDATES))
    gagree = _grad_agreements(fn, case_list, precision, alignment, gspecs)
    pooled = {s: tuple(sum(d[g][i] for g in GRADS) for i in range(3))
              for s, d in gagree.items()}
    ok = [s for s in gspecs if pooled[s][2]]
    if ok:
        gbest = max(ok, key=lambda s: _share(pooled[s]))
        row.update(grad_closest=model_label(gbest),
                   grad_closest_bitwise=_share(pooled[gbest]),
                   grad_closest_ulp1=pooled[gbest][1] / pooled[gbest][2],
                   **{f"grad_closest_{g}_bitwise": _share(gagree[gbest][g]) for g in GRADS})
    if gmodel and pooled[gmodel][2]:
        row.update(grad_model=model_label(gmodel),
                   grad_model_bitwise=_share(pooled[gmodel]),
                   grad_model_ulp1=pooled[gmodel][1] / pooled[gmodel][2])
    return row


def table_row(target: str, precision: str, budget: str,
              experiment: str = "kernel_table") -> tuple[dict, pd.DataFrame | None]:
    """One row of the table (see the module docstring) and the audit's case table."""
    from flashnum.audit import audit
    from flashnum.audit.cases import cases
    from flashnum.audit.targets import resolve
    from flashnum.harness.grid import hash_id

    row = dict(case_id=hash_id([experiment, target, precision]), target=target,
               precision=precision,
               budget=budget)
    why = missing(target)
    if why is not None:
        return dict(row, status=why[0], install=why[1]), None
    fn, alignment, _ = resolve(target)
    case_list = cases(budget)
    backward = not TARGETS[target].inference
    t0 = time.perf_counter()
    rep = audit(fn, precision=precision, alignment=alignment, budget=budget,
                model=None, case_list=case_list,
                backward=backward, diagnose=False)
    t = rep.table
    row.update(alignment=alignment, audit_s=time.perf_counter() - t0, backward=backward)
    crashed = t["failed"].str.split(",").apply(lambda f: "crash" in f)
    if crashed.all():
        msg = str(t["message"].dropna().iloc[0]) if "message" in t else "every case raised"
        return dict(row, status=f"unsupported: {msg[:160]}", cases=len(t), kept=0), t
    failed = t["failed"].fillna("").str.split(",").apply(lambda f: {r for r in f if r})
    if backward and _no_backward(t, failed):
        # the kernel has no backward on this device: said once, and its forward judged by
        # the forward's rules alone (a case is not "broken" by a pass that does not exist)
        msg = t["message"].dropna().astype(str)
        row.update(backward=False, no_backward=msg[msg.str.contains("no backward")].iloc[0][:160])
        failed = failed.apply(lambda f: f - {"grad_crash"})
        backward = False
    row.update(status="ran", cases=len(t), kept=int((failed.apply(len) == 0).sum()))
    for rule in RULES:
        row[f"broken_{rule}"] = int(sum(rule in f for f in failed))
    ratio = t["err_max"] / t["fa_bound"]
    i = ratio.idxmax()
    row.update(worst_ratio=float(ratio.max()), worst_case=t.loc[i, "id"],
               worst_err=float(t.loc[i, "err_max"]))
    r_std = (t["err_max"] / t["std_err_max"]).replace([math.inf, -math.inf], math.nan).dropna()
    row.update(ratio_std_median=float(r_std.median()) if len(r_std) else math.nan,
               ratio_std_max=float(r_std.max()) if len(r_std) else math.nan,
               lse_checked=bool("lse_err_max" in t and t["lse_err_max"].notna().any()))
    if backward:
        row.update(_grad_columns(t), **_grad_models(fn, target, case_list, precision, alignment))
    model = TARGETS[target].model
    specs = tuple(dict.fromkeys(((model,) if model else ()) + CANDIDATES))
    agree = _agreements(fn, case_list, precision, alignment, specs)
    if model:
        m = agree[model]
        row.update(model=model_label(model), model_bitwise=_share(m),
                   model_ulp1=m[1] / m[2] if m[2] else math.nan, model_elements=m[2])
    ok = [s for s in specs if agree[s][2]]
    if ok:  # none where the kernel answered no case the models take
        best = max(ok, key=lambda s: _share(agree[s]))
        b = agree[best]
        row.update(closest=model_label(best), closest_bitwise=_share(b),
                   closest_ulp1=b[1] / b[2])
    row["time_s"] = _time_call(fn, precision)
    if backward:
        row["time_fwd_bwd_s"] = _time_backward(fn, precision)
    return row, t


def run(cfg) -> int:
    """The experiment: every (target, precision) of conf/audit/<experiment>.yaml, stored."""
    from omegaconf import OmegaConf

    from flashnum import store
    from flashnum.store import manifest
    from flashnum.store.paths import CONF

    spec = OmegaConf.to_container(OmegaConf.load(CONF / "audit" / f"{cfg.experiment}.yaml"))
    if not torch.cuda.is_available():  # flashnum_triton's CPU interpreter must be chosen
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before any import of triton.language
    started, t0 = manifest.now(), time.perf_counter()
    rows, tables = [], []
    for target in spec["targets"]:
        for precision in spec["precisions"]:
            row, t = table_row(target, precision, spec["budget"], cfg.experiment)
            rows.append(row)
            if t is not None:
                tables.append(t.assign(target=target))
            print(f"{cfg.experiment}: {target} {precision}: {_verdict(row)}", flush=True)
    df = pd.DataFrame(rows)
    print(summary_table(df), flush=True)
    rec = manifest.record("flashnum.run", [f"experiment={cfg.experiment}"], config=spec,
                          shard=0, num_shards=1, n_workers=1, start_time=started,
                          end_time=manifest.now(), wall_s=time.perf_counter() - t0,
                          counts=dict(grid=len(df), run=int((df.status == "ran").sum()),
                                      failed=0),
                          kernel_versions=package_versions())
    folder = store.replace(cfg.experiment, df, rec, root=cfg.store.root)
    if tables:
        pd.concat(tables, ignore_index=True).astype({"params": str}).to_parquet(
            Path(folder) / "cases.parquet")
    ran = df[df.status == "ran"]
    return 0 if len(ran) and bool((ran.kept == ran.cases).all()) else 1


def _verdict(row: dict) -> str:
    """One row in words: ran (kept / cases, the worst ratio), or why not."""
    if row["status"] != "ran":
        extra = f" ({row['install']})" if row.get("install") else ""
        return f"{str(row['status'])[:100]}{extra}"
    return (f"ran, {row['kept']}/{row['cases']} cases kept every rule, worst error "
            f"{row['worst_ratio']:.3g} x its limit")


SUMMARY = {"target": "target", "precision": "prec", "status": "status", "kept": "kept",
           "worst_ratio": "worst/limit", "model_bitwise": "model bitwise",
           "closest": "closest model", "time_s": "time s"}


def summary_table(df: pd.DataFrame) -> str:
    """The table a run prints at its end: per (target, precision) the status (the reason
    cut short: the stored table holds it whole), cases kept, worst error over its limit,
    the share equal to the model bit for bit, the closest candidate, the time of a call."""
    t = pd.DataFrame({name: df[col] if col in df else None for col, name in SUMMARY.items()})
    if "cases" in df:
        t["kept"] = [f"{k:.0f}/{c:.0f}" if c == c and k == k else "--"
                     for k, c in zip(df.get("kept", df["cases"]), df["cases"], strict=True)]
    t["status"] = [str(x).split(":")[0] for x in t["status"]]
    t["model bitwise"] = [f"{100 * x:.1f}%" if x == x and x is not None else "--"
                          for x in t["model bitwise"]]
    for col, fmt in (("worst/limit", "{:.3g}"), ("time s", "{:.3g}")):
        t[col] = [fmt.format(x) if isinstance(x, float) and x == x else "--" for x in t[col]]
    t = t.fillna("--")
    installs = sorted({str(x) for x in df.get("install", pd.Series(dtype=str)).dropna()})
    lines = [t.to_string(index=False)] + [f"  to add the missing ones: {x}" for x in installs]
    return "\n".join(lines)


def check(cfg) -> None:
    """Bad experiment files raise one ValueError (the CLI's exit 2)."""
    from omegaconf import OmegaConf

    from flashnum.audit.cases import BUDGETS
    from flashnum.audit.targets import NAMES
    from flashnum.store.paths import CONF

    spec = OmegaConf.to_container(OmegaConf.load(CONF / "audit" / f"{cfg.experiment}.yaml"))
    for t in spec["targets"]:
        if t not in NAMES:
            raise ValueError(f"unknown target {t!r} in {cfg.experiment}; valid: {', '.join(NAMES)}")
    for p in spec["precisions"]:
        if p not in DTYPES:
            raise ValueError(f"unknown precision {p!r}; valid: {', '.join(DTYPES)}")
    if spec["budget"] not in BUDGETS:
        raise ValueError(f"unknown budget {spec['budget']!r}; valid: {', '.join(BUDGETS)}")
