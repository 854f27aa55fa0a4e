"""The paper's figures, tables and quoted numbers, from the stored results tables only.

    python -m flashnum.figures [store.root=DIR] [out=paper/figures]
    make -C paper figures

Reads experiments/<name>/ through flashnum.store.load and never reruns a case.
Rewrites the marked tables of README.md and docs/*.md beside the store (flashnum.figures.docs
TABLES: each block <!-- table:Name --> ... <!-- /table --> generated whole from the store).
Writes into --out (default paper/figures/):

    <figure>.pdf, <figure>.png   the plot (matplotlib, Agg)
    <figure>.tex                 what the paper \\input's in the figure's place: the
                                 \\includegraphics line, or a framed placeholder
                                 \\notyetrun{<command>} when its table does not exist
    tab_<name>.tex               a booktabs table (or the placeholder)
    numbers.tex                  one \\newcommand per number the text quotes, an
                                 \\ifhave<Experiment> switch per experiment, one
                                 \\if<Fact> per yes/no the text branches on, and one
                                 \\Sel<Figure> macro per figure saying which rows it shows

The text of the paper never hard-codes a measured number: it quotes these macros,
says nothing about an experiment whose switch is false, and chooses between its
sentences by the facts (e.g. \\ifQiuYaoNegativeSixteen a negative bias ... \\else ... \\fi).
A number that cannot be computed (its table is missing) is the macro \\nyr ("not yet
run").

Deterministic: the same tables give byte-identical files (categories sorted, no
timestamps: PDF CreationDate dropped, PNG Software dropped). A missing table is
reported with the command that produces it; its figure's old plot files are
removed, so the folder always shows what the tables say.

What each figure shows (the selection is also written into its \\Sel macro):

    error_vs_n          seqlen_growth: median max|out - exact| over seeds vs N, one
                        line per precision (policy fa2, gaussian), bound dashed
    error_vs_block_n    block_size: median error vs block_n, one line per policy
    error_by_order      block_order: median error of each key-block order divided
                        by forward order's, per distribution
    heatmap             bf16_sweep: median error per distribution x policy
    attribution         attribution: per site, the error with only that site
                        rounded and with all but that site rounded
    kernel_vs_emulator  kernel_vs_emulator: max ulp error of the Triton kernel and
                        of the emulator on the same cases
    precision_bits      precision_bits: median error vs significand bits p, per policy
    bwd_error           bwd_bf16_sweep: median relative error of dQ, dK, dV per backward
                        policy, beside torch's bf16 autograd
    bwd_order           bwd_order: dQ's spread over accumulation orders vs dQ's error
    bwd_growth          bwd_seqlen_growth: error of dQ, dK, dV vs N per backward policy
    tab_tightness       the sweeps: bound / measured error per precision and policy
    tab_presets         the presets' format per site (from flashnum.numerics.policy: no experiment)
    tab_worst_case      worst_case: the searched inputs and near_overflow against gaussian
                        (max, relative and ulp error; median and range over seeds)
    tab_repro_*         the reproductions: published numbers beside ours
    pcast_threshold, fp8_offset, tab_block_scaled, tab_splitkv_decode
                        the low-precision measurements (flashnum.figures.lowprec)
    tab_kernel_audit    kernel_audit: real kernels audited, beside standard attention and
                        the emulated fa2/lowp, and their models' bitwise agreement
    tab_kernel_table    kernel_table: every kernel this machine runs, per dtype: verdicts,
                        error over the bound and over standard attention, its model's
                        bitwise and within-1-ulp shares, time per call; GPU-only rows
    qiu_yao_clamp       repro_qiu_yao: out / ref of Qiu & Yao's released fix vs the max
                        logit, the derived clamp collapse dashed
    trained_model       trained_model: error of a small trained model's heads beside the
                        catalogue, per setting (flashnum.figures.trained)
    tab_trained_model   trained_model(_stats): each head's logit statistics and the
                        catalogue distribution nearest it in error profile

Where things are (a new figure or table goes into the module that holds its kind, and
is declared there with @figure(its sources): flashnum.figures.registry):

    tex.py      TeX text: macro names, numbers, escapes, booktabs tables
    numbers.py  the registry of experiments (EXPERIMENTS) and quoted numbers (NUMBERS),
                numbers.tex
    context.py  Figures (tables in, files and numbers out), Unplottable, row selections
    plots.py    one function per plot
    tables.py   one function per table from the sweeps and presets
    reproductions.py  the reproductions' tables and the numbers and facts the paper's
                sentences about them read
    quantities.py  the named quantities paper, README and docs quote (QUANTITIES)
    quantities_*.py  the functions computing them, one module per topic
    quoting.py  how a document quotes a quantity or a fact, and the check; one table renderer
    docs/       the tables README and docs show, generated whole, one module per topic
    lowprec.py  block-scaled formats, FA4's fp8 offset, the P-cast threshold, split-KV
    audit.py    the real codes audited: experiments/kernel_audit, Qiu & Yao's clamp
    trained.py  the trained model's heads beside the catalogue
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

# imported for their @figure declarations (flashnum.figures.registry), in this order
from flashnum.figures import audit, lowprec, plots, registry, tables, trained  # noqa: F401
from flashnum.figures.context import Figures, Unplottable
from flashnum.figures.numbers import (
    EXPERIMENTS,
    NUMBERS,
    quantities,
    write_numbers,
)
from flashnum.figures.reproductions import REPRO, tab_repro
from flashnum.figures.tex import tex_name
from flashnum.harness.cli import main_of
from flashnum.harness.config import StoreConf

__all__ = ["EXPERIMENTS", "FIGURES", "NUMBERS", "PLOTS", "REPROS", "SOURCES", "Figures",
           "generate", "main", "tex_name"]

# relative to the working folder, as every command's store.root: an installed package
# reads and writes there, never inside site-packages
EXPERIMENTS_DIR = Path("experiments")
OUT = Path("paper") / "figures"

# The registry: every figure and table, each declared with its sources where it is
# defined (@figure in plots.py, tables.py, lowprec.py, audit.py, trained.py), made in the
# order of those modules' imports above.
FIGURES = tuple(registry.FIGURES)
SOURCES = {stem: sources[0] for stem, sources in registry.SOURCES.items()}
PLOTS = tuple(f.__name__ for f in FIGURES if not f.__name__.startswith("tab_"))

REPROS = tuple(REPRO)  # the reproductions' tables, after the figures (reproductions.py)


def generate(experiments=None, out=None) -> Figures:
    """Every figure, table and number from the tables under `experiments`, into `out`."""
    experiments = Path(experiments) if experiments else EXPERIMENTS_DIR
    out = Path(out) if out else OUT
    out.mkdir(parents=True, exist_ok=True)
    F = Figures(experiments, out)
    for fn in FIGURES:
        try:
            fn(F)
        except Unplottable as e:
            F.cannot_draw(fn.__name__, SOURCES[fn.__name__], str(e))
    for name in REPROS:
        tab_repro(F, name)
    quantities(F)
    write_numbers(F, PLOTS)
    return F


@dataclass
class Args:
    """python -m flashnum.figures [store.root=DIR] [out=DIR]

    store.root: the experiment tables (default: experiments/ of the working folder);
    out: where the figures go (default: paper/figures/ of the working folder).
    """

    out: str = ""
    store: StoreConf = field(default_factory=StoreConf)


def _run(a) -> int:
    # imported here, not above: its modules import figure modules, which would change the
    # registry's order
    from flashnum.figures import docs

    root = a.store.root if a.store.root != StoreConf.root else None
    F = generate(root, a.out or None)
    print(f"wrote {len(F.made)} figures/tables and numbers.tex to {F.out}")
    for path in docs.write_tables(F):
        print(f"  rewrote      the tables of {path}")
    for stem in F.made:
        print(f"  made         {stem}")
    for stem, exp in F.placeholders:
        print(f"  placeholder  {stem}: no table {exp}; run: {EXPERIMENTS[exp]}")
    for stem, exp, why in F.not_drawn:
        print(f"  not drawn    {stem}: table {exp} {why}")
    missing = sorted({exp for _, exp in F.placeholders})
    if missing:
        print(f"{len(missing)} experiment(s) not yet run: {', '.join(missing)}")
    return 0


def _check(a) -> None:
    """A store root that does not exist is bad input (exit 2), not 22 placeholders; a table
    missing inside an existing store is a placeholder."""
    root = Path(a.store.root)
    if not root.is_dir():
        raise ValueError(f"store.root={a.store.root} is not a folder; valid: a store of "
                         f"experiment tables, e.g. store.root=experiments")


def main(argv=None) -> int:
    """python -m flashnum.figures (see Args)."""
    return main_of("flashnum.figures", Args, _run, argv, check=_check, doc=Args.__doc__)


if __name__ == "__main__":
    sys.exit(main())
