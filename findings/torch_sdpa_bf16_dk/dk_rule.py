"""torch_sdpa (torch 2.13.0+cpu): dk_rule broken on a B=1 H=1 Nq=2 Nk=2 d=128 causal input.

Written by flashnum's audit (flashnum.audit.reproducer); runs without flashnum.
    python dk_rule.py      # exit 1 while the defect is present, 0 once fixed, 2 cannot run

Kernel: torch_sdpa (torch 2.13.0+cpu)
Rule: dk_rule; the audit's case plateau/B2H1/Nq77Nk77/d128/causal/s0 broke it by 1.892x;
shrunk in 120 kernel calls to B=1 H=1 Nq=2 Nk=2 d=128, where the audit measures 1.666x.
The float64 reference is within 2.8e-15 of the limit of flashnum's certified one here.
"""

import importlib.util
import math
import sys

import numpy as np
import torch

REQUIRES = ()
_missing = [p for p in REQUIRES if importlib.util.find_spec(p) is None]
if _missing:
    print(f"skip: {', '.join(_missing)} not installed")
    sys.exit(2)

# -- the kernel's call ---------------------------------------------------------------------
import torch
import torch.nn



def torch_sdpa(q, k, v, causal=False, scale=None):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                            scale=scale)

kernel = torch_sdpa  # the kernel under test: fn(q, k, v, causal=..., scale=...)

# -- the input: exact bits -----------------------------------------------------------------
DTYPE = torch.bfloat16
CAUSAL = True
ALIGNMENT = 'top_left'  # top_left: query i sees keys 0..i; bottom_right: 0..i + Nk - Nq
SCALE = None
RULE = 'dk_rule'
SHAPES = {'q': (1, 1, 2, 128), 'k': (1, 1, 2, 128), 'v': (1, 1, 2, 128), 'do': (1, 1, 2, 128)}
_HEX = {
    'q': (
        '0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000'
        '0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000'
        '0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000'
        '0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000'
        '0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000'
        '000000000000000000000000000000000000000000000000000000000000000000000000803f803f00000000'
        '0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000'
        '0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000'
        '0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000'
        '0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000'
        '0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000'
        '00000000000000000000000000000000000000000000000000000000'
    ),
    'k': (
        '0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000'
        '0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000'
        '0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000'
        '0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000'
        '0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000'
        '0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000'
        '0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000'
        '0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000'
        '0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000'
        '0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000'
        '0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000'
        '00000000000000000000000000000000000000000000000000000000'
    ),
    'v': (
        '804081407f407e407d407d407b4081407f408340824081407d4081407e4081408040804081407b4083407f40'
        '804081407f407e407e40814081407e40824082407f407e40804083407c407e407c4080407c40804080407d40'
        '7b407e407d407f407e4084407f4082408040814080407d407d4081407f40814082408240854081407b408140'
        '7e40814080408040824080407c40824080407e4082407f4081407c407e407f4082407e408040844084408140'
        '81407d407e40804081407e407f407d4082407c4081407e408240804080408240824080407d407f4081407b40'
        '81407f407b407e408040814081407e407840804082408140804082407f407c4082407f40804081407b408440'
        '7d407f40814081407c40804082407f407f4081407e4083407e40804080407d408140814081407f407c408340'
        '7a40804079407f4080408140804080407d407f40814081408240824080408040804080407b40804082408040'
        '7f407f4082407a407c40814079407e407c407a408240834080407f408340834081407d4081407e4080408140'
        '80407d408140834083407d4080408140814080407d407f4082407d408140804080407d407c40804080407f40'
        '80407f4081408240844081408240814080407f4082407e40814085407d40814082407e407f4081407e407b40'
        '7b40824082407f407c407f40804083407a407c407f40804082408140'
    ),
    'do': (
        '803f004000400040003c0040803f803f0040003f80be004000be003f803f80bf803d00bd80be003e80bf80be'
        '00c080bf803d00bf80be00c0003e803f803f003f803f80bd00bf00bf80be803f803f00c0003f004080bf80be'
        '80be00bf003f00c000c080be80bf80bf80be80bf003b803f803e00bf003f00be00bf003f00bf00bf003f80bf'
        '80bf803e80be80bf003f00c000c0003f80be00bf80bf0040803f80bf003f003f80bf80be00c0803e803e00bf'
        '803e003f803f80bf80bf80bf80bf80bf80bf00be80bf803e003f80bf803e803f80bd803f803f80bf003e003f'
        '003f003e803f003d80bf00bf803e80bf003f803f00bf803f0040003f80bf80bd803f803f803f00c080bf003f'
        '0040004000bd00bf80bf803f003e80bf803f80bf80bf003f003f803f803e00bd00bf00bf00be00bf00bf003e'
        '803e00bf00bf803f80bf80bf004080be803e00bf80bf00bf803f803f803f00bf00bf003f80bf80bf003f0040'
        '003e00c0004080bf80be80be80bf003f803f80be003f80bf00c0803f80bf004000c0003e00bf80bf00bf003f'
        '003f003f003d0040803f00c0003f80bd003f00be80bd00c080bf803f00be803e00bf00be003f803e80bf803e'
        '80be003f80bf803f80be80bf003f003d803d00bf803f80bf003b00bf80be00bf803f003f003e80bf80bb00c0'
        '803f00bf80bf003f803f003f003f003f803f80bb80bd00bf00bf00c0'
    ),
}


def _raw(name):
    return np.frombuffer(bytes.fromhex(_HEX[name]), dtype=np.uint8)


def tensor(name):
    bits = np.ascontiguousarray(_raw(name)).view('<i2').copy()
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
