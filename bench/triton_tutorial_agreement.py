"""Bitwise agreement of flashnum's fa2/exp2 model with the Triton tutorial's forward kernel.

    python bench/triton_tutorial_agreement.py PATH/06-fused-attention.py
    python bench/triton_tutorial_agreement.py PATH --audit --out results.json

PATH is triton-lang/triton's python/tutorials/06-fused-attention.py (it never enters this
repository). Its module is loaded under the CPU interpreter (TRITON_INTERPRET=1) and its
own host function `attention(q, k, v, causal, sm_scale)` is called, so its forward
@triton.jit functions run unchanged: fp16, one 128 x 64 tile configuration (the
autotuner's list replaced by that one entry), N 256 and 512, causal and not, sm_scale
0.5 and 1.3. Each output is compared element by element with
flashnum.attention(precision="fp16", policy="fa2", block_m=128, block_n=64,
variant="exp2", scale=sm_scale) under both forms of the exp2 scale site
(exp2_scale="twice", the tutorial's fl32(fl32(sm_scale) * fl32(1.44269504)), and "once").

Three things the tutorial needs that a CPU lacks are supplied by the loader of
flashnum.harness.triton_tutorial without touching its code: an active Triton driver (a
stand-in that names the CPU device), a single tile configuration (the autotuner would
time configurations), and, on Triton releases whose interpreter converts a one-element
array with int() (numpy 2 refuses), an __index__ that takes the element. The tutorials
written with block pointers run on Triton releases whose interpreter still has them (3.2
here: PYTHONPATH to such a release).

The backward is the experiment triton_tutorial_backward (flashnum.harness.triton_tutorial,
whose loader this script uses): FLASHNUM_TRITON_TUTORIAL=PATH python -m flashnum.run
experiment=triton_tutorial_backward.

--audit also runs flashnum.audit on the tutorial (quick budget, fp16), each in a child
process, once as is and once with isolate=True: the tutorial stores its row statistics
without a mask, so an N that is not a multiple of BLOCK_M writes past the end of its M
buffer; in-process that corrupts the audit's own heap, isolated the audit reports those
cases as failed (crash) and finishes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import torch  # noqa: E402

from flashnum.harness.triton_tutorial import load  # noqa: E402

CASES = [(n, causal, s) for n in (256, 512) for causal in (False, True) for s in (0.5, 1.3)]


def agreement(mod, seed: int = 0) -> list[dict]:
    import flashnum

    rows = []
    for n, causal, sm_scale in CASES:
        g = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(1, 2, n, 64, generator=g).half() for _ in range(3))
        out = mod.attention(q, k, v, causal, sm_scale)
        row = dict(n=n, causal=causal, sm_scale=sm_scale, elements=out.numel())
        for form in ("twice", "once"):
            res = flashnum.attention(q, k, v, precision="fp16", policy="fa2", block_m=128,
                                     block_n=64, variant="exp2", causal=causal,
                                     scale=sm_scale, exp2_scale=form)
            mine = res.out.half()
            row[f"bitwise_{form}"] = float((mine == out).double().mean())
            row[f"max_diff_{form}"] = float((mine.double() - out.double()).abs().max())
        rows.append(row)
        print(f"N={n} causal={causal} sm_scale={sm_scale}: bitwise "
              f"{100 * row['bitwise_twice']:.3f}% (exp2_scale twice), "
              f"{100 * row['bitwise_once']:.3f}% (once)", flush=True)
    return rows


AUDIT_CHILD = """
import sys, math, json
sys.path.insert(0, {bench!r})
import triton_tutorial_agreement as t
mod = t.load({path!r})
import flashnum.audit as fa
def tutorial(q, k, v, causal=False, scale=None):
    return mod.attention(q, k, v, causal, 1 / math.sqrt(q.shape[-1]) if scale is None else scale)
rep = fa.audit(tutorial, precision="fp16", budget="quick", alignment="top_left",
               isolate={isolate!r})
print(rep.summary())
print("AUDIT_JSON " + json.dumps(dict(passed=bool(rep.passed), cases=len(rep.table),
                                      broken=rep.broken())))
"""


def audit_child(path: str, isolate: bool) -> dict:
    code = AUDIT_CHILD.format(bench=str(Path(__file__).parent), path=str(Path(path).resolve()),
                              isolate=isolate)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=dict(os.environ, TRITON_INTERPRET="1"))
    tail = (p.stdout + p.stderr)[-3000:]
    print(tail)
    found = [ln for ln in p.stdout.splitlines() if ln.startswith("AUDIT_JSON ")]
    result = json.loads(found[-1][len("AUDIT_JSON "):]) if found else None
    return dict(exit_code=p.returncode, survived=bool(found), result=result)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", help="the tutorial's 06-fused-attention.py")
    ap.add_argument("--out", default=None, help="default: bench/results/"
                    "triton_tutorial_agreement.json")
    ap.add_argument("--audit", action="store_true", help="also audit it (child process)")
    args = ap.parse_args(argv)
    if not Path(args.path).is_file():
        ap.error(f"no tutorial file at {args.path!r}; give the path of "
                 "python/tutorials/06-fused-attention.py")
    args.out = args.out or str(Path(__file__).parent / "results"
                               / "triton_tutorial_agreement.json")
    import triton

    rows = agreement(load(args.path))
    out = dict(triton=triton.__version__, torch=torch.__version__, cases=rows)
    if args.audit:  # in-process (the target's memory errors reach the audit), then isolated
        out["audit"] = {f"isolate={x}": audit_child(args.path, x) for x in (False, True)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
