"""The emulated blocked online-softmax recurrence (backend "emulate").

    import flashnum
    res = flashnum.attention(q, k, v, precision="bf16", policy="fa2",
                             block_m=64, block_n=64, order="forward", variant="fa2",
                             causal=False, scale=None, rounding="nearest", seed=0,
                             trace=False)

For every query block (all at once, vectorised over batch, heads and query
blocks) it visits the key blocks in the chosen order and runs FlashAttention-2's
recurrence (Dao 2023, Algorithm 1):

    m_i = max(m_{i-1}, rowmax(S_ij))
    l_i = l_{i-1} exp(m_{i-1} - m_i) + rowsum(exp(S_ij - m_i))
    o_i = o_{i-1} exp(m_{i-1} - m_i) + exp(S_ij - m_i) @ V_j
    out = o_last / l_last

rounding every value at the site the policy names (flashnum.numerics.policy) and nowhere
else. Memory is O(Nq * block_n): no Nq x Nk matrix is ever formed (the
`standard` structure, which must form S, works through row chunks).

Arithmetic model. Each elementwise operation (+, -, *, /, exp) is correctly
rounded into its site's format: computed exactly enough in a carrier, then
rounded once. Reductions (the two dots, the block row sum) accumulate in their
site's format: fp64/exact in float64, fp32 by real fp32 arithmetic (torch's
float32 matmul/sum, whose summation order is the BLAS's, as a GPU's is its
own), tf32 by rounding the operands to tf32 and summing in fp32 (tensor cores),
narrower formats by recursive summation rounded after every addition. A
block's row sum and its P @ V tile are stored in l's and o's formats before they
are added into l and o (what a pure-PyTorch port does with bf16 tensors; a no-op
when l and o are fp32, as in FA2 kernels). The
carrier is float32 when every site is fp32 or narrower (exact for +, -, *, /
since 24 >= 2p + 2 for p <= 11 makes the double rounding innocuous), else
float64. exp is always evaluated in float64 and then rounded once. For a float32
argument rounded into fp32 (the P site of every policy with fp32 softmax state)
that is the correctly rounded exp on every input (checked exhaustively, `python
bench/exp_exhaustive.py`); otherwise it is correctly rounded except within ~2^-52
of a rounding boundary. The fp32 exp site runs in flashnum.engine.native's fused C kernel
when that is built, else in torch: the same values either way (docs/engine.md). FMA
contraction is not modelled (a GPU kernel may contract s * scale - m).

Variants:
    fa2      divide once at the end (FlashAttention-2)
    fa1      normalise every step: P relative to the block max, o kept normalised
             (FlashAttention-1, Algorithm 1)
    exp2     fa2 with log2(e) folded into the scale and exp2 (Triton's tutorial)
    lazy     fa2 that rescales only when the max grows by more than `tau` (in the
             units of the logits; FlashAttention-4 uses 8 in log2 units)
    qiu_yao  fa2 with Qiu & Yao's max adjustment: where >= 2 logits of a block lie
             within 1e-3 of its max, use beta * max (max > 0) or 0 (max < 0) as the
             block max, so that no P is exactly 1
Fully masked rows (causal with Nq > Nk) give out = 0 and are flagged in
`res.masked`; l stays 0 and m stays -inf for them, never NaN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from flashnum.engine import native
from flashnum.engine.arith import Arith, carrier, wider
from flashnum.engine.result import Result, Trace
from flashnum.numerics.constants import LOG2E
from flashnum.numerics.formats import EXACT, ROUNDINGS, get_format
from flashnum.numerics.policy import Policy, check_precision, make_policy
from flashnum.numerics.tiling import (
    ORDERS,
    causal_visible,
    check_block,
    key_block_order,
    n_blocks,
    needs_block_max,
)

VARIANTS = ("fa2", "fa1", "exp2", "lazy", "qiu_yao")
BACKENDS = ("emulate", "triton", "mp")
QIU_YAO_WINDOW = 1e-3  # "scores within 1e-3 of the block max" (Qiu & Yao 2025)
_CHUNK = 1 << 18  # logit-tile elements per thread per chunk on the fast path (~1 MiB: L2)


# ---------------------------------------------------------------------------
# validation


def _check(q, k, v, precision, policy, block_m, block_n, order, variant, rounding, backend):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if x.ndim < 2:
            raise ValueError(f"{name} must have shape (..., N, d), got {tuple(x.shape)}")
        if not x.is_floating_point():
            raise ValueError(f"{name} must be floating point, got {x.dtype}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k head dims differ: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v key counts differ: k {tuple(k.shape)}, v {tuple(v.shape)}")
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(
            f"batch dims differ: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    for name, x in (("q", q), ("k", k), ("v", v)):
        # a finite sum needs every term finite (one pass); only a sum that is not finite
        # (an inf or NaN, or merely an overflow) needs the elementwise check
        if math.isfinite(float(x.sum())):
            continue
        if not bool(torch.isfinite(x).all()):
            bad = "NaN" if bool(torch.isnan(x).any()) else "inf"
            raise ValueError(f"{name} contains {bad}; inputs must be finite (mask with causal=)")
    check_precision(precision, mp=True)  # a policy's precision (p<bits> too), or mp
    check_block("block_m", block_m)
    check_block("block_n", block_n)
    if isinstance(order, str) and order not in ORDERS:
        raise ValueError(f"unknown order {order!r}; valid: {', '.join(ORDERS)}, or a permutation")
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; valid: {', '.join(VARIANTS)}")
    if rounding not in ROUNDINGS:
        raise ValueError(f"unknown rounding {rounding!r}; valid: {', '.join(ROUNDINGS)}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; valid: {', '.join(BACKENDS)}")


# ---------------------------------------------------------------------------
# the public entry point


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    precision: str = "bf16",
    policy: str | Policy = "fa2",
    block_m: int = 64,
    block_n: int = 64,
    order="forward",
    variant: str = "fa2",
    causal: bool = False,
    scale: float | None = None,
    rounding: str = "nearest",
    seed: int = 0,
    trace: bool = False,
    backend: str = "emulate",
    mp_bits: int = 256,
    tau: float = 8.0,
    beta: float = 2.0,
) -> Result:
    """Attention softmax(scale Q K^T) V through the blocked online softmax.

    precision: fp64 fp32 tf32 fp16 bf16 fp8_e4m3 fp8_e5m2 mp, or p<bits> (2..52)
    policy:    fa2 naive lowp exact uniform, or a flashnum.numerics.policy.Policy
    order:     forward reverse random max_ascending max_descending, or a permutation
    variant:   fa2 fa1 exp2 lazy (tau) qiu_yao (beta)
    rounding:  nearest stochastic (seeded by `seed`; inputs are always rounded to nearest)
    backend:   emulate (this module), triton (flashnum.backends), mp (mpmath at mp_bits)
    """
    if precision == "mp" and backend == "emulate":
        backend = "mp"
    _check(q, k, v, precision, policy, block_m, block_n, order, variant, rounding, backend)
    if backend == "mp":
        from flashnum.backends.mp import attention_mp

        return attention_mp(
            q, k, v, bits=mp_bits, block_m=block_m, block_n=block_n, order=order,
            variant=variant, causal=causal, scale=scale, seed=seed, trace=trace, tau=tau,
            beta=beta,
        )
    pol = make_policy(policy, precision)
    if backend == "triton":
        from flashnum.backends.triton import attention_triton

        return attention_triton(
            q, k, v, policy=pol, precision=precision, block_m=block_m, block_n=block_n,
            order=order, variant=variant, causal=causal, scale=scale, seed=seed, trace=trace,
            rounding=rounding,
        )
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if pol.structure == "standard":
        res = _standard(q, k, v, pol, causal, scale, rounding, seed, block_m)
    else:
        res = _flash(
            q, k, v, pol, block_m, block_n, order, variant, causal, scale, rounding, seed,
            trace, tau, beta,
        )
    res.info = dict(
        precision=precision, policy=pol.name, block_m=block_m, block_n=block_n,
        order=order if isinstance(order, str) else "permutation", variant=variant,
        causal=causal, scale=scale, rounding=rounding, seed=seed,
    )
    return res


@dataclass
class _Blocks:
    """Inputs reshaped into padded tiles: q (B, n_qb, bm, d), k/v (B, n_kb, bn, .)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    nq: int
    nk: int
    n_qb: int
    n_kb: int


def _tiles(x: torch.Tensor, block: int) -> torch.Tensor:
    b, n, d = x.shape
    nb = n_blocks(n, block)
    pad = nb * block - n
    if pad:
        x = torch.cat([x, x.new_zeros(b, pad, d)], dim=1)
    return x.reshape(b, nb, block, d)


def _visible(blocks: _Blocks, bm: int, bn: int, kb: torch.Tensor, causal: bool):
    """(.., n_qb, bm, bn) bool for the key blocks `kb` ((B or 1, n_qb)), or None if all visible."""
    ragged = blocks.n_kb * bn != blocks.nk
    if not causal and not ragged:
        return None
    qpos = torch.arange(blocks.n_qb)[:, None] * bm + torch.arange(bm)[None, :]  # (n_qb, bm)
    kpos = kb[..., None] * bn + torch.arange(bn)  # (B?, n_qb, bn)
    vis = (kpos < blocks.nk)[..., None, :].expand(*kpos.shape[:-1], bm, bn)
    if causal:
        vis = vis & (kpos[..., None, :] <= qpos[..., :, None] + (blocks.nk - blocks.nq))
    return vis


def _gather(x: torch.Tensor, kb: torch.Tensor, tall: bool) -> torch.Tensor:
    """x (B, n_kb, bn, d), kb (B or 1, n_qb) -> (B, 1, bn, d) when every query block takes
    the same key block (tall), else (B, n_qb, bn, d)."""
    if tall:
        return x[:, int(kb.flatten()[0])].unsqueeze(1)
    kb = kb.expand(x.shape[0], -1)
    b = torch.arange(x.shape[0])[:, None]
    return x[b, kb]


def _tile_dot(ar: Arith, a: torch.Tensor, b: torch.Tensor, fmt, tall: bool) -> torch.Tensor:
    """a (B, n_qb, bm, x) @ b (B, 1 or n_qb, x, y).

    tall: one (n_qb bm) x x x y GEMM when b is shared by every query block (orders that
    are the same for all query blocks), about 2x faster than n_qb small ones. BLAS may
    sum in another order for another shape, so a run keeps one shape for every tile
    (per-query-block orders use the small GEMMs throughout) and `logits` mirrors it.
    """
    if tall:
        B, n_qb, bm, x = a.shape
        return ar.dot(a.reshape(B, 1, n_qb * bm, x), b, fmt).reshape(B, n_qb, bm, -1)
    return ar.dot(a, b, fmt)


def _logits(ar: Arith, blocks: _Blocks, kb, scale_s, bm, bn, causal, tall):
    kt = _gather(blocks.k, kb, tall).transpose(-1, -2)
    s = _tile_dot(ar, blocks.q, kt, ar.policy.fmt("qk_acc"), tall)
    s = ar.site(ar.site(s, "s") * scale_s, "s")
    vis = _visible(blocks, bm, bn, kb, causal)
    if vis is not None:
        s = s.masked_fill(~vis, -math.inf)
    return s


def _stored(ar: Arith, *xs):
    """The inputs as stored in memory (a round-to-nearest cast into the inputs format), on
    the carrier, leading dims flattened: (B, N, d) each."""
    fin = ar.policy.fmt("inputs")
    return tuple(_store(ar, x, fin).reshape(-1, *x.shape[-2:]) for x in xs)


def _store(ar: Arith, x: torch.Tensor, fin) -> torch.Tensor:
    x = x.detach().to("cpu")
    if x.dtype is torch.float32 and ar.dtype is torch.float32:
        # an fp32 value is its own float64 carrier: Arith.rnd's fp32 -> low cast is then
        # the one correctly rounded conversion (no double rounding), without the trip
        # through float64
        return ar.rnd(x, fin, nearest=True)
    return ar.rnd(x.to(torch.float64), fin, nearest=True).to(ar.dtype)


def _flash(q, k, v, pol, bm, bn, order, variant, causal, scale, rounding, seed, trace, tau, beta):
    lead = q.shape[:-2]
    nq, nk, dv = q.shape[-2], k.shape[-2], v.shape[-1]
    dtype = carrier(pol)
    ar = Arith(pol, rounding, seed, dtype)
    q3, k3, v3 = _stored(ar, q, k, v)
    B = q3.shape[0]
    blocks = _Blocks(
        _tiles(q3, bm), _tiles(k3, bn), _tiles(v3, bn), nq, nk, n_blocks(nq, bm), n_blocks(nk, bn)
    )
    n_qb, n_kb = blocks.n_qb, blocks.n_kb
    base2 = variant == "exp2"
    f_s, f_m, f_p = pol.fmt("s"), pol.fmt("m"), pol.fmt("p")
    f_diff = wider(f_s, f_m)  # s - m: torch computes it in the wider of the two
    # the scale is held in the logits' format, as a kernel holds sm_scale in fp32
    scale_s = float(ar.rnd(torch.tensor(scale * (LOG2E if base2 else 1.0), dtype=dtype), f_s))

    # -- the order of key blocks, per (batch*head, query block) --
    tall = not needs_block_max(order)
    if needs_block_max(order):
        # a tile's largest logit over its *real* query rows: padded rows would add logit 0
        real = (torch.arange(n_qb)[:, None] * bm + torch.arange(bm) < nq)[..., None]
        bmax = torch.stack(
            [
                _logits(ar, blocks, torch.full((1, n_qb), j), scale_s, bm, bn, causal, tall)
                .masked_fill(~real, -math.inf)
                .amax(dim=(-1, -2))
                for j in range(n_kb)
            ],
            dim=-1,
        )  # (B, n_qb, n_kb)
        perm = key_block_order(order, n_qb, n_kb, seed, bmax)
    else:
        perm = key_block_order(order, n_qb, n_kb, seed)[None]  # (1, n_qb, n_kb)

    fast = variant != "fa1" and _in_place_ok(ar)
    # the native kernel can take the scale into its exp pass: max(fl(s c)) = fl(c max(s))
    # for c > 0 (rounding is monotone), and only the max and P read the scaled logits
    # in these variants, so each value is the one the separate pass gives
    fold = fast and variant in ("fa2", "exp2", "lazy") and scale_s > 0 and native.available()
    # (and with the kernel, the state update of fa2 and exp2 is one native pass too)

    def recurrence(blocks, perm, o):
        Bc = blocks.q.shape[0]
        shape = (Bc, n_qb, bm)
        m = torch.full(shape, -math.inf, dtype=dtype)
        l = torch.zeros(shape, dtype=dtype)
        n_rescales = torch.zeros(shape, dtype=torch.int64)
        tm, tl = [], []
        bufs = _Buffers(Bc, n_qb, bm, bn, dv) if fast else None
        # key block per step when every query block shares the order (as _gather reads it)
        js = perm.reshape(-1, n_kb)[0].tolist() if tall else None
        m_finite = False  # every m finite: the isfinite guards below are the identity
        for t in range(n_kb):
            kb = perm[..., t]
            if fast:
                s = _logits_into(ar, blocks, kb, None if fold else scale_s, bm, bn, causal,
                                 tall, bufs, js[t] if tall else None)
            else:
                s = _logits(ar, blocks, kb, scale_s, bm, bn, causal, tall)
            vj = blocks.v[:, js[t]].unsqueeze(1) if tall else _gather(blocks.v, kb, tall)
            m_blk = s.amax(dim=-1).mul_(scale_s) if fold else ar.rnd(s.amax(dim=-1), f_m)
            if variant == "qiu_yao":
                near = (s >= (m_blk - QIU_YAO_WINDOW)[..., None]).sum(-1) >= 2
                adj = torch.where(m_blk > 0, ar.rnd(beta * m_blk, f_m), torch.zeros_like(m_blk))
                m_blk = torch.where(near & (m_blk != 0) & torch.isfinite(m_blk), adj, m_blk)
            if variant == "fa1":
                m, l, o = _fa1_step(ar, s, vj, m, l, o, m_blk, f_diff, n_rescales, tall)
            elif fold and variant != "lazy" and (finite := native.fa2_state(
                    m, m_blk, n_rescales, bufs.m_safe, bufs.alpha, base2)) is not None:
                # the state update of the branch below in one native pass, m in place
                m_finite = finite
                l, o = _fa2_update_in_place(ar, s, vj, bufs.m_safe, bufs.alpha, l, o, base2,
                                            tall, bufs, scale_s)
            else:
                m_new = torch.maximum(m, m_blk)
                if variant == "lazy":
                    keep = torch.isfinite(m) & (m_new - m <= tau)
                    m_new = torch.where(keep, m, m_new)
                # the sum of m_new is finite only if every m_new is (an overflowing sum
                # merely takes the general branch)
                new_finite = fast and variant != "lazy" and math.isfinite(float(m_new.sum()))
                if m_finite and new_finite:
                    n_rescales += m_new > m
                    m_safe = m_new
                else:
                    n_rescales += (m_new > m) & torch.isfinite(m)
                    # fully masked so far: shift by 0 so that exp(-inf - 0) = 0, never NaN
                    m_safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
                m_finite = new_finite
                alpha = ar.exp(ar.rnd(m - m_safe, f_m), f_p, base2)
                if fast:
                    l, o = _fa2_update_in_place(ar, s, vj, m_safe, alpha, l, o, base2, tall, bufs,
                                                scale_s if fold else 1.0)
                    m = m_new
                    if trace:
                        tm.append(m.reshape(Bc, -1)[:, :nq].clone())
                        tl.append(l.reshape(Bc, -1)[:, :nq].clone())
                    continue
                p = ar.exp(ar.rnd(s - m_safe[..., None], f_diff), f_p, base2)
                pc = ar.site(p, "p_cast")
                # a block's row sum and P @ V tile are values in l's and o's formats before
                # they are added (pure-PyTorch ports store them in the dtype; for fa2 they are
                # already fp32: no rounding)
                l_blk = ar.site(ar.rowsum(pc if pol.l_from == "p_cast" else p, pol.fmt("l_acc")),
                                "l")
                l = ar.site(ar.site(l * alpha, "l") + l_blk, "l")
                pv = ar.site(_tile_dot(ar, pc, vj, pol.fmt("pv_acc"), tall), "o")
                o = ar.site(ar.site(o * alpha[..., None], "o") + pv, "o")
                m = m_new
            if trace:
                tm.append(m.reshape(Bc, -1)[:, :nq].clone())
                tl.append(l.reshape(Bc, -1)[:, :nq].clone())
        return m, l, o, n_rescales, tm, tl

    # the fast path runs a few heads at a time: each (batch, head) is independent, the
    # GEMM shapes per head are unchanged, and tiles that fit in cache are much faster
    # (stochastic rounding never takes it: it would reorder the random stream); the
    # intra-op threads split a tile, so a chunk holds about one L2's worth per thread
    per_head = n_qb * bm * max(bn, dv)
    step = max(1, _CHUNK * torch.get_num_threads() // per_head) if fast else B
    o_all = torch.zeros(B, n_qb, bm, dv, dtype=dtype)  # each chunk updates its slice

    def chunk(b0):
        sub = _Blocks(blocks.q[b0 : b0 + step], blocks.k[b0 : b0 + step],
                      blocks.v[b0 : b0 + step], nq, nk, n_qb, n_kb)
        return recurrence(sub, perm[b0 : b0 + step] if perm.shape[0] > 1 else perm,
                          o_all[b0 : b0 + step])

    parts = [chunk(b0) for b0 in range(0, B, step)]
    if len(parts) == 1:
        m, l, o, n_rescales, tm, tl = parts[0]
    else:
        m, l, n_rescales = (torch.cat([x[i] for x in parts]) for i in (0, 1, 3))
        o = o_all if fast else torch.cat([x[2] for x in parts])
        tm = [torch.cat([x[4][t] for x in parts]) for t in range(len(parts[0][4]))]
        tl = [torch.cat([x[5][t] for x in parts]) for t in range(len(parts[0][5]))]

    masked = m == -math.inf  # +inf (an overflowed logit) is not masking: it shows as NaN
    if variant == "fa1":
        out = o  # already normalised at every step
    else:
        l_safe = torch.where(l > 0, l, torch.ones_like(l))
        out = ar.site(o / l_safe[..., None], "div")
    out = ar.site(out, "out")
    if bool(masked.any()):
        out = torch.where(masked[..., None], torch.zeros_like(out), out)
    # a row is finite iff its sum is, unless the sum overflows: check those rows again
    nonfinite = ~torch.isfinite(out.sum(-1))
    if bool(nonfinite.any()):
        nonfinite = ~torch.isfinite(out).all(dim=-1)

    def rows(x):
        return x.reshape(B, n_qb * bm, *x.shape[3:])[:, :nq].reshape(*lead, nq, *x.shape[3:])

    m64, l64 = rows(m).to(torch.float64), rows(l).to(torch.float64)
    lse = m64 / LOG2E + torch.log(l64) if base2 else m64 + torch.log(l64)
    tr = None
    if trace:
        tr = Trace(
            m=torch.stack(tm, dim=1).reshape(*lead, n_kb, nq).to(torch.float64),
            l=torch.stack(tl, dim=1).reshape(*lead, n_kb, nq).to(torch.float64),
            order=perm.expand(B, n_qb, n_kb).reshape(*lead, n_qb, n_kb).clone(),
        )
    return Result(
        out=rows(out).to(torch.float64), m=m64, l=l64, lse=lse, masked=rows(masked),
        n_rescales=rows(n_rescales), trace=tr, nonfinite=rows(nonfinite),
    )


# ---------------------------------------------------------------------------
# the in-place fast path: the same operations, in the same order, on buffers the
# step owns. It changes no rounding: an in-place op rounds exactly as the op that
# returns a new tensor, and fp32 sites on the fp32 carrier need no rounding step.
# It exists for speed: torch's CPU allocator does not cache large blocks, so every
# large temporary costs page faults.


def _in_place_ok(ar: Arith) -> bool:
    """Whether every large-tensor site of an fa2-like step is plain fp32 arithmetic."""
    pol = ar.policy
    if ar.dtype is not torch.float32 or ar.stochastic:
        return False
    fp32 = ("s", "m", "p", "l_acc", "l", "o")
    return all(pol.fmt(x) is not EXACT and pol.fmt(x).name == "fp32" for x in fp32)


class _Buffers:
    """Tiles reused across key blocks: s/p (fp32), p_cast, P @ V, the per-row shift and
    alpha; P in float64 for torch's exp, made only when torch computes it."""

    def __init__(self, B, n_qb, bm, bn, dv):
        self.s = torch.empty(B, n_qb, bm, bn, dtype=torch.float32)
        self.pc = torch.empty(B, n_qb, bm, bn, dtype=torch.float32)
        self.low = {}
        self.pv = torch.empty(B, n_qb, bm, dv, dtype=torch.float32)
        self.m_safe = torch.empty(B, n_qb, bm, dtype=torch.float32)
        self.alpha = torch.empty(B, n_qb, bm, dtype=torch.float32)

    def lowp(self, dtype):
        if dtype not in self.low:
            self.low[dtype] = torch.empty(self.s.shape, dtype=dtype)
        return self.low[dtype]


def _logits_into(ar: Arith, blocks: _Blocks, kb, scale_s, bm, bn, causal, tall, bufs, j):
    """`_logits` writing into bufs.s: the same GEMM shape, fp32 s and its fp32 scaling (None:
    left to the exp pass); j is the key block when tall (kb's common value)."""
    kt = (blocks.k[:, j].unsqueeze(1) if tall else _gather(blocks.k, kb, tall)).transpose(-1, -2)
    f = ar.fmt("qk_acc")
    if tall and f is not EXACT and f.name == "fp32":
        B, n_qb, _, d = blocks.q.shape
        out = bufs.s.view(B, 1, n_qb * bm, bn)
        torch.matmul(blocks.q.reshape(B, 1, n_qb * bm, d), kt, out=out)
        s = bufs.s
    else:
        s = _tile_dot(ar, blocks.q, kt, f, tall)
    if scale_s is not None:  # None: the exp pass scales (see `fold` in _flash)
        s.mul_(scale_s)  # the fp32 product s * scale_s, rounded once (site s is fp32)
    vis = _visible(blocks, bm, bn, kb, causal)
    if vis is not None:
        s.masked_fill_(~vis, -math.inf)
    return s


def _fa2_update_in_place(ar: Arith, s, vj, m_safe, alpha, l, o, base2, tall, bufs, scale=1.0):
    """l, o of an fa2-like step; s (times `scale` if not yet scaled) is overwritten with P.
    See the loop in `_flash`."""
    pol = ar.policy
    f_pc = ar.fmt("p_cast")
    bf16 = f_pc is not EXACT and f_pc.name == "bf16" and s.shape == bufs.pc.shape
    p = s
    # P = fp32(exp(fl(s - m))), from a float64 exp: what Arith.exp does. The native
    # kernel does it (and P's bf16 cast) in one pass, with the same values on every
    # input (flashnum.engine.native); else torch, in passes
    done = native.exp_rows(s, m_safe, p, bufs.pc if bf16 else None, "bf16" if bf16 else None,
                           base2, scale)
    cast_done = done and bf16
    if not done:
        if scale != 1.0:
            s.mul_(scale)
        p64 = bufs.lowp(torch.float64) if s.shape == bufs.s.shape else torch.empty(
            s.shape, dtype=torch.float64)
        s.sub_(m_safe[..., None])
        p64.copy_(s)
        hard = [(s == h, v) for h, v in native.torch_fixes(base2)]  # see Arith.exp
        if base2:
            p64.exp2_()
        else:
            p64.exp_()
        p.copy_(p64)
        for mask, v in hard:
            p.masked_fill_(mask, v)
    if cast_done:
        pc = bufs.pc
    elif f_pc is not EXACT and f_pc.name == "fp32":
        pc = p
    elif (f_pc is not EXACT and f_pc.torch_dtype is not None and f_pc.p < 24
          and f_pc.saturate == (f_pc.name == "fp8_e4m3") and p.shape == bufs.pc.shape):
        # fp32 -> low -> fp32: one round-to-nearest-even, as in Arith.rnd
        low = bufs.lowp(f_pc.torch_dtype)
        low.copy_(p)
        pc = bufs.pc
        pc.copy_(low)
    else:
        pc = ar.site(p, "p_cast")
    l_blk = ar.rowsum(pc if pol.l_from == "p_cast" else p, ar.fmt("l_acc"))
    if not native.rescale_add(l.unsqueeze(-1), alpha, l_blk.unsqueeze(-1)):  # l in place
        l = ar.site(ar.site(l * alpha, "l") + l_blk, "l")
    f_pv = ar.fmt("pv_acc")
    if tall and f_pv is not EXACT and f_pv.name == "fp32" and pc.shape == bufs.s.shape:
        B, n_qb, bm, bn = pc.shape
        torch.matmul(pc.view(B, 1, n_qb * bm, bn), vj, out=bufs.pv.view(B, 1, n_qb * bm, -1))
        pv = bufs.pv
    else:
        pv = ar.site(_tile_dot(ar, pc, vj, f_pv, tall), "o")
    if not native.rescale_add(o, alpha, pv):  # the same two fp32 roundings in one pass
        o.mul_(alpha[..., None])
        o.add_(pv)
    return l, o


def _fa1_step(ar, s, vj, m, l, o, m_blk, f_diff, n_rescales, tall):
    """FlashAttention-1 (Dao et al. 2022, Algorithm 1, lines 9-12): o kept normalised."""
    f_p, f_m = ar.policy.fmt("p"), ar.policy.fmt("m")
    m_new = torch.maximum(m, m_blk)
    n_rescales += (m_new > m) & torch.isfinite(m)
    zero = torch.zeros_like(m_new)
    m_blk_safe = torch.where(torch.isfinite(m_blk), m_blk, zero)
    m_new_safe = torch.where(torch.isfinite(m_new), m_new, zero)
    p = ar.exp(ar.rnd(s - m_blk_safe[..., None], f_diff), f_p)  # P~ relative to the block max
    pc = ar.site(p, "p_cast")
    l_blk = ar.site(ar.rowsum(pc if ar.policy.l_from == "p_cast" else p,
                              ar.policy.fmt("l_acc")), "l")
    a_old = ar.exp(ar.rnd(m - m_new_safe, f_m), f_p)
    a_blk = ar.exp(ar.rnd(m_blk - m_new_safe, f_m), f_p)
    l_new = ar.site(ar.site(a_old * l, "l") + ar.site(a_blk * l_blk, "l"), "l")
    pv = ar.site(_tile_dot(ar, pc, vj, ar.policy.fmt("pv_acc"), tall), "o")
    num = ar.site(
        ar.site(ar.site(l * a_old, "o")[..., None] * o, "o")
        + ar.site(a_blk[..., None] * pv, "o"),
        "o",
    )
    l_safe = torch.where(l_new > 0, l_new, torch.ones_like(l_new))
    o_new = ar.site(num / l_safe[..., None], "div")
    return m_new, l_new, o_new


def _standard(q, k, v, pol, causal, scale, rounding, seed, block_m):
    """Standard attention: S, softmax normalised, then P @ V (FA3's baseline).

    Works through chunks of query rows so that at most ~2^24 logits exist at once;
    the chunking changes no rounding (every row is independent).
    """
    lead = q.shape[:-2]
    nq, nk, dv = q.shape[-2], k.shape[-2], v.shape[-1]
    dtype = carrier(pol)
    ar = Arith(pol, rounding, seed, dtype)
    q3, k3, v3 = _stored(ar, q, k, v)
    B = q3.shape[0]
    f_s, f_m = pol.fmt("s"), pol.fmt("m")
    f_diff = wider(f_s, f_m)
    scale_s = float(ar.rnd(torch.tensor(scale, dtype=dtype), f_s))
    rows = max(1, min(nq, (1 << 24) // max(1, B * nk)))
    outs, ms, ls = [], [], []
    vis_all = causal_visible(nq, nk) if causal else None
    for r0 in range(0, nq, rows):
        qc = q3[:, r0 : r0 + rows]
        s = ar.dot(qc, k3.transpose(-1, -2), pol.fmt("qk_acc"))
        s = ar.site(ar.site(s, "s") * scale_s, "s")
        if vis_all is not None:
            s = s.masked_fill(~vis_all[r0 : r0 + rows], -math.inf)
        m = ar.rnd(s.amax(dim=-1), f_m)
        m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        e = ar.exp(ar.rnd(s - m_safe[..., None], f_diff), pol.fmt("p"))
        l = ar.site(ar.rowsum(e, pol.fmt("l_acc")), "l")
        l_safe = torch.where(l > 0, l, torch.ones_like(l))
        p = ar.site(ar.site(e / l_safe[..., None], "div"), "p_cast")
        out = ar.site(ar.dot(p, v3, pol.fmt("pv_acc")), "out")
        out = torch.where((m == -math.inf)[..., None], torch.zeros_like(out), out)
        outs.append(out)
        ms.append(m)
        ls.append(l)
    out = torch.cat(outs, 1).reshape(*lead, nq, dv).to(torch.float64)
    m = torch.cat(ms, 1).reshape(*lead, nq).to(torch.float64)
    l = torch.cat(ls, 1).reshape(*lead, nq).to(torch.float64)
    return Result(
        out=out, m=m, l=l, lse=m + torch.log(l), masked=m == -math.inf,
        n_rescales=torch.zeros_like(m, dtype=torch.int64),
    )


def logits(q, k, *, precision="bf16", policy="fa2", block_m=64, block_n=64, causal=False,
           scale=None, order="forward", variant="fa2") -> torch.Tensor:
    """The computed logits (..., Nq, Nk) exactly as the emulated flash recurrence forms them
    (same tiles, same roundings), masked entries -inf. Forms the whole Nq x Nk matrix:
    for checks (the invariant "final m is the row max of the computed logits"), not sweeps.
    """
    pol = make_policy(policy, precision)
    dtype = carrier(pol)
    ar = Arith(pol, "nearest", 0, dtype)
    d, nq, nk = q.shape[-1], q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    q3, k3 = _stored(ar, q, k)
    blocks = _Blocks(_tiles(q3, block_m), _tiles(k3, block_n), _tiles(k3, block_n), nq, nk,
                     n_blocks(nq, block_m), n_blocks(nk, block_n))
    base2 = variant == "exp2"
    scale_s = float(ar.rnd(torch.tensor(scale * (LOG2E if base2 else 1.0), dtype=dtype),
                           pol.fmt("s")))
    tall = not needs_block_max(order)
    kb = [torch.full((1, blocks.n_qb), j) for j in range(blocks.n_kb)]
    cols = [_logits(ar, blocks, j, scale_s, block_m, block_n, causal, tall) for j in kb]
    s = torch.cat(cols, dim=-1).reshape(q3.shape[0], -1, blocks.n_kb * block_n)
    return s[:, :nq, :nk].reshape(*q.shape[:-2], nq, nk)


def policy_for(precision: str, policy) -> Policy:
    """The Policy a (precision, policy) pair names; `mp` has none (it is all mp)."""
    if precision == "mp":
        return Policy(name="mp")
    return make_policy(policy, precision)


__all__ = ["attention", "logits", "VARIANTS", "BACKENDS", "policy_for", "get_format"]
