"""What README.md and docs/distributions.md quote about the sweeps as passages: the clean
commits their stored rows come from (their manifests), and the worst_case table. Their
sizes, growth exponents and invariants are named quantities (flashnum.figures.quantities).
"""

from __future__ import annotations

from flashnum.figures.docs.digits import sci
from flashnum.figures.docs.sources import last_run, table
from flashnum.figures.quantities_sweeps import INVARIANT_SWEEPS
from flashnum.figures.quoting import Passage, require


def provenance_readme(F):
    """Each sweep's stored rows come from a clean commit, named by its manifest's last run."""
    by = {}
    for n in INVARIANT_SWEEPS:
        git = last_run(F, n)["git"]
        require(git["dirty"] is False,
                "every sweep's stored rows come from a clean commit")
        by.setdefault(git["commit"][:7], []).append(n)
    return ["(" + "; ".join(f"{', '.join(v)}: {c}" for c, v in by.items()) + ")"]


def distributions_docs(F):
    """docs/distributions.md: the baseline and plateau from the stored worst_case table (the
    search runs in its tables were not stored; their commands are given there)."""
    df = table(F, "worst_case")
    # the document describes one draw, seed 0 (the search's spread over seeds: README)
    df = df[df.seed == 0] if "seed" in df else df
    w = df[(df.precision == "bf16") & (df.policy == "fa2")].set_index(["distribution",
                                                                        "seq_len_q"])
    g, p = w.loc[("gaussian", 1024)], w.loc[("plateau", 1024)]
    return [f"Baseline (gaussian, inputs rounded to bf16): max_abs = {sci(g.max_abs_err, 3)}",
            f"errs by {w.loc[('plateau', 256)].max_ulp_err:.2f} ulp of bf16",
            f"In `max_abs` terms `plateau` at N = 1024 reaches {p.max_abs_err:.3g} = "
            f"{p.max_abs_err / g.max_abs_err:.0f}x the gaussian baseline"]


PASSAGES = {
    "SweepProvenance": Passage("docs/experiments.md: the clean commit each sweep's rows come from",
                                provenance_readme),
    "DistributionsWorstCase": Passage("docs/distributions.md: the baseline and plateau "
                                      "(worst_case)", distributions_docs),
}
