"""The one exception of a store that cannot be read or written, and its one line.

    raise unreadable(path, "not a flashnum table: no case_id column")

StoreError's text is the line a command prints (exit status 2): the file, what is wrong
with it and the command that repairs the store. Here, below files.py and owners.py, so
that every module that reads a store file raises the same error.
"""

from __future__ import annotations

from pathlib import Path

# the folders of a store whose files sit one level down (flashnum.store.owners, store)
SUBFOLDERS = ("parts", "claims", ".runs")


class StoreError(Exception):
    """A store file that cannot be read or written; str() is one line for the user,
    .path the file and .why what is wrong with it (when one file is to blame)."""

    def __init__(self, msg: str, path: Path | None = None, why: str | None = None):
        super().__init__(msg)
        self.path, self.why = path, why

    def __reduce__(self):  # raised in a worker, re-raised whole in the runner
        return (type(self), (str(self), self.path, self.why))


def unreadable(path: Path, why) -> StoreError:
    """The error of an unreadable store file: one line naming it, why, and the command
    that repairs the store (python -m flashnum.stored repair)."""
    path = Path(path)
    exp_dir = path.parent.parent if path.parent.name in SUBFOLDERS else path.parent
    why = why if isinstance(why, str) else f"{type(why).__name__}: {why}".splitlines()[0]
    return StoreError(f"{path} is unreadable ({why}); repair the store with: python -m "
                      f"flashnum.stored repair {exp_dir.name} store.root={exp_dir.parent}",
                      path, why)
