"""The package's shape, measured: no function over 80 lines (a reader finds each step on
one screen; long ones are split into named steps that compute the same values), no module
over 600 lines (a module holds one topic), and 15 or more parameters only where a Triton
kernel takes its pointers and strides one by one (elsewhere related arguments travel as
one checked object)."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "flashnum"
LINES, MODULE_LINES, PARAMS = 80, 600, 15
# @triton.jit kernels: a launch passes every pointer, stride and size as its own argument
MANY_PARAMS = {"_fa2_fwd", "_bwd_dkdv", "_bwd_dq"}


def _functions():
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path.relative_to(PKG.parent), node


def test_no_function_is_over_80_lines():
    long = [f"{p}:{f.lineno} {f.name} ({f.end_lineno - f.lineno + 1})"
            for p, f in _functions() if f.end_lineno - f.lineno + 1 > LINES]
    assert long == []


def test_no_module_is_over_600_lines():
    big = [f"{p.relative_to(PKG.parent)} ({p.read_text().count(chr(10))})"
           for p in sorted(PKG.rglob("*.py")) if p.read_text().count("\n") > MODULE_LINES]
    assert big == []


def test_only_the_triton_kernels_take_15_or_more_parameters():
    def count(a):
        return (len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg)
                + bool(a.kwarg))

    many = {f.name for _, f in _functions() if count(f.args) >= PARAMS}
    assert many <= MANY_PARAMS, many - MANY_PARAMS
