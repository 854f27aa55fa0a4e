"""What README.md, docs/bounds.md and docs/experiments.md quote about the a-priori bounds:
their accounting over every stored table, bound_tightness, the stress test
(experiments/bound_stress) and the ties bias (experiments/ties_bias), as passages.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from flashnum.analysis.bounds import accounting, tightness_summary
from flashnum.figures.docs.digits import sci, tex_sci, thousands
from flashnum.figures.docs.sources import last_run, table
from flashnum.figures.quoting import Passage, require
from flashnum.studies.bounds import stress_summary


def bound_accounting(F):
    names = [p.parent.name for p in sorted(Path(F.experiments).glob("*/results.parquet"))]
    # the forward tables: bwd_attribution's "bound" is per-site terms, with no verdict
    names = [n for n in names if {"bound", "bound_holds"} <= set(table(F, n).columns)]
    frames = [table(F, n) for n in names]
    acc = accounting(pd.concat([f["bound"] for f in frames if "bound" in f]),
                     pd.concat([f["bound_holds"] for f in frames if "bound" in f]))
    where = {n: int(f["bound"].isna().sum()) for n, f in zip(names, frames, strict=True)
             if "bound" in f and f["bound"].isna().any()}
    which = " and ".join(f"{k} in {n}" for n, k in where.items())
    return [f"finite and held in {thousands(acc['held'])} of {thousands(acc['cases'])} rows",
            f"in {acc['vacuous']}, undefined (no bound) in {acc['undefined']} rows ({which})"]


def bf16_sweep_summary_line(F):
    df = table(F, "bf16_sweep")
    fin = np.isfinite(df["bound"])
    held = int((df["bound_holds"] == True).sum())  # noqa: E712
    return [f"a-priori bound finite and held in {held} of {len(df)}, vacuous (infinite) in "
            f"{int((~fin).sum())} rows"]


def tightness_readme(F):
    t = table(F, "bound_tightness")
    acc = accounting(t["bound"], t["holds"])
    fa = t[(t.policy == "fa2") & t.precision.isin(["bf16", "fp16"]) & np.isfinite(t.bound)]
    return [f"finite and held in {thousands(acc['held'])} of {thousands(acc['cases'])} "
            f"tightness cases (vacuous in {acc['vacuous']})",
            f"(tightest {fa.tightness.min():.2f}x on plateau inputs)"]


def tightness_docs(F):
    t = table(F, "bound_tightness")
    acc = accounting(t["bound"], t["holds"])
    out = [f"finite and held in {acc['held']} of {acc['cases']} cases and vacuous in "
           f"{acc['vacuous']}"]
    g = lambda x: f"{x:.3g}".replace("e+0", "e").replace("e+", "e")  # noqa: E731
    for _, r in tightness_summary(t).iterrows():
        cells = [r.policy, r.precision, r.cases, r.held, r.vacuous] + [
            g(r[c]) for c in ("det_median", "det_min", "det_max", "prob_median", "prob_min",
                              "prob_max")] + [r.held_prob]
        out.append("| " + " | ".join(str(c) for c in cells) + " |")
    return out


def stress(F, family):
    """experiments/bound_stress's accounting of one family (studies.bounds.stress_summary)."""
    return stress_summary(table(F, "bound_stress"), family)


def stress_claims(F):
    c, o = stress(F, "catalogue"), stress(F, "overflow")
    t, climb = c["tightest"], c["climb"]
    steps, starts, best, bad = climb
    wall = last_run(F, "bound_stress")["wall_s"]
    readme = [f"and in a {thousands(c['cases'])}-case random stress run (finite and held in "
              f"{thousands(c['held'])}, vacuous in {thousands(c['vacuous'])}, exceeded in "
              f"{c['exceeded']}",
              f"tightest cases came no closer than {best:.2f}x)",
              f"stress run of {thousands(o['cases'])} cases near the formats' largest numbers "
              f"(finite and held in {thousands(o['held'])}, vacuous in "
              f"{thousands(o['vacuous'])}, exceeded in {o['exceeded']};"]
    docs = [f"{thousands(c['cases'])} catalogue cases and {thousands(o['cases'])} overflow "
            f"cases, one thread, {wall:.0f} s",
            f"{thousands(c['cases'])} cases, finite and held in {thousands(c['held'])}, "
            f"vacuous in {thousands(c['vacuous'])}, exceeded in {c['exceeded']}; the "
            f"tightest case came within a factor {t.ratio:.2f} ({t.inputs}, {t.precision}, "
            f"{t.policy}, $N = {t.n}$, $d = {t.d}$)",
            f"A hill-climb of {steps} steps from each of the {starts} tightest cases",
            f"reached bound / measured = {best:.2f}, exceeded in {bad}",
            f"{thousands(o['cases'])} cases: finite and held in {thousands(o['held'])}, "
            f"vacuous in {thousands(o['vacuous'])}, exceeded in {o['exceeded']}."]
    return readme, docs


def stress_readme(F):
    return stress_claims(F)[0]


def stress_docs(F):
    return stress_claims(F)[1]


def tightness_prose(F):
    t = table(F, "bound_tightness")
    f = t[np.isfinite(t.bound)]
    fa = f[(f.policy == "fa2") & f.precision.isin(["bf16", "fp16"])]
    pl = fa[fa.distribution == "plateau"].tightness
    nv = f[(f.policy == "naive") & (f.distribution == "plateau")
           & f.precision.isin(["bf16", "fp16"])].tightness
    fb = f[(f.policy == "fa2") & (f.precision == "bf16")].groupby("distribution").tightness
    grid = fb.median()[["early_max", "late_max", "ramp", "sink", "ties", "underflow"]]
    offgrid = fb.median()[["gaussian", "fa3_outliers", "heavy_tail", "scaled", "low_rank",
                           "cancellation"]]
    f32 = f[(f.policy == "fa2") & (f.precision == "fp32")]
    lowp = f[f.policy == "lowp"].groupby("precision").tightness.median()[["bf16", "fp16"]]
    vac = t[~np.isfinite(t.bound) & (t.distribution == "heavy_tail")].measured.max()
    r10 = lambda x: f"{round(x, -1):.0f}"  # noqa: E731
    return [f"(fa2 bf16/fp16: {pl.min():.2f}-{pl.max():.2f}, naive: {nv.min():.2f}-"
            f"{nv.max():.2f})",
            f"sit at medians {grid.min():.1f}-{grid.max():.1f} in fa2 bf16",
            f"**Loosest: fp32** (median {f32.tightness.median():.0f})",
            f"probabilistic bound is {f32.tightness.median() / f32.tightness_prob.median():.0f}x "
            f"sharper (median {f32.tightness_prob.median():.0f})",
            f"`flat` gives the extreme ({sci(f.tightness.max())})",
            f"median {r10(offgrid.min())}-{r10(offgrid.max())} in fa2 bf16",
            f"**lowp** (median {lowp.min():.0f}-{lowp.max():.0f})",
            f"the measured error there is {vac:.1f}"]


def ties_bias(F):
    """{(section, run): (mean signed error, z)} from experiments/ties_bias."""
    t = table(F, "ties_bias")
    t = t[t.kind == "bias"]
    return {(s, r): (e, z) for s, r, e, z in zip(t.section, t.run, t.mean_signed_err, t.z,
                                                 strict=True)}


def ties_claims(F):
    b = ties_bias(F)
    t = "ties, V ~ N(-1.0, 0.5^2)"

    def ez(section, run, paren=False):
        e, z = b[section, run]
        zs = f"{z:.0f}" if abs(z) >= 10 else f"{z:.1f}"
        return f"${tex_sci(e)}$ ($z = {zs}$)" if paren else f"${tex_sci(e)}$, $z = {zs}$"

    lowp = b[t, "lowp"]
    u = table(F, "ties_bias")
    pos = dict(zip(u[u.kind == "ulp"].run, u[u.kind == "ulp"].value, strict=True))
    ex, lo, up, shift = (pos[k] for k in ("exact", "lower half", "upper half", "mean shift"))
    return [f"mean signed error ${tex_sci(lowp[0])}$, $z = {lowp[1]:.0f}$",
            f"division in bf16 together give {ez(t, 'only l, o, div in bf16', paren=True)}",
            f"leaves {ez(t, 'lowp, div and out in fp32', paren=True)}",
            f"(one key block: {ez(t, 'lowp, one key block')})",
            f"(gaussian logits with the same $V$: "
            f"{ez('gaussian, V ~ N(-1.0, 0.5^2)', 'lowp')})",
            f"adjustment does not remove it ({ez(t, 'lowp, qiu_yao variant')})",
            f"N(+1, 0.5^2)$: $+{tex_sci(b['ties, V ~ N(1.0, 0.5^2)', 'lowp'][0])}$)",
            f"0.5^2)$: {ez('ties, V ~ N(-0.75, 0.5^2)', 'lowp')})",
            f"*opposite* sign ($+{tex_sci(b[t, 'lowp, P @ V summed in bf16'][0])}$, "
            f"$z = {b[t, 'lowp, P @ V summed in bf16'][1]:+.0f}$)",
            f"{100 * up:.1f}% lie in the upper half of their bf16 ulp, {100 * lo:.1f}% in the "
            f"lower half, {100 * ex:.1f}% exactly on the grid",
            f"increases their magnitude by ${tex_sci(float(shift))}$"]


def ties_table(F):
    a = table(F, "ties_bias")
    a = a[a.kind == "attribution"]
    rows = {s: (o, w) for s, o, w in zip(a.run, a.err_only, a.err_without, strict=True)}

    def cell(x):
        d = 2 if abs(x) >= 1e-5 else 1
        return f"${'+' if x > 0 and d == 2 else ''}{tex_sci(x, d)}$"

    out = [f"| {s} | {cell(rows[s][0])} | {cell(rows[s][1])} |" for s in ("s", "p")]
    out += [f"| {s} ({why}) | {cell(rows[s][0])} | {cell(rows[s][1])} |"
            for s, why in (("l", "state and block row sums"), ("o", "state and $PV$ tiles"))]
    out.append(f"| div | {cell(rows['div'][0])} | {cell(rows['div'][1])} |")
    require(max(abs(rows[s][0]) for s in ("pv_acc", "l_acc")) < 1e-9,
            "pv_acc and l_acc in fp32 alone err by under 1e-9")
    out.append(f"| pv_acc, l_acc (fp32) | $< 10^{{-9}}$ | {cell(rows['pv_acc'][1])} |")
    return out


PASSAGES = {
    "BoundAccounting": Passage("docs/experiments.md: the bound's verdicts over every stored "
                               "forward table", bound_accounting),
    "BoundSweepLine": Passage("docs/experiments.md: bf16_sweep's summary line",
                              bf16_sweep_summary_line),
    "ReadmeTightness": Passage("README.md: bound_tightness in short", tightness_readme),
    "BoundTightness": Passage("docs/bounds.md: bound_tightness's table", tightness_docs),
    "ReadmeStress": Passage("README.md: the stress test (bound_stress)", stress_readme),
    "BoundStress": Passage("docs/bounds.md: the stress test (bound_stress)", stress_docs),
    "BoundTightnessProse": Passage("docs/bounds.md: where the bound is tight and loose",
                                   tightness_prose),
    "TiesBias": Passage("docs/bounds.md: the ties bias (experiments/ties_bias)", ties_claims),
    "TiesAttribution": Passage("docs/bounds.md: the ties bias per site (ties_bias)",
                               ties_table),
}
