"""Recompute a sample of stored cases through today's harness; every non-timing column must match.

    python bench/results_unchanged.py                       # 6 cases of each experiment below
    python bench/results_unchanged.py --sample 20 --experiments bf16_sweep block_order
    python bench/results_unchanged.py --stored DIR   # against another store (older code's)
    python bench/results_unchanged.py --ids FILE     # only write the sampled case_ids (JSON)

For each experiment (default: bf16_sweep fp16_sweep block_order kernel_vs_emulator) the
grid is composed from conf/ exactly as `python -m flashnum.run experiment=NAME` does,
a deterministic sample of its cases with at most --max-logits query-key pairs is taken
(spread over the case_ids), and flashnum.harness.run.run computes them into a scratch
store. Each recomputed row is compared with the stored row of the same case_id, column
by column, every column but the timings (wall_s, attention_s): equal values, NaN equal
to NaN. Columns that only one side has are listed, differences summarised per column
(count, largest relative difference). Exit status 0 when all match, 1 otherwise.

Against older code: write the sample's case_ids with --ids FILE, extract the older commit
(`git archive COMMIT | tar -x -C DIR`), run each listed case there through that
commit's run_group (one case per call: run_group shares inputs within its group) into a
store, compact it, and pass that store as --stored.

Measured (2-core Xeon, 2026-11-30): 6 cases of each of the four experiments and 4 of
precision_bits, against commit 0cef886 (before the package moves) and 64d8a92: every
non-timing column identical (bound_finite is new since). Against the stored tables
(written by commit 4bcce39, a dirty tree, before either) max_abs_err agrees to <= 2e-14
relative, aggregates to <= 2e-12, naive_rmse_ratio to 7e-5 and kernel_vs_emulator's
naive ratios to 0.42: that drift predates the moves (0cef886 shows the same).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import pandas as pd
from hydra import compose, initialize_config_dir

from flashnum.harness import store
from flashnum.harness.config import check
from flashnum.harness.grid import expand
from flashnum.harness.paths import CONF
from flashnum.harness.run import run

EXPERIMENTS = ("bf16_sweep", "fp16_sweep", "block_order", "kernel_vs_emulator")
TIMINGS = ("wall_s", "attention_s")


def sample(cases, n: int, max_logits: int):
    small = sorted((c for c in cases if c.seq_len_q * c.seq_len_k <= max_logits),
                   key=lambda c: c.case_id)
    step = max(1, len(small) // max(n, 1))
    return small[::step][:n]


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    try:
        return bool(a == b) or (pd.isna(a) and pd.isna(b))
    except (TypeError, ValueError):
        return str(a) == str(b)


def _cfg(name: str, scratch: Path):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={name}", f"store.root={scratch}",
                                           "n_jobs=1", "progress=false", "worst=3"])
    check(cfg)
    return cfg


def compare(name: str, n: int, max_logits: int, scratch: Path, root=None) -> list[str]:
    cfg = _cfg(name, scratch)
    stored = store.load(name, root, all_rows=True).set_index("case_id")
    cases = [c for c in sample(expand(cfg), n, max_logits) if c.case_id in stored.index]
    new = run(cfg, cases, [f"experiment={name}"])["table"].set_index("case_id")
    diffs = []
    cols = [c for c in stored.columns if c not in TIMINGS]
    only = sorted(set(new.columns) ^ set(stored.columns))
    if only:
        print(f"{name}: columns on one side only: {', '.join(only)}")
    for cid in new.index:
        for col in cols:
            if col in new.columns and not same(new.at[cid, col], stored.at[cid, col]):
                diffs.append((name, cid, col, stored.at[cid, col], new.at[cid, col]))
    print(f"{name}: {len(new)} cases recomputed, {len(cols)} columns compared, "
          f"{len(diffs)} differences")
    return diffs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--experiments", nargs="+", default=list(EXPERIMENTS))
    ap.add_argument("--sample", type=int, default=6, help="cases per experiment")
    ap.add_argument("--max-logits", type=int, default=512 * 512,
                    help="only cases with seq_len_q * seq_len_k up to this")
    ap.add_argument("--stored", default=None, help="the store to compare with (default: "
                    "the repository's experiments/)")
    ap.add_argument("--ids", default=None, help="write {experiment: [case_id, ...]} and stop")
    a = ap.parse_args(argv)
    if a.ids:
        ids = {n: [c.case_id for c in sample(expand(_cfg(n, Path("."))), a.sample,
                                             a.max_logits)] for n in a.experiments}
        Path(a.ids).write_text(json.dumps(ids, indent=1))
        return 0
    diffs = []
    with tempfile.TemporaryDirectory() as scratch:
        for name in a.experiments:
            diffs += compare(name, a.sample, a.max_logits, Path(scratch), a.stored)
    by_col: dict = {}
    for name, _cid, col, old, now in diffs:
        try:
            rel = abs(float(now) - float(old)) / max(abs(float(old)), 1e-300)
        except (TypeError, ValueError):
            rel = math.nan  # text (bound_terms, a site name): not a number
        n, worst = by_col.get((name, col), (0, 0.0))
        by_col[(name, col)] = (n + 1, max(worst, rel) if rel == rel else worst)
    for (name, col), (n, worst) in sorted(by_col.items()):
        print(f"  {name:20s} {col:22s} {n:3d} rows differ, largest relative difference "
              f"{worst:.2g}")
    print("all non-timing columns identical" if not diffs else f"{len(diffs)} differences")
    return 0 if not diffs else 1


if __name__ == "__main__":
    sys.exit(main())
