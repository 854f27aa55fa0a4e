"""`python -m flashnum.reproduce NAME [key=value ...]`: an alias of the one runner,
`python -m flashnum.run experiment=repro_NAME [key=value ...]`."""

from flashnum.harness.cli import alias, named

alias(named(prefix="repro_"))
