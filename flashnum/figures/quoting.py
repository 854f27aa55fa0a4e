"""How a document quotes a named quantity, and how the quote is checked.

    Quantity(what, value, tex, md)   one quoted thing: value(F) from the stored tables
    words("held", "failed")          md of a yes/no fact: the words each answer reads as
    require(cond, "what the text says")  inside a value: the text's claim in words holds
    quotes(text), quoted_as(before, rendered), misquoted(F, paths, registry)
    markdown(df)                     the one table renderer: DataFrame -> Markdown rows
    tables(text), stale(F, paths, TABLES), write_tables(F, paths, TABLES)   marked tables

A quantity is a number (rendered with the digits its sentence wants) or a yes/no fact (the
paper branches on it, \\ifName; a document writes the chosen words). A Markdown document
quotes one as its rendered text followed by the invisible marker <!--q:Name-->; misquoted
recomputes each quantity and reports every marked place that does not say it. The registry
itself is flashnum.figures.quantities.QUANTITIES. A sentence with several numbers points to
the table that holds them rather than quoting each.

A table is generated whole: a function F -> DataFrame (its cells as the document prints
them, its columns the header) rendered by markdown() between the invisible lines
<!-- table:Name --> and <!-- /table -->. `python -m flashnum.figures` rewrites each block
from the store; stale() reports every block that differs from what the store gives now.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from flashnum.figures.tex import tex_num


def fixed(digits: int) -> Callable[[float], str]:
    """1.84 style: `digits` decimals."""
    return lambda x: f"{x:.{digits}f}"


def sci(digits: int = 2) -> Callable[[float], str]:
    """3.3e-4 style: `digits` significant digits, no exponent padding."""
    def render(x: float) -> str:
        mant, exp = f"{x:.{digits - 1}e}".split("e")
        return f"{mant}e{int(exp)}"
    return render


def percent(x: float) -> str:
    """A fraction as a whole percentage: 0.251 -> 25%."""
    return f"{100 * x:.0f}%"


def two(x: float) -> str:
    """0.30, 4.0, 16, 1400 style: two significant digits, written out (Markdown)."""
    d = 1 - math.floor(math.log10(abs(x)))
    return f"{round(x, d):.{max(d, 0)}f}"


def count(n: int) -> str:
    """1,790 style: a whole number with thousands separators (Markdown)."""
    return f"{int(n):,}"


def sig(digits: int = 2) -> Callable[[float], str]:
    """As the paper prints a number (flashnum.figures.tex.tex_num), for LaTeX."""
    return lambda x: tex_num(x, digits)


def words(yes: str, no: str) -> Callable[[bool], str]:
    """How a document writes a yes/no fact: `yes` when it holds, `no` otherwise."""
    return lambda b: yes if b else no


@dataclass(frozen=True)
class Quantity:
    """One quoted number or yes/no fact: what it is, how it is computed, how each medium
    writes it."""

    what: str
    value: Callable[[object], object]  # F -> the value, or None (its source is missing)
    tex: Callable[[object], str] = sig(2)
    md: Callable[[object], str] = str
    paper: bool = True  # numbers.tex gets its macro or \newif (False: only the documents)
    fact: bool = False  # a yes/no (the paper: \ifName ... \else ... \fi)


def Fact(what: str, value: Callable[[object], bool], yes: str, no: str,  # noqa: N802
         paper: bool = False) -> Quantity:
    """A yes/no from the stored tables, quoted in a document as the words of its answer."""
    return Quantity(what, value, md=words(yes, no), paper=paper, fact=True)


class Contradicted(Exception):
    """A stored table no longer says what a quoted text states in words."""


def require(cond, says: str) -> None:
    """Inside a quantity's value: the statement `says`, which the document makes in words,
    holds in the stored tables (Contradicted otherwise, reported with the quote)."""
    if not bool(cond):
        raise Contradicted(says)


MARK = re.compile(r"<!--q:(\w+)-->")


def _in_code(text: str, pos: int) -> bool:
    """Whether text[pos] lies in a fenced code block or a code span (where a marker prints:
    an example of the syntax, not a quote)."""
    start = text.rfind("\n", 0, pos) + 1
    fences = sum(line.lstrip().startswith("```") for line in text[:start].splitlines())
    paragraph = text.rfind("\n\n", 0, pos) + 1  # a code span may run over a line break
    return fences % 2 == 1 or text[paragraph:pos].count("`") % 2 == 1


def quotes(text: str) -> list[tuple[str, str]]:
    """(name, the text before the marker: other markers removed, runs of white space one
    space, as Markdown reads them) for each marker of a Markdown text outside code (in
    code the marker would print: there it is an example, not a quote)."""
    out, parts, last = [], [], 0
    for m in MARK.finditer(text):
        parts.append(text[last:m.start()])
        last = m.end()
        if not _in_code(text, m.start()):
            out.append((m[1], " ".join("".join(parts).split())))
    return out


def quoted_as(before: str, rendered: str) -> bool:
    """Whether the text before a marker ends with the rendered value, a whole token: not the
    tail of a longer number (12.5 is no quote of 2.5, -2.5 none of 2.5), though a range's
    dash may precede it (1.57-2.23). A rendered table row (ending in "|") is quoted with
    the marker inside its last cell, so that the row keeps its number of cells."""
    rendered = " ".join(rendered.split())
    if rendered.endswith("|"):  # a table row's marker sits in its last cell, before the "|"
        rendered = rendered[:-1].rstrip()
    if not before.endswith(rendered):
        return False
    head = before[:len(before) - len(rendered)]
    if head[-1:] == "-":
        return head[-2:-1].isdigit() or head[-2:-1] == ">"
    return not (head[-1:].isalnum() or head[-1:] in ("_", ".", "+"))


def _value(registry: dict, name: str, F):
    """(rendered, None) or (None, why it cannot be checked)."""
    q = registry[name]
    try:
        v = q.value(F)
    except Contradicted as e:
        return None, f"the stored tables no longer say: {e}"
    except FileNotFoundError as e:
        return None, f"(its source is missing: {e.filename})"
    return (None, "(its source is missing)") if v is None else (q.md(v), None)


def misquoted(F, paths, registry: dict) -> list[str]:
    """Every marked quote in `paths` whose text is not its quantity rendered now, one line
    each (path, name, what it says, what it should say); unknown names and contradicted
    statements included."""
    rendered: dict = {}
    bad = []
    for path in paths:
        for name, before in quotes(Path(path).read_text()):
            if name not in registry:
                bad.append(f"{path}: unknown quantity {name!r} (declare it in QUANTITIES)")
                continue
            if name not in rendered:
                rendered[name] = _value(registry, name, F)
            want, why = rendered[name]
            if why is not None:
                bad.append(f"{path}: {name}: {why}")
            elif not quoted_as(before, want):
                bad.append(f"{path}: {name} is quoted as ...{before[-12:]!r}, "
                           f"its value is {want}")
    return bad


TABLE = re.compile(r"(<!-- table:(\w+) -->\n)(.*?)(<!-- /table -->)", re.S)


def markdown(df: pd.DataFrame) -> str:
    """The documents' one table renderer: the header from df's columns, one row per row,
    each cell as str() writes it (a table function formats its cells as the text reads)."""
    # a bare "|" inside a cell would end it: written "/" (an escaped "\\|" stays a "|")
    cells = lambda row: "| " + " | ".join(re.sub(r"(?<!\\)\|", "/", str(c)) for c in row) + " |\n"  # noqa: E501,E731
    return (cells(df.columns) + "|" + "---|" * len(df.columns) + "\n"
            + "".join(cells(r) for r in df.itertuples(index=False)))


def tables(text: str) -> list[tuple[str, str]]:
    """(name, content) of each marked table block of a Markdown text."""
    return [(m[2], m[3]) for m in TABLE.finditer(text)]


def _rendered(F, name: str, registry: dict) -> tuple[str | None, str | None]:
    """(the block's Markdown, None) or (None, why it cannot be made)."""
    if name not in registry:
        return None, f"unknown table {name!r} (declare it in TABLES)"
    try:
        return markdown(registry[name](F)), None
    except Contradicted as e:
        return None, f"table {name}: the stored tables no longer say: {e}"
    except FileNotFoundError as e:
        return None, f"table {name}: its source is missing: {e.filename}"


def stale(F, paths, registry: dict) -> list[str]:
    """Every marked table in `paths` that is not what the store gives now, one line each
    (path, name, why): `python -m flashnum.figures` rewrites a stale one."""
    bad = []
    for path in paths:
        for name, content in tables(Path(path).read_text()):
            want, why = _rendered(F, name, registry)
            if why is not None:
                bad.append(f"{path}: {why}")
            elif content != want:
                bad.append(f"{path}: table {name} differs from what the store gives "
                           "(python -m flashnum.figures rewrites it)")
    return bad


def write_tables(F, paths, registry: dict) -> list[Path]:
    """Rewrite each marked table of `paths` from the store; the files that changed. A block
    that cannot be made is left as it is (stale() reports it)."""
    changed = []
    for path in map(Path, paths):
        text = path.read_text()
        new = TABLE.sub(lambda m: m[1] + (_rendered(F, m[2], registry)[0] or m[3]) + m[4], text)
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed
