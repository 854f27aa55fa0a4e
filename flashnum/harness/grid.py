"""An experiment's grid: from the composed config to a list of cases.

A *case* is one point of a sweep: distribution + params + shape +
precision + policy + tiling + variant + backend + causal + seed (+ num_splits and
split_precision for split-KV decoding). Its `case_id` is the first 16 hex digits of
sha256 of the case as canonical JSON (sorted keys, no spaces), so it is the same on
every machine and in every process, and names the case in the results table, in
resume and in sharding. The fields in OPTIONAL enter the JSON only when not at their
defaults, so the cases of tables stored before those fields existed keep their ids.

The grid is a list of *slices*. A slice maps axes to lists of values; its cases
are the product of those lists, every other axis taken from the config's single
case (precision=, policy=, tiling=, distribution=, shape=, ...). The grid is
the union of its slices, in order, each case once. `zip` ties axes together:
`zip: [{block_m: 32, block_n: 32}, {block_m: 128, block_n: 64}]`. A slice with
`search: {...}` (flashnum.inputs.search.worst_case arguments, over the config's
`search:`) makes search cases: their inputs are the worst the search finds
(distribution "worst_case", the search's settings as its params). A captured case
(distribution captured, flashnum.capture's file) takes its shape and causal flag from
the call it names and carries the file's sha256 in its params, so a changed capture is
a different case.

    grid:
      - name: broad                       # a label, not an axis
        policy: [fa2, naive, lowp]
        block_n: [16, 32, 64, 128]
        seq_len_k: [256, 1024]
        distribution: [gaussian, {name: late_max, params: {gap: 8.0}}]

Canonical form (so that one computation has one case_id): axes that cannot
change the result are set to fixed values: tau and beta unless the variant takes
them (its fields in flashnum.engine.variants: lazy tau, qiu_yao beta), mp_bits unless
the backend is mp, split_precision unless num_splits > 1, the tiling of standard
attention on the emulator (policy naive: no blocks, so block_m, block_n and order take
the config's defaults), the policy of precision mp (the mp recurrence has none:
"exact"). seq_len_k null means seq_len_q; `seq_len` sets both.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from omegaconf import OmegaConf

from flashnum.engine.variants import PARAMS as VARIANT_PARAMS
from flashnum.engine.variants import VARIANTS as VARIANT_CLASSES
from flashnum.engine.variants import Variant, variant_of
from flashnum.harness.config import base_case, check_case, plain, set_variant
from flashnum.inputs.distributions import captured_case, params
from flashnum.store.paths import CONF  # conf/ of the checkout, flashnum/conf/ when installed


@dataclass(frozen=True)
class Case:
    distribution: str
    dist_params: str  # canonical JSON of the distribution's parameters
    batch: int
    heads: int
    seq_len_q: int
    seq_len_k: int
    head_dim: int
    precision: str
    policy: str
    policy_sites: str  # canonical JSON of per-site format overrides, "{}" for none
    block_m: int
    block_n: int
    order: str
    variant: str
    tau: float
    beta: float
    rounding: str
    backend: str
    mp_bits: int
    causal: bool
    seed: int
    # split-KV decoding (flashnum.engine.splitkv); OPTIONAL: hashed and stored only when
    # not at their defaults, so that every case without them keeps its case_id
    num_splits: int = 1
    split_precision: str = "fp32"
    # the causal mask's alignment (flashnum.numerics.tiling): config `causal: top_left`
    causal_align: str = "bottom_right"
    # the variant's parameters beyond tau and beta (which are axes of their own since the
    # first tables), canonical JSON of those away from the variant's defaults: a variant
    # given a new parameter in flashnum.engine.variants is swept with no change here
    variant_params: str = "{}"

    @functools.cached_property
    def case_id(self) -> str:
        # hashed once per case: expand, select and the store ask for it many times
        return case_id(self)

    @property
    def params(self) -> dict:
        return json.loads(self.dist_params)

    @property
    def variant_object(self) -> Variant:
        """The variant with all its parameters: what attention and the bound are given."""
        return variant_of(self.variant, tau=self.tau, beta=self.beta,
                          **json.loads(self.variant_params))

    @property
    def sites(self) -> dict:
        return json.loads(self.policy_sites)

    @property
    def is_search(self) -> bool:
        """A worst_case search case (its inputs come from flashnum.inputs.search)."""
        return self.distribution == "worst_case" and '"search"' in self.dist_params

    def input_key(self) -> tuple:
        """Cases with the same key draw their inputs from one make() call per block_n."""
        return (self.distribution, self.dist_params, self.batch, self.heads, self.seq_len_q,
                self.seq_len_k, self.head_dim, self.seed)


# fields added after tables were stored: (name, default). A case at every default hashes
# and stores as it did before they existed (tests/test_grid_fields.py checks the shipped
# tables); an experiment that sets one stores its column in every row (columns()).
OPTIONAL = {"num_splits": 1, "split_precision": "fp32", "causal_align": "bottom_right",
            "variant_params": "{}"}
CASE_FIELDS = tuple(f.name for f in fields(Case) if f.name not in OPTIONAL)
# axes a slice may sweep: every case field but the two JSON ones, and these helpers
AXES = tuple(f for f in CASE_FIELDS if f not in ("dist_params", "policy_sites")) + (
    *(k for k in OPTIONAL if k != "variant_params"), "seq_len", "policy_sites", "zip",
)
_INT = ("batch", "heads", "seq_len_q", "seq_len_k", "head_dim", "block_m", "block_n",
        "mp_bits", "seed", "num_splits")
_FLOAT = ("tau", "beta")


def canonical_json(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False)


def hash_id(obj, spaced: bool = False) -> str:
    """The one case-id function of every table: 16 hex digits of sha256 over `obj` as JSON
    with sorted keys. canonical_json (no spaces, NaN refused) by default; spaced=True:
    json.dumps' own ", " and ": " separators (anything JSON lacks as its str()), with which
    the backward's, the reproductions' and the head statistics' tables were keyed, so
    that their stored rows keep their ids."""
    text = json.dumps(obj, sort_keys=True, default=str) if spaced else canonical_json(obj)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def case_id(case: Case) -> str:
    d = {k: v for k, v in asdict(case).items() if k not in OPTIONAL or v != OPTIONAL[k]}
    return hash_id(d)


def columns(cases) -> tuple[str, ...]:
    """The case fields a results table of these cases carries: CASE_FIELDS, and each
    optional field that some case sets away from its default."""
    extra = tuple(k for k, v in OPTIONAL.items() if any(getattr(c, k) != v for c in cases))
    return CASE_FIELDS + extra


def in_shard(cid: str, shard: int, num_shards: int) -> bool:
    """Shards split the grid by case hash: balanced, and stable when the grid grows."""
    return int(cid, 16) % num_shards == shard


def distribution_params(name: str, conf_dir: Path = CONF) -> dict:
    """A distribution's parameters: the code's defaults, then conf/distribution/<name>.yaml."""
    return dict(_distribution_params(name, str(conf_dir)))


@functools.cache
def _distribution_params(name: str, conf_dir: str) -> dict:
    conf_dir = Path(conf_dir)
    out = dict(params(name))
    f = conf_dir / "distribution" / f"{name}.yaml"
    if f.exists():
        y = OmegaConf.to_container(OmegaConf.load(f), resolve=True) or {}
        out.update(y.get("params") or {})
    return out


def canonical(d: dict, base: dict, conf_dir: Path = CONF, search: dict | None = None) -> Case:
    """The Case a (checked) dict of axes names: defaults filled, inert axes fixed.

    With `search` (the worst_case experiment) the inputs are whatever the search
    finds: the case's distribution is "worst_case" and its params the search's settings.
    """
    d = dict(d)
    if search:
        dist_name, params = "worst_case", {"search": search}
    else:
        dist_name = d["distribution"]["name"]
        params = {**distribution_params(dist_name, conf_dir),
                  **(d["distribution"].get("params") or {})}
    if dist_name == "captured":  # the file names the case by content, and sets its shape
        params, shape = captured_case(params, int(d["seed"]), block_m=int(d["block_m"]),
                                      block_n=int(d["block_n"]))
        d.update(shape, causal=bool(d["causal"] or shape["causal"]))
    if d["seq_len_k"] is None:
        d["seq_len_k"] = d["seq_len_q"]
    for name in _FLOAT:  # a parameter the variant does not take: its fixed value
        if name not in VARIANT_CLASSES[d["variant"]].params():
            d[name] = VARIANT_PARAMS[name]
    d["variant_params"] = _variant_params(d["variant"], d.get("variant_params") or {})
    if d["precision"] == "mp":  # every operation at mp_bits: what `uniform` names
        d["backend"], d["policy"], d["policy_sites"] = "mp", "uniform", {}
    if d["backend"] != "mp":
        d["mp_bits"] = 256
    d = {**OPTIONAL, **d}
    if isinstance(d["causal"], str):  # an alignment: `causal: top_left` (or bottom_right)
        d["causal_align"], d["causal"] = d["causal"], True
    if not d["causal"]:  # no mask: its alignment is inert
        d["causal_align"] = OPTIONAL["causal_align"]
    if d["num_splits"] == 1:  # one split stores no partials: their precision is inert
        d["split_precision"] = OPTIONAL["split_precision"]
    if d["backend"] == "emulate" and d["policy"] == "naive":
        # standard attention forms S whole: the tiling does not exist for it
        d["block_m"], d["block_n"], d["order"] = base["block_m"], base["block_n"], "forward"
    kw = {k: d[k] for k in (*CASE_FIELDS, *OPTIONAL)
          if k not in ("distribution", "dist_params", "policy_sites")}
    for k in _INT:
        kw[k] = int(kw[k])
    for k in _FLOAT:
        kw[k] = float(kw[k])
    kw["causal"] = bool(kw["causal"])
    return Case(distribution=dist_name, dist_params=canonical_json(params),
                policy_sites=canonical_json(dict(d.get("policy_sites") or {})), **kw)


def _variant_params(name: str, given: dict) -> str:
    """The canonical JSON of a variant's other parameters: those at the variant's default
    left out, so that `{name: exp2, exp2_scale: once}` is the case `variant=exp2`."""
    default = VARIANT_CLASSES[name]()
    return canonical_json({k: x for k, x in sorted(given.items()) if k not in _FLOAT
                           and k in default.params() and x != getattr(default, k)})


def _set(d: dict, axis: str, value, where: str) -> None:
    if axis == "seq_len":
        d["seq_len_q"] = d["seq_len_k"] = value
    elif axis == "distribution":
        d["distribution"] = value if isinstance(value, dict) else {"name": value, "params": {}}
    elif axis == "variant" and isinstance(value, dict):  # {name: lazy, tau: 4}
        set_variant(d, value, where)
    elif axis == "zip":
        if not isinstance(value, dict):
            raise ValueError(f"zip entries must be mappings of axes, got {value!r} (in {where})")
        for k, v in value.items():
            if k not in AXES or k == "zip":
                raise ValueError(f"unknown axis {k!r} in zip (in {where}); valid: "
                                 f"{', '.join(a for a in AXES if a != 'zip')}")
            _set(d, k, v, where)
    else:
        d[axis] = value


def points(slices, axes, skip=("name",)):
    """The one grid expansion, of forward sweeps (expand) and backward sweeps
    (flashnum.harness.backward.expand): for each slice in turn (a mapping of axes to lists
    of values; a single value is a list of one), every combination of its lists, as
    (slice, where, [(axis, value), ...]). Keys in `skip` are no axes (a slice's name)."""
    for i, sl in enumerate(slices):
        if not isinstance(sl, dict):
            raise ValueError(f"grid slice {i} must be a mapping of axes to lists, got {sl!r}")
        where = f"grid slice {sl.get('name', i)!r}" if sl else "config"
        names, values = [], []
        for axis, vals in sl.items():
            if axis in skip:
                continue
            if axis not in axes:
                raise ValueError(f"unknown grid axis {axis!r} (in {where}); valid: "
                                 f"{', '.join(axes)}")
            vals = vals if isinstance(vals, list) else [vals]
            if not vals:
                raise ValueError(f"grid axis {axis!r} has no values (in {where})")
            names.append(axis)
            values.append(vals)
        for combo in itertools.product(*values):
            yield sl, where, list(zip(names, combo, strict=True))


def _search(cfg, sl: dict, where: str) -> dict | None:
    """A search slice's worst_case arguments over cfg.search, or None."""
    if "search" not in sl:
        return None
    extra = sl["search"]
    if not isinstance(extra, dict):
        raise ValueError(f"search must be a mapping of flashnum.inputs.search.worst_case "
                         f"arguments, got {extra!r} (in {where})")
    return {**(plain(cfg.search) or {}), **extra}


def expand(cfg, conf_dir: Path = CONF) -> list[Case]:
    """Every case of the config's grid (its single case when the grid is empty), in order,
    each once (by case_id)."""
    base = base_case(cfg)
    cases, seen = [], set()
    for sl, where, point in points(plain(cfg.grid) or [{}], AXES, skip=("name", "search")):
        search = _search(cfg, sl, where)
        d = dict(base)
        for axis, val in point:
            _set(d, axis, val, where)
        check_case(d, where, search=bool(search))
        case = canonical(d, base, conf_dir, search)
        if case.case_id not in seen:
            seen.add(case.case_id)
            cases.append(case)
    return cases


def select(cases: list[Case], shard: int = 0, num_shards: int = 1) -> list[Case]:
    return [c for c in cases if in_shard(c.case_id, shard, num_shards)]
