"""Every figure and table of the paper, declared where it is defined.

    @figure("seqlen_growth")            # the stored table(s) it reads
    def error_vs_n(F: Figures) -> None: ...

A figure is a function F -> None named after the file stem it writes (tab_<name> for a
table). The decorator records it with its sources; flashnum.figures makes every
registered one, in the order their modules are imported, and names the first source in
the message of a figure its table cannot draw. Nothing else lists figures.
"""

from __future__ import annotations

from collections.abc import Callable

FIGURES: list[Callable] = []
SOURCES: dict[str, tuple[str, ...]] = {}


def figure(*sources: str) -> Callable[[Callable], Callable]:
    """Register the decorated function as a figure or table made from `sources` (the
    experiment names it reads; "policy" for one made from flashnum's declarations alone)."""
    if not sources:
        raise ValueError("a figure names the stored table(s) it reads")

    def register(fn: Callable) -> Callable:
        if fn.__name__ in SOURCES:
            raise ValueError(f"figure {fn.__name__!r} is registered twice")
        FIGURES.append(fn)
        SOURCES[fn.__name__] = sources
        return fn
    return register
