"""Entry point: `python -m flashnum.reproduce`."""

from flashnum.reproduce import main

raise SystemExit(main())
