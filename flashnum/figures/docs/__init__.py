"""What README.md and docs/*.md quote or show, checked by one mechanism (flashnum.figures.quoting).

    QUOTED      name -> Quantity: every named number and fact (QUANTITIES, shared with the
                paper, and the few only a document states)
    TABLES      name -> F -> DataFrame: the documents' tables, generated whole into the
                marked blocks <!-- table:Name --> ... <!-- /table --> (most of them views
                of one stored table, flashnum.figures.docs.views)
    misquoted(F)  every marked place that does not say its quantity now, every stale table
    write_tables(F)  rewrite every marked table from the store (python -m flashnum.figures)

A document carries a quantity's rendered text followed by <!--q:Name-->; tests/test_quoted.py
recomputes every quantity and table from the stored tables and checks every marked place.
A new quoted number goes into QUANTITIES (flashnum.figures.quantities); a new table into
the module here named for its topic. A sentence that would carry several numbers points to
the table that holds them instead.
"""

from __future__ import annotations

from pathlib import Path

from flashnum.figures import quoting
from flashnum.figures.docs import (
    audit,
    backward,
    bounds,
    engine,
    experiments,
    formats,
    kernel,
    reference,
    reproductions,
    trained,
)
from flashnum.figures.quantities import QUANTITIES

QUOTED = {**QUANTITIES, **audit.QUOTED, **trained.QUOTED}
TABLES = {**audit.TABLES, **backward.TABLES, **bounds.TABLES, **engine.TABLES,
          **experiments.TABLES, **formats.TABLES, **kernel.TABLES, **reference.TABLES,
          **reproductions.TABLES, **trained.TABLES}


def documents(root: Path) -> list[Path]:
    """The Markdown files under the repository's root that may quote a quantity."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def misquoted(F, paths=None) -> list[str]:
    """Every marked place in `paths` (default: every document) that does not say its
    quantity now, one line each."""
    paths = documents(Path(F.experiments).parent) if paths is None else paths
    return quoting.misquoted(F, paths, QUOTED) + quoting.stale(F, paths, TABLES)


def write_tables(F, paths=None) -> list[Path]:
    """Rewrite every marked table in `paths` (default: every document beside the store that
    exists) from the store; the files that changed."""
    paths = documents(Path(F.experiments).parent) if paths is None else paths
    return quoting.write_tables(F, [p for p in paths if Path(p).is_file()], TABLES)
