"""Entry point: `python -m flashnum.attribution` (code: flashnum.analysis.attribution)."""

from flashnum.analysis.attribution import main

if __name__ == "__main__":
    main()
