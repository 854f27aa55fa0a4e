"""hf_eager (torch 2.13.0+cpu, transformers 5.24.0): masked broken on a B=1 H=1 Nq=2 Nk=1 d=1 causal input.

Written by flashnum's audit (flashnum.audit.reproducer); runs without flashnum.
    python masked.py      # exit 1 while the defect is present, 0 once fixed, 2 cannot run

Kernel: hf_eager (torch 2.13.0+cpu, transformers 5.24.0)
Rule: masked; the audit's case masked/B1H1/Nq96Nk64/d64/causal/s0 broke it by inf (the limit is 0: any value breaks it);
shrunk in 59 kernel calls to B=1 H=1 Nq=2 Nk=1 d=1, where the audit measures inf (the limit is 0: any value breaks it).
"""

import importlib.util
import math
import sys

import numpy as np
import torch

REQUIRES = ('transformers',)
_missing = [p for p in REQUIRES if importlib.util.find_spec(p) is None]
if _missing:
    print(f"skip: {', '.join(_missing)} not installed")
    sys.exit(2)

# -- the kernel's call ---------------------------------------------------------------------
from types import SimpleNamespace
import importlib
import importlib.util
import math
import torch
import torch.nn



def _eager_plain(module, query, key, value, attention_mask, scaling, dropout=0.0):
    """transformers' eager_attention_forward without the KV-group repeat (groups = 1)."""
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = torch.nn.functional.softmax(attn_weights, dim=-1,
                                               dtype=torch.float32).to(query.dtype)
    attn_weights = torch.nn.functional.dropout(attn_weights, p=dropout,
                                               training=module.training)
    attn_output = torch.matmul(attn_weights, value)
    return attn_output.transpose(1, 2).contiguous(), attn_weights


def _eager():
    if importlib.util.find_spec("transformers") is None:
        return _eager_plain
    from transformers.models.llama.modeling_llama import eager_attention_forward

    return eager_attention_forward


def hf_eager(q, k, v, causal=False, scale=None):
    """The eager attention of transformers, (B, H, N, d) in and out."""
    nq, nk = q.shape[-2], k.shape[-2]
    scaling = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    mask = None
    if causal:
        i = torch.arange(nq)[:, None]
        j = torch.arange(nk)[None, :]
        mask = torch.zeros(nq, nk, dtype=q.dtype).masked_fill(
            j > i + (nk - nq), torch.finfo(q.dtype).min)[None, None]
    module = SimpleNamespace(num_key_value_groups=1, training=False)
    out, _ = _eager()(module, q, k, v, mask, scaling)
    return out.transpose(1, 2)

kernel = hf_eager  # the kernel under test: fn(q, k, v, causal=..., scale=...)

# -- the input: exact bits -----------------------------------------------------------------
DTYPE = torch.bfloat16
CAUSAL = True
ALIGNMENT = 'bottom_right'  # top_left: query i sees keys 0..i; bottom_right: 0..i + Nk - Nq
SCALE = 0.125
RULE = 'masked'
SHAPES = {'q': (1, 1, 2, 1), 'k': (1, 1, 1, 1), 'v': (1, 1, 1, 1)}
_HEX = {
    'q': (
        '00000000'
    ),
    'k': (
        '0000'
    ),
    'v': (
        '80bf'
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
