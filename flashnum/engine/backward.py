"""The emulated backward pass: dQ, dK, dV of attention with rounding at every site.

    import flashnum
    g = flashnum.attention_backward(q, k, v, do, precision="bf16", policy="fa2",
                                    block_m=64, block_n=64, order="forward",
                                    causal=False, scale=None, rounding="nearest",
                                    seed=0, dq_order="forward")
    g.dq, g.dk, g.dv     float64, each value representable in the output format
    g.lse, g.delta       (..., Nq) the stored log-sum-exp and D, as the backward read them
    g.ds_rowsum          (..., Nq) rowsum of dS as it enters the GEMMs, summed on the
                         carrier (float32 when every site is fp32 or narrower); with
                         measure_ds=True only, else None
                         (zero in exact arithmetic: sum_j P_ij (dP_ij - D_i) = 0)
    g.out                the forward output O the backward used (flashnum's own forward
                         with the same policy, or `out=` and `lse=` given by the caller)

Structure "flash" is FlashAttention-2's Algorithm 2 (Dao 2023), as flash-attn's
`compute_dq_dk_dv_1colblock` and Triton's fused-attention tutorial (`_attn_bwd_dkdv`,
`_attn_bwd_dq`) run it:

    D = rowsum(dO * O)                               (the preprocessing kernel)
    for each key block j (dQ's accumulation order: `dq_order`):
        for each query block i (in order):
            S = Q_i K_j^T;  P = exp(scale S - L_i)   (recomputed from the stored LSE)
            dV_j += cast(P)^T dO_i
            dP = dO_i V_j^T;  dS = P * (dP - D_i)
            dK_j += cast(dS)^T Q_i
            dQ_i += cast(dS) K_j                     (flash-attn: fp32 atomic adds)
    dK = scale dK;  dQ = scale dQ;  each cast to the output format

Structure "standard" is autograd of softmax((Q K^T) * scale) V written in plain torch:
P is the forward's stored softmax output, dV = P^T dO, dP = dO V^T (stored),
dS = P * (dP - rowsum(P * dP)) (torch's softmax backward, in fp32 for bf16/fp16),
dS * scale (the backward of the scaling, stored), dQ = dS K, dK = dS^T Q.

Every value is rounded at its site of a flashnum.numerics.policy.BackwardPolicy and
nowhere else, with the forward engine's arithmetic model (flashnum.engine.arith.Arith:
elementwise operations rounded once, fp32 reductions in real fp32 arithmetic, narrower
ones recursively). A tile's product is stored in its accumulator's format before it is
added (a no-op for fp32 accumulators). Presets (`policy=`):

    fa2    flash-attn 2 and the Triton tutorial: Q, K, V, dO in the precision; fp32 LSE,
           recomputed S and P, dP, D, dS and fp32 dQ/dK/dV accumulators; P cast to the
           input dtype before P^T dO (`p.to(do.dtype)`), dS cast before dS^T Q and dS K;
           outputs cast to the dtype.
    naive  autograd of standard attention in the dtype (structure "standard"): the
           forward's naive P; dP and dS * scale stored in the dtype; fp32 GEMMs.
    lowp   a pure-PyTorch port of Algorithm 2 on dtype tensors: GEMMs accumulate in
           fp32, every stored value and every accumulator across blocks in the dtype.
    exact  no rounding (the forward exact too): the algorithm alone.

Where flashnum.engine.fused_backward claims a flash-structure call (fa2 in bf16, fp16,
fp32), the loop below runs in one native pass per head instead: the same values, bit for
bit (tests/test_fused_backward.py).

Fully masked rows (causal with Nq > Nk) give dQ = 0 and contribute nothing to dK, dV.
Memory is O(Nq * block_n) for "flash" (no Nq x Nk matrix); "standard" works through
chunks of query rows (about 2^24 logits at a time), summing dK, dV in their sites.

exp2=True recomputes P in base 2, as flash-attn's CUDA backward (`scale_apply_exp2` with
`scale_softmax_log2` and the LSE times log2 e) and Triton's tutorial (M stored in log2
units) do: P = exp2(S2 - L2) with S2 = (Q K^T) * fl_s(scale log2 e) (log2 e folded into
the scale, held in the s site's format: fp32 in fa2, as flashnum's exp2 forward holds
it) and L2 = fl_lse(L log2 e) (the stored LSE in log2 units, g.lse then in those units);
dK and dQ are still multiplied by the natural scale. The flash structure only (naive is
autograd of standard attention, which has no stored LSE). The tutorial folds log2 e into
K itself, in the input dtype (`k * (sm_scale * RCP_LN2)`, then dQ *= ln 2): not modelled
here (model="triton_tutorial" models that kernel, flashnum.models.triton_tutorial), nor
FMA contraction.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from flashnum.engine import fused_backward, native
from flashnum.engine.arith import Arith, carrier, wider
from flashnum.engine.call import OPTIONS, BackwardCall, Call
from flashnum.engine.checks import check_finite, check_memory
from flashnum.engine.emulate import emulate
from flashnum.engine.result import Gradients
from flashnum.numerics import accumulate
from flashnum.numerics.constants import LOG2E
from flashnum.numerics.formats import EXACT, FORMATS
from flashnum.numerics.policy import PRESETS, BackwardPolicy, make_backward_policy
from flashnum.numerics.tiling import (
    causal_visible,
    key_block_order,
    n_blocks,
    visible,
    visible_count,
)

DQ_ORDERS = ("forward", "reverse", "random")
FP32 = FORMATS["fp32"]
_CHUNK = 1 << 24  # logits per row chunk of the standard structure


def check_backward(call: BackwardCall) -> None:
    """What the backward checks beyond the forward's (flashnum.engine.checks): out= and lse=
    (both or neither, their shapes), the memory, finite inputs."""
    q, v, out, lse = call.q, call.v, call.out, call.lse
    if (out is None) != (lse is None):
        raise ValueError("give both out= and lse= (the forward's O and LSE), or neither")
    want = (*q.shape[:-1], v.shape[-1])
    if out is not None:
        for name, x, shape in (("out", out, want), ("lse", lse, want[:-1])):
            if not isinstance(x, torch.Tensor) or not x.is_floating_point():
                raise TypeError(f"{name} must be a floating-point torch.Tensor, got "
                                f"{type(x).__name__} {getattr(x, 'dtype', '')}")
            if tuple(x.shape) != shape:
                raise ValueError(f"out {tuple(out.shape)} / lse {tuple(lse.shape)}; valid: "
                                 f"{want} and {want[:-1]}")
    pol = call.policy
    standard = call.model is None and (isinstance(pol, BackwardPolicy) or pol in PRESETS) and \
        make_backward_policy(pol, call.precision).structure == "standard"
    check_memory(q, call.k, v, call, backward=True, standard=standard)
    check_finite(q=q, k=call.k, v=v, do=call.do, **({} if out is None else {"out": out}))


def backward(call: BackwardCall) -> Gradients:
    """Gradients of sum(dO * attention(q, k, v)) of a checked call, emulated (flashnum.api.
    attention_backward documents every option); the forward, where not given by out= and
    lse=, runs here with the same policy."""
    q, k, v, do = call.q, call.k, call.v, call.do
    block_m, block_n, causal, seed = call.block_m, call.block_n, call.causal, call.seed
    rounding, exp2, out, lse = call.rounding, call.exp2, call.out, call.lse
    pol = make_backward_policy(call.policy, call.precision)
    if exp2 and pol.structure != "flash":
        raise ValueError(f"exp2 applies to the flash structure (fa2, lowp, exact), not "
                         f"{pol.name!r} ({pol.structure}: autograd of standard attention)")
    scale = call.softmax_scale
    if out is None:  # the forward, same arithmetic model
        fwd = Call(q, k, v, **{f: getattr(call, f) for f in OPTIONS})
        res = emulate(replace(fwd, policy=pol.forward, scale=scale, trace=False))
        out, lse = res.out, res.lse
    lead, nq, nk, dv = q.shape[:-2], q.shape[-2], k.shape[-2], v.shape[-1]
    dtype = torch.float64 if torch.float64 in (carrier(pol), carrier(pol.forward)) else \
        torch.float32
    ar = Arith(pol, rounding, seed, dtype)
    fin = pol.forward.fmt("inputs")
    q3, k3, v3 = (_stored(ar, x, fin) for x in (q, k, v))
    do3 = _stored(ar, do, pol.fmt("do"))
    o3 = out.detach().to("cpu", torch.float64).reshape(-1, nq, dv).to(dtype)
    lse3 = lse.detach().to("cpu", torch.float64).reshape(-1, nq)
    if pol.structure == "standard":
        arf = Arith(pol.forward, rounding, seed, dtype)
        dq, dk, dvv, delta, ds_rowsum = _standard(ar, arf, q3, k3, v3, do3, causal, scale)
        lse_used = lse3
    else:
        perm = key_block_order(call.dq_order, 1, n_blocks(nk, block_n), seed)[0].tolist()
        dq, dk, dvv, delta, lse_used, ds_rowsum = _flash(
            ar, q3, k3, v3, do3, o3, lse3, block_m, block_n, causal, scale, perm,
            call.measure_ds, exp2)
    order, dq_order = call.order, call.dq_order
    info = dict(precision=call.precision, policy=pol.name, structure=pol.structure,
                block_m=block_m, block_n=block_n,
                order=order if isinstance(order, str) else "permutation",
                dq_order=dq_order if isinstance(dq_order, str) else "permutation",
                causal=causal, scale=scale, rounding=rounding, seed=seed, exp2=exp2,
                variant=call.variant.name if call.out is None else "given")
    return _gradients(dq, dk, dvv, delta, lse_used, ds_rowsum, o3, lead, nq, nk, dv, causal,
                      info)


def _gradients(dq, dk, dvv, delta, lse_used, ds_rowsum, o3, lead, nq, nk, dv, causal,
               info) -> Gradients:
    """The flat results in float64 with the inputs' leading dims, and the masked rows."""
    masked = causal_visible(nq, nk, causal=causal).sum(-1) == 0 if causal else \
        torch.zeros(nq, dtype=bool)

    def shaped(x, n):
        return x.to(torch.float64).reshape(*lead, n, x.shape[-1])

    return Gradients(
        dq=shaped(dq, nq), dk=shaped(dk, nk), dv=shaped(dvv, nk),
        lse=lse_used.to(torch.float64).reshape(*lead, nq),
        delta=delta.to(torch.float64).reshape(*lead, nq),
        out=o3.to(torch.float64).reshape(*lead, nq, dv),
        masked=masked.expand(*lead, nq).clone(),
        ds_rowsum=None if ds_rowsum is None else ds_rowsum.reshape(*lead, nq),
        info=info,
    )


def _stored(ar: Arith, x: torch.Tensor, fmt) -> torch.Tensor:
    """x as stored in memory: rounded to nearest into `fmt`, (B, N, d) on the carrier."""
    if fmt is not EXACT and x.dtype is fmt.torch_dtype:  # already values of the format
        return x.detach().to("cpu", ar.dtype).reshape(-1, *x.shape[-2:])
    x64 = x.detach().to("cpu", torch.float64)
    return ar.rnd(x64, fmt, nearest=True).to(ar.dtype).reshape(-1, *x.shape[-2:])


def _pad_rows(x: torch.Tensor, n: int, value: float = 0.0) -> torch.Tensor:
    pad = n - x.shape[1]
    if pad == 0:
        return x
    return torch.cat([x, x.new_full((x.shape[0], pad, *x.shape[2:]), value)], dim=1)


def _rowsum_products(ar: Arith, a: torch.Tensor, b: torch.Tensor, site: str) -> torch.Tensor:
    """rowsum(a * b): products and sum in fp32 or wider (the site's format if wider),
    the sum stored in the site's format (D in flash-attn, torch's softmax backward)."""
    acc = wider(ar.fmt(site), FP32)
    return ar.site(ar.rowsum(ar.rnd(a * b, acc), acc), site)


def _scaled(ar: Arith, scale: float, fmt) -> float:
    return float(ar.rnd(torch.tensor(scale, dtype=ar.dtype), fmt))


def _tile_sums(ar: Arith, x: torch.Tensor, y: torch.Tensor, bm: int, acc_site: str,
               site: str) -> torch.Tensor:
    """sum_i x_i^T y_i over query blocks i in order: x (B, n_qb bm, bn), y (B, n_qb bm, e).

    Each tile's product accumulates in `acc_site` and is stored in `site`'s format, then
    added into the accumulator (`site`), as the inner loop of Algorithm 2 does."""
    B, nqp, bn = x.shape
    n_qb = nqp // bm
    xt = x.reshape(B, n_qb, bm, bn).transpose(-1, -2)
    tiles = ar.site(ar.dot(xt, y.reshape(B, n_qb, bm, -1), ar.fmt(acc_site)), site)
    acc = tiles[:, 0]
    for i in range(1, n_qb):
        acc = ar.site(acc + tiles[:, i], site)
    return acc


def _flash(ar, q3, k3, v3, do3, o3, lse, bm, bn, causal, scale, perm, measure_ds, exp2):
    """Algorithm 2 on (B, N, .) carrier tensors; returns dq, dk, dv, delta, lse as read."""
    B, nq, _ = q3.shape
    nk = k3.shape[1]
    nqp = n_blocks(nq, bm) * bm
    nkp = n_blocks(nk, bn) * bn
    delta = _rowsum_products(ar, do3, o3, "delta")
    # from float64: once (exp2: the LSE in log2 units, as flash-attn multiplies it in fp32)
    lse_s = ar.rnd(lse * LOG2E if exp2 else lse, ar.fmt("lse"), nearest=True).to(ar.dtype)
    # a fully masked row has L = -inf and every S = -inf: shift by 0 so that P = 0
    lse_safe = _pad_rows(torch.where(torch.isfinite(lse_s), lse_s, torch.zeros_like(lse_s)),
                         nqp)
    qp, dop = _pad_rows(q3, nqp), _pad_rows(do3, nqp)
    deltap = _pad_rows(delta, nqp)
    kp, vp = _pad_rows(k3, nkp), _pad_rows(v3, nkp)
    scale_s = _scaled(ar, scale * LOG2E if exp2 else scale, ar.fmt("s"))
    f_diff = wider(ar.fmt("s"), ar.fmt("lse"))
    qpos = torch.arange(nqp)[:, None]
    dq = torch.zeros(B, nqp, q3.shape[-1], dtype=ar.dtype)
    dk = torch.zeros(B, nkp, k3.shape[-1], dtype=ar.dtype)
    dv = torch.zeros(B, nkp, v3.shape[-1], dtype=ar.dtype)
    ds_rowsum = torch.zeros(B, nqp, dtype=ar.dtype) if measure_ds else None  # on the carrier
    fused = not exp2 and _fused_ok(ar, scale_s)
    shape = (bm, bn, q3.shape[-1], v3.shape[-1], fused_backward.group(nqp // bm, bm) * bm, nqp)
    if fused_backward.claim(ar, scale_s, shape, measure_ds) is None:
        # the whole loop below in one native pass per head: the same values, bit for bit
        vis = torch.zeros(nqp, dtype=torch.int64)  # keys each row sees (padding rows: none)
        vis[:nq] = visible_count(nq, nk, causal)
        fused_backward.run(ar, fused_backward.Padded(qp, kp, vp, dop, lse_safe, deltap), perm,
                           vis, bm, bn, scale_s, exp2,
                           fused_backward.Grads(dq, dk, dv, ds_rowsum))
        perm = []
    for j in perm:
        cols = slice(j * bn, (j + 1) * bn)
        kj, vj = kp[:, cols], vp[:, cols]
        s = ar.dot(qp, kj.transpose(-1, -2), ar.fmt("qk_acc"))
        if causal or nqp != nq or (j + 1) * bn > nk:  # else every entry of the tile is seen
            kpos = torch.arange(j * bn, (j + 1) * bn)[None, :]
            vis = (qpos < nq) & (kpos < nk)
            if causal:
                vis = vis & visible(qpos, kpos, nq, nk, causal)
            s.masked_fill_(~vis, -math.inf)  # -inf * scale is -inf (scale > 0 or not fused)
        if fused:  # the same values as the branch below, in one native pass
            p, pc = s, torch.empty_like(s)
            native.exp_rows(s, lse_safe, p, pc, ar.fmt("p_cast").name, scale=scale_s)
        else:
            s = ar.site(ar.site(s, "s") * scale_s, "s")
            p = ar.exp(ar.rnd(s - lse_safe[..., None], f_diff), ar.fmt("p"), base2=exp2)
            pc = ar.site(p, "p_cast")
        dv[:, cols] = _tile_sums(ar, pc, dop, bm, "dv_acc", "dv")
        dp = ar.site(ar.dot(dop, vj.transpose(-1, -2), ar.fmt("dp_acc")), "dp")
        if fused:  # fp32 (dP - D) * P in place: the same two roundings
            ds = dp.sub_(deltap[..., None]).mul_(p)
        else:
            ds = ar.site(p * ar.site(dp - deltap[..., None], "ds"), "ds")
        dsc = ar.site(ds, "ds_cast")
        if ds_rowsum is not None:
            ds_rowsum += accumulate.rowsum(dsc, "fp32" if ar.dtype is torch.float32 else "fp64")
        dk[:, cols] = _tile_sums(ar, dsc, qp, bm, "dk_acc", "dk")
        dq = ar.site(dq + ar.site(ar.dot(dsc, kj, ar.fmt("dq_acc")), "dq"), "dq")
    # the softmax scale multiplies the accumulators once, at the end (in their formats)
    dq = ar.site(ar.site(dq[:, :nq] * _scaled(ar, scale, ar.fmt("dq")), "dq"), "out")
    dk = ar.site(ar.site(dk[:, :nk] * _scaled(ar, scale, ar.fmt("dk")), "dk"), "out")
    dv = ar.site(dv[:, :nk], "out")
    return dq, dk, dv, delta, lse_s, None if ds_rowsum is None else ds_rowsum[:, :nq]


def _fused_ok(ar: Arith, scale_s: float) -> bool:
    """Whether P, its cast and dS can take the native pass and in-place fp32 ops: a float32
    carrier, round to nearest, fp32 s, lse, p, dp, ds, a cast the kernel knows, scale > 0."""
    if ar.dtype is not torch.float32 or ar.stochastic or scale_s <= 0 or not native.available():
        return False
    fp32 = all(ar.fmt(x) is not EXACT and ar.fmt(x).name == "fp32"
               for x in ("s", "lse", "p", "dp", "ds"))
    return fp32 and ar.fmt("p_cast").name in native.CASTS


def _softmax_rows(arf: Arith, qc, k3, vis, scale_f):
    """P of some query rows as the standard forward stores it (flashnum.engine.standard's
    structure: S in its site, fp32 softmax, normalised P cast to p_cast)."""
    pol = arf.policy
    s = arf.dot(qc, k3.transpose(-1, -2), pol.fmt("qk_acc"), pol.fmt("qk_product"))
    s = arf.site(arf.site(s, "s") * scale_f, "s")
    if vis is not None:
        s = s.masked_fill(~vis, -math.inf)
    m = arf.rnd(s.amax(dim=-1), pol.fmt("m"))
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = arf.exp(arf.rnd(s - m_safe[..., None], wider(pol.fmt("s"), pol.fmt("m"))), pol.fmt("p"))
    l = arf.site(arf.rowsum(e, pol.fmt("l_acc")), "l")
    l_safe = torch.where(l > 0, l, torch.ones_like(l))
    return arf.site(arf.site(e / l_safe[..., None], "div"), "p_cast")


def _standard(ar, arf, q3, k3, v3, do3, causal, scale):
    """Autograd of standard attention, through chunks of query rows; dK and dV partial
    sums of the chunks add in their accumulator sites (one chunk unless N is large)."""
    B, nq, _ = q3.shape
    nk = k3.shape[1]
    rows = max(1, min(nq, _CHUNK // max(1, B * nk)))
    vis_all = causal_visible(nq, nk, causal=causal) if causal else None
    scale_f = _scaled(arf, scale, arf.policy.fmt("s"))
    scale_ds = _scaled(ar, scale, ar.fmt("ds"))  # torch multiplies in its opmath (fp32)
    dqs, deltas, sums = [], [], []
    dk = dv = None
    for r0 in range(0, nq, rows):
        qc, doc = q3[:, r0 : r0 + rows], do3[:, r0 : r0 + rows]
        p = _softmax_rows(arf, qc, k3, None if vis_all is None else vis_all[r0 : r0 + rows],
                          scale_f)
        dv_c = ar.site(ar.dot(p.transpose(-1, -2), doc, ar.fmt("dv_acc")), "dv")
        dp = ar.site(ar.dot(doc, v3.transpose(-1, -2), ar.fmt("dp_acc")), "dp")
        delta = _rowsum_products(ar, p, dp, "delta")
        ds = ar.site(p * ar.site(dp - delta[..., None], "ds"), "ds")
        dsc = ar.site(ds, "ds_cast")
        sums.append(accumulate.rowsum(dsc, "fp64"))
        dsc = ar.site(dsc * scale_ds, "ds_cast")
        dqs.append(ar.site(ar.dot(dsc, k3, ar.fmt("dq_acc")), "out"))
        dk_c = ar.site(ar.dot(dsc.transpose(-1, -2), qc, ar.fmt("dk_acc")), "dk")
        dk = dk_c if dk is None else ar.site(dk + dk_c, "dk")
        dv = dv_c if dv is None else ar.site(dv + dv_c, "dv")
        deltas.append(delta)
    return (torch.cat(dqs, 1), ar.site(dk, "out"), ar.site(dv, "out"), torch.cat(deltas, 1),
            torch.cat(sums, 1))


__all__ = ["backward", "check_backward", "Gradients", "DQ_ORDERS"]
