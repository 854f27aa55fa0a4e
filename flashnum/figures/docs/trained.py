"""What docs/trained_model.md shows of the trained model: tables generated from
experiments/trained_model, trained_model_stats, bwd_trained_model and models/stdlib_lm.json
(the training log and the capture's description, written by `python models/stdlib_lm.py
capture`), TABLES; and the numbers its in-short sentences state (QUOTED).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from flashnum.figures.docs.sources import root, table
from flashnum.figures.docs.views import cell, view
from flashnum.figures.quoting import Quantity, require
from flashnum.figures.trained import FLOOR, errors, nearest


def info(F):
    return json.loads((root(F) / "models" / "stdlib_lm.json").read_text())


def parts(F):
    t = errors(table(F, "trained_model"))
    heads = [i for i in t.index if i.startswith("L")]
    cat = [i for i in t.index if not i.startswith("L")]
    return t, heads, cat, table(F, "trained_model_stats")


def scalars(d: dict, prefix="") -> dict:
    """A JSON record's numbers and words, nested records flattened ("corpus.files.val")."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out |= scalars(v, f"{prefix}{k}.")
        elif not isinstance(v, list) and k not in ("sha256", "root", "corpus_sha256"):
            out[prefix + k] = v
    return out


def training(F) -> pd.DataFrame:
    """models/stdlib_lm.json's record of the model, its training and its capture, as is."""
    m = info(F)
    fields = {**scalars(m["training"], "training."),
              **{f"capture.{k}": v for k, v in m.items() if k in ("rows", "context", "wall_s")},
              "training.curve: the last val_loss": [c["val_loss"] for c in m["training"]["curve"]
                                                    if "val_loss" in c][-1]}
    return pd.DataFrame({"field": list(fields), "value": [cell(v) for v in fields.values()]})


def distances(F) -> pd.DataFrame:
    """Each catalogue distribution's median distance over the heads (the root-mean-square
    of log10 of the error ratio over the settings), nearest first."""
    t, heads, cat, _ = parts(F)
    lg = np.log10(t.clip(lower=FLOOR))
    d = pd.DataFrame({h: ((lg.loc[cat] - lg.loc[h]) ** 2).mean(axis=1) ** 0.5 for h in heads})
    require(not np.isfinite(d.loc["near_overflow"]).any(), "near_overflow is infinitely far")
    return d.median(axis=1).sort_values().map(cell).rename_axis("distribution").reset_index(
        name="median distance")


STATS = ["max_logit", "spread", "entropy", "max_prob", "sink_mass", "q_outlier_ratio",
         "k_outlier_ratio", "ties_bf16"]
TABLES = {"TrainedTraining": training, "TrainedDistances": distances,
          "TrainedStats": view("trained_model_stats", "", STATS, by=["distribution"]),
          "TrainedBackwardRules": view("bwd_trained_model", "distribution == 'captured'",
                                       ["rule_dq", "rule_dk", "rule_dv"],
                                       by=["policy", "precision"], agg="mean", never={
              "distribution == 'captured' and policy == 'lowp' and rule_dq and rule_dk and "
              "rule_dv": "lowp keeps flash-attn's rule on no head"})}


def nearest_counts(F) -> str:
    """Heads per nearest distribution by error profile, most first."""
    counts = sorted(nearest(parts(F)[0]).nearest.value_counts().items(),
                    key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{d} ({n})" for d, n in counts)


def _worst_over_gaussian(F) -> float:
    t, heads, _, _ = parts(F)
    return (t.loc[heads] / t.loc["gaussian"]).values.max()


QUOTED = {
    "TrainedSettings": Quantity("trained_model: the settings each head runs",
                                lambda F: parts(F)[0].shape[1], paper=False),
    "TrainedWorstOverGaussian": Quantity("trained_model: a head's largest error over "
                                         "gaussian's in any setting", _worst_over_gaussian,
                                         md=lambda x: f"{x:.2f}", paper=False),
    "TrainedNearest": Quantity("trained_model: heads per nearest distribution",
                               nearest_counts, paper=False)}
