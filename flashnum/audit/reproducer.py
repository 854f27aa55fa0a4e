"""A standalone reproducer of one broken rule: a Python file that needs only the kernel's
own library, torch and numpy.

    from flashnum.audit.reproducer import write
    path = write(out_dir / "dk_rule.py", instance, "dk_rule", standalone(fn),
                 alignment="top_left", title="torch_sdpa 2.13.0+cpu")

The file holds the instance's exact bits (inline hex when small, else a .npz beside it),
the kernel's call (flashnum.audit.standalone), and the audit's rule restated in plain
torch: the float64 reference (softmax attention computed in float64), standard attention
in the same dtype (S rounded to the dtype, softmax in fp32 rounded, P V in the dtype; for
gradients autograd through torch.softmax on the dtype's S), and the limit
2 max|std - ref| + 2 max|fl32(ref + 0.3 - 0.3) - ref|. It prints the verdict and exits 1
while the kernel breaks the rule, 0 when it keeps it, 2 when the kernel cannot run here
(a package missing, or the call raised: "skip: ...").

Why float64 suffices as the reference here: the writer compares it on the instance with
flashnum's certified reference (every output the float64 nearest the exact attention;
for gradients the certified backward) and records the largest difference as a fraction
of the rule's limit (ref_gap in the file's header and the README); a verdict can move
only by that fraction.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

INLINE_BYTES = 32 * 1024  # inputs up to this size are written into the file itself
_BITS = {torch.float32: ("<u4", torch.int32), torch.bfloat16: ("<u2", torch.int16),
         torch.float16: ("<u2", torch.int16)}
_DTYPE_NAME = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}

TEMPLATE = '''"""{title}: {rule} broken on a {shape_text} input.

Written by flashnum's audit (flashnum.audit.reproducer); runs without flashnum.
    python {filename}      # exit 1 while the defect is present, 0 once fixed, 2 cannot run
{header}"""

import importlib.util
import math
import sys

import numpy as np
import torch

REQUIRES = {requires!r}
_missing = [p for p in REQUIRES if importlib.util.find_spec(p) is None]
if _missing:
    print(f"skip: {{', '.join(_missing)}} not installed")
    sys.exit(2)

# -- the kernel's call ---------------------------------------------------------------------
{kernel_code}
kernel = {kernel_name}  # the kernel under test: fn(q, k, v, causal=..., scale=...)

# -- the input: exact bits -----------------------------------------------------------------
DTYPE = torch.{dtype}
CAUSAL = {causal!r}
ALIGNMENT = {alignment!r}  # top_left: query i sees keys 0..i; bottom_right: 0..i + Nk - Nq
SCALE = {scale!r}
RULE = {rule!r}
SHAPES = {shapes!r}
{data_code}


def tensor(name):
    bits = np.ascontiguousarray(_raw(name)).view({np_signed!r}).copy()
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
                      f"max|{{name}} - {{name}}_ref| (limit: 2x standard attention's + fp32 noise)")
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
    print(f"{{RULE}}: {{what}} = {{err:.6g}}, limit {{lim:.6g}}: ratio {{ratio:.6g}}")
    print("DEFECT PRESENT" if broken else "rule kept")
    return 1 if broken else 0


if __name__ == "__main__":
    try:
        status = main()
    except Exception as e:  # the kernel cannot run here: no verdict either way
        print(f"skip: the kernel could not run: {{type(e).__name__}}: {{str(e)[:600]}}")
        status = 2
    sys.exit(status)
'''


def _tensors(inst) -> dict[str, torch.Tensor]:
    out = dict(q=inst.q, k=inst.k, v=inst.v)
    if inst.do is not None:
        out["do"] = inst.do
    return out


def _data_code(path: Path, tensors: dict[str, torch.Tensor]) -> str:
    """The lines that define _raw(name): the tensors' bits inline, or from a .npz."""
    raw = {n: t.contiguous().view(_BITS[t.dtype][1]).numpy() for n, t in tensors.items()}
    if sum(a.nbytes for a in raw.values()) <= INLINE_BYTES:
        lines = ["_HEX = {"]
        for n, a in raw.items():
            h = a.astype(_BITS[tensors[n].dtype][0]).tobytes().hex()
            chunks = [h[i:i + 88] for i in range(0, len(h), 88)] or [""]
            lines.append(f"    {n!r}: (")
            lines += [f"        {c!r}" for c in chunks]
            lines.append("    ),")
        lines.append("}")
        lines.append("")
        lines.append("")
        lines.append("def _raw(name):")
        lines.append("    return np.frombuffer(bytes.fromhex(_HEX[name]), dtype=np.uint8)")
        return "\n".join(lines)
    npz = path.with_suffix(".npz")
    np.savez_compressed(npz, **{n: a.astype(_BITS[tensors[n].dtype][0])
                                for n, a in raw.items()})
    return ("from pathlib import Path\n\n_DATA = np.load(Path(__file__).with_suffix('.npz'))"
            "\n\n\ndef _raw(name):\n    return _DATA[name].view(np.uint8)")


def write(path, inst, rule: str, kernel, *, alignment: str, title: str,
          header: str = "") -> Path:
    """Write the reproducer of `rule` on `inst` (a flashnum.audit.shrink.Instance) calling
    `kernel` (a flashnum.audit.standalone.Standalone) to path; returns path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = _tensors(inst)
    dt = inst.q.dtype
    b, h, nq, nk, d = inst.shape
    text = TEMPLATE.format(
        title=title, rule=rule, filename=path.name, header=header,
        shape_text=f"B={b} H={h} Nq={nq} Nk={nk} d={d}"
                   f"{'' if inst.v.shape[-1] == d else f' dv={inst.v.shape[-1]}'}"
                   f"{' causal' if inst.causal else ''}",
        requires=tuple(p for p in kernel.packages if p not in ("torch", "numpy")),
        kernel_code=kernel.code.strip() + "\n", kernel_name=kernel.name,
        dtype=_DTYPE_NAME[dt], causal=bool(inst.causal), alignment=alignment,
        scale=None if inst.scale is None else float(inst.scale),
        shapes={n: tuple(t.shape) for n, t in tensors.items()},
        data_code=_data_code(path, tensors),
        np_signed="<i4" if dt == torch.float32 else "<i2")
    path.write_text(text)
    return path
