"""The front door: `python -m flashnum VERB [key=value ...]`.

    python -m flashnum run experiment=bf16_sweep              # = python -m flashnum.run ...
    python -m flashnum audit target=torch_sdpa precision=bf16
    python -m flashnum figures store.root=experiments
    python -m flashnum stored check bf16_sweep
    python -m flashnum worst-case precision=bf16 budget=100
    python -m flashnum attribute distribution=ties policy=lowp
    python -m flashnum verify bwd_order ties_bias             # rerun, compare with experiments/
    python -m flashnum VERB --help                            # the verb's own keys

Each verb runs exactly what its module's entry point runs (VERBS names the module), with
the same arguments and the same exit status: 0 ok, 1 a check failed (a table that does
not reproduce, a kernel that broke a rule), 2 bad input (one line on stderr). An unknown
verb is bad input. Hydra stays the configuration layer of `run`; this file only routes.
"""

from __future__ import annotations

import importlib
import sys

PROG = "flashnum"

# verb -> (the module whose main(argv) runs it, what it does in one line)
VERBS = {
    "run": ("flashnum.run", "compute an experiment into the store (experiment=NAME)"),
    "audit": ("flashnum.audit.__main__", "audit a kernel against the rules (target=NAME)"),
    "figures": ("flashnum.figures", "the paper's figures and numbers from the store"),
    "stored": ("flashnum.stored", "a stored table's size and columns; check, repair"),
    "worst-case": ("flashnum.worst_case", "search the inputs on which a policy errs most"),
    "attribute": ("flashnum.attribute", "per-site error attribution of one case"),
    "verify": ("flashnum.verify", "rerun stored experiments into a scratch store, compare"),
}


def usage() -> str:
    width = max(map(len, VERBS))
    lines = [f"usage: python -m {PROG} VERB [key=value ...]", "", "verbs:"]
    lines += [f"  {verb:<{width}}  {line}" for verb, (_, line) in VERBS.items()]
    lines += ["", f"python -m {PROG} VERB --help lists the verb's keys.",
              "Exit status: 0 ok, 1 a check failed, 2 bad input (one line on stderr)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), end="")
        return 0
    verb, rest = argv[0], argv[1:]
    if verb not in VERBS:
        print(f"{PROG}: error: unknown verb {verb!r}; valid: {', '.join(VERBS)}",
              file=sys.stderr, flush=True)
        return 2
    module = VERBS[verb][0]
    # a multirun (run -m) reads sys.argv through hydra.main: it must see the verb's own
    sys.argv = [module, *rest]
    return int(importlib.import_module(module).main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
