"""The package's layers hold: the import-linter contract in pyproject.toml ([tool.importlinter],
the one place the layers are stated) is kept, with imports inside functions counted: each
layer imports only from those below it, no module imports the package root, no package's
modules import each other in a cycle, and (checked here on the same import graph) no cycle
runs through a package's __init__ either.
"""

import subprocess
import sys
from pathlib import Path

import grimp
import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: import-linter's own dependency
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "flashnum"


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("flashnum", cache_dir=None)


def test_lint_imports_keeps_every_contract():
    exe = Path(sys.executable).with_name("lint-imports")
    p = subprocess.run([str(exe), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert "0 broken" in p.stdout


def test_imports_inside_functions_are_in_the_graph_the_contract_reads(graph):
    # flashnum.api imports flashnum.backends.mp inside a function only
    lines = graph.get_import_details(importer="flashnum.api", imported="flashnum.backends.mp")
    assert lines and all(d["line_contents"].startswith("from ") for d in lines)
    src = (PKG / "api.py").read_text().splitlines()
    assert all(src[d["line_number"] - 1].startswith("    ") for d in lines)  # indented


def test_no_import_cycle_at_all(graph):
    """Tarjan's strongly connected components of the whole module graph: none larger
    than one module (acyclic_siblings does not see a cycle through a package's __init__)."""
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on.discard(comp[-1])
            if len(comp) > 1:
                cycles.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for m in sorted(graph.modules):
        if m not in index:
            visit(m)
    assert cycles == []


def test_the_layers_name_every_package_and_entry_point():
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in conf["contracts"] if c["type"] == "layers")["layers"]
    named = {m.strip() for layer in layers for m in layer.replace(":", "|").split("|")}
    here = {f"flashnum.{p.name}" for p in PKG.iterdir() if (p / "__init__.py").exists()}
    here |= {f"flashnum.{p.stem}" for p in PKG.glob("*.py") if p.stem != "__init__"}
    assert named == here
