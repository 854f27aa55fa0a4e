"""What docs/experiments.md and docs/distributions.md show of the sweeps: the clean commits
their stored rows come from (their manifests, a passage), and the worst_case draw (TABLES). Their
sizes, growth exponents and invariants are named quantities (flashnum.figures.quantities).
"""

from __future__ import annotations

from flashnum.figures.docs.sources import last_run
from flashnum.figures.docs.views import view
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


PASSAGES = {
    "SweepProvenance": Passage("docs/experiments.md: the clean commit each sweep's rows come from",
                                provenance_readme),
}
# docs/distributions.md's one draw (seed 0) of the stored worst_case table
TABLES = {"DistributionsWorstCase": view(
    "worst_case", "seed == 0 and precision == 'bf16' and policy == 'fa2' and distribution in "
    "['gaussian', 'plateau']", ["distribution", "seq_len_q", "max_abs_err", "max_ulp_err"])}
