"""Recompute a sample of stored experiments and compare them with the stored tables.

    python bench/check_unchanged.py                      # shard 0 of 20 of each, ~ minutes
    python bench/check_unchanged.py --num-shards 10 --experiments bf16_sweep block_order
    python bench/check_unchanged.py --num-shards 1       # every case (long)
    python bench/check_unchanged.py --baseline /tmp/orig # also rerun an older tree, compare

For each experiment (default bf16_sweep, fp16_sweep, block_order, kernel_vs_emulator)
it runs the public command line into a scratch store,

    python -m flashnum.run experiment=X store.root=SCRATCH num_shards=K shard=S

(a shard is the cases whose case_id is S mod K: a deterministic sample), then compares
every column of every recomputed row with the row of the same case_id in the stored
table experiments/X/results.parquet, except the timings (attention_s, wall_s): values
must be identical (NaN equal to NaN), not close. Exits 1 on any difference, a missing
row or a missing column, and writes bench/results/unchanged.json (per experiment: cases
compared, columns compared, differences with a few examples and the largest relative
difference per column, the command, wall time).

--baseline PATH reruns the same sample with the code of another checkout (a worktree of
an older commit, run with PYTHONPATH=PATH from PATH) into the scratch store as well, and
compares the two recomputations column by column: what a code change alone did, apart
from whatever else (machine, libraries) separates a rerun from the stored table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from flashnum.harness import store

REPO = Path(__file__).resolve().parents[1]
OUT = Path(__file__).parent / "results" / "unchanged.json"
EXPERIMENTS = ("bf16_sweep", "fp16_sweep", "block_order", "kernel_vs_emulator")
TIMINGS = ("attention_s", "wall_s")  # the only columns a rerun may change


def _missing(x) -> bool:
    try:
        return bool(pd.isna(x))
    except (TypeError, ValueError):  # not a scalar
        return False


def same(a, b) -> bool:
    """Identical values: a missing value (NaN, None, NA) equals only a missing value;
    everything else compared with == (floats exactly)."""
    if _missing(a) or _missing(b):
        return _missing(a) and _missing(b)
    return bool(a == b)


def compare(new: pd.DataFrame, old: pd.DataFrame) -> dict:
    """Every non-timing column of every row of `new` against `old`'s row of its case_id."""
    old = old.set_index("case_id")
    cols = [c for c in new.columns if c not in TIMINGS and c != "case_id"]
    missing_cols = [c for c in cols if c not in old.columns]
    missing_rows = [i for i in new["case_id"] if i not in old.index]
    diffs = []
    for _, row in new.iterrows():
        if row["case_id"] not in old.index:
            continue
        ref = old.loc[row["case_id"]]
        for c in cols:
            if c in old.columns and not same(row[c], ref[c]):
                diffs.append({"case_id": row["case_id"], "column": c, "recomputed": repr(row[c]),
                              "stored": repr(ref[c])})
    worst = {}
    for d in diffs:
        try:
            a, b = float(new.set_index("case_id").loc[d["case_id"], d["column"]]), float(
                old.loc[d["case_id"], d["column"]])
            rel = abs(a - b) / max(abs(a), abs(b))
        except (TypeError, ValueError, ZeroDivisionError):
            rel = None  # not numbers (JSON text, strings)
        w = worst.get(d["column"], 0.0)
        worst[d["column"]] = None if rel is None or w is None else max(w, rel)
    return {"cases": len(new), "columns": len(cols), "missing_columns": missing_cols,
            "missing_rows": missing_rows, "n_differences": len(diffs), "differences": diffs[:20],
            "columns_differing": sorted(worst), "max_rel_difference": worst}


def recompute(name: str, scratch: Path, num_shards: int, shard: int, tree: Path = REPO):
    """Run the sample through `tree`'s command line; (its rows or None, the record)."""
    overrides = [f"experiment={name}", f"store.root={scratch}", f"num_shards={num_shards}",
                 f"shard={shard}", f"hydra.run.dir={scratch / 'hydra' / name}"]
    cmd = [sys.executable, "-m", "flashnum.run", *overrides]
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=tree, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(tree)})
    res = {"command": "python -m flashnum.run " + " ".join(overrides[:-1]),
           "wall_s": time.perf_counter() - t}
    if proc.returncode != 0:
        res["error"] = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return None, res
    return store.load(name, root=scratch, all_rows=True), res


def run_one(name: str, scratch: Path, num_shards: int, shard: int, baseline: Path | None):
    new, res = recompute(name, scratch, num_shards, shard)
    if new is None:
        return res
    res.update(compare(new, store.load(name, root=REPO / "experiments")))
    if baseline is not None:
        old, rec = recompute(name, scratch / "baseline", num_shards, shard, baseline)
        rec["tree"] = str(baseline)
        if old is not None:
            rec.update(compare(new, old))
        res["vs_baseline"] = rec
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--experiments", nargs="+", default=list(EXPERIMENTS))
    ap.add_argument("--num-shards", type=int, default=20, help="sample 1/K of each grid")
    ap.add_argument("--shard", type=int, default=0)
    ap.add_argument("--scratch", type=Path, default=None,
                    help="scratch store (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--baseline", type=Path, default=None,
                    help="another checkout to rerun the sample with and compare against")
    args = ap.parse_args(argv)
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="flashnum-unchanged-"))
    report = {"machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
              "num_shards": args.num_shards, "shard": args.shard, "experiments": {}}
    ok = True
    for name in args.experiments:
        r = run_one(name, scratch, args.num_shards, args.shard, args.baseline)
        report["experiments"][name] = r
        good = "error" not in r and not (r["n_differences"] or r["missing_rows"]
                                         or r["missing_columns"])
        ok &= good
        what = (f"error: {r['error']}" if "error" in r else
                f"{r['cases']} cases x {r['columns']} columns, {r['n_differences']} differences"
                + (f" in {r['columns_differing']}" if r["n_differences"] else "")
                + (f", {len(r['missing_rows'])} rows not stored" if r["missing_rows"] else ""))
        print(f"{name}: {what} ({r['wall_s']:.0f} s)", flush=True)
        if "vs_baseline" in r:
            b = r["vs_baseline"]
            print(f"  vs {args.baseline}: " + (f"error: {b['error']}" if "error" in b else
                  f"{b['n_differences']} differences in {b['columns_differing']}"
                  + (f"; columns only here: {b['missing_columns']}" if b["missing_columns"]
                     else "")), flush=True)
    report["identical"] = ok
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print("identical in every non-timing column" if ok else "DIFFERENCES (see " + str(args.out)
          + ")")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
