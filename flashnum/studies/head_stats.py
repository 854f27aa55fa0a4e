"""The logit statistics of every input of a forward experiment, stored as a table of heads.

    python -m flashnum.studies.head_stats trained_model      # -> experiments/trained_model_stats
    df = flashnum.store.load("trained_model_stats")  # one row per (input, batch, head)

For each distinct input of conf/experiment/NAME.yaml's grid (distribution and its
params, shape, seed, causal flag: every case that shares them reads the same Q, K, V,
flashnum.harness.run) the inputs are made as the runner makes them and
flashnum.analysis.logit_stats.head_stats describes each (batch, head): max logit,
spread, sink mass, ties at the row max, outlier channels of q and k (that module says how
each is defined). So a captured model's heads and the catalogue's distributions are
described on one scale beside their errors in experiments/NAME. The statistics are of
the inputs as given (fp64 logits of the stored tensors, before any policy rounds them).

The table is recomputed whole on every run (store.replace) with a manifest record of
the code and command; it takes seconds (no attention is run). Columns: the input's
fields (distribution, dist_params, batch, heads, seq_len_q, seq_len_k, head_dim, causal,
seed, block_n), input_id (what the input's cases share), b and head (which batch entry and
head of the input), case_id (input_id, b and head hashed), then logit_stats.STATS.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import pandas as pd
import torch

from flashnum import store
from flashnum.analysis.logit_stats import STATS, head_stats
from flashnum.harness.cli import main_of
from flashnum.harness.config import StoreConf
from flashnum.harness.grid import hash_id
from flashnum.inputs.distributions import make
from flashnum.store import manifest
from flashnum.store.paths import CONF

INPUT_FIELDS = ("distribution", "dist_params", "batch", "heads", "seq_len_q", "seq_len_k",
                "head_dim", "causal", "seed", "block_n")


def _sha(obj) -> str:
    return hash_id(obj, spaced=True)


def inputs_of(experiment: str) -> list[dict]:
    """The distinct inputs of a forward experiment's grid, in grid order."""
    from hydra import compose, initialize_config_dir

    from flashnum.harness.config import register
    from flashnum.harness.grid import expand

    register()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={experiment}"])
    out, seen = [], set()
    for case in expand(cfg):
        key = {f: getattr(case, f) for f in INPUT_FIELDS}
        iid = _sha(key)
        if iid not in seen:
            seen.add(iid)
            out.append({**key, "input_id": iid})
    return out


def stats_rows(inp: dict) -> list[dict]:
    """One row per (batch, head) of an input (module docstring)."""
    x = make(inp["distribution"], batch=inp["batch"], heads=inp["heads"],
             seq_len_q=inp["seq_len_q"], seq_len_k=inp["seq_len_k"],
             head_dim=inp["head_dim"], seed=inp["seed"], block_n=inp["block_n"],
             **json.loads(inp["dist_params"]))
    # the runner's causal: the case's flag or the one the input asks for (bottom-right)
    causal = bool(inp["causal"] or x.causal)
    rows = []
    for r in head_stats(x.q, x.k, x.v, scale=x.softmax_scale, causal=causal):
        b, h = r.pop("batch"), r.pop("head")
        rows.append({**inp, "causal": causal, "b": b, "head": h,
                     "case_id": _sha({"input_id": inp["input_id"], "b": b, "head": h}), **r})
    return rows


@dataclass
class Args:
    """python -m flashnum.studies.head_stats EXPERIMENT [store.root=DIR]"""

    experiment: str = ""  # a forward experiment (conf/experiment/NAME.yaml)
    store: StoreConf = field(default_factory=StoreConf)


def _check(cfg) -> None:
    if not (CONF / "experiment" / f"{cfg.experiment}.yaml").is_file() or \
            cfg.experiment.startswith("bwd_"):
        valid = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml")
                       if not p.stem.startswith("bwd_"))
        raise ValueError(f"unknown experiment {cfg.experiment!r}; valid: {', '.join(valid)}")


def _run(cfg) -> int:
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    name = f"{cfg.experiment}_stats"
    rec = manifest.record("flashnum.run", [f"experiment={name}"])
    rows = [r for inp in inputs_of(cfg.experiment) for r in stats_rows(inp)]
    df = pd.DataFrame(rows, columns=[*INPUT_FIELDS, "input_id", "b", "head", "case_id",
                                     *STATS])
    rec.update(end_time=manifest.now(), wall_s=time.perf_counter() - t0,
               counts={"rows": len(df)})
    exp_dir = store.replace(name, df, rec, root=cfg.store.root)
    print(f"{name}: {len(df)} heads of {df['input_id'].nunique()} inputs -> {exp_dir} "
          f"({time.perf_counter() - t0:.1f} s)")
    return 0


def main(argv=None) -> int:
    return main_of("flashnum.studies.head_stats", Args, _run, argv, positional="experiment",
                   check=_check, doc=__doc__)


if __name__ == "__main__":  # an alias: python -m flashnum.run experiment=NAME_stats
    from flashnum.harness.cli import alias, named

    alias(named(suffix="_stats"))
