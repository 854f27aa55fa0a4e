"""Entry point: `python -m flashnum.run` (the code lives in flashnum.harness.run).

An audit table (conf/audit/<name>.yaml, e.g. experiment=kernel_table) goes to the audit,
which sits above the harness: this entry point, on top of both, chooses.
"""

import sys

from flashnum.harness.run import _audit_table
from flashnum.harness.run import main as run_main


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if _audit_table(argv):  # an audit table (conf/audit/<name>.yaml): flashnum.audit runs it
        from flashnum.audit.__main__ import main as audit_main

        return audit_main(argv)
    return run_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
