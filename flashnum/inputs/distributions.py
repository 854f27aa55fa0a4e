"""The adversarial catalogue: named, seeded generators of Q, K, V.

Each distribution stresses one failure mode of the online softmax; its docstring
says which, where the idea comes from, and which property it guarantees (the
tests check every such claim).

    from flashnum.inputs.distributions import make, DISTRIBUTIONS, describe, params
    inp = make("late_max", seq_len_q=1024, head_dim=64, block_n=64, seed=0, gap=4.0)
    inp.q, inp.k, inp.v        # float64, (batch, heads, N, d)
    inp.causal, inp.scale      # scale None means 1/sqrt(d)
    inp.params                 # every parameter as resolved (defaults filled in)
    logits(inp)                # (batch, heads, Nq, Nk) fp64 scaled logits, -inf where masked

The generators live in modules named for what they stress; this one holds the registry
and make():

    draws            Inputs, Shape, the seeded generator, grids (COMMON), dot_logits, logits
    statistical      gaussian fa3_outliers scaled heavy_tail outlier_channels low_rank masked
    logit_structured late_max early_max ramp sink near_overflow underflow (the bias channel)
    repeated_keys    ties flat cancellation plateau structured
    replayed         worst_case captured (from a file; check_memory)

Reproducibility: the same (name, seed, shape, params) gives bitwise identical tensors in
every process (flashnum.inputs.draws says how). Grids: `grid=` rounds Q, K, V at the end
of generation ("none", a format name, or "common": see flashnum.inputs.draws).

Logit-structured distributions (late_max, ramp, early_max, sink, near_overflow,
underflow) are built with a *bias channel* (flashnum.inputs.logit_structured): a key bias
c * w_j on top of a random logit, raised until the property holds with a margin that
survives every policy's logit rounding.

Masking: -inf logits arise only from the causal mask (masked, flashnum.inputs.statistical).
"""

from __future__ import annotations

import inspect

import torch

from flashnum.inputs.capture_file import file_sha256
from flashnum.inputs.draws import Inputs, Shape, _check, _grid, _seed_of, logits  # noqa: F401
from flashnum.inputs.logit_structured import (
    early_max,
    late_max,
    near_overflow,
    ramp,
    sink,
    underflow,
)
from flashnum.inputs.repeated_keys import cancellation, flat, plateau, structured, ties
from flashnum.inputs.replayed import captured, check_memory, worst_case
from flashnum.inputs.statistical import (
    fa3_outliers,
    gaussian,
    heavy_tail,
    low_rank,
    masked,
    outlier_channels,
    scaled,
)

# (1) Inputs and logits, what make() gives and how to read it, are imported from here too
# (docs/distributions.md)

# replayed from a file, not drawn: outside the catalogue that studies and screens loop over
FROM_FILE = ("worst_case", "captured")


DISTRIBUTIONS = {
    f.__name__: f
    for f in (
        gaussian, fa3_outliers, scaled, late_max, ramp, early_max, ties, sink, flat,
        near_overflow, heavy_tail, outlier_channels, low_rank, cancellation, masked,
        underflow, plateau, structured, worst_case, captured,
    )
}


def captured_case(params: dict, seed: int, *, block_m: int | None = None,
                  block_n: int | None = None, backward: bool = False) -> tuple[dict, dict]:
    """(params with the file's sha256, the shape and causal flag its inputs have).

    What the harness needs to name a captured case: its content, not just its path. The
    file is checked (flashnum.inputs.capture_file) and the case's memory estimated
    (check_memory, with the case's blocks) before the file is hashed or read: a bad file
    or a case too large for the machine is one ValueError.
    """
    p = {**params}
    _check(bool(p.get("path")), "distribution captured needs path=<file written by "
           "flashnum.capture> (distribution.path=FILE)")
    check_memory(p["path"], p.get("call", 0), p.get("head_ids"), p.get("rows"),
                 block_m=block_m, block_n=block_n, backward=backward)
    digest = file_sha256(p["path"])
    if p.get("sha256") and p["sha256"] != digest:
        raise ValueError(f"{p['path']} has changed: its sha256 is no longer {p['sha256']}")
    p["sha256"] = digest
    key = (repr(sorted(p.items())), seed)  # a grid names one call in many cases: load it once
    if key not in _CAPTURED_SHAPES:
        inp = make("captured", seed=seed, **p)
        b, h, nq, d = inp.q.shape
        _CAPTURED_SHAPES[key] = dict(batch=b, heads=h, seq_len_q=nq, seq_len_k=inp.k.shape[-2],
                                     head_dim=d, causal=inp.causal)
    return p, dict(_CAPTURED_SHAPES[key])


_CAPTURED_SHAPES: dict = {}


def _get(name: str):
    if name not in DISTRIBUTIONS:
        raise ValueError(f"unknown distribution {name!r}; valid: {', '.join(DISTRIBUTIONS)}")
    return DISTRIBUTIONS[name]


def describe(name: str) -> str:
    """The docstring of a distribution: what it stresses and where the idea comes from."""
    return inspect.getdoc(_get(name)) or ""


def params(name: str) -> dict:
    """The default parameters of a distribution."""
    sig = inspect.signature(_get(name))
    return {p.name: p.default for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY}


def _check_int(name, x, lo=1):
    if isinstance(x, bool) or not isinstance(x, int) or x < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {x!r}")


def make(name: str, *, batch: int = 1, heads: int = 1, seq_len_q: int = 256,
         seq_len_k: int | None = None, head_dim: int = 64, seed: int = 0, block_n: int = 64,
         **kw) -> Inputs:
    """Draw Q, K, V (float64, (batch, heads, N, d)) from the named distribution."""
    fn = _get(name)
    defaults = params(name)
    bad = sorted(set(kw) - set(defaults))
    if bad:
        raise ValueError(
            f"unknown parameter(s) {', '.join(bad)} for distribution {name!r}; "
            f"valid: {', '.join(defaults) or '(none)'}"
        )
    for key, val in (("batch", batch), ("heads", heads), ("seq_len_q", seq_len_q),
                     ("head_dim", head_dim), ("block_n", block_n)):
        _check_int(key, val)
    if seq_len_k is not None:
        _check_int("seq_len_k", seq_len_k)
    _check_int("seed", seed, lo=0)
    if "grid" in kw:
        _grid(kw["grid"])  # a clear error before any work
    sh = Shape(batch, heads, seq_len_q, seq_len_k or seq_len_q, head_dim, block_n,
               nk_given=seq_len_k is not None)
    g = torch.Generator().manual_seed(_seed_of(name, seed))
    out = fn(g, sh, **kw)
    resolved = {**defaults, **kw, **out.get("params", {})}
    return Inputs(
        q=out["q"], k=out["k"], v=out["v"], causal=bool(out.get("causal", False)), name=name,
        params=resolved, scale=out.get("scale"), seed=seed, block_n=block_n, do=out.get("do"),
    )
