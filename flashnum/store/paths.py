"""Where the Hydra configs live: flashnum/conf/, in a checkout a link to the top-level conf/.

    from flashnum.store.paths import CONF     # a Path holding config.yaml

conf/ at the top of the repository is the only source; flashnum/conf links to it, so that
a built wheel carries it as package data (pyproject.toml) and a non-editable install runs
from any directory. CONF is the resolved folder: conf/ itself in a checkout or an
editable install.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
CONF = (PACKAGE / "conf").resolve()
