"""The configuration schema of `python -m flashnum.run`, and its checks.

One dataclass per config group (conf/<group>/*.yaml fills it), one `Config` for
the whole composed tree, registered in Hydra's ConfigStore as `flashnum_schema`
and named first in conf/config.yaml's defaults list. OmegaConf then rejects
unknown keys and values of the wrong type while composing; `check(cfg)` rejects
what types cannot say (a format that does not exist, block_n = 0, an unknown
distribution or grid axis) with one ValueError that names the bad value and
the valid choices.

    precision   formats: fp64 fp32 tf32 fp16 bf16 fp8_e4m3 fp8_e5m2 mp, or p<bits>
                (a p-bit significand with fp32's exponent range, 2 <= p <= 52)
    policy      preset fa2 naive lowp exact, or uniform (every site in the
                precision, dots included); `sites` overrides single sites
    tiling      block_m, block_n (positive), order: forward reverse random
                max_ascending max_descending partial_first
    backend     emulate triton mp (mp_bits for mp)
    distribution  name and params, one of flashnum.inputs.distributions.DISTRIBUTIONS;
                path, call, head_ids, rows: shorthands for params.* (distribution=captured)
    shape       batch heads seq_len_q seq_len_k (null: seq_len_q) head_dim
    variant     a name of flashnum.engine.variants.VARIANTS, with tau and beta its
                parameters where it takes them (lazy tau, qiu_yao beta), or the variant
                with its parameters, {name: lazy, tau: 4} (also as a grid value);
                rounding nearest stochastic
    num_splits, split_precision   split-KV decoding: the keys in num_splits chunks, each
                chunk's partial (o, lse) stored in split_precision, merged in fp32
    causal      false, true (= bottom_right: key j seen by query i iff j <= i + Nk - Nq),
                bottom_right, or top_left (j <= i, torch's is_causal); a top_left case
                stores its alignment in the column causal_align
    grid        a list of slices; each slice maps axes to lists of values (see
                flashnum.harness.grid.AXES); the grid is the union of the slices' products
    shard / num_shards   run only the cases whose hash is shard mod num_shards
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, ListConfig, OmegaConf

from flashnum.engine import BACKENDS, VARIANTS
from flashnum.engine.variants import VARIANTS as VARIANT_CLASSES
from flashnum.engine.variants import variant_of
from flashnum.inputs import distributions as dist
from flashnum.numerics.formats import FORMAT_NAMES, PRECISIONS, ROUNDINGS, get_format
from flashnum.numerics.policy import POLICIES, SITES
from flashnum.numerics.tiling import ALIGNMENTS, ORDERS


@dataclass
class PrecisionConf:
    name: str = "bf16"


@dataclass
class PolicyConf:
    name: str = "fa2"
    sites: dict[str, str] = field(default_factory=dict)


@dataclass
class TilingConf:
    block_m: int = 64
    block_n: int = 64
    order: str = "forward"


@dataclass
class BackendConf:
    name: str = "emulate"
    mp_bits: int = 256


@dataclass
class DistributionConf:
    name: str = "gaussian"
    params: dict[str, Any] = field(default_factory=dict)
    # shorthands for a file's inputs (captured): distribution.path=FILE sets params.path;
    # null leaves params as they are
    path: str | None = None
    call: int | None = None
    head_ids: list[int] | None = None
    rows: int | None = None


SHORTHANDS = ("path", "call", "head_ids", "rows")


@dataclass
class ShapeConf:
    batch: int = 1
    heads: int = 1
    seq_len_q: int = 128
    seq_len_k: int | None = None
    head_dim: int = 64


@dataclass
class ReferenceConf:
    # "certified" (python-flint, rigorous) while batch*heads*Nq*Nk <= this, else "fp64"
    certified_max_logits: int = 65536
    bits: int = 256
    # a row's reference is trusted when its err_bound <= ratio * the error measured
    ok_ratio: float = 0.01


@dataclass
class ChecksConf:
    trace: bool = True  # trace the emulated state: m must never decrease
    naive_ratio: bool = True  # also run standard attention in the precision
    bound: bool = True  # flashnum.analysis.bounds.bound for every case
    bound_prob: bool = True  # and its probabilistic bound (Higham & Mary)


@dataclass
class StoreConf:
    root: str = "experiments"  # relative paths resolve against the launch directory


@dataclass
class Config:
    experiment: str = "single"  # the table's name: set from experiment=NAME, or name=
    name: str | None = None  # an ad-hoc sweep's table (default: the experiment's, or single)
    description: str = ""
    kind: str = "forward"  # every experiment YAML says which runner it is (harness.experiments)
    precision: PrecisionConf = field(default_factory=PrecisionConf)
    policy: PolicyConf = field(default_factory=PolicyConf)
    tiling: TilingConf = field(default_factory=TilingConf)
    backend: BackendConf = field(default_factory=BackendConf)
    distribution: DistributionConf = field(default_factory=DistributionConf)
    shape: ShapeConf = field(default_factory=ShapeConf)
    variant: Any = "fa2"  # a name, or {name: lazy, tau: 4}: the variant with its parameters
    tau: float = 8.0
    beta: float = 2.0
    rounding: str = "nearest"
    causal: Any = False  # false, true (= bottom_right), bottom_right or top_left
    seed: int = 0
    num_splits: int = 1  # split-KV decoding (flashnum.engine.splitkv): key chunks merged by lse
    split_precision: str = "fp32"  # the format the partial (o, lse) of each split are stored in
    grid: list[dict[str, Any]] = field(default_factory=list)
    search: dict[str, Any] = field(default_factory=dict)
    reference: ReferenceConf = field(default_factory=ReferenceConf)
    checks: ChecksConf = field(default_factory=ChecksConf)
    store: StoreConf = field(default_factory=StoreConf)
    recompute: bool = False
    shard: int = 0
    num_shards: int = 1
    n_jobs: int = 0  # 0: every core this process may use; 1: in-process, no pool
    progress: bool = True
    dry_run: bool = False  # expand the grid, print its size, run nothing
    max_cases: int | None = None  # first n cases of the (sharded) grid
    worst: int = 8  # how many worst cases the summary lists
    # a store root (e.g. experiments): after the run, compare the rows computed now with the
    # rows stored there (flashnum.store.compare); exit status 1 if any differ
    compare_with: str | None = None


def register() -> None:
    """Put the schema into Hydra's ConfigStore (idempotent)."""
    ConfigStore.instance().store(name="flashnum_schema", node=Config)


def _choices(valid) -> str:
    return ", ".join(str(v) for v in valid)


def check_format(what: str, name, site: bool = False) -> None:
    """A precision (fp64 ... mp, p<bits>) or, with site=True, a site's format (no mp)."""
    ok = isinstance(name, str) and not (site and name.startswith("mp"))
    if ok:
        try:
            get_format(name)
        except ValueError:
            ok = False
    if not ok or (name == "exact" and not site):
        valid = FORMAT_NAMES if site else PRECISIONS
        raise ValueError(f"unknown {what} {name!r}; valid: {_choices(valid)}, or p<bits> (2..52)")


def check_choice(what: str, value, valid) -> None:
    if value not in valid:
        raise ValueError(f"unknown {what} {value!r}; valid: {_choices(valid)}")


def check_positive(what: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{what} must be a positive integer, got {value!r}; valid: 1, 2, ...")


def check_name(name) -> None:
    """A table's name is one folder under the store: letters, digits, _ - and ."""
    if not (isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", name)):
        raise ValueError(f"bad name {name!r}: a table's name is one folder name; valid: "
                         f"letters, digits, _ - . (e.g. name=my_sweep)")


def check(cfg) -> None:
    """Every constraint the dataclass types cannot state; raises one clear ValueError."""
    if cfg.kind != "forward":  # this schema is the forward sweep's; the router sends others
        raise ValueError(f"kind {cfg.kind!r} is not a forward sweep; valid: forward (other "
                         f"kinds run through python -m flashnum.run experiment=NAME)")
    if cfg.num_shards < 1:
        check_positive("num_shards", cfg.num_shards)
    if not 0 <= cfg.shard < cfg.num_shards:
        raise ValueError(
            f"shard {cfg.shard} is not in range(num_shards={cfg.num_shards}); "
            f"valid: 0..{cfg.num_shards - 1}"
        )
    if cfg.n_jobs < 0:
        raise ValueError(f"n_jobs must be >= 0, got {cfg.n_jobs}; valid: 0 (all cores), 1, 2, ...")
    if cfg.max_cases is not None and cfg.max_cases < 0:
        raise ValueError(f"max_cases must be >= 0 or null, got {cfg.max_cases}")
    if cfg.get("compare_with") is not None and cfg.compare_with == cfg.store.root:
        raise ValueError(f"compare_with={cfg.compare_with} is the store this run writes to; "
                         "valid: another store root (e.g. store.root=scratch)")
    if cfg.get("name") is not None:
        check_name(cfg.name)
    if cfg.reference.certified_max_logits < 0:
        raise ValueError("reference.certified_max_logits must be >= 0")
    # the case axes; every case of the grid is checked the same way (flashnum.harness.grid)
    check_case(base_case(cfg), where="config")


def plain(x):
    """A config node as plain Python (dicts, lists), anything else as it is."""
    if isinstance(x, (DictConfig, ListConfig)):
        return OmegaConf.to_container(x, resolve=True)
    return x


def set_variant(d: dict, value: dict, where: str) -> None:
    """A variant written with its parameters, `{name: lazy, tau: 4}`: the case's variant
    axis and its parameter axes (the same case, and case id, as `variant=lazy tau=4`)."""
    name = value.get("name")
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}; valid: {', '.join(VARIANTS)} "
                         f"(in {where})")
    takes = VARIANT_CLASSES[name].params()
    bad = sorted(set(value) - {"name", *takes})
    if bad:
        raise ValueError(f"unknown parameter {bad[0]!r} of variant {name!r}; valid: "
                         f"{', '.join(takes) or '(none)'} (in {where})")
    given = {k: v for k, v in value.items() if k != "name"}
    try:  # the variant checks its own parameters (a tau < 0, an unknown exp2_scale)
        variant_of(name, **given)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{e} (in {where})") from None
    d["variant"] = name
    # tau and beta are axes of their own; every other parameter travels in variant_params
    d.update({k: v for k, v in given.items() if k in ("tau", "beta")})
    d["variant_params"] = {k: v for k, v in given.items() if k not in ("tau", "beta")}


def base_case(cfg) -> dict:
    """The config's single case, as a dict of axes (not yet canonical)."""
    d = dict(
        distribution={"name": cfg.distribution.name, "params": {
            **(plain(cfg.distribution.params) or {}),
            **{k: plain(cfg.distribution.get(k)) for k in SHORTHANDS
               if cfg.distribution.get(k) is not None}}},
        batch=cfg.shape.batch, heads=cfg.shape.heads, seq_len_q=cfg.shape.seq_len_q,
        seq_len_k=cfg.shape.seq_len_k, head_dim=cfg.shape.head_dim,
        precision=cfg.precision.name, policy=cfg.policy.name,
        policy_sites=plain(cfg.policy.sites), block_m=cfg.tiling.block_m,
        block_n=cfg.tiling.block_n, order=cfg.tiling.order, variant=plain(cfg.variant),
        tau=cfg.tau,
        beta=cfg.beta, rounding=cfg.rounding, backend=cfg.backend.name,
        mp_bits=cfg.backend.mp_bits, causal=cfg.causal, seed=cfg.seed,
        num_splits=cfg.num_splits, split_precision=cfg.split_precision,
    )
    if isinstance(d["variant"], dict):  # `variant: {name: lazy, tau: 4}`
        set_variant(d, d["variant"], "config")
    return d


def check_case(d: dict, where: str = "grid", search: bool = False) -> None:
    """Raise one ValueError naming the first bad axis value of a case dict, and the choices."""
    def at(msg):
        return f"{msg} (in {where})"

    try:
        if search:  # the search makes its own inputs
            d = {**d, "distribution": {"name": "gaussian", "params": {}}}
        name = d["distribution"]["name"] if isinstance(d["distribution"], dict) else None
        if not isinstance(name, str):
            raise ValueError(f"distribution must be a name or {{name:, params:}}, got "
                             f"{d['distribution']!r}")
        check_choice("distribution", name, tuple(dist.DISTRIBUTIONS))
        given = d["distribution"].get("params") or {}
        valid = dist.params(name)
        bad = sorted(set(given) - set(valid))
        if bad:
            raise ValueError(f"unknown parameter(s) {', '.join(bad)} of distribution {name!r}; "
                             f"valid: {', '.join(valid) or '(none)'}")
        check_format("precision", d["precision"])
        check_choice("policy", d["policy"], POLICIES)
        sites = d.get("policy_sites") or {}
        if not isinstance(sites, dict):
            raise ValueError(f"policy_sites must be a mapping site -> format, got {sites!r}")
        for site, fmt in sites.items():
            check_choice("policy site", site, SITES)
            check_format(f"format for site {site}", fmt, site=True)
        for key in ("block_m", "block_n", "batch", "heads", "seq_len_q", "head_dim"):
            check_positive(key, d[key])
        if d["seq_len_k"] is not None:
            check_positive("seq_len_k", d["seq_len_k"])
        check_positive("num_splits", d.get("num_splits", 1))
        check_format("split_precision", d.get("split_precision", "fp32"), site=True)
        check_choice("order", d["order"], ORDERS)
        check_choice("variant", d["variant"], VARIANTS)
        check_choice("rounding", d["rounding"], ROUNDINGS)
        check_choice("backend", d["backend"], BACKENDS)
        if isinstance(d["mp_bits"], bool) or not isinstance(d["mp_bits"], int) or d["mp_bits"] < 2:
            raise ValueError(f"mp_bits must be an integer >= 2, got {d['mp_bits']!r}")
        if isinstance(d["seed"], bool) or not isinstance(d["seed"], int) or d["seed"] < 0:
            raise ValueError(f"seed must be an integer >= 0, got {d['seed']!r}")
        if not isinstance(d["causal"], bool) and d["causal"] not in ALIGNMENTS:
            raise ValueError(f"causal must be true or false, or an alignment "
                             f"{' or '.join(ALIGNMENTS)}, got {d['causal']!r}")
        for key in ("tau", "beta"):
            if isinstance(d[key], bool) or not isinstance(d[key], (int, float)):
                raise ValueError(f"{key} must be a number, got {d[key]!r}")
    except ValueError as e:
        raise ValueError(at(str(e))) from None


register()  # importing the schema makes it composable (hydra's compose API, the runner)
