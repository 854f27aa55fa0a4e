"""Entry point: `python -m flashnum.figures`."""

from flashnum.figures import main

raise SystemExit(main())
