"""Entry point: `python -m flashnum.run` (the code lives in flashnum.harness.run)."""

from flashnum.harness.run import main

if __name__ == "__main__":
    raise SystemExit(main())
