"""The store's command line: `python -m flashnum.stored` (the store itself is
flashnum.store; this module holds only its commands).

    python -m flashnum.stored bf16_sweep          # print size and columns; compact=true
    python -m flashnum.stored check bf16_sweep    # read every file; exit status 1 if one fails
    python -m flashnum.stored repair bf16_sweep   # unreadable files to quarantine/, recount
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from flashnum.harness import cli
from flashnum.harness.config import StoreConf
from flashnum.store import compact, done_ids, experiment_dir, load, problems
from flashnum.store.files import unreadable
from flashnum.store.repair import check_store, repair


@dataclass
class Args:
    """python -m flashnum.stored [check|repair] EXPERIMENT [compact=true] [store.root=DIR]

    EXPERIMENT          the table's size and columns (compact=true: merge the parts first)
    check EXPERIMENT    read every file whole; one line per file a run or repair would trip
                        on (unreadable, or not flashnum's), exit status 1 (a check failed)
    repair EXPERIMENT   move those files to quarantine/ (nothing readable is deleted),
                        reconcile dead runs' records, compact, and count what is missing;
                        a folder that is not a flashnum store is refused (one line, exit 2)
    """

    experiment: str = ""  # a name under store.root, or a path to the folder
    action: str = "show"  # show, check, repair (or the first word: check NAME, repair NAME)
    compact: bool = False  # merge the parts into results.parquet first
    store: StoreConf = field(default_factory=StoreConf)


ACTIONS = ("show", "check", "repair")


def _check(a) -> None:
    if a.action not in ACTIONS:
        raise ValueError(f"unknown action {a.action!r}; valid: {', '.join(ACTIONS)}")
    if not a.experiment:
        raise ValueError("which experiment? give its name: python -m flashnum.stored bf16_sweep")


def _root(a):
    """store.root as given, or None (./experiments) by default."""
    return a.store.root if a.store.root != StoreConf.root else None


def _run(a) -> int:
    root = _root(a)
    exp_dir = experiment_dir(a.experiment, root)
    if a.action != "show":
        check_store(exp_dir)  # never judge or move the files of a folder that is not one
    if a.action == "check":
        bad = problems(exp_dir)
        for f, why in bad:
            print(unreadable(f, why), file=sys.stderr)
        if not bad:
            print(f"{exp_dir}: every file readable; {len(done_ids(exp_dir))} cases stored")
        return 1 if bad else 0
    if a.action == "repair":
        r = repair(exp_dir)
        for m in r["quarantined"]:
            print(f"quarantined {m['file']} -> {m['to']} ({m['why']})")
        missing = "" if r["grid"] is None else (
            f"; {r['missing']} of the grid's {r['grid']} cases have no row (run the "
            f"experiment's command again to compute them)")
        print(f"{exp_dir}: {r['rows']} rows readable{missing}")
        return 0
    if a.compact:
        n = compact(a.experiment, root)
        print(f"compacted: {n} rows")
    try:
        df = load(a.experiment, root)
    except FileNotFoundError as e:  # a name that is no stored table: bad input
        there = sorted(p.name for p in exp_dir.parent.iterdir() if p.is_dir()
                       and not p.name.startswith(".")) if exp_dir.parent.is_dir() else []
        cli.fail("flashnum.stored", f"{e}; valid: {', '.join(there) or 'none stored'}")
    print(f"{exp_dir}: {len(df)} rows, {len(df.columns)} columns")
    print(", ".join(df.columns))
    return 0


def main(argv=None) -> int:
    """python -m flashnum.stored: a stored table's size and columns; check; repair."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ACTIONS:  # a leading word: the action, the experiment next
        argv = argv[1:] + [f"action={argv[0]}"]
    return cli.main_of("flashnum.stored", Args, _run, argv, positional="experiment",
                       check=_check, doc=Args.__doc__)


if __name__ == "__main__":
    sys.exit(main())
