"""The trained model's heads beside the catalogue: figure, table and the numbers quoted.

    trained_model(F)      experiments/trained_model: normwise relative error of every
                          captured head (one marker per head, coloured by layer) and of
                          every catalogue distribution (grey) per setting: fa2, lowp and
                          naive in bf16 and fp16, and P cast to fp8 / MX / NVFP4 formats
    (numbers)             bwd_trained_model: flash-attn's rule per policy on the heads, fa2's
                          bf16 dQ error beside gaussian's
    tab_trained_model     per captured head: its logit statistics
                          (experiments/trained_model_stats), its fa2 bf16 error over
                          gaussian's, and the catalogue distribution nearest it in error
                          profile (below)

Nearest in error profile: for a head h and a distribution c, the root-mean-square over
the settings of log10(err_h / err_c), errors floored at 1e-12 so that exact zeros stay
finite; the nearest c has the smallest. It says which synthetic input makes the same
errors as the head across the settings, whatever the statistics look like.

The model's size and training (the paragraph says them) come from models/stdlib_lm.json,
which `python models/stdlib_lm.py capture` writes beside the capture it describes.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from flashnum.figures.context import Figures
from flashnum.figures.registry import figure
from flashnum.figures.tex import tabular, tex_num, tex_word

METRIC = "normwise_rel_err"
FLOOR = 1e-12  # exact zero errors (flat in fp32) plotted and compared at this floor
ROUNDING = [(p, x) for x in ("bf16", "fp16") for p in ("fa2", "lowp", "naive")]
SINK = 0.1  # a head with mean probability on key 0 above this counts as an attention sink
CASTS = ("fp8_e4m3", "fp8_e5m2", "mxfp8_e4m3", "mxfp6_e3m2", "mxfp4", "nvfp4", "nvfp4_row")


def setting(row) -> str:
    """A row's setting: 'fa2 bf16' or the format P is cast to."""
    sites = json.loads(row["policy_sites"]) if row["policy_sites"] else {}
    if "p_cast" in sites:
        return f"P {sites['p_cast']}"
    return f"{row['policy']} {row['precision']}"


def head_label(dist_params: str) -> tuple[int, int]:
    """(call, stored head) of a captured row."""
    p = json.loads(dist_params)
    return int(p["call"]), int(p["head_ids"][0])


def errors(df: pd.DataFrame) -> pd.DataFrame:
    """inputs x settings of the error: captured heads as 'L<call> h<head>', the catalogue by
    name."""
    df = df.assign(setting=[setting(r) for _, r in df.iterrows()])
    names = []
    for d, p in zip(df.distribution, df.dist_params, strict=True):
        names.append("L{} h{}".format(*head_label(p)) if d == "captured" else d)
    df = df.assign(input=names)
    order = [f"{p} {x}" for p, x in ROUNDING] + [f"P {c}" for c in CASTS]
    t = df.pivot_table(index="input", columns="setting", values=METRIC, aggfunc="first")
    return t[[s for s in order if s in t.columns]]


def nearest(t: pd.DataFrame) -> pd.DataFrame:
    """Per captured head, the catalogue distribution nearest in error profile."""
    lg = np.log10(t.clip(lower=FLOOR))
    heads = [i for i in lg.index if i.startswith("L")]
    cat = [i for i in lg.index if not i.startswith("L")]
    rows = []
    for h in heads:
        dist = ((lg.loc[cat] - lg.loc[h]) ** 2).mean(axis=1) ** 0.5
        rows.append(dict(input=h, nearest=dist.idxmin(), distance=float(dist.min()),
                         gaussian_distance=float(dist["gaussian"])))
    return pd.DataFrame(rows).set_index("input")


def model_info(F: Figures) -> dict | None:
    path = F.experiments.parent / "models" / "stdlib_lm.json"
    return json.loads(path.read_text()) if path.exists() else None


@figure("trained_model")
def trained_model(F: Figures) -> None:
    df = F.table("trained_model")
    if df is None or not (df.distribution == "captured").any():
        return F.placeholder("trained_model", "trained_model")
    from flashnum.figures.plots import _style

    plt = _style()
    t = errors(df)
    heads = [i for i in t.index if i.startswith("L")]
    cat = [i for i in t.index if not i.startswith("L")]
    fig, ax = plt.subplots(figsize=(6.5, 2.9))
    x = np.arange(len(t.columns))
    low = min(float(t.loc[heads].min().min()), float(t.loc["gaussian"].min())) / 30
    for c in cat:  # errors far below every head's (flat under a P cast: exact) at the edge
        y = t.loc[c]
        ax.plot(x, y.where(y >= low), "o", ms=2.5, color="0.75", zorder=1,
                label="catalogue" if c == cat[0] else None)
        ax.plot(x, y.where(y < low).clip(lower=low), "v", ms=3, color="0.75", zorder=1)
    ax.plot(x, t.loc["gaussian"].clip(lower=FLOOR), "_", ms=10, mew=1.5, color="k", zorder=2,
            label="gaussian")
    layers = sorted({h.split()[0] for h in heads})
    for h in heads:
        li = layers.index(h.split()[0])
        ax.plot(x + 0.12 * (int(h.split()[1][1:]) - 0.5), t.loc[h].clip(lower=FLOOR), "x",
                ms=4, color=f"C{li}", zorder=3,
                label=f"trained, layer {h.split()[0][1:]}" if h.endswith("h0") else None)
    ax.set_xticks(x, list(t.columns), rotation=35, ha="right")
    ax.set_yscale("log")
    ax.set_ylim(bottom=low / 1.5)
    ax.set_ylabel(r"$\|O - O^*\|_F / \|O^*\|_F$")
    fig.legend(loc="outside upper center", ncol=6, fontsize=6)
    F.select("trained_model", [f"{len(heads)} captured heads", f"{len(cat)} distributions",
                               f"Nq {int(df.seq_len_q.iloc[0])}",
                               f"Nk {int(df.seq_len_k.iloc[0])}", METRIC])
    F.save(fig, "trained_model")
    _numbers(F, t, heads, cat)


def _numbers(F: Figures, t: pd.DataFrame, heads: list[str], cat: list[str]) -> None:
    ratio = t.loc[heads] / t.loc["gaussian"]
    F.num("TrainedHeads", len(heads))
    F.num("TrainedDists", len(cat))
    fa = t["fa2 bf16"]
    F.num("TrainedFaBfMin", float(fa[heads].min()))
    F.num("TrainedFaBfMax", float(fa[heads].max()))
    F.num("TrainedFaBfGauss", float(fa["gaussian"]))
    F.num("TrainedOverGaussMedian", float(np.nanmedian(ratio.values)))
    F.num("TrainedOverGaussMax", float(np.nanmax(ratio.values)))
    near = nearest(t)
    counts = sorted(near.nearest.value_counts().items(), key=lambda kv: (-kv[1], kv[0]))
    F.num("TrainedNearest", ", ".join(f"{tex_word(d)} ({n})" for d, n in counts))
    _backward(F, heads)
    info = model_info(F)
    if info is not None:
        tr = info["training"]
        val = [c["val_loss"] for c in tr["curve"] if "val_loss" in c]
        F.num("TrainedParams", tr["params"] / 1e6)
        F.num("TrainedLayers", tr["config"]["n_layer"])
        F.num("TrainedDModel", tr["config"]["d_model"])
        F.num("TrainedSteps", tr["steps_done"])
        F.num("TrainedTokens", tr["steps_done"] * tr["batch"] * tr["config"]["context"] / 1e6)
        F.num("TrainedMinutes", tr["wall_s"] / 60)
        F.num("TrainedValLoss", val[-1] if val else math.nan)


def _backward(F: Figures, heads: list[str]) -> None:
    """The numbers of bwd_trained_model: flash-attn's rule (error at most twice torch's
    autograd in the same dtype) per policy over the captured heads, and fa2's bf16 dQ
    error beside gaussian's at seq_len 128."""
    df = F.table("bwd_trained_model")
    if df is None or not (df.distribution == "captured").any():
        return
    rule = df[[f"rule_{g}" for g in ("dq", "dk", "dv")]].astype(bool).all(axis=1)
    cap = df.distribution == "captured"
    F.num("TrainedBwdCalls", int((cap & (df.policy == "fa2") & (df.precision == "bf16")).sum()))
    for pol, name in (("fa2", "Fa"), ("lowp", "Lowp")):
        sel = cap & (df.policy == pol)
        F.num(f"TrainedBwdRule{name}", f"{int(rule[sel].sum())} of {int(sel.sum())}")
    fa = df[(df.policy == "fa2") & (df.precision == "bf16")]
    rel = fa.err_dq / fa.ref_dq
    gauss = rel[(fa.distribution == "gaussian") & (fa.seq_len == 128)]
    r = rel[fa.distribution == "captured"] / float(gauss.iloc[0]) if len(gauss) else rel * math.nan
    F.num("TrainedBwdDqOverGaussMedian", float(r.median()))
    F.num("TrainedBwdDqOverGaussMax", float(r.max()))


@figure("trained_model")
def tab_trained_model(F: Figures) -> None:
    df, st = F.table("trained_model"), F.table("trained_model_stats")
    if df is None or st is None or not (df.distribution == "captured").any():
        return F.placeholder("tab_trained_model", "trained_model")
    t = errors(df)
    near = nearest(t)
    st = st[st.distribution == "captured"]
    info = model_info(F)
    kept = {}  # (call, stored head) -> the model's head index
    if info is not None:
        by_layer: dict = {}
        for r in info["heads"]:
            if r["kept"]:
                by_layer.setdefault(r["layer"], []).append(r["head"])
        kept = {(la, i): h for la, hs in by_layer.items() for i, h in enumerate(sorted(hs))}
    rows = []
    for _, r in st.sort_values("dist_params").iterrows():
        call, h = head_label(r.dist_params)
        key = f"L{call} h{h}"
        rows.append([
            str(call), str(kept.get((call, h), "--")), tex_num(r.max_logit), tex_num(r.spread),
            tex_num(r.sink_mass), tex_num(r.entropy), tex_num(r.ties_bf16, 3),
            tex_num(r.k_outlier_ratio), tex_num(float(t.loc[key, "fa2 bf16"] /
                                                      t.loc["gaussian", "fa2 bf16"])),
            tex_word(near.loc[key, "nearest"]), tex_num(near.loc[key, "distance"]),
        ])
    cols = ["layer", "head", "max logit", "spread", "sink mass", "entropy", "bf16 ties",
            "k outliers", "fa2 bf16 / gaussian", "nearest", "distance"]
    F.write_table("tab_trained_model", tabular(cols, rows, "rrrrrrrrrlr"))
    sink, top = float(st.sink_mass.max()), float(st.max_logit.max())
    F.num("TrainedSinkMax", sink)
    F.num("TrainedMaxLogit", top)
    F.fact("TrainedSink", sink >= SINK)
