"""What a reproduction declares: its name, the function that measures it, its sizes and the
columns its printed table shows (flashnum.reproduce.runner runs and stores it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd


@dataclass(frozen=True)
class Reproduction:
    """A published result, reproduced: `run(quick=, seed=)` returns its tidy table (the
    protocol columns, `ours` and `published`), `sizes` its "full" and "quick" sizes,
    `display` the columns printed; stored as experiments/repro_<name>/."""

    name: str
    run: Callable[..., pd.DataFrame]
    sizes: dict
    display: list[str] = field(default_factory=list)
