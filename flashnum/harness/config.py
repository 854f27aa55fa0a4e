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
                max_ascending max_descending
    backend     emulate triton mp (mp_bits for mp)
    distribution  name and params, one of flashnum.inputs.distributions.DISTRIBUTIONS
    shape       batch heads seq_len_q seq_len_k (null: seq_len_q) head_dim
    variant     fa2 fa1 exp2 lazy (tau) qiu_yao (beta); rounding nearest stochastic
    grid        a list of slices; each slice maps axes to lists of values (see
                flashnum.harness.grid.AXES); the grid is the union of the slices' products
    shard / num_shards   run only the cases whose hash is shard mod num_shards
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore


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
    m_exact: bool = True  # emulate: final m == max of engine.logits, bit for bit
    naive_ratio: bool = True  # also run standard attention in the precision
    bound: bool = True  # flashnum.analysis.bounds.bound for every case
    bound_prob: bool = True  # and its probabilistic bound (Higham & Mary)


@dataclass
class StoreConf:
    root: str = "experiments"  # relative paths resolve against the launch directory


@dataclass
class Config:
    experiment: str = "single"
    description: str = ""
    precision: PrecisionConf = field(default_factory=PrecisionConf)
    policy: PolicyConf = field(default_factory=PolicyConf)
    tiling: TilingConf = field(default_factory=TilingConf)
    backend: BackendConf = field(default_factory=BackendConf)
    distribution: DistributionConf = field(default_factory=DistributionConf)
    shape: ShapeConf = field(default_factory=ShapeConf)
    variant: str = "fa2"
    tau: float = 8.0
    beta: float = 2.0
    rounding: str = "nearest"
    causal: bool = False
    seed: int = 0
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


def register() -> None:
    """Put the schema into Hydra's ConfigStore (idempotent)."""
    ConfigStore.instance().store(name="flashnum_schema", node=Config)


def _choices(valid) -> str:
    return ", ".join(str(v) for v in valid)


def check_format(what: str, name, site: bool = False) -> None:
    """A precision (fp64 ... mp, p<bits>) or, with site=True, a site's format (no mp)."""
    from flashnum.numerics.formats import FORMAT_NAMES, PRECISIONS, get_format

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


def check(cfg) -> None:
    """Every constraint the dataclass types cannot state; raises one clear ValueError."""
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
    if cfg.reference.certified_max_logits < 0:
        raise ValueError("reference.certified_max_logits must be >= 0")
    # the case axes themselves are checked where every case is built (flashnum.harness.grid)
    from flashnum.harness.grid import base_case, check_case

    check_case(base_case(cfg), where="config")


register()  # importing the schema makes it composable (hydra's compose API, the runner)
