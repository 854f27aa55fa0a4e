"""tinygrad_sdpa (tinygrad 0.14.0, torch 2.13.0+cpu): fa_rule broken on a B=1 H=1 Nq=1 Nk=74 d=1 dv=2 input.

Written by flashnum's audit (flashnum.audit.reproducer); runs without flashnum.
    python fa_rule.py      # exit 1 while the defect is present, 0 once fixed, 2 cannot run

Kernel: tinygrad_sdpa (tinygrad 0.14.0, torch 2.13.0+cpu)
Rule: fa_rule; the audit's case underflow/B1H2/Nq600Nk600/d64/full/s0 broke it by 1.438x;
shrunk in 116 kernel calls to B=1 H=1 Nq=1 Nk=74 d=1 dv=2, where the audit measures 1.093x.
The float64 reference is within 2.4e-09 of the limit of flashnum's certified one here.
"""

import importlib.util
import math
import sys

import numpy as np
import torch

REQUIRES = ('tinygrad',)
_missing = [p for p in REQUIRES if importlib.util.find_spec(p) is None]
if _missing:
    print(f"skip: {', '.join(_missing)} not installed")
    sys.exit(2)

# -- the kernel's call ---------------------------------------------------------------------
import math
import torch

TINYGRAD_CPU = "its CPU device compiles each kernel with clang >= 19: install one, or `pip install ziglang` (flashnum's tinygrad target then puts zig's clang on PATH)"


def tinygrad_sdpa(q, k, v, causal=False, scale=None):
    """tinygrad's Tensor.scaled_dot_product_attention on its default device (CPU here);
    (B, H, N, d) torch in and out. tinygrad scales by 1/sqrt(d) itself: another scale
    is folded into q."""
    from tinygrad import Tensor

    d = q.shape[-1]
    qn = q.detach().float().numpy()
    if scale is not None and scale != 1.0 / math.sqrt(d):
        qn = qn * (scale * math.sqrt(d))
    try:
        t = [Tensor(x) for x in (qn, k.detach().float().numpy(), v.detach().float().numpy())]
        out = t[0].scaled_dot_product_attention(t[1], t[2], is_causal=causal).numpy()
    except (RuntimeError, NotImplementedError, FileNotFoundError) as e:
        raise RuntimeError(f"tinygrad's CPU device does not run here ({type(e).__name__}: "
                           f"{str(e)[:80]}): " + TINYGRAD_CPU) from None
    return torch.from_numpy(out.copy()).to(q.dtype)

kernel = tinygrad_sdpa  # the kernel under test: fn(q, k, v, causal=..., scale=...)

# -- the input: exact bits -----------------------------------------------------------------
DTYPE = torch.float32
CAUSAL = False
ALIGNMENT = 'top_left'  # top_left: query i sees keys 0..i; bottom_right: 0..i + Nk - Nq
SCALE = 0.125
RULE = 'fa_rule'
SHAPES = {'q': (1, 1, 1, 1), 'k': (1, 1, 74, 1), 'v': (1, 1, 74, 2)}
_HEX = {
    'q': (
        '00008043'
    ),
    'k': (
        '0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000'
        '0000000000000000000000000000000000000000000000000000000000000000000080bf000080bf000000bf'
        '000080bf000080be000000bf000000bf000000bf000000bf000080bf000080be000000bf000000bf000080be'
        '000080bf000000bd000080be000000bf000000bf000000bf000080be000080be000000bf000080bf000000bf'
        '000080bf000000be000080bf000080bf000080bf000000bf000000bf000000bf000080bf000080bf000000bd'
        '000000bf000000bf000080be000000bf000000bf000000be000000bf000080bd000080be000080bf000080be'
        '000080be000000bf000080bf000080bf000000bf000080be000000bf000080be'
    ),
    'v': (
        '000080bf000080be0000003f000000c0000000be000080bf000080bf000000bf0000803e0000003f000080be'
        '0000803f000000bf000000400000003d00000040000000bd0000003f000000c0000080be0000803f00000040'
        '000000bf000000bf0000003e000000bf0000803e000080bf0000004000000040000000400000803f000080bf'
        '0000003f0000803f000000400000803e0000003e0000003f000080bc0000003f0000803f000000bf000080be'
        '000080bf0000803f00000040000000be00000040000080be000080bf000080be0000803f0000803f000080be'
        '000080bf0000003f0000803d0000803f0000003e000080bf000000c00000003f0000803e000000bf000080bf'
        '000000be000080bf000080bf0000803e000000bf00000040000080be0000003f0000003f0000803e000080bf'
        '0000803f000080bf0000803e0000003f000080bf000000c0000000bf0000003f0000003f000080be0000803f'
        '0000003e000000be0000803f000080bf000000400000003f0000803f0000003f000000be0000803d00000040'
        '0000004000000040000000bf000080be0000003f0000003f0000803e0000803f0000803f000000bf0000003f'
        '000080be0000003e00000040000000bf0000803c0000803f0000003e000000bf000080bf00000040000080bf'
        '0000803f000000400000803e0000803e0000803f0000003d0000803f0000803f000080bf000080bf000080bf'
        '000000be0000803f000000bf0000803f0000803f0000803e000080be000080bf000000bf000000bf000080be'
        '0000803f000080be00000040000080be0000803f'
    ),
}


def _raw(name):
    return np.frombuffer(bytes.fromhex(_HEX[name]), dtype=np.uint8)


def tensor(name):
    bits = np.ascontiguousarray(_raw(name)).view('<i4').copy()
    return torch.from_numpy(bits).view(DTYPE).reshape(SHAPES[name])


def visible(nq, nk):
    i, j = torch.arange(nq)[:, None], torch.arange(nk)[None, :]
    return j <= i + (nk - nq if ALIGNMENT == "bottom_right" else 0)


def attention(q, k, v, scale, *, exact):
    """exact: float64 softmax attention (the reference); else standard attention in the
    dtype, flash-attn's attention_ref(upcast=False)."""
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    vis = visible(q.shape[-2], k.shape[-2]) if CAUSAL else torch.ones(
        q.shape[-2], k.shape[-2], dtype=torch.bool)
    dead = ~vis.any(-1, keepdim=True)  # rows that see no key: out 0
    s = s.masked_fill(~vis, -math.inf).masked_fill(dead, 0.0)
    if exact:
        p = torch.softmax(s, dim=-1)
    elif RULE.startswith("d"):  # the gradients' standard: softmax on the dtype's logits
        p = torch.softmax(s, dim=-1)
    else:
        p = torch.softmax(s.float(), dim=-1)
    p = p.masked_fill(dead, 0.0)
    return torch.matmul(p.to(q.dtype), v), dead[..., 0].expand(q.shape[:-1])


def vmax(x):
    return float(torch.nan_to_num(x, nan=math.inf, posinf=math.inf).max()) if x.numel() else 0.0


def limit(std, ref, keep):
    noise = ((ref.float() + 0.3 - 0.3).double() - ref.float().double()).abs()[keep]
    return 2 * vmax((std.double() - ref).abs()[keep & torch.isfinite(std.double())
                                               if not RULE.startswith("d") else keep]
                    ) + 2 * vmax(noise)


def grads(f, q, k, v, do):
    xs = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
    out = f(*xs)
    out = out[0] if isinstance(out, (tuple, list)) else out
    return dict(zip(("dq", "dk", "dv"), torch.autograd.grad(out, xs, do.to(out.dtype))))


def main():
    q, k, v = tensor("q"), tensor("k"), tensor("v")
    scale = SCALE if SCALE is not None else 1.0 / math.sqrt(q.shape[-1])
    q64, k64, v64 = q.double(), k.double(), v.double()
    ref, dead = attention(q64, k64, v64, scale, exact=True)
    if RULE in ("dq_rule", "dk_rule", "dv_rule", "grad_nonfinite", "grad_masked"):
        do = tensor("do")
        got = grads(lambda a, b, c: kernel(a, b, c, causal=CAUSAL, scale=SCALE), q, k, v, do)
        if RULE == "grad_masked":
            return report(vmax(got["dq"].double()[dead].abs()), 0.0,
                          "max|dQ| on rows that see no key")
        gref = grads(lambda a, b, c: attention(a, b, c, scale, exact=True)[0],
                     q64, k64, v64, do.double())
        if RULE == "grad_nonfinite":
            n = sum(int((~torch.isfinite(got[g]) & torch.isfinite(gref[g])).sum())
                    for g in got)
            return report(float(n), 0.0, "inf/NaN entries in dQ, dK, dV")
        name = RULE[:2]
        gstd = grads(lambda a, b, c: attention(a, b, c, scale, exact=False)[0], q, k, v, do)
        keep = torch.isfinite(gref[name])
        err = vmax((got[name].double() - gref[name]).abs()[keep])
        return report(err, limit(gstd[name], gref[name], keep),
                      f"max|{name} - {name}_ref| (limit: 2x standard attention's + fp32 noise)")
    out = kernel(q, k, v, causal=CAUSAL, scale=SCALE)
    lse = out[1] if isinstance(out, (tuple, list)) and len(out) > 1 else None
    out = (out[0] if isinstance(out, (tuple, list)) else out).double()
    keep = torch.isfinite(ref) & ~dead[..., None].expand_as(ref)
    if RULE == "masked":
        return report(vmax(out[dead[..., None].expand_as(out)].abs()), 0.0,
                      "max|out| on rows that see no key")
    if RULE == "nonfinite":
        return report(float((~torch.isfinite(out) & keep).sum()), 0.0,
                      "inf/NaN outputs where the reference is finite")
    if RULE == "lse":
        s = torch.matmul(q64, k64.transpose(-1, -2)) * scale
        vis = visible(q.shape[-2], k.shape[-2]) if CAUSAL else True
        lse_ref = torch.logsumexp(s.masked_fill(~vis, -math.inf) if CAUSAL else s, dim=-1)
        sd = (torch.matmul(q, k.transpose(-1, -2)) * scale).float()
        lse_std = torch.logsumexp(sd.masked_fill(~vis, -math.inf) if CAUSAL else sd, dim=-1)
        fin = torch.isfinite(lse_ref)
        lim = 2 * vmax((lse_std.double() - lse_ref)[fin].abs()) + 8 * 2.0**-24 * vmax(
            lse_ref[fin].abs())
        return report(vmax((lse.double() - lse_ref)[fin].abs()), lim, "max|lse - lse_ref|")
    std, _ = attention(q, k, v, scale, exact=False)
    err = vmax((out - ref).abs()[keep])
    return report(err, limit(std, ref, keep),
                  "max|out - ref| (limit: 2x standard attention's + fp32 noise)")


def report(err, lim, what):
    broken = not err <= lim
    ratio = err / lim if lim > 0 else (math.inf if err > 0 else 0.0)
    print(f"{RULE}: {what} = {err:.6g}, limit {lim:.6g}: ratio {ratio:.6g}")
    print("DEFECT PRESENT" if broken else "rule kept")
    return 1 if broken else 0


if __name__ == "__main__":
    try:
        status = main()
    except Exception as e:  # the kernel cannot run here: no verdict either way
        print(f"skip: the kernel could not run: {type(e).__name__}: {str(e)[:600]}")
        status = 2
    sys.exit(status)
