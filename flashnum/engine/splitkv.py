"""Split-KV decoding (flash-decoding): keys in S contiguous chunks, merged by their LSE.

    import flashnum
    res = flashnum.attention(q, k, v, num_splits=8, split_precision=None,
                             merge_precision=None, precision="bf16", policy="fa2",
                             block_n=64, causal=False)
    # q (..., Hq, Nq, d); k, v (..., Hkv, Nk, d) with Hq a multiple of Hkv (GQA)

What a split-KV kernel does (FlashAttention-2's flash_fwd_splitkv_kernel and its
combine kernel; flash-decoding, Dao et al. 2023):
  1. the key blocks are dealt into S contiguous splits of ceil(n_kb / S) blocks each
     (so that splits beyond the last key block are empty, as in the kernel);
  2. each split runs the online-softmax recurrence over its keys alone and stores its
     normalised partial output o_s = O_s / l_s and its log-sum-exp lse_s = m_s + log l_s,
     both rounded to `split_precision` (fp32 in FA2's oaccum / softmax_lseaccum; by
     default the policy's `o` format, the accumulator's: fp32 in fa2, exact in exact);
     an empty split (or a row that sees none of its keys under the causal mask) stores
     o_s = 0 and lse_s = -inf;
  3. the combine (a site: every operation rounded to `merge_precision`, by default the
     policy's `l` format, the softmax state's: fp32 in fa2, exact in exact) computes
         lse_max = max_s lse_s,   w = sum_s exp(lse_s - lse_max),
         lse = log(w) + lse_max,  out = sum_s exp(lse_s - lse) o_s   (summed in split order)
     and rounds out into the policy's output format.
Every split runs the emulator (flashnum.engine.emulate) on the call, except that its `out` site is
`split_precision` (the partial stored); lse is computed in float64 from the split's m and
l and rounded once (a kernel's fp32 m * scale + log l rounds twice: below our resolution).

GQA: query head h reads K/V head h // (Hq / Hkv). Without a causal mask the query heads
of a group are packed into the rows of one call (what flash-attn does for decoding,
seqlenq_ngroups_swapped); the rows are independent, so this changes no value.

The causal rule is the package's (flashnum.numerics.tiling.visible, either alignment); within
a split that becomes a per-row count of visible keys, so rows are run in groups that see
the same number of the split's keys (a few groups for decoding, Nq <= 16).

The result: out, lse (the merged one), m = the row max over all splits (the invariant a
merge must keep), l = sum_s l_s exp(m_s - m) in float64, n_rescales summed over splits,
and with trace=True a Trace whose steps are the splits (each split's final m_s, l_s).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from flashnum.engine.result import Result, Trace
from flashnum.numerics import elementary
from flashnum.numerics.formats import get_format
from flashnum.numerics.tiling import clamp_block, n_blocks, visible_count


def split_bounds(nk: int, block_n: int, num_splits: int) -> list[tuple[int, int]]:
    """[a, b) key ranges of the splits: ceil(n_kb / S) key blocks each, the tail empty."""
    per = math.ceil(n_blocks(nk, block_n) / num_splits) * block_n
    return [(min(s * per, nk), min((s + 1) * per, nk)) for s in range(num_splits)]


def _rows_visible(nq: int, nk: int, a: int, b: int, causal) -> torch.Tensor:
    """How many of the split's keys [a, b) each query row sees."""
    return visible_count(nq, nk, causal, a, b)


def _partial(call, a, b, causal, split_fmt, run_split):
    """o_s, lse_s, m_s, l_s, n_rescales of one split; rows grouped by visible count. `call`
    holds the split's policy and the (packed) q, k, v of every split; run_split(call) runs
    one group of rows on the split's keys."""
    q, k, v = call.q, call.k, call.v
    nq, dv = q.shape[-2], v.shape[-1]
    lead = q.shape[:-2]
    o = torch.zeros(*lead, nq, dv, dtype=torch.float64)
    lse = torch.full((*lead, nq), -math.inf, dtype=torch.float64)
    m = torch.full((*lead, nq), -math.inf, dtype=torch.float64)
    l = torch.zeros((*lead, nq), dtype=torch.float64)
    nr = torch.zeros((*lead, nq), dtype=torch.int64)
    seen = _rows_visible(nq, k.shape[-2], a, b, causal)
    for n in seen.unique().tolist():
        if n == 0:
            continue  # an empty split for these rows: o = 0, lse = -inf
        rows = (seen == n).nonzero().flatten()
        # the split's keys as one call, checked already: blocks no larger than its keys
        res = run_split(replace(call, q=q[..., rows, :], k=k[..., a : a + n, :],
                              v=v[..., a : a + n, :], causal=False,
                              block_m=clamp_block(call.block_m, len(rows)),
                              block_n=clamp_block(call.block_n, n)))
        o[..., rows, :] = split_fmt.round(res.out)
        lse[..., rows] = split_fmt.round(res.lse)
        m[..., rows], l[..., rows], nr[..., rows] = res.m, res.l, res.n_rescales
    return o, lse, m, l, nr


def merge(o_s: torch.Tensor, lse_s: torch.Tensor, fmt) -> tuple[torch.Tensor, torch.Tensor]:
    """The LSE-weighted combine of partials (S, ..., Nq, dv) and (S, ..., Nq), every
    operation rounded into `fmt` (FA2's combine kernel, in fp32 there)."""
    r = fmt.round
    lse_max = lse_s.amax(0)
    safe = torch.where(torch.isfinite(lse_max), lse_max, torch.zeros_like(lse_max))
    w = torch.zeros_like(lse_max)
    for ls in lse_s:  # the kernel sums the split weights in split order
        w = r(w + r(elementary.exp(r(ls - safe))))
    lse = torch.where(w > 0, r(r(elementary.log(w)) + safe), torch.full_like(w, -math.inf))
    lse_safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    out = torch.zeros_like(o_s[0])
    for os_, ls in zip(o_s, lse_s, strict=True):
        scale = torch.where(torch.isfinite(lse), r(elementary.exp(r(ls - lse_safe))),
                            torch.zeros_like(ls))
        out = r(out + r(scale[..., None] * os_))
    return out, lse


def _gqa(q, k, v, causal):
    """Pack (non-causal) or expand (causal) query heads that share a K/V head."""
    if q.ndim < 3 or q.shape[-3] == k.shape[-3]:
        return q, k, v, None
    hq, hkv = q.shape[-3], k.shape[-3]
    if hq % hkv:
        raise ValueError(f"query heads {hq} must be a multiple of key/value heads {hkv} (GQA)")
    g = hq // hkv
    if causal:
        return q, k.repeat_interleave(g, dim=-3), v.repeat_interleave(g, dim=-3), None
    nq = q.shape[-2]
    packed = q.reshape(*q.shape[:-3], hkv, g * nq, q.shape[-1])
    return packed, k, v, (hq, nq)


def split_attention(call, run_split) -> Result:
    """Split-KV on a checked call (flashnum.engine.call.Call: num_splits, split_precision,
    merge_precision; GQA too), on the emulator only (flashnum.engine.checks): each split's
    rows by run_split(call), the emulator (flashnum.engine.emulate)."""
    causal, num_splits, block_n, trace = call.causal, call.num_splits, call.block_n, call.trace
    pol = call.pol
    split_fmt = get_format(pol.o if call.split_precision is None else call.split_precision)
    merge_fmt = get_format(pol.l if call.merge_precision is None else call.merge_precision)
    for name, f in (("split_precision", split_fmt), ("merge_precision", merge_fmt)):
        if not hasattr(f, "round"):
            raise ValueError(f"{name} must be a format with a rounding, got {f}")
    q, k, v, packed = _gqa(call.q, call.k, call.v, causal)
    nk = k.shape[-2]
    split = replace(call, q=q, k=k, v=v, policy=pol.with_sites(
        out=split_fmt.name, name=f"{pol.name}/split"), trace=False, num_splits=1)
    parts = [_partial(split, a, b, causal, split_fmt, run_split)
             for a, b in split_bounds(nk, block_n, num_splits)]
    o_s, lse_s, m_s, l_s, nr_s = (torch.stack([p[i] for p in parts]) for i in range(5))
    out, lse = merge(o_s, lse_s, merge_fmt)
    out = pol.fmt("out").round(out)
    m = m_s.amax(0)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    l = torch.zeros_like(m)
    for ms, ls in zip(m_s, l_s, strict=True):  # in split order
        l = l + ls * elementary.exp(torch.where(torch.isfinite(ms), ms - m_safe, -math.inf))
    masked = ~torch.isfinite(lse)
    out = torch.where(masked[..., None], torch.zeros_like(out), out)
    tr = Trace(m=m_s.movedim(0, -2), l=l_s.movedim(0, -2),
               order=torch.arange(num_splits)[None]) if trace else None
    res = Result(out=out, m=m, l=l, lse=lse, masked=masked, n_rescales=nr_s.sum(0), trace=tr)
    if packed is not None:  # unpack the query heads of each K/V head
        hq, nq = packed
        res = _unpack(res, hq, nq)
    res.info = dict(precision=call.precision, policy=pol.name, block_n=block_n, causal=causal,
                    num_splits=num_splits, split_precision=split_fmt.name,
                    merge_precision=merge_fmt.name)
    return res


def _unpack(res: Result, hq: int, nq: int) -> Result:
    def rows(x, tail):
        return x.reshape(*x.shape[: x.ndim - 2 - tail], hq, nq, *x.shape[x.ndim - tail :])

    def steps(x):  # (..., hkv, S, g nq) -> (..., hq, S, nq)
        *lead, hkv, S, _ = x.shape
        x = x.reshape(*lead, hkv, S, hq // hkv, nq).movedim(-2, -3)
        return x.reshape(*lead, hq, S, nq)

    tr = res.trace
    if tr is not None:
        tr = Trace(m=steps(tr.m), l=steps(tr.l), order=tr.order)
    return Result(out=rows(res.out, 1), m=rows(res.m, 0), l=rows(res.l, 0),
                  lse=rows(res.lse, 0), masked=rows(res.masked, 0),
                  n_rescales=rows(res.n_rescales, 0), trace=tr)
