"""Rerun shards of shipped experiments into a scratch store and compare them with the stored
tables, in one process (tests/test_same_bits.py runs it under each forced path).

    python tests/orders/rerun.py SCRATCH EXPERIMENTS "NAME KEY=VALUE ..." ...

Prints one line per experiment ("NAME: identical" or its differences) and exits 1 if any
row differs from the stored table, 2 if a run could not be made.
"""

import contextlib
import io
import sys

from flashnum import run as front_door


def main(argv: list[str]) -> int:
    scratch, stored, *specs = argv
    worst = 0
    for spec in specs:
        name, *keys = spec.split()  # keys: the experiment's own way to take a few cases
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = front_door.main([f"experiment={name}", f"store.root={scratch}",
                                    f"compare_with={stored}", *keys])
        text = out.getvalue()
        tail = [ln for ln in text.splitlines() if "computed now" in ln or ln.startswith("  ")]
        verdict = "identical" if code == 0 and "identical" in text else "DIFFERS"
        print(f"{name}: {verdict}", *(tail if verdict != "identical" else []), sep="\n  ")
        worst = max(worst, 0 if verdict == "identical" else (1 if code in (0, 1) else 2))
    return worst


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
