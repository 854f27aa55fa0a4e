"""Where the documents' tables read their numbers: stored tables, their manifests and the
bench results, each under the folder F.experiments sits in (the repository's root).

    table(F, "bwd_order")            experiments/bwd_order/results.parquet
    last_run(F, "bwd_order")         the manifest's last run (wall_s, git, n_workers, ...)
    bench(F, "engine")               bench/results/engine.json

A missing file raises FileNotFoundError, which the check reports as a missing source.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd


def root(F) -> Path:
    """The repository's root: the folder that holds experiments/ and bench/."""
    return Path(F.experiments).parent


def table(F, name: str) -> pd.DataFrame:
    """An experiment's stored table, as the parquet file holds it."""
    return pd.read_parquet(Path(F.experiments) / name / "results.parquet")


def last_run(F, name: str) -> dict:
    """The manifest's record of the run that wrote the stored table last."""
    return json.loads((Path(F.experiments) / name / "manifest.json").read_text())["runs"][-1]


def bench(F, name: str) -> dict:
    """A stored bench result, bench/results/<name>.json."""
    return json.loads((root(F) / "bench" / "results" / f"{name}.json").read_text())
