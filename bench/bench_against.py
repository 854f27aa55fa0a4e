"""The same calls timed in this checkout and at another commit, interleaved (numbers for notes).

    python bench/bench_against.py 202234e                 # every workload, 3 rounds
    python bench/bench_against.py 202234e --only fwd_fused bwd_fused --rounds 5

"Is it slower than before?" has an answer only when both sides run on the same machine
at the same time: a speed ratio moves by 20% between CPUs and with the load. The commit
is exported (`git archive`) into a temporary folder; each round runs every workload once
in this checkout and once in the other, alternately, each in a fresh process with that
checkout first on PYTHONPATH (the same interpreter and packages; each side builds its
own C kernels on its first call, outside the timing). A workload times its call after one
warm-up call, best of 3 in the process; the figure per side is the best over rounds
(noise on a shared machine only ever adds time). Writes bench/results/against_REV.json
with the machine, the load before and after, and per workload both times and their ratio
(this checkout / the other: above 1 is slower now), its rounds, the load after it and the
head it ran at, and whether both sides' results are the same bits (a digest of every tensor
of the result; of the stored table but its timings for the experiment). With --only the
workloads not run are kept from the file; --bits-only calls each once a side and updates
only the bits (on a loaded machine, where times would mean nothing).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(__file__).parent / "results"

# each workload is a snippet run in the child: SETUP is run once, CALL is timed
PRELUDE = """
import torch, flashnum
from flashnum.engine import fused, fused_backward, native
g = torch.Generator().manual_seed(0)
def randn(*s, dt=torch.float32): return torch.randn(*s, generator=g).to(dt)
"""
WORKLOADS = {
    "fwd_fused": ("q, k, v = (randn(1, 8, 4096, 64) for _ in range(3))",
                  "flashnum.attention(q, k, v, precision='bf16', policy='fa2')"),
    "fwd_lowp": ("q, k, v = (randn(1, 8, 4096, 64) for _ in range(3))",
                 "flashnum.attention(q, k, v, precision='bf16', policy='lowp')"),
    "fwd_in_place": ("q, k, v = (randn(1, 8, 4096, 64) for _ in range(3)); "
                     "fused.set_enabled(False)",
                     "flashnum.attention(q, k, v, precision='bf16', policy='fa2')"),
    "fwd_torch_path": ("q, k, v = (randn(1, 2, 512, 64) for _ in range(3)); "
                       "native.set_enabled(False)",
                       "flashnum.attention(q, k, v, precision='bf16', policy='fa2')"),
    "fwd_fp16_exp2": ("q, k, v = (randn(1, 8, 2048, 64) for _ in range(3))",
                      "flashnum.attention(q, k, v, precision='fp16', policy='fa2', "
                      "variant='exp2')"),
    "step_overhead": ("q, k, v = (randn(1, 2, n, 64) for n in (64, 4096, 4096))",
                      "flashnum.attention(q, k, v, precision='bf16', policy='fa2')"),
    "bwd_fused": ("q, k, v, do = (randn(1, 8, 2048, 64, dt=torch.bfloat16) for _ in range(4)); "
                  "f = flashnum.attention(q, k, v, precision='bf16', policy='fa2')",
                  "flashnum.attention_backward(q, k, v, do, out=f.out, lse=f.lse)"),
    "bwd_torch_loop": ("q, k, v, do = (randn(1, 2, 1024, 64, dt=torch.bfloat16) "
                       "for _ in range(4)); "
                       "f = flashnum.attention(q, k, v, precision='bf16', policy='fa2'); "
                       "fused_backward.set_enabled(False)",
                       "flashnum.attention_backward(q, k, v, do, out=f.out, lse=f.lse)"),
    "mp_256_bits": ("q, k, v = (randn(1, 1, 64, 16, dt=torch.float64) for _ in range(3))",
                    "flashnum.attention(q, k, v, precision='mp', mp_bits=256, block_n=16)"),
    # fresh inputs per call: the certified reference keeps what it computed
    "reference": ("", "flashnum.reference(*(randn(1, 1, 1024, 64, dt=torch.float64) "
                  "for _ in range(3)))"),
}
CHILD = PRELUDE + """
import hashlib, sys, time
{setup}
def call(): return {call}
def digest(x, h):  # every tensor of the result, its bytes as stored
    if isinstance(x, torch.Tensor):
        h.update(x.detach().contiguous().view(torch.uint8).numpy().tobytes())
    elif isinstance(x, (tuple, list)):
        [digest(y, h) for y in x]
    elif hasattr(x, "__dataclass_fields__"):
        [digest(getattr(x, f), h) for f in x.__dataclass_fields__]
    return h
h = digest(call(), hashlib.sha256()).hexdigest()[:16]
best = float('inf')
for _ in range({repeats}):
    t = time.perf_counter(); call(); best = min(best, time.perf_counter() - t)
print(best, h)
"""
# a whole experiment through the router, Hydra and the store: the wall of the process
EXPERIMENT = "bwd_order"


def export(rev: str, into: Path) -> Path:
    """`git archive REV` unpacked under `into`: the other side's source, nothing else."""
    tar = into / "src.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(tar), rev], check=True)
    with tarfile.open(tar) as t:
        t.extractall(into / "src", filter="data")
    return into / "src"


def run_side(src: Path, name: str, scratch: Path, repeats: int = 3) -> tuple[float, str]:
    """(best wall s, a digest of the result's bytes; for the experiment, of its table)."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    if name == EXPERIMENT:
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "flashnum.run", f"experiment={name}",
                        f"store.root={scratch}"], cwd=src, env=env,
                       check=True, capture_output=True)
        wall = time.perf_counter() - t
        import pandas as pd
        df = pd.read_parquet(scratch / name / "results.parquet")
        df = df[sorted(c for c in df.columns if "time" not in c and not c.endswith("_s"))]
        rows = df.sort_values(list(df.columns)[:1]).to_csv(index=False).encode()
        return wall, hashlib.sha256(rows).hexdigest()[:16]
    setup, call = WORKLOADS[name]
    r = subprocess.run([sys.executable, "-c", CHILD.format(setup=setup, call=call,
                                                          repeats=repeats)],
                       cwd=src, env=env, check=True, capture_output=True, text=True)
    best, digest = r.stdout.split()[-2:]
    return float(best), digest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev", help="the commit to compare with, e.g. 202234e")
    ap.add_argument("--only", nargs="+", choices=(*WORKLOADS, EXPERIMENT),
                    help="these workloads (default: all)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--bits-only", action="store_true",
                    help="one call per side: record whether the results are the same bits, "
                         "keep the stored times")
    args = ap.parse_args()
    names = args.only or [*WORKLOADS, EXPERIMENT]
    sys.path.insert(0, str(ROOT))
    from flashnum.harness import timing

    res = {**timing.facts(), "command": " ".join(["python bench/bench_against.py", *sys.argv[1:]]),
           "rev": subprocess.run(["git", "-C", str(ROOT), "rev-parse", args.rev], check=True,
                                 capture_output=True, text=True).stdout.strip(),
           "head": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=True,
                                  capture_output=True, text=True).stdout.strip(),
           "workloads": {}}
    with tempfile.TemporaryDirectory() as tmp:
        other = export(args.rev, Path(tmp))
        sides = {"now": ROOT, "then": other}
        for name in names:
            if args.bits_only:
                bits = {s: run_side(src, name, Path(tmp) / f"store_{s}", 0)[1]
                        for s, src in sides.items()}
                res["workloads"][name] = {"digests": bits, "same_bits":
                                          bits["now"] == bits["then"], "bits_head": res["head"]}
                print(f"{name:16s} same bits: {bits['now'] == bits['then']}", flush=True)
                continue
            times, bits = {s: [] for s in sides}, {}
            for i in range(args.rounds):  # a fresh store each time: nothing is reused
                for side, src in sides.items():
                    t, bits[side] = run_side(src, name, Path(tmp) / f"store_{side}_{i}")
                    times[side].append(t)
            best = {s: min(t) for s, t in times.items()}
            res["workloads"][name] = {"now_s": best["now"], "then_s": best["then"],
                                      "ratio": best["now"] / best["then"], "runs_s": times,
                                      "rounds": args.rounds, "load_average": os.getloadavg(),
                                      "head": res["head"], "digests": bits, "same_bits":
                                      bits["now"] == bits["then"], "bits_head": res["head"]}
            print(f"{name:16s} now {best['now']:8.3f} s  then {best['then']:8.3f} s  "
                  f"ratio {best['now'] / best['then']:.2f}", flush=True)
    res["load_average_after"] = os.getloadavg()
    OUT.mkdir(exist_ok=True)
    path = OUT / f"against_{args.rev}.json"
    if (args.only or args.bits_only) and path.exists():  # what was not run now is kept
        old = json.loads(path.read_text())["workloads"]
        res["workloads"] = {k: old.get(k, {}) | res["workloads"].get(k, {})
                            for k in {**old, **res["workloads"]}}
    path.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
