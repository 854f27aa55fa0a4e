"""`python -m flashnum.attribute`: per-site error attribution from the command line.

    python -m flashnum.attribute distribution=ties precision=bf16 policy=lowp
    python -m flashnum.run experiment=attribution    # the stored grid: experiments/attribution

One case prints flashnum.analysis.attribution.attribute's table per metric;
experiment=true runs the grid flashnum.studies.attribution.EXPERIMENT and replaces the
stored table <store.root>/attribution (flashnum.store.replace, with a manifest
record). `--help` lists every key with its default.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import pandas as pd

from flashnum import store
from flashnum.analysis.attribution import METRICS, attribute
from flashnum.harness.cli import alias, main_of
from flashnum.harness.config import StoreConf
from flashnum.inputs.distributions import make
from flashnum.reproduce import case_ids
from flashnum.store import manifest
from flashnum.studies.attribution import EXPERIMENT, experiment


@dataclass
class Args:
    """python -m flashnum.attribute [key=value ...]: which rounding site causes the error."""

    distribution: str = "gaussian"
    precision: str = "bf16"
    policy: str = "fa2"
    seq_len: int = 256
    head_dim: int = 64
    heads: int = 1
    block_n: int = 64
    order: str = "forward"
    variant: str = "fa2"
    seed: int = 0
    experiment: bool = False  # run the stored grid into <store.root>/attribution
    store: StoreConf = field(default_factory=StoreConf)


def _experiment(a) -> int:
    root = a.store.root if a.store.root != StoreConf.root else None
    t0, started = time.perf_counter(), manifest.now()
    t = experiment()
    df = t.copy()
    df.insert(0, "case_id", case_ids("attribution", t))  # from the protocol columns
    cfg = {key: list(val) if isinstance(val, tuple) else val for key, val in EXPERIMENT.items()}
    rec = manifest.record("flashnum.run", ["experiment=attribution"], config=cfg, shard=0,
                          num_shards=1, n_workers=1, start_time=started,
                          end_time=manifest.now(), wall_s=time.perf_counter() - t0,
                          counts=dict(grid=len(df), run=len(df), failed=0))
    path = store.replace("attribution", df, rec, root=root)
    print(f"stored {len(df)} rows in {path}")
    return 0


def _run(a) -> int:
    if a.experiment:
        return _experiment(a)
    inp = make(a.distribution, heads=a.heads, seq_len_q=a.seq_len, head_dim=a.head_dim,
               seed=a.seed, block_n=a.block_n)
    t = attribute(inp.q, inp.k, inp.v, precision=a.precision, policy=a.policy,
                  block_n=a.block_n, order=a.order, variant=a.variant, causal=inp.causal,
                  scale=inp.scale)
    with pd.option_context("display.width", 120, "display.float_format", "{:.3e}".format):
        for metric in METRICS:
            print(f"-- {metric} --")
            print(t[t.metric == metric].drop(columns="metric").to_string(index=False))
    return 0


def main(argv=None) -> int:
    return main_of("flashnum.attribute", Args, _run, argv, doc=__doc__)


def _stored(argv: list[str]) -> list[str]:
    """experiment=true (the stored table) as the one runner names it."""
    return ["experiment=attribution" if a == "experiment=true" else a for a in argv]


if __name__ == "__main__":
    if "experiment=true" in sys.argv[1:]:  # the stored table: an alias of the one runner
        alias(_stored)
    sys.exit(main())
