"""No function of the package is over 100 lines (a reader finds each step on one screen or
two; long ones are split into named steps that compute the same values)."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "flashnum"
LIMIT = 100


def test_no_function_is_over_100_lines():
    long = []
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > LIMIT:
                    long.append(f"{path.relative_to(PKG.parent)}:{node.lineno} {node.name} ({n})")
    assert long == []
