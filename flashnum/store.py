"""Entry point: `python -m flashnum.store` (the code lives in flashnum.harness.store)."""

from flashnum.harness.store import main

if __name__ == "__main__":
    raise SystemExit(main())
