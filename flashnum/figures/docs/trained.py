"""What README.md and docs/trained_model.md quote about the trained model, as passages
rebuilt from experiments/trained_model, trained_model_stats, bwd_trained_model, their
manifests, and models/stdlib_lm.json (the training log and the capture's description,
written by `python models/stdlib_lm.py capture`).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from flashnum.figures.docs.sources import last_run, root, table
from flashnum.figures.quoting import Passage
from flashnum.figures.trained import FLOOR, errors, nearest


def sci(x):
    """3.4e-3 style: two significant digits."""
    mant, exp = f"{x:.1e}".split("e")
    return f"{mant}e{int(exp)}"


def g2(x):
    return f"{x:.2g}"


def info(F):
    return json.loads((root(F) / "models" / "stdlib_lm.json").read_text())


def parts(F):
    t = errors(table(F, "trained_model"))
    heads = [i for i in t.index if i.startswith("L")]
    cat = [i for i in t.index if not i.startswith("L")]
    return t, heads, cat, table(F, "trained_model_stats")


def model_claims(F):
    m = info(F)
    tr = m["training"]
    cfg, steps, b = tr["config"], tr["steps_done"], tr["batch"]
    val = {c["step"]: c["val_loss"] for c in tr["curve"] if "val_loss" in c}
    nbytes = sum(tr["corpus"]["bytes"].values())
    seen = steps * b * cfg["context"]
    cap = root(F) / "models" / "stdlib_lm.capture.safetensors"
    return [
        f"{cfg['n_layer']} layers, d_model {cfg['d_model']}, {cfg['n_head']} heads of "
        f"{cfg['d_model'] // cfg['n_head']}, context {cfg['context']}",
        f"{tr['params'] / 1e6:.2f} M parameters",
        f"trained for {steps} optimizer steps of {b} sequences of {cfg['context']} bytes",
        f"({seen / 1e6:.2f} M bytes, under {math.ceil(100 * seen / nbytes)}% of one pass over "
        f"its {nbytes / 1e6:.1f} MB corpus)",
        f"held-out loss of {val[steps]:.2f} nats per byte ({val[50]:.2f} at step 50)",
        f"training stopped at its {tr['minutes_cap']:.0f}-minute cap after {steps} steps "
        f"({tr['wall_s']:.1f} s wall, {tr['cpu_s']:.1f} s of CPU over both threads; the "
        f"1-minute load average was {tr['load_average_at_start'][0]:.1f} when it started)",
        f"the capture took {m['wall_s']:.0f} s",
        f"Python {tr['corpus']['python']} here: {sum(tr['corpus']['files'].values())} files, "
        f"{nbytes / 1e6:.1f} MB)",
        f"is held out ({tr['corpus']['files']['val']} files)",
        f"(`models/stdlib_lm.capture.safetensors`, {cap.stat().st_size / 2**20:.1f} MiB",
        f"the last {m['rows']} query rows ({m['context'] - m['rows']}..{m['context'] - 1})",
        f"rerun with `--stop-after {steps}`",
    ]


def run_claims(F):
    fwd, st, bwd = (last_run(F, n) for n in ("trained_model", "trained_model_stats",
                                              "bwd_trained_model"))
    return [
        f"# {fwd['counts']['run']} cases, {fwd['wall_s']:.0f} s on {fwd['n_workers']} workers",
        f"# {len(table(F, 'trained_model_stats'))} heads, {st['wall_s']:.0f} s",
        f"# {len(table(F, 'bwd_trained_model'))} cases, {bwd['wall_s']:.0f} s",
    ]


def finding_claims(F):
    t, heads, cat, st = parts(F)
    fa = t["fa2 bf16"]
    ratio = t.loc[heads] / t.loc["gaussian"]
    casts = [c for c in t.columns if c.startswith("P ")]
    cr = ratio[casts].values
    near = nearest(t).nearest.value_counts()
    counts = sorted(near.items(), key=lambda kv: (-kv[1], kv[0]))
    lg = np.log10(t.clip(lower=FLOOR))
    dist = pd.DataFrame({h: ((lg.loc[cat] - lg.loc[h]) ** 2).mean(axis=1) ** 0.5
                         for h in heads}).median(axis=1).sort_values()
    cap = st[st.distribution == "captured"]
    by = st.set_index("distribution")
    l2 = sorted(cap[cap.dist_params.str.contains('"call":2')].max_prob)
    worse = {d: t.loc[d, casts].values[None, :] / t.loc[heads, casts].values
             for d in ("late_max", "early_max", "ramp", "underflow", "gaussian")}
    med = [float(np.median(r)) for r in worse.values()]
    allr = np.concatenate([r.ravel() for r in worse.values()])
    listed = ", ".join(f"{d} {v:.2f}" for d, v in dist.iloc[:5].items())
    far = ", ".join(f"{d} {dist[d]:.2f}" for d in ("gaussian", "late_max", "early_max", "ramp",
                                                  "sink", "cancellation", "flat"))
    return [
        f"{len(cat)} catalogue distributions at the same shape",
        f"put a mean {l2[0]:.2f} and {l2[1]:.2f} of each row's mass on one key",
        f"between {sci(fa[heads].min())} and {sci(fa[heads].max())} (gaussian "
        f"{sci(fa['gaussian'])})",
        f"over all {t.shape[1]} settings a head's error is at most {ratio.values.max():.2f} "
        f"times gaussian's",
        f"a median {np.median(cr):.2f} of gaussian's ({cr.min():.2f} to {cr.max():.2f})",
        f"the nearest distribution is {counts[0][0]} for {counts[0][1]} heads, "
        + ", ".join(f"{d} for {n}" for d, n in counts[1:-1])
        + f" and {counts[-1][0]} for {counts[-1][1]}",
        f"Median distance over the heads, nearest first: {listed}; far off: {far}",
        "(near_overflow is infinitely far" if not np.isfinite(dist["near_overflow"]) else "",
        f"max logits {g2(cap.max_logit.min())} to {g2(cap.max_logit.max())} (gaussian "
        f"{g2(by.loc['gaussian', 'max_logit'])}, scaled {g2(by.loc['scaled', 'max_logit'])}, "
        f"heavy_tail {g2(by.loc['heavy_tail', 'max_logit'])}), median row spread "
        f"{g2(cap.spread.min())} to {g2(cap.spread.max())}, normalised entropy "
        f"{g2(cap.entropy.min())} to {g2(cap.entropy.max())}",
        f"the largest mean probability on key 0 is {g2(cap.sink_mass.max())} (sink: "
        f"{by.loc['sink', 'sink_mass']:.2f})",
        f"outlier ratios are at most {g2(cap.q_outlier_ratio.max())} and "
        f"{g2(cap.k_outlier_ratio.max())} (outlier_channels: "
        f"{by.loc['outlier_channels', 'q_outlier_ratio']:.1f} and "
        f"{by.loc['outlier_channels', 'k_outlier_ratio']:.1f})",
        f"at most {cap.ties_bf16.max():.3f} keys per row round to P = 1 in bf16 on average "
        f"(ties: {by.loc['ties', 'ties_bf16']:.0f})",
        f"make a median {min(med):.1f} to {max(med):.1f} times the heads' error under the P "
        f"casts ({allr.min():.1f} to {allr.max():.1f} times",
    ]


def backward_claims(F):
    df = table(F, "bwd_trained_model")
    cap = df.distribution == "captured"
    rule = df[[f"rule_{g}" for g in ("dq", "dk", "dv")]].astype(bool).all(axis=1)
    fa, lp = cap & (df.policy == "fa2"), cap & (df.policy == "lowp")
    f = df[(df.policy == "fa2") & (df.precision == "bf16")]
    rel = f.err_dq / f.ref_dq
    g = float(rel[(f.distribution == "gaussian") & (f.seq_len == 128)].iloc[0])
    r = rel[f.distribution == "captured"] / g
    worst = json.loads(f.capture[r.idxmax()])
    which = ("first", "second")[worst["head_ids"][0]]
    return [
        f"({int(rule[fa].sum())} of {int(fa.sum())} cases), lowp on "
        f"{'none' if not rule[lp].any() else int(rule[lp].sum())} ({int(rule[lp].sum())} of "
        f"{int(lp.sum())})",
        f"a median {r.median():.2f} times that on gaussian inputs of 128 rows, at most "
        f"{r.max():.1f} times (layer {worst['call']}'s {which} head)",
    ]


def readme_claims(F):
    t, heads, cat, st = parts(F)
    m = info(F)["training"]
    counts = sorted(nearest(t).nearest.value_counts().items(), key=lambda kv: (-kv[1], kv[0]))
    val = [c["val_loss"] for c in m["curve"] if "val_loss" in c][-1]
    return [
        f"{m['params'] / 1e6:.2f} M parameters, {m['steps_done']} steps, "
        f"{m['wall_s'] / 60:.0f} minutes on 2 shared cores",
        f"held-out loss {val:.2f} nats per byte",
        f"capture --run scratch/stdlib_lm_run` ({info(F)['wall_s']:.0f} s)",
        f"two heads per layer, the last {info(F)['rows']} of {info(F)['context']} query rows",
        f"over all {t.shape[1]} settings",
        f"a head's error is at most {(t.loc[heads] / t.loc['gaussian']).values.max():.2f} "
        "times gaussian's",
        "nearest in error profile: " + ", ".join(f"{d} ({n})" for d, n in counts),
    ]


PASSAGES = {
    "TrainedModel": Passage("docs/trained_model.md: the model and its training "
                            "(models/stdlib_lm.json)", model_claims),
    "TrainedRuns": Passage("docs/trained_model.md: the runs' sizes and times (manifests)",
                           run_claims),
    "TrainedFindings": Passage("docs/trained_model.md: the heads beside the catalogue",
                               finding_claims),
    "TrainedBackward": Passage("docs/trained_model.md: bwd_trained_model", backward_claims),
    "TrainedInShort": Passage("docs/trained_model.md: the trained model in short", readme_claims),
}
