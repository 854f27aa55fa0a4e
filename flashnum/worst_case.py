"""`python -m flashnum.worst_case`: the worst-case input search from the command line.

    python -m flashnum.worst_case precision=bf16 seq_len=1024 budget=100
    python -m flashnum.worst_case policy=lowp max_evals=200 screen=false store.root=/tmp/x
    python -m flashnum.worst_case start=acts.safetensors start_call=1 max_evals=50

Runs flashnum.inputs.search.worst_case, saves the worst inputs under
<store.root>/worst_case/inputs/ (flashnum.inputs.io: tensors + JSON, loaded without
running code) unless out= names another folder, and prints the search's summary as JSON.
`--help` lists every key with its default.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from flashnum.harness.cli import main_of
from flashnum.harness.config import StoreConf
from flashnum.inputs.capture import load_call
from flashnum.inputs.search import METRICS, Search, worst_case
from flashnum.numerics.policy import POLICIES


@dataclass
class Args:
    """python -m flashnum.worst_case [key=value ...]: the inputs on which a policy errs most."""

    policy: str = "fa2"
    precision: str = "bf16"
    seq_len: int = 1024
    head_dim: int = 64
    block_m: int = 64
    block_n: int = 64
    order: str = "forward"
    variant: str = "fa2"
    metric: str = "max_abs"
    budget: float = 100.0  # wall-clock seconds
    max_evals: int | None = None  # a reproducible search: stop after this many evaluations
    seed: int = 0
    screen: bool = True  # screen the catalogue distributions first
    quiet: bool = False
    out: str = ""  # where the inputs go (default: <store.root>/worst_case/inputs)
    start: str = ""  # a flashnum.capture file: refine its call start_call (docs/capture.md)
    start_call: int = 0
    store: StoreConf = field(default_factory=StoreConf)


def _check(a) -> None:
    if a.metric not in METRICS:
        raise ValueError(f"unknown metric {a.metric!r}; valid: {', '.join(METRICS)}")
    if a.policy not in POLICIES:
        raise ValueError(f"unknown policy {a.policy!r}; valid: {', '.join(POLICIES)}")
    if a.start:
        if not Path(a.start).is_file():
            raise ValueError(f"start={a.start!r} is not a file (a flashnum.capture file)")
        load_call(a.start, a.start_call)  # one line naming the calls it holds, if not there


def _run(a) -> int:
    out = a.out or str(Path(a.store.root) / "worst_case" / "inputs")
    search = Search(a.policy, a.precision, a.seq_len, a.head_dim, a.block_n, a.block_m,
                    a.order, a.variant, metric=a.metric, budget_s=a.budget,
                    max_evals=a.max_evals, seed=a.seed, screen=a.screen)
    res = worst_case(search, save=out, verbose=not a.quiet,
                     start={"path": a.start, "call": a.start_call} if a.start else None)
    print(json.dumps(res.summary(), default=str))
    return 0


def main(argv=None) -> int:
    return main_of("flashnum.worst_case", Args, _run, argv, check=_check, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())
