"""Entry point: `python -m flashnum.search` (the code lives in flashnum.inputs.search)."""

from flashnum.inputs.search import main

if __name__ == "__main__":
    main()
