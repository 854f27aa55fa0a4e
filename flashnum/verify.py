"""`python -m flashnum verify`: every stored table computed again and compared, one line each.

    python -m flashnum verify                          # every name in VERIFY, cheapest first
    python -m flashnum verify bwd_order ties_bias      # some of them
    python -m flashnum verify store.root=/tmp/s compare_with=experiments
    python -m flashnum verify bf16_sweep num_shards=20 shard=0   # other keys go to each run
    make verify VERIFY="bwd_order ties_bias"          # the same

Each experiment's folder in the scratch store (store.root=, default scratch) is removed,
then `python -m flashnum.run experiment=NAME store.root=SCRATCH compare_with=ROOT` runs in
its own process, its output in SCRATCH/NAME.log. The verdict per experiment, written to
SCRATCH/verify.txt and printed: identical (exit 0), DIFFERS (exit 1), not run (any other
exit: a table that needs a third party's file says so), or a real kernel's table stored
on another CPU class (flashnum.store.compare: not compared). Exit status 1 if any
DIFFERS, 2 for bad input (an unknown name, the scratch store being the compared one).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from flashnum import run

PROG = "flashnum verify"

# cheapest first, by the wall times their manifests record; a table that needs a third
# party's file (qiu_yao_agreement, triton_tutorial_*) says so and counts as not run
VERIFY = (
    "input_transforms", "trained_model_stats", "bwd_delta_site", "ties_bias",
    "bwd_trained_model", "bwd_order", "trained_model", "precision_bits", "fa3_protocol",
    "fp32_sweep", "block_scaled", "bound_tightness", "block_order", "block_size",
    "bwd_attribution", "repro_fp8_offset", "kernel_audit_backward", "bwd_bf16_sweep",
    "repro_pcast_threshold", "kernel_audit", "splitkv_decode", "fp16_sweep",
    "torch_cpu_backward", "kernel_vs_emulator", "worst_case", "repro_qiu_yao", "attribution",
    "kernel_table", "repro_fp8_pcast", "repro_is_flash_stable", "repro_splitkv_decode",
    "repro_fa3_table3", "repro_block_scaled", "exp_exhaustive", "bf16_sweep", "seqlen_growth",
    "bwd_seqlen_growth", "torch_cpu_forward", "triton_interpreter", "audit_ports",
    "qiu_yao_agreement", "triton_tutorial_backward", "triton_tutorial_forward", "bound_stress",
)
OTHER_CLASS = "compared only on its CPU class"


def _fail(msg: str) -> int:
    print(f"{PROG}: error: {msg}", file=sys.stderr, flush=True)
    return 2


def parse(argv: list[str]) -> tuple[list[str], Path, Path, list[str]] | str:
    """(names, scratch root, compared root, the other overrides), or the one bad line."""
    names, rest, root, other = [], [], "scratch", "experiments"
    for a in argv:
        key, eq, value = a.partition("=")
        if not eq:
            names.append(a)
        elif key == "store.root":
            root = value
        elif key == "compare_with":
            other = value
        elif key == "experiment":
            names += [n for n in value.split(",") if n]
        else:
            rest.append(a)
    bad = [n for n in names if run.find(n) is None]
    if bad:
        return run.unknown(bad[0])
    if Path(root).resolve() == Path(other).resolve():
        return (f"store.root={root} is the store compared with; valid: a scratch store "
                f"(store.root=scratch)")
    if not Path(other).is_dir():
        return f"compare_with={other} is not a folder; valid: a store, e.g. experiments"
    return names or list(VERIFY), Path(root), Path(other), rest


def verdict(code: int, log: str) -> str:
    if OTHER_CLASS in log:
        return "a real kernel's table, stored on another CPU class: not compared"
    return {0: "identical", 1: "DIFFERS"}.get(code, f"not run (exit {code})")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip() + "\n")
        return 0
    parsed = parse(argv)
    if isinstance(parsed, str):
        return _fail(parsed)
    names, root, other, rest = parsed
    root.mkdir(parents=True, exist_ok=True)
    summary = root / "verify.txt"
    summary.write_text("")
    differs = False
    for name in names:
        shutil.rmtree(root / name, ignore_errors=True)
        t0 = time.time()
        log = root / f"{name}.log"
        with open(log, "w") as f:
            code = subprocess.call([sys.executable, "-m", "flashnum.run", f"experiment={name}",
                                    f"store.root={root}", f"compare_with={other}", *rest],
                                   stdout=f, stderr=subprocess.STDOUT)
        v = verdict(code, log.read_text(errors="replace"))
        differs |= v == "DIFFERS"
        line = f"{name}: {v}, {int(time.time() - t0)} s"
        print(line, flush=True)
        with open(summary, "a") as f:
            f.write(line + "\n")
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
