"""Worst-case search: the inputs on which a policy's attention errs most.

    from flashnum.inputs.search import worst_case, replay, load_worst
    res = worst_case(policy="fa2", precision="bf16", seq_len=1024, head_dim=64,
                     budget_s=100, seed=0)
    res.error, res.baseline, res.ratio     # max|out - exact| and its ratio to gaussian
    res.params                             # the worst point of the `structured` family
    res.path                               # experiments/worst_case/inputs/<id>.pt
    replay(res.path)                       # recomputes the error from the saved tensors
    make("worst_case", path=res.path)      # the same inputs as a catalogue entry

    python -m flashnum.worst_case precision=bf16 seq_len=1024 budget=100   (flashnum/worst_case.py)

What is measured. Inputs are first rounded to the policy's `inputs` format and
the exact reference is computed on those rounded tensors, so the error is the
algorithm's own (the rounding inside attention), not the quantisation of the
inputs. The search's reference is a plain float64 softmax attention (error
< 1e-12, far below any bf16/fp16 error, and ~10x faster than the bounded "fp64"
method of flashnum.reference: 1.5-2.8 s at N = 1024 on the loaded 2-core
machine); the final worst case is re-checked with flashnum.reference's "fp64"
and "certified" methods (SearchResult.verified).

Fair comparison. Attention's error scales with |V| (out is a convex combination
of V's rows), so a bigger V alone would "win". Every candidate's V is held to
the range of the gaussian baseline's V: |V| <= bound = max|V_gaussian|
(the structured family clamps V there; catalogue entries are scaled by a power
of two, exactly). The scale-free ratio error / max|V| is reported as well.

How it searches (seeded; deterministic for a given max_evals):
  1. screen: every catalogue distribution at its defaults (V scaled into range),
     for at most the first 25% of the budget;
  2. differential evolution (scipy, seeded; the first 70% of the budget) over
     the 9 continuous parameters of the `structured` family (logit spread, key
     repetition, a peak block with its gap, position and per-row spread, a ramp,
     V's mean and spread); every candidate reuses the same random draws
     (common random numbers), so the objective is a deterministic function of
     the parameters;
  3. a (1+1) evolution strategy on direct perturbations of the best V (shifts of
     whole columns, clamped to the bound) for the last 30% of the budget;
  4. the best inputs found are saved (q, k, v, params, errors, configuration).
The wall-clock budget stops the search wherever it is: what a budget-only run
finds depends on the machine's speed. Pass max_evals for a reproducible run.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import torch
from scipy.optimize import differential_evolution
from scipy.stats import qmc

from flashnum.api import attention
from flashnum.inputs.distributions import DISTRIBUTIONS, FROM_FILE, Inputs, make
from flashnum.inputs.draws import dot_logits
from flashnum.inputs.io import load_inputs, save_inputs
from flashnum.numerics import elementary
from flashnum.numerics.accumulate import rowsum
from flashnum.numerics.policy import make_policy
from flashnum.reference import plain64, reference

# max_abs: max |out - exact|; rmse: its root mean square (FlashAttention-3's Table 3);
# max_abs_v: max_abs / max|V| (scale-free); max_ulp: max |out - exact| / ulp(exact) in
# the output format (1/2 is a correctly rounded output; near-zero exact values blow it up)
METRICS = ("max_abs", "rmse", "max_abs_v", "max_ulp")
FAMILY = "structured"
DEFAULT_DIR = Path("experiments/worst_case/inputs")
# not screened: the family itself, saved files, and shapes of their own (masked has Nk < Nq)
SKIP_SCREEN = ("structured", *FROM_FILE)


@dataclass
class SearchResult:
    error: float  # metric of the worst inputs found
    baseline: float  # the same metric on gaussian inputs, same shape, policy, tiling, seed
    ratio: float  # error / baseline
    ratio_v: float  # the same with each error divided by its max|V| (scale-free)
    inputs: Inputs  # the worst inputs, already rounded to the policy's input format
    family: str  # the distribution they came from
    params: dict  # its parameters
    bound: float  # |V| <= bound for every candidate
    path: str | None = None  # where the inputs were saved
    n_evals: int = 0
    elapsed_s: float = 0.0
    history: list = field(default_factory=list)  # (eval, seconds, best error so far)
    screen: dict = field(default_factory=dict)  # catalogue name -> error at defaults
    verified: dict = field(default_factory=dict)  # reference method -> error (final check)
    config: dict = field(default_factory=dict)

    def seconds_to(self, ratio: float) -> float | None:
        """Seconds from the start until the best error first reached ratio x baseline."""
        hit = [t for _, t, e in self.history if e >= ratio * self.baseline]
        return hit[0] if hit else None

    def summary(self) -> dict:
        d = asdict(self)
        d.pop("inputs")
        d.pop("history")
        d["seconds_to_10x"] = self.seconds_to(10.0)
        d["certified"] = self.verified.get("certified")  # None when not verified
        return d


# -- the objective --------------------------------------------------------------------


REFERENCES = ("torch64", "fp64", "certified")


def reference_out(inp: Inputs, method: str = "torch64") -> torch.Tensor:
    """Exact attention of the inputs (fully masked rows give 0).

    "torch64": plain float64 softmax attention (BLAS), the search's objective: its
    error, ~(Nk + d) 2^-53 max|V| < 1e-12 here, is 10^8 below a bf16 error and it is
    ~10x faster than the bounded fp64 method. "fp64" / "certified":
    flashnum.reference with that method (the final worst case is checked with both).
    """
    if method not in REFERENCES:
        raise ValueError(f"unknown reference {method!r}; valid: {', '.join(REFERENCES)}")
    if method != "torch64":
        # no cache: every candidate of a search is new, hashing it would only cost time
        return reference(inp.q, inp.k, inp.v, causal=inp.causal, scale=inp.scale,
                         method=method, cache=False).out
    return plain64(inp.q, inp.k, inp.v, scale=inp.softmax_scale, causal=inp.causal)


def metric_of(out: torch.Tensor, ref: torch.Tensor, v: torch.Tensor, metric: str,
              out_format=None) -> float:
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; valid: {', '.join(METRICS)}")
    err = (out - ref).abs()
    if metric == "max_ulp":
        if not hasattr(out_format, "ulp"):
            raise ValueError(f"metric max_ulp needs a rounded output format, got {out_format}")
        return float((err / out_format.ulp(ref)).max())
    if metric == "rmse":
        return float((rowsum((err * err).reshape(-1), "fp64") / err.numel()).sqrt())
    e = float(err.max())
    if metric == "max_abs_v":
        return e / float(v.abs().max())
    return e


@dataclass(frozen=True)
class Search:
    """One search's settings, checked once: what it measures, on which shape, how long.

    population: members of the DE population. budget_s: wall-clock seconds (0: none,
    then max_evals must be given); max_evals: stop after this many evaluations, the
    reproducible budget. screen: try every catalogue distribution first.
    """

    policy: str = "fa2"
    precision: str = "bf16"
    seq_len: int = 1024
    head_dim: int = 64
    block_n: int = 64
    block_m: int = 64
    order: str = "forward"
    variant: str = "fa2"
    batch: int = 1
    heads: int = 1
    metric: str = "max_abs"
    budget_s: float = 100.0
    max_evals: int | None = None
    seed: int = 0
    population: int = 16
    screen: bool = True

    def __post_init__(self):
        if self.metric not in METRICS:
            raise ValueError(f"unknown metric {self.metric!r}; valid: {', '.join(METRICS)}")
        if self.budget_s <= 0 and self.max_evals is None:
            raise ValueError(f"budget_s must be > 0 (or give max_evals), got {self.budget_s}")
        if self.population < 5:
            raise ValueError(f"population must be >= 5, got {self.population}")

    @property
    def engine_kw(self) -> dict:
        """The flashnum.attention options every candidate is run with."""
        return _engine_kw(self.policy, self.precision, self.block_m, self.block_n, self.order,
                          self.variant)

    @classmethod
    def of(cls, search: Search | None, settings: dict) -> Search:
        """search with settings replaced; popsize (scipy's multiplier, kept for older
        configs) gives population = popsize x 9."""
        settings = dict(settings)
        if settings.get("popsize") is not None:
            settings["population"] = settings["popsize"] * 9
        settings.pop("popsize", None)
        valid = [f.name for f in fields(cls)]
        bad = [k for k in settings if k not in valid]
        if bad:
            raise ValueError(f"unknown search setting {bad[0]!r}; valid: {', '.join(valid)}")
        return replace(search or cls(), **settings)


def _engine_kw(policy, precision, block_m, block_n, order, variant) -> dict:
    return dict(policy=policy, precision=precision, block_m=block_m, block_n=block_n,
                order=order, variant=variant)


def prepare(inp: Inputs, precision: str, policy: str) -> Inputs:
    """The inputs rounded to the policy's `inputs` format: what both sides then see."""
    fmt = make_policy(policy, precision).fmt("inputs")
    return Inputs(fmt.round(inp.q), fmt.round(inp.k), fmt.round(inp.v), inp.causal, inp.name,
                  inp.params, inp.scale, inp.seed, inp.block_n)


def evaluate(inp: Inputs, engine_kw: dict, metric: str = "max_abs",
             reference: str = "torch64") -> float:
    """The metric of flashnum.attention on (already rounded) inputs against the reference."""
    res = attention(inp.q, inp.k, inp.v, causal=inp.causal, scale=inp.scale, **engine_kw)
    fmt = make_policy(engine_kw["policy"], engine_kw["precision"]).fmt("out")
    return metric_of(res.out, reference_out(inp, reference), inp.v, metric, fmt)


def _into_range(inp: Inputs, bound: float) -> Inputs:
    """Hold V to |V| <= bound: scale by a power of two (exact) to max|V| < 2 bound, clamp."""
    vmax = float(inp.v.abs().max())
    if vmax <= bound or vmax == 0:
        return inp
    e = min(0, math.ceil(math.log2(bound / vmax)))
    v = (inp.v * 2.0**e).clamp(-bound, bound)
    return Inputs(inp.q, inp.k, v, inp.causal, inp.name, {**inp.params, "v_scaled": 2.0**e},
                  inp.scale, inp.seed, inp.block_n)


# -- the search space of the structured family (unit cube -> parameters) ----------------


def _space(n: int, bound: float):
    """(names, decode): decode maps x in [0, 1]^9 to `structured` parameters."""
    names = ("logit_std", "distinct", "peak_gap", "peak_frac", "peak_pos", "row_spread",
             "ramp", "v_mean", "v_std")
    lo_frac = 1.0 / n

    def decode(x) -> dict:
        x = [min(1.0, max(0.0, float(t))) for t in x]
        return dict(
            logit_std=3.0 * x[0],
            distinct=lo_frac ** (1.0 - x[1]),  # log-uniform in [1/N, 1]
            peak_gap=12.0 * x[2],
            peak_frac=0.0 if x[3] < 0.05 else lo_frac * (0.5 / lo_frac) ** ((x[3] - 0.05) / 0.95),
            peak_pos=x[4],
            row_spread=2.0 * x[5],
            ramp=2.0 * x[6] - 1.0,
            v_mean=bound * (2.0 * x[7] - 1.0),
            v_std=bound * x[8],
            v_clip=bound,
        )

    return names, decode


def _initial(population: int, dim: int, seed: int):
    """DE's first population: a seeded Sobol or Latin hypercube sample, plus the gaussian.

    Smaller than scipy's default (15 x dim) so that evolution starts within a budget
    of a few dozen evaluations on a loaded machine. The gaussian corner (logit_std 1,
    all keys distinct, no peak, no ramp, V ~ N(0, bound / 4)) makes the baseline a member.
    """

    if population & (population - 1) == 0:  # Sobol's balance needs a power of two
        x = qmc.Sobol(dim, scramble=True, seed=seed).random(population)
    else:
        x = qmc.LatinHypercube(dim, seed=seed).random(population)
    x[0] = [1 / 3, 1.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.25][:dim]
    return x


class _Stop(Exception):
    pass


def _screen(consider, shape: dict, bound: float, screened: dict) -> None:
    """Step 1: every catalogue distribution, V scaled into range, until the stage ends."""
    for name in DISTRIBUTIONS:
        if name in SKIP_SCREEN:
            continue
        inp = _into_range(make(name, **shape), bound)
        try:
            screened[name] = consider(inp, name, dict(inp.params))
        except _Stop:
            break


def _begin(start, s: Search):
    """(start as Inputs or None, the shape of make()'s arguments, the search's config):
    a captured call given by its params is made here, and its shape is the search's."""
    start_params = None
    if isinstance(start, dict):  # a captured call, by its distribution params
        start_params = dict(start)
        start = make("captured", seed=s.seed, block_n=s.block_n, **start)
    elif start is not None and not isinstance(start, Inputs):
        raise TypeError(f"start must be an Inputs or a dict of captured params "
                        f"(path, call, ...), got {type(start).__name__}")
    batch, heads, seq_len, head_dim = s.batch, s.heads, s.seq_len, s.head_dim
    if start is not None:
        batch, heads, seq_len, head_dim = start.q.shape
    shape = dict(batch=batch, heads=heads, seq_len_q=seq_len, head_dim=head_dim,
                 block_n=s.block_n, seed=s.seed)
    config = dict(metric=s.metric, seq_len=seq_len, head_dim=head_dim, batch=batch,
                  heads=heads, seed=s.seed, budget_s=s.budget_s, max_evals=s.max_evals,
                  population=s.population, **s.engine_kw)
    if start is not None:
        config.update(start=start_params or {"name": start.name, **start.params},
                      seq_len_k=start.k.shape[-2], causal=start.causal)
    return start, shape, config


def _result(best: dict, baseline: float, bound: float, metric: str, **rest) -> SearchResult:
    """The SearchResult of the best candidate; ratio_v compares errors relative to max|V|."""
    worst: Inputs = best["inputs"]
    ratio_v = (best["error"] / float(worst.v.abs().max())) / (baseline / bound)
    if metric == "max_abs_v":
        ratio_v = best["error"] / baseline
    return SearchResult(
        error=best["error"], baseline=baseline, ratio=best["error"] / baseline, ratio_v=ratio_v,
        inputs=worst, family=best["family"], params=best["params"], bound=bound, **rest)


def worst_case(search: Search | None = None, /, *, start: Inputs | dict | None = None,
               save: bool | str | Path = True, verify: bool = True, verbose: bool = False,
               **settings) -> SearchResult:
    """Search inputs for the largest error; see the module docstring for what and how.

    search: a Search, or its fields as keywords (policy=, precision=, seq_len=, ...;
    settings replace the given Search's fields).
    start: inputs to start from, e.g. a real model's call: an Inputs, or the params of
    distribution captured ({"path": file, "call": i, ...}). The search then runs at
    their shape, causal flag and scale (seq_len, head_dim, batch, heads are ignored),
    measures them first (the baseline, so ratio is how much worse the result is than
    the start), skips the screen and the structured family, and spends the budget on
    step 3 from the start, V held to the start's max|V|: the worst inputs near it.
    """

    s = Search.of(search, settings)
    t0 = time.perf_counter()
    start, shape, config = _begin(start, s)
    base = prepare(start if start is not None else make("gaussian", **shape), s.precision,
                   s.policy)
    bound = float(base.v.abs().max())
    tally = _Tally(s, t0, evaluate(base, s.engine_kw, s.metric), verbose)
    screened: dict = {}
    names, decode = _space(shape["seq_len_q"], bound)
    try:
        tally.stage(0.25)  # the screen gets at most a quarter of the budget
        if start is not None:  # the start is the first candidate; step 3 refines it
            tally.consider(start, start.name or "start", dict(start.params))
            raise _Stop
        if s.screen:
            _screen(tally.consider, shape, bound, screened)

        def objective(x):
            p = decode(x)
            return -tally.consider(make(FAMILY, **shape, **p), FAMILY, p)

        tally.stage(0.7)  # differential evolution up to 70%, the refinement the rest
        differential_evolution(objective, [(0.0, 1.0)] * len(names), seed=s.seed,
                               init=_initial(s.population, len(names), s.seed), maxiter=10**6,
                               tol=0.0, atol=0.0, polish=False, updating="immediate")
    except _Stop:
        pass
    tally.stage(1.0)
    if tally.best["inputs"] is not None:
        try:
            _refine(tally.best, tally.consider, bound, s.seed)
        except _Stop:
            pass
    if tally.best["inputs"] is None:
        raise ValueError("the budget ended before any candidate was evaluated; raise budget_s")
    res = _result(tally.best, tally.baseline, bound, s.metric, n_evals=tally.n,
                  elapsed_s=time.perf_counter() - t0, history=tally.history, screen=screened,
                  config=config)
    if verify:
        res.verified = _verify(res.inputs, s.engine_kw, s.metric)
    if save:
        res.path = str(save_worst(res, save if not isinstance(save, bool) else DEFAULT_DIR))
    return res


class _Tally:
    """The evaluations so far, the best candidate and the current stage's limits."""

    def __init__(self, s: Search, t0: float, baseline: float, verbose: bool):
        self.s, self.t0, self.baseline, self.verbose = s, t0, baseline, verbose
        self.best = dict(error=-math.inf, inputs=None, family=None, params=None)
        self.history: list = []  # (eval, seconds, best error so far)
        self.n = 0
        self.total = s.max_evals if s.max_evals is not None else math.inf
        self.deadline = t0 + s.budget_s if s.budget_s > 0 else math.inf

    def stage(self, upto: float) -> None:
        """Limits for the next stage: up to this fraction of the time and of the
        evaluations left (all that is left at 1.0)."""
        if upto == 1.0:
            self.evals, self.time = self.total, self.deadline
            return
        left = self.total - self.n
        self.evals = self.n + math.ceil(upto * left) if self.s.max_evals else math.inf
        self.time = self.t0 + upto * (self.deadline - self.t0)

    def consider(self, inp: Inputs, family: str, params: dict) -> float:
        if self.n >= self.evals or time.perf_counter() > self.time:
            raise _Stop
        inp = prepare(inp, self.s.precision, self.s.policy)
        e = evaluate(inp, self.s.engine_kw, self.s.metric)
        self.n += 1
        if e > self.best["error"]:
            self.best.update(error=e, inputs=inp, family=family, params=params)
            self.history.append((self.n, time.perf_counter() - self.t0, e))
            if self.verbose:
                print(f"[{self.n:5d} {time.perf_counter() - self.t0:6.1f}s] {e:.4g} "
                      f"({e / self.baseline:.1f}x) {family} {params}")
        return e


def _refine(best: dict, consider, bound: float, seed: int) -> None:
    """A seeded (1+1) evolution strategy on direct perturbations of the best V.

    The move is a shift of whole V columns (a random subset, N(0, sigma) each),
    clamped to [-bound, bound]: it keeps the structure that makes the rounding errors
    coherent across keys and moves each column's exact output along the rounding
    grid of the output format. sigma follows the 1/5th success rule. Runs until the
    caller's budget raises _Stop.
    """
    g = torch.Generator().manual_seed(seed + 7919)
    v0 = best["inputs"].v
    d = v0.shape[-1]
    shift = torch.zeros(d, dtype=torch.float64)
    sigma = bound * 2.0**-6
    e_cur = best["error"]
    while True:
        mask = (torch.rand(d, generator=g) < 0.25).to(torch.float64)
        step = sigma * mask * torch.randn(d, generator=g, dtype=torch.float64)
        cand = shift + step
        inp = best["inputs"]
        inp = Inputs(inp.q, inp.k, (v0 + cand).clamp(-bound, bound), inp.causal, inp.name,
                     inp.params, inp.scale, inp.seed, inp.block_n)
        params = {**best["params"], "v_column_shift": cand.tolist()}
        e = consider(inp, best["family"], params)
        if e > e_cur:
            shift, e_cur, sigma = cand, e, sigma * 1.5
        else:
            sigma = max(sigma * 1.5**-0.25, bound * 2.0**-16)


def _verify(inp: Inputs, kw: dict, metric: str) -> dict:
    """The worst case's error against flashnum.reference's fp64 and certified methods."""
    return {m: evaluate(inp, kw, metric, reference=m) for m in ("fp64", "certified")}


def anatomy(inp: Inputs, engine_kw: dict) -> dict:
    """Where and why a case errs: the worst output element and the structure around it.

    Returns the worst (row, col), the exact and computed values and the error in ulps
    of the output format at the exact value; for that row: how many distinct logits
    and how many keys share the max, which key block holds the max, the share of
    softmax mass on keys whose logit is shared with another key (repeated logits:
    their P round alike, so their cast errors add up), and the share of that V
    column's entries with the majority sign.
    """
    res = attention(inp.q, inp.k, inp.v, causal=inp.causal, scale=inp.scale, **engine_kw)
    ref = reference_out(inp)
    err = (res.out - ref).abs()
    idx = tuple(int(t) for t in torch.unravel_index(err.flatten().argmax(), err.shape))
    *bh, i, c = idx
    s = dot_logits(inp.q[tuple(bh)][i : i + 1], inp.k[tuple(bh)], inp.softmax_scale)[0]
    p = elementary.exp(s - s.max())
    vals, inverse, counts = torch.unique(s, return_inverse=True, return_counts=True)
    fmt = make_policy(engine_kw["policy"], engine_kw["precision"]).fmt("out")
    x = ref[idx]
    vcol = inp.v[tuple(bh)][:, c]
    return dict(
        row=i, col=c, exact=float(x), computed=float(res.out[idx]),
        error=float(err[idx]), error_ulps=float(err[idx] / fmt.ulp(x)),
        distinct_logits=int(vals.numel()), keys_at_max=int((s == s.max()).sum()),
        max_key_block=int(s.argmax()) // engine_kw["block_n"],
        repeated_mass=float(rowsum(p[counts[inverse] >= 2], "fp64") / rowsum(p, "fp64")),
        v_col_same_sign=float(max((vcol > 0).double().mean(), (vcol < 0).double().mean())),
    )


# -- saving and replaying -------------------------------------------------------------


def _case_id(res: SearchResult) -> str:
    h = hashlib.sha256()
    for t in res.inputs.tensors():
        h.update(t.contiguous().numpy().tobytes())
    c = res.config
    return f"{c['policy']}_{c['precision']}_n{c['seq_len']}_d{c['head_dim']}_{h.hexdigest()[:12]}"


def save_worst(res: SearchResult, where: str | Path = DEFAULT_DIR) -> Path:
    """Save the worst inputs and their errors (flashnum.inputs.io); a directory gets <id>.pt."""
    path = Path(where)
    if path.suffix != ".pt":
        path = path / f"{_case_id(res)}.pt"
    inp = res.inputs
    meta = dict(causal=inp.causal, scale=inp.scale, name=res.family, params=res.params,
                seed=inp.seed, block_n=inp.block_n,
                summary={k: v for k, v in res.summary().items() if k != "path"})
    return save_inputs(path, dict(q=inp.q, k=inp.k, v=inp.v), meta)


def load_worst(path: str | Path) -> Inputs:
    """The saved worst inputs as an Inputs (name and params of the family they came from)."""
    t, m = load_inputs(path)
    return Inputs(t["q"], t["k"], t["v"], m["causal"], m["name"], dict(m["params"]), m["scale"],
                  m["seed"], m["block_n"])


def replay(path: str | Path, reference: str = "torch64") -> dict:
    """Recompute the saved case's error from its tensors and configuration."""
    s = load_inputs(path)[1]["summary"]
    c = s["config"]
    kw = _engine_kw(c["policy"], c["precision"], c["block_m"], c["block_n"], c["order"],
                    c["variant"])
    e = evaluate(load_worst(path), kw, c["metric"], reference)
    return dict(error=e, saved_error=s["error"], baseline=s["baseline"], ratio=e / s["baseline"])
