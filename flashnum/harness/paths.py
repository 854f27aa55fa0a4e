"""Where the Hydra configs live: conf/ of the source tree, or flashnum/conf/ when installed.

    from flashnum.harness.paths import CONF     # a Path holding config.yaml

conf/ at the top of the repository is the only source; a built wheel carries a copy
of it as flashnum/conf/ (setup.py's build hook), so a non-editable install runs from
any directory. A source tree or an editable install reads conf/ itself.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]


def conf_dir() -> Path:
    """flashnum/conf/ if the package carries one (an installed wheel), else ../conf/."""
    shipped = PACKAGE / "conf"
    return shipped if (shipped / "config.yaml").is_file() else PACKAGE.parent / "conf"


CONF = conf_dir()
