"""Entry point: `python -m flashnum.run` (the code lives in flashnum.harness.run).

An experiment whose runner sits above the harness (flashnum.harness.run.ABOVE: an audit
table, a reproduction, the attribution table) goes to that runner from here, the entry
point on top of them all; every other run goes to flashnum.harness.run.main.
`compare_with=ROOT` works for every kind (flashnum.harness.run.compared).
"""

import sys

from flashnum.harness import run


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    handed = run.handed_over(argv)
    if handed is None:
        return run.main(argv)
    exp, rest = handed
    return run.compared(exp.name, rest, lambda rest: _runner(exp, rest))


def _runner(exp, rest: list[str]) -> int:
    if exp.kind == "audit":
        from flashnum.audit.__main__ import main as audit_main

        return audit_main([f"experiment={exp.name}", *rest])
    if exp.kind == "reproduction":
        from flashnum.reproduce import main as reproduce_main

        return reproduce_main([exp.name.removeprefix("repro_"), *rest])
    from flashnum.attribute import main as attribution_main

    return attribution_main(["experiment=true", *rest])


if __name__ == "__main__":
    raise SystemExit(main())
