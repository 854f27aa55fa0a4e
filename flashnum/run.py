"""Entry point: `python -m flashnum.run experiment=NAME [key=value ...]`, the one router.

Every experiment has a kind (flashnum.harness.experiments: the `kind:` of its YAML; the
reproductions and the attribution table have no YAML) and RUNNERS holds one runner per
kind; a forward sweep (and a multirun, -m) goes to flashnum.harness.run.main. The
overrides but experiment= and Hydra's go with the experiment to its runner.
`compare_with=ROOT` works for every kind: the backward and forward runners compare the
rows they computed; for the others flashnum.harness.run.compared compares the table the
run wrote.
"""

from __future__ import annotations

import sys

from flashnum.harness import cli, experiments
from flashnum.harness import run as forward
from flashnum.harness.experiments import Experiment
from flashnum.store.paths import CONF

PROG = "flashnum.run"


def _reproductions() -> tuple[str, ...]:
    from flashnum.reproduce import REPRODUCTIONS

    return REPRODUCTIONS


def find(name: str, dirs=()) -> Experiment | None:
    """The experiment called `name`, of any kind (None when there is none)."""
    exp = experiments.find(name, dirs)
    if exp is None and name.startswith("repro_") and \
            name.removeprefix("repro_") in _reproductions():
        exp = Experiment(name, "reproduction")
    if exp is None and name == "attribution":
        exp = Experiment(name, "attribution")
    return exp


def names(dirs=()) -> list[str]:
    """Every name `experiment=` takes."""
    return sorted({*experiments.names(dirs), *(f"repro_{r}" for r in _reproductions()),
                   "attribution"})


def unknown(name: str, dirs=()) -> str:
    return experiments.unknown(name, names(dirs))


def _backward(exp: Experiment, rest: list[str]) -> int:
    from flashnum.harness import backward

    shipped = exp.path.parent == CONF / "experiment"  # else the user's own YAML
    return backward.main([f"experiment={exp.name if shipped else exp.path}", *rest])


def _table(exp: Experiment, rest: list[str]) -> int:
    from flashnum.harness import tables

    return forward.compared(exp.name, rest, lambda r: tables.main([f"experiment={exp.name}", *r]))


def _head_stats(exp: Experiment, rest: list[str]) -> int:
    from flashnum.studies import head_stats

    return forward.compared(exp.name, rest,
                    lambda r: head_stats.main([f"experiment={exp.path.stem}", *r]))


def _audit(exp: Experiment, rest: list[str]) -> int:
    from flashnum.audit.__main__ import main as audit_main

    return forward.compared(exp.name, rest, lambda r: audit_main([f"experiment={exp.name}", *r]))


def _reproduction(exp: Experiment, rest: list[str]) -> int:
    from flashnum.reproduce import main as reproduce_main

    return forward.compared(exp.name, rest,
                    lambda r: reproduce_main([exp.name.removeprefix("repro_"), *r]))


def _attribution(exp: Experiment, rest: list[str]) -> int:
    from flashnum.attribute import main as attribution_main

    return forward.compared(exp.name, rest, lambda r: attribution_main(["experiment=true", *r]))


# kind -> runner(experiment, overrides) -> exit status; forward: flashnum.harness.run.main
RUNNERS = {"backward": _backward, "table": _table, "head_stats": _head_stats,
           "audit": _audit, "reproduction": _reproduction, "attribution": _attribution}


def routed(argv: list[str]) -> tuple[Experiment, list[str]] | None:
    """(experiment, its runner's overrides) when argv names an experiment of a kind in
    RUNNERS; None for a forward sweep, no experiment= or a multirun of forward sweeps.
    An unknown name, or a multirun of another kind, is one line and exit 2."""
    args = cli.hydra_args(argv)
    choice = forward.choice_of(args.overrides)
    if choice is None:
        return None
    dirs = forward.user_dirs(args)
    found = []
    for c in choice.split(","):
        try:
            found.append(find(c, dirs))
        except ValueError as e:  # a YAML whose kind: its folder does not hold
            cli.fail(PROG, str(e))
        if found[-1] is None:
            cli.fail(PROG, unknown(c, dirs))
    if all(e.kind == "forward" for e in found):
        return None
    if args.multirun or len(found) > 1:
        other = next(e for e in found if e.kind != "forward")
        cli.fail(PROG, f"experiment {other.name} is kind {other.kind}: it runs alone "
                       f"(a multirun, -m, sweeps forward experiments only)")
    rest = [o for o in args.overrides if not o.startswith(("experiment=", "hydra.", "hydra/"))]
    return found[0], rest


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    route = routed(argv)
    if route is None:
        return forward.main(argv)
    exp, rest = route
    return RUNNERS[exp.kind](exp, rest)


if __name__ == "__main__":
    raise SystemExit(main())
