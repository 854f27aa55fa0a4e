"""The package's layers: module-level imports go down the layers only, and never in a cycle.

Layers, lowest first (docs/experiments.md, the package docstrings): numerics < engine <
backends < reference < analysis < inputs < harness < reproduce < figures; the entry
shims (flashnum/run.py, search.py, attribution.py, store.py) and the package itself sit
on top. Read from the source (ast), so a function-local import, the only kind allowed to
go up (the engine's dispatch to a backend, heavy optional dependencies), is not counted.
"""

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "flashnum"
LAYERS = ["numerics", "engine", "backends", "reference", "analysis", "inputs", "harness",
          "reproduce", "figures"]


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def top_level_imports(path: Path, mods) -> set[str]:
    """The flashnum modules a file imports at module level (not inside a function).

    `from pkg import sub` of a submodule counts as importing pkg.sub alone.
    """
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("flashnum")}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("flashnum"):
            subs = {f"{node.module}.{a.name}" for a in node.names} & set(mods)
            out |= subs if len(subs) == len(node.names) else subs | {node.module}
    return out


def graph() -> dict[str, set[str]]:
    mods = {module_name(p): p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts}
    return {m: {i for i in top_level_imports(p, mods) if i in mods and i != m}
            for m, p in mods.items()}


def layer(mod: str) -> int | None:
    part = mod.split(".")[1] if mod.count(".") else None
    return LAYERS.index(part) if part in LAYERS else None


def test_module_level_imports_form_no_cycle():
    g = graph()
    state: dict[str, int] = {}

    def visit(m, path):
        state[m] = 1
        for n in sorted(g[m]):
            if state.get(n) == 1:
                pytest.fail("import cycle: " + " -> ".join(path + [m, n]))
            if n not in state:
                visit(n, path + [m])
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [])


def test_module_level_imports_go_down_the_layers_only():
    up = []
    for m, deps in graph().items():
        lm = layer(m)
        for d in deps:
            ld = layer(d)
            if lm is not None and ld is not None and ld > lm:
                up.append(f"{m} imports {d}")
    assert up == []


def test_the_layers_named_here_are_the_packages_that_exist():
    assert {p.name for p in PKG.iterdir() if (p / "__init__.py").exists()} >= set(LAYERS) - {
        "reference"}
