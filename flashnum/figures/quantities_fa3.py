"""The named quantities of the FlashAttention-3 reproductions: the fp16 pair at the protocol
size (fa3_protocol, and fa3_protocol_heldout on seeds fixed before their run) and Table 3
(repro_fa3_table3) (flashnum.figures.quantities)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

from flashnum.figures.quoting import Fact, Quantity, fixed, percent, sci
from flashnum.reproduce.fa3 import protocol_summary as fa3_summary


def _fa3(key: Callable[[dict], object], name: str = "fa3_protocol"
         ) -> Callable[[object], object]:
    """A number of the FA3 fp16 pair at the protocol N = 8192, d = 128, from its summary:
    over seeds 0-7 (experiments/fa3_protocol, chosen after the search) or over the
    held-out seeds fixed before their run (name fa3_protocol_heldout)."""
    def value(F):
        df = F.table(name)
        return None if df is None else key(fa3_summary(df))
    return value


def _fa3_seeds(how: Callable, name: str) -> Callable[[object], object]:
    """The first or last seed of an fa3_protocol table."""
    def value(F):
        df = F.table(name)
        return None if df is None else int(how(df.seed))
    return value


def _run_commit(name: str) -> Callable[[object], object]:
    """The short commit of a table's last run (its manifest), for the text that dates it."""
    def value(F):
        path = Path(F.experiments) / name / "manifest.json"
        if not path.exists():
            return None
        return json.loads(path.read_text())["runs"][-1]["git"]["commit"][:7]
    return value


def _fa3_measured(F):
    """Whether the protocol fixed in advance was measured (None: it was not)."""
    return None if F.table("fa3_protocol") is None else True


def _fa3_inside(name: str = "fa3_protocol") -> Callable[[object], object]:
    """Whether the published ratio lies inside the per-seed range of the protocol's ratio."""
    def value(F):
        df = F.table(name)
        if df is None:
            return None
        r = fa3_summary(df)
        return (r["summary"]["ratio"]["min"] <= r["published_ratio"]
                <= r["summary"]["ratio"]["max"])
    return value


def _fa3_published(row: str) -> Callable[[object], object]:
    """The published number of one row of FA3's Table 3 (repro_fa3_table3)."""
    def value(F):
        df = F.table("repro_fa3_table3")
        if df is None:
            return None
        d = df[(df.row == row) & df.published.notna()]
        return float(d.published.iloc[0]) if len(d) else math.nan
    return value


def _fa3_best(pick: Callable, col: str = "ours") -> Callable[[object], object]:
    """A column of FA3 Table 3's best-matching protocol (repro_fa3_table3, rows flagged
    `best`), on the row pick(best rows) selects (a boolean mask)."""
    def value(F):
        df = F.table("repro_fa3_table3")
        if df is None or "best" not in df or col not in df:
            return None
        b = df[df["best"].astype(bool)]
        d = b[pick(b)]
        return d[col].iloc[0].item() if len(d) else math.nan
    return value


def _fp16(policy: str) -> Callable:
    return lambda b: (b.section == "fp16") & (b.policy == policy)


def _fp8(row: str) -> Callable:
    return lambda b: b.row == row


def _fa3_ratio(F):
    std, fa = (_fa3_best(_fp16(p))(F) for p in ("naive", "fa2"))
    return None if std is None else std / fa


def _fa3_fp8_worst(F):
    """The largest |ours / published - 1| over the published fp8 rows, in whole % (up)."""
    df = F.table("repro_fa3_table3")
    if df is None or "best" not in df:
        return None
    b = df[df["best"].astype(bool) & (df.section == "fp8") & df.published.notna()]
    return math.ceil(100 * float((b.ours / b.published - 1).abs().max())) if len(b) else None


def _fa3_fp8_match(F):
    df = F.table("repro_fa3_table3")
    if df is None or "best" not in df or "match" not in df:
        return None
    m = df[df["best"].astype(bool) & (df.section == "fp8")]["match"].dropna()
    return float(m.iloc[0]) if len(m) else math.nan


_PROTOCOL = "experiments/fa3_protocol"
_HELD = "fa3_protocol_heldout"
# the same protocol on seeds fixed before their run (conf/table/fa3_protocol_heldout.yaml)
_FA3_HELDOUT = {
    "FaThreeHeldoutMeasured": Fact(f"experiments/{_HELD} exists",
                                   lambda F: None if F.table(_HELD) is None else True,
                                   "measured", "not measured", paper=True),
    "FaThreeHeldoutInside": Fact(f"{_HELD}: the published ratio lies inside the per-seed "
                                 "range", _fa3_inside(_HELD), "inside", "outside", paper=True),
    "FaThreeHeldoutSeeds": Quantity(f"{_HELD}: seeds", _fa3(lambda r: r["seeds"], _HELD),
                                    tex=str),
    **{f"FaThreeHeldoutSeed{k}": Quantity(f"{_HELD}: the {w} seed", _fa3_seeds(how, _HELD),
                                          tex=str)
       for k, w, how in (("First", "first", min), ("Last", "last", max))},
    "FaThreeHeldoutCommit": Quantity(f"{_HELD}: the commit its run ran at",
                                     _run_commit(_HELD), tex=str),
    "FaThreeProtocolCommit": Quantity("fa3_protocol: the commit its last run ran at",
                                      _run_commit("fa3_protocol"), tex=str),
    **{f"FaThreeHeldout{k}": Quantity(f"{_HELD}: {w}'s mean RMSE",
                                      _fa3(lambda r, p=p: r["summary"][p]["mean"], _HELD),
                                      md=sci(2))
       for k, w, p in (("Std", "standard attention", "naive"),
                       ("Flash", "FlashAttention-2", "fa2"))},
    **{f"FaThreeHeldout{k}Sd": Quantity(f"{_HELD}: {w}'s relative standard deviation over "
                                        "seeds",
                                        _fa3(lambda r, p=p: r["summary"][p]["rel_sd"], _HELD),
                                        tex=lambda x: f"{100 * x:.0f}", md=percent)
       for k, w, p in (("Std", "standard attention", "naive"),
                       ("Flash", "FlashAttention-2", "fa2"))},
    **{f"FaThreeHeldout{k}": Quantity(f"{_HELD}: {w}", _fa3(f, _HELD), tex=fixed(2),
                                      md=fixed(2))
       for k, w, f in (("Ratio", "ratio of the means",
                        lambda r: r["summary"]["ratio_of_means"]),
                       ("RatioMin", "smallest per-seed ratio",
                        lambda r: r["summary"]["ratio"]["min"]),
                       ("RatioMax", "largest per-seed ratio",
                        lambda r: r["summary"]["ratio"]["max"]))},
}
