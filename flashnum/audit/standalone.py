"""The source of a kernel's call that runs without flashnum: what a reproducer holds.

    from flashnum.audit.standalone import standalone
    s = standalone(fn)                  # a function object (a target's, a wrapper's)
    s = standalone("pkg.mod:func")      # an importable callable: its import line only
    s.code, s.name, s.packages, s.versions()

A function object is written out whole: its source, and those of the functions, classes
and constants of its module (and of flashnum modules) it reaches through its globals,
recursively, with an import line per module or name it reads from a library. What the
result would need from flashnum itself is refused (ValueError naming it): a reproducer
imports only the kernel's own library, torch and numpy. "pkg.mod:func" is one line,
`from pkg.mod import func`.
"""

from __future__ import annotations

import ast
import builtins
import importlib.metadata
import inspect
import sys
import textwrap
from dataclasses import dataclass

_PLAIN = (int, float, str, bool, bytes, type(None))


@dataclass(frozen=True)
class Standalone:
    code: str                     # import lines and definitions; defines `name`
    name: str                     # the kernel's function in that code
    packages: tuple[str, ...]     # the top-level packages it imports (not the stdlib)

    def versions(self) -> dict[str, str]:
        """package -> installed version (of the distribution that provides it)."""
        dists = importlib.metadata.packages_distributions()
        out = {}
        for p in self.packages:
            for dist in dists.get(p, [p]):
                try:
                    out[p] = importlib.metadata.version(dist)
                    break
                except importlib.metadata.PackageNotFoundError:
                    continue
        return out


def _names(src: str) -> tuple[set[str], set[tuple[str, str]]]:
    """The bare names a definition's source reads (its decorators included), and the
    (name, attribute) pairs it reads off them (for submodules: importlib.util)."""
    names, attrs = set(), set()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            attrs.add((node.value.id, node.attr))
    return names, attrs


class _Bundle:
    def __init__(self, root):
        self.root = getattr(root, "__module__", "")  # its module's definitions are written
        self.imports: dict[str, str] = {}   # bound name -> import line
        self.defs: dict[str, tuple[object, str]] = {}
        self.consts: dict[str, str] = {}

    def own(self, v) -> bool:
        """Defined in flashnum or beside the kernel (its source is written out), not
        imported from a library."""
        u = inspect.unwrap(v) if callable(v) else v
        mod = getattr(u, "__module__", None) or ""
        return (inspect.isfunction(u) or inspect.isclass(u)) and (
            mod.split(".")[0] == "flashnum" or mod == self.root)

    def add(self, name: str, obj) -> None:
        if name in self.defs:
            if self.defs[name][0] is not obj:
                raise ValueError(f"two definitions named {name!r} would be written out")
            return
        self.defs[name] = (obj, "")  # placed first: recursion stops here
        src = textwrap.dedent(inspect.getsource(obj))
        self.defs[name] = (obj, src)
        glb = inspect.unwrap(obj).__globals__ if not inspect.isclass(obj) else vars(
            sys.modules[obj.__module__])
        names, attrs = _names(src)
        for n in sorted(names):
            if n in glb and not hasattr(builtins, n):
                self.bind(n, glb[n])
        for n, a in sorted(attrs):  # `import importlib.util`: a submodule read off a module
            v = glb.get(n)
            if inspect.ismodule(v) and n == v.__name__ and inspect.ismodule(getattr(v, a, None)):
                self.imports[f"{n}.{a}"] = f"import {v.__name__}.{a}"

    def bind(self, n: str, v) -> None:
        if inspect.ismodule(v):
            if v.__name__.split(".")[0] == "flashnum":
                raise ValueError(f"the kernel's code reads flashnum module {v.__name__} "
                                 f"as {n!r}: it cannot run without flashnum")
            top = v.__name__.split(".")[0]
            self.imports[n] = (f"import {v.__name__}" if n == v.__name__ or n == top and
                               v.__name__.startswith(top + ".") else
                               f"import {v.__name__} as {n}")
        elif self.own(v):
            self.add(n, v)
        elif isinstance(v, _PLAIN) or isinstance(v, (tuple, dict)) and _literal(v):
            self.consts[n] = f"{n} = {v!r}\n"
        elif hasattr(v, "__module__") and hasattr(v, "__qualname__"):
            line = f"from {v.__module__} import {v.__qualname__}"
            self.imports[n] = line if v.__qualname__ == n else f"{line} as {n}"
        else:
            raise ValueError(f"the kernel's code reads {n!r} ({type(v).__name__}), which "
                             "cannot be written out as source")


def _literal(v) -> bool:
    try:
        return eval(repr(v), {"torch": sys.modules.get("torch")}) == v  # noqa: S307
    except Exception:
        return False


def _packages(code: str) -> tuple[str, ...]:
    out = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return tuple(sorted(p for p in out if p not in sys.stdlib_module_names
                        and p != "__future__"))


def standalone(fn) -> Standalone:
    """The kernel's call as code that runs without flashnum (module docstring)."""
    if isinstance(fn, str):
        mod, _, name = fn.partition(":")
        if not (mod and name):
            raise ValueError(f"target {fn!r} is not 'module:function'")
        code = f"from {mod} import {name}\n"
        return Standalone(code, name, _packages(code))
    if not callable(fn) or not hasattr(fn, "__name__"):
        raise ValueError(f"kernel {fn!r} has no source to write out (a function is needed)")
    b = _Bundle(fn)
    b.add(fn.__name__, fn)
    body = "\n\n".join(src for _, src in reversed(b.defs.values()))
    code = ("\n".join(sorted(set(b.imports.values()))) + "\n\n" + "".join(b.consts.values())
            + "\n\n" + body)
    if "flashnum" in "".join(line for line in code.splitlines()
                             if line.strip().startswith(("import ", "from "))):
        raise ValueError(f"{fn.__name__}'s code imports flashnum: it cannot run without it")
    return Standalone(code, fn.__name__, _packages(code))
