"""TeX text for the paper's generated files: macro names, numbers, escapes, booktabs tables.

    from flashnum.figures.tex import tex_name, tex_num, tex_word, tabular
    tex_name("bf16_sweep") -> "BfSixteenSweep"     (a control-sequence name: letters only)
    tex_num(0.00123) -> "\\ensuremath{1.2\\times 10^{-3}}"   (two significant digits)
    tabular(cols, rows, "lrr")                    (rows: lists of cells; None draws a rule)

Pure string functions: no table is read here.
"""

from __future__ import annotations

import math
import re

import numpy as np

_ONES = ["Zero", "One", "Two", "Three", "Four", "Five", "Six", "Seven", "Eight", "Nine",
         "Ten", "Eleven", "Twelve", "Thirteen", "Fourteen", "Fifteen", "Sixteen",
         "Seventeen", "Eighteen", "Nineteen"]
_TENS = ["", "", "Twenty", "Thirty", "Forty", "Fifty", "Sixty", "Seventy", "Eighty", "Ninety"]


def int_words(n: int) -> str:
    """0..99 as English words in CamelCase (TeX names take no digits); larger digit by digit."""
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + (_ONES[n % 10] if n % 10 else "")
    return "".join(_ONES[int(c)] for c in str(n))


def tex_name(name: str) -> str:
    """A TeX control-sequence name (letters only) for a word: bf16_sweep -> BfSixteenSweep."""
    out = []
    for tok in re.findall(r"[A-Za-z]+|[0-9]+", name):
        out.append(int_words(int(tok)) if tok.isdigit() else tok[0].upper() + tok[1:])
    return "".join(out)


def tex_escape(s: str) -> str:
    """Text safe in TeX's text mode (backslash first, so later escapes survive)."""
    s = s.replace("\\", "\x00")
    for a, b in (("_", r"\_"), ("%", r"\%"), ("&", r"\&"), ("#", r"\#"), ("$", r"\$"),
                 ("{", r"\{"), ("}", r"\}"), ("^", r"\^{}"), ("~", r"\~{}")):
        s = s.replace(a, b)
    return s.replace("\x00", r"\textbackslash{}")


def tex_num(x, digits: int = 2) -> str:
    """A number for running text or a table cell, `digits` significant digits."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return r"\nyr"
    if isinstance(x, (bool, np.bool_)):
        return "yes" if x else "no"
    if isinstance(x, (int, np.integer)):
        return f"{int(x):,}".replace(",", "{,}")
    x = float(x)
    if x == 0:
        return "0"
    if x.is_integer() and abs(x) < 1e6:  # exact parameters (S = 256, N) print exactly
        return tex_num(int(x))
    e = math.floor(math.log10(abs(x)))
    if -2 <= e < digits:
        return f"{x:.{max(digits - 1 - e, 0)}f}"
    if digits <= e < 6:  # 1082 -> 1{,}100: a whole number, still `digits` significant
        return f"{round(x, digits - 1 - e):,.0f}".replace(",", "{,}")
    m = f"{x:.{digits - 1}e}"
    mant, exp = m.split("e")
    return rf"\ensuremath{{{mant}\times 10^{{{int(exp)}}}}}"


def tex_word(s: str) -> str:
    return rf"\texttt{{{tex_escape(str(s))}}}"


def tabular(cols: list[str], rows: list[list[str]], align: str | None = None) -> str:
    align = align or "l" * len(cols)
    lines = [f"\\begin{{tabular}}{{{align}}}", r"\toprule", " & ".join(cols) + r" \\",
             r"\midrule"]
    lines += [r"\midrule" if r is None else " & ".join(r) + r" \\" for r in rows]  # None: a rule
    lines += [r"\bottomrule", r"\end{tabular}", ""]
    return "\n".join(lines)


def cell(v) -> str:
    """A table cell: text escaped, a number by tex_num, a missing value as --."""
    if v is None or (isinstance(v, (float, np.floating)) and not np.isfinite(v)):
        return "--"
    if isinstance(v, str):
        return tex_escape(v) if v else "--"
    return tex_num(v)


def pm(x, se) -> str:
    """ours with its standard error, when it has one."""
    if se is not None and np.isfinite(se) and se > 0:
        return f"{cell(x)} $\\pm$ {cell(se)}"
    return cell(x)
