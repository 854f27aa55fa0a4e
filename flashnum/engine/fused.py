"""The fused forward: every (batch, head, query block) through its key blocks in one C loop.

    from flashnum.engine.fused import fused_forward
    out = fused_forward(run, tiles, perm, scale_s, causal, variant, trace)  # None: not claimed
    states, traces = out if out is not None else run_in_place(...)

The in-place path (flashnum.engine.fast) runs each key block over every query row at once:
every tile goes through memory between the GEMM, the exp, the row sum and the state update.
Here flashnum.engine.native's `fn_fused_forward` runs one job (a few query blocks of one
head) through all its key blocks while its tiles stay in cache, on torch's OpenMP threads
over (batch, head, query blocks). It performs the in-place path's operations in its
order, so it changes no bit of any result:

  - the two tile GEMMs are flashnum.numerics.accumulate's chains (each dot one FMA chain
    over k from +0), compiled into the loop from accumulate.c on the path accumulate.isa()
    names: on AVX-512 (`fn_fused_forward_v4`) a panel of rows goes through S, P and the O
    update while it is in the first-level cache; on AVX2 and scalar the GEMMs go through
    memory (`fn_fused_forward`); all three give the same bits;
  - the exp is native.c's correctly rounded exp_round, the exp site's own kernel;
  - the row sum of P is accumulate.c's cascade (accumulate.rowsum's order);
  - every fp32 operation is the one IEEE operation the steps perform (-ffp-contract=off).

`claim` is the one place that decides what the fused path runs: fa2, exp2 and lazy on the
fp32 carrier with fp32 GEMM accumulators or tf32 dots (operands rounded to tf32, as
Arith.dot does: Q, K, V once, P in the loop), any key order, causal or not, with or
without a trace, and either every large-tensor site fp32 (fast.in_place_ok) with P cast
to fp32, bf16, fp16 or p<bits> (a p-bit significand with fp32's range, rounded on the
bits), or (lowp) s, m, P, its cast, l and o all bf16 or all fp16 with l_acc fp32.
There every value is rounded where recurrence.fa2_step rounds it (native.c's `site`),
and the exp site is the float64 exp rounded once into the format, checked once per
format against Arith.exp on all 2^16 inputs it can meet (`_exp_agrees`).
Anything else, or no compiler, or FLASHNUM_FUSED=0, goes to the torch path.
tests/test_fused.py checks the two bit for bit over the shipped experiments' grids.
"""

from __future__ import annotations

import ctypes
import functools
import os

import torch

from flashnum.engine import native
from flashnum.engine.fast import in_place_ok
from flashnum.engine.recurrence import Run, State
from flashnum.engine.tiles import Tiles, is_fp32
from flashnum.engine.variants import Variant, variant_of
from flashnum.numerics import accumulate
from flashnum.numerics.floats import Format
from flashnum.numerics.formats import EXACT, FORMATS
from flashnum.numerics.policy import PRODUCT_SITES
from flashnum.numerics.tiling import visible_count

# the running-max rules the C loop performs (flashnum.engine.variants: fa2, exp2, lazy)
MAX_RULES = ("max", "lazy")
CASTS = {"fp32": 0, "bf16": 1, "fp16": 2}  # P casts it rounds itself (native.c)
SITES = {"bf16": 1, "fp16": 2}  # one narrow format at every softmax site (lowp; native.c)
ROWS = 256  # query rows per job when every query block shares the key order (tall)

_enabled = os.environ.get("FLASHNUM_FUSED", "1") != "0"


class _Job(ctypes.Structure):
    """native.c's fused_job."""

    _fields_ = (
        [("isa", ctypes.c_int)]
        + [(n, ctypes.c_void_p) for n in ("q", "k", "v", "perm", "vis")]
        + [(n, ctypes.c_int64) for n in ("B", "n_qb", "bm", "g", "n_kb", "bn", "d", "dv",
                                         "perm_b")]
        + [("scale", ctypes.c_float), ("tau", ctypes.c_float)]
        + [(n, ctypes.c_int) for n in ("lazy", "base2", "cast", "l_from_cast")]
        + [(n, ctypes.c_void_p) for n in ("m", "l", "o", "m_tr", "l_tr", "n_resc", "kt")]
        + [(n, ctypes.c_int) for n in ("sites", "cast_drop", "dot_drop")])


def set_enabled(flag: bool) -> None:
    """Turn the fused path on or off for this process (tests and benchmarks compare)."""
    global _enabled
    _enabled = bool(flag)


def status() -> str:
    """One line: whether the fused loop can run in this process, and if not why."""
    if not _enabled:
        return "off (disabled)"
    if not native.available() or accumulate.isa() == "torch":
        return f"off (native: {native.status()}; accumulate: {accumulate.status()})"
    return f"on (flashnum.engine.fused, {accumulate.isa()})"


def _sites(ar) -> int | None:
    """native.c's F: 0 when s, m, p, l_acc, l and o are fp32 (fa2's softmax state); 1 or 2
    when s, m, p, P's cast, l and o are all bf16 or all fp16 and l_acc fp32 (lowp, every
    site rounded on the fp32 carrier); None otherwise."""
    if ar.dtype is not torch.float32 or ar.stochastic:
        return None
    if in_place_ok(ar):
        return 0
    f = ar.fmt("s")
    if (getattr(f, "name", None) in SITES and not f.saturate and is_fp32(ar.fmt("l_acc"))
            and all(ar.fmt(x) == f for x in ("m", "p", "p_cast", "l", "o"))):
        return SITES[f.name]
    return None


@functools.cache
def _exp_agrees(sites: int, base2: bool) -> bool:
    """Whether native.c's exp site into bf16 (fp16) gives Arith.exp's value (the float64 exp
    rounded once by Format.round) on every one of the format's 2^16 values: the exp's
    argument is rounded into that format first (the s - m and m_old - m sites), so this
    is every input it can meet."""
    from flashnum.engine.arith import Arith
    from flashnum.numerics.policy import make_policy

    name = {v: k for k, v in SITES.items()}[sites]
    codes = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16)
    x = (codes.view(torch.bfloat16) if name == "bf16" else codes.view(torch.float16)).float()
    pol = make_policy("lowp", name)
    want = Arith(pol, "nearest", 0, torch.float32).exp(x, pol.fmt("p"), base2)
    got = torch.empty_like(x)
    native.library().fn_exp_site(x.data_ptr(), got.data_ptr(), x.numel(), int(base2), sites)
    nan = torch.isnan(want)
    return torch.equal(nan, torch.isnan(got)) and torch.equal(
        want[~nan].view(torch.int32), got[~nan].view(torch.int32))


def _bits_dropped(f) -> int | None:
    """24 - p for a plain binary format with fp32's exponent range (p <= 24 bits: bf16,
    tf32, p<bits>): on the fp32 carrier Format.round into it drops the low 24 - p bits of
    the fp32 significand, nearest even, subnormals and overflow included (native.c's
    round_bits); None for any other format."""
    fp32 = FORMATS["fp32"]
    if type(f) is not Format or f.saturate or not f.has_inf or f.max_override is not None:
        return None
    return 24 - f.p if (f.p <= 24 and f.emin == fp32.emin and f.emax == fp32.emax) else None


def _cast(ar) -> tuple[int, int] | None:
    """native.c's (cast, cast_drop) for the P cast site: none (fp32 or 24 bits), bf16 or
    fp16 (the casts torch's dtypes make), or p-bit rounding; None if it has no cast."""
    f = ar.fmt("p_cast")
    if getattr(f, "name", None) in CASTS and not f.saturate:
        return CASTS[f.name], 0
    drop = _bits_dropped(f)
    return None if drop is None else ((3, drop) if drop else (0, 0))


def _dot_drop(ar) -> int | None:
    """0 when both tile GEMMs accumulate in fp32, 13 when both are tf32 dots (operands
    rounded to tf32, products summed in fp32: Arith.dot), None otherwise."""
    names = {getattr(ar.fmt(x), "name", None) for x in ("qk_acc", "pv_acc")}
    if names == {"fp32"}:
        return 0
    return _bits_dropped(FORMATS["tf32"]) if names == {"tf32"} else None


def claim(run: Run, tiles: Tiles, variant: Variant | str) -> str | None:
    """None if the fused path runs this call bit-identically, else why it does not."""
    ar, variant = run.ar, variant_of(variant)
    if not _enabled:
        return "disabled"
    if (variant.max_rule not in MAX_RULES or variant.normalised or variant.reads_logits
            or variant.floor(ar) is not None):
        return f"variant {variant.name}"
    rounded = [x for x in PRODUCT_SITES if ar.fmt(x) is not EXACT]
    if rounded:  # its C loop's dots are FMA chains: the readable path rounds the products
        return f"a product rounded before its sum ({', '.join(rounded)})"
    sites = _sites(ar)
    if sites is None or _dot_drop(ar) is None:
        return ("a large-tensor site or a GEMM accumulator is not fp32 or tf32 (nor, with "
                "such accumulators, are the softmax sites all one of bf16, fp16)")
    if _cast(ar) is None:
        return f"P cast to {ar.fmt('p_cast')}"
    if ar.policy.l_from not in ("p", "p_cast"):
        return f"l_from {ar.policy.l_from}"
    if not native.available() or accumulate.isa() == "torch":
        return "no native kernel"
    if sites and not _exp_agrees(sites, run.base2):
        return f"the exp site in {ar.fmt('p')} is not reproduced here"
    return None


def _group(run: Run, tiles: Tiles) -> int:
    """Query blocks per job: several when they share the key order (one taller GEMM), as
    long as every thread still gets a few jobs."""
    if not run.tall:
        return 1
    jobs_wanted = 4 * torch.get_num_threads()
    g = max(1, ROWS // tiles.bm)
    while g > 1 and tiles.q.shape[0] * -(-tiles.n_qb // g) < jobs_wanted:
        g //= 2
    return min(g, tiles.n_qb)


def fused_forward(run: Run, tiles: Tiles, perm: torch.Tensor, scale_s: float, causal: bool,
                  variant: Variant, trace: bool):
    """The final State and the trace, as fast.run_in_place returns them; None if `claim`
    declines the call (the caller takes the torch path)."""
    if claim(run, tiles, variant) is not None:
        return None
    sites, (cast, cast_drop), dot_drop = _sites(run.ar), _cast(run.ar), _dot_drop(run.ar)
    B, n_qb, bm, d = tiles.q.shape
    n_kb, bn, dv = tiles.n_kb, tiles.bn, tiles.v.shape[-1]
    q, k, v = (x.contiguous() for x in (tiles.q, tiles.k, tiles.v))
    if dot_drop:  # tf32 dots read tf32 operands (Arith.dot rounds each tile the same way)
        q, k, v = (FORMATS["tf32"].round(x.double()).float() for x in (q, k, v))
        tiles = Tiles(q, k, v, tiles.nq, tiles.nk)
    perm = perm.to(torch.int64).contiguous()
    # keys visible to each row (a prefix: numerics.tiling's rule); padded rows see every key
    vis = torch.full((n_qb * bm,), tiles.nk, dtype=torch.int64)
    vis[: tiles.nq] = visible_count(tiles.nq, tiles.nk, causal)
    m = torch.empty(B, n_qb, bm)
    l, n_resc = torch.empty_like(m), torch.empty(m.shape, dtype=torch.int64)
    o = torch.empty(B, n_qb, bm, dv)
    m_tr = torch.empty(n_kb, B, n_qb, bm) if trace else None
    l_tr = torch.empty_like(m_tr) if trace else None
    # compared in fp32, as torch does (any value where the rule is not lazy's: unread)
    tau = float(torch.tensor(getattr(variant, "tau", 0.0), dtype=torch.float32))
    job = _Job(
        accumulate.ISAS[accumulate.isa()], q.data_ptr(), k.data_ptr(), v.data_ptr(),
        perm.data_ptr(), vis.data_ptr(),
        B, n_qb, bm, _group(run, tiles), n_kb, bn, d, dv, int(perm.shape[0] > 1),
        scale_s, tau, int(variant.max_rule == "lazy"), int(run.base2),
        0 if sites else cast, int(run.ar.policy.l_from == "p_cast"),
        m.data_ptr(), l.data_ptr(), o.data_ptr(),
        m_tr.data_ptr() if trace else None, l_tr.data_ptr() if trace else None,
        n_resc.data_ptr(), None, sites, 0 if sites else cast_drop, dot_drop)
    kt = tiles.k.transpose(-1, -2).contiguous()  # K_j^T of every key block: (d, bn)
    job.kt = kt.data_ptr()
    lib, threads = native.library(), torch.get_num_threads()
    if not lib.fn_fused_forward_v4(ctypes.byref(job), threads):  # AVX-512's panels, or
        lib.fn_fused_forward(ctypes.byref(job), threads)  # the GEMMs through memory
    traces = [[(m_tr[t], l_tr[t]) for t in range(n_kb)] if trace else None]
    return [State(m, l, o, n_resc)], traces
