"""Why a kernel fails: the flashnum model that reproduces it most closely, the site that
makes that model's error, and the case where the kernel is worst.

    from flashnum.audit.diagnosis import diagnose, worst_case
    d = diagnose(kept, table, case_list, precision="bf16", alignment="top_left")
    d["closest"], d["shares"], d["site"], d["worst"], d["cost"]

The closest model: every candidate the installed flashnum runs (flashnum.audit.models:
each preset with its variants, every kernel model of flashnum.models.MODELS) is run on
every case the kernel answered, and the share of the kernel's values it equals bit for
bit is counted (the output, and dQ, dK, dV in a gradient audit; `bitwise` pools every
value of every case the model could take). The SCANNED flash candidates with the largest
shares, and fa2 whatever its share, are then tried at every tiling of models.TILINGS:
block sizes up to one block of the whole row, in forward order and in FlexAttention's
(partial_first). Each model runs once per case and distinct values (Runs: candidates
whose models.Candidate.bits_key agrees on a case share the run); `cost` counts the
candidates (at most len(candidates) + (SCANNED + 1) * len(models.TILINGS)), the
model runs and the reused ones, and the seconds. A gradient audit whose
kernel gave no gradient (it has no backward) compares the outputs alone, with every
forward candidate (`forward_only`). A share near 100% says what the kernel
computes; the sites of that model then say where its error comes from. Under REPRODUCES
(99%) no model reproduces the kernel: the diagnosis says so (`reproduced` False), still
names the closest with its share, and attributes no site to it (a site of a model that
does not compute what the kernel computes says nothing about the kernel).

The dominant site: flashnum.analysis.attribution (forward) or attribution_backward (the
gradient of the worst ratio) of the closest model on the worst case (or, where the model
cannot take that case's mask, on the worst case it can): the site whose rounding alone
gives the largest max error; beside it, the kernel's own error on that case (a kernel
that errs well beyond its closest model does something no model's rounding does).

The worst case: the row and quantity (out, dq, dk, dv) with the largest error / limit;
its error and its limit are quoted from that one row.

The causal alignment: the failing causal cases with Nq != Nk (where top-left and
bottom-right masks differ) judged again under the other alignment (other_alignment):
when they all pass there, the kernel's mask is the other one, and the summary says so
and names the alignment= to audit it with.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from types import SimpleNamespace

import pandas as pd
import torch

from flashnum.audit import gradients, models
from flashnum.audit.rules import ALIGNMENTS, DTYPES, _bound, _check_out, aligned_reference
from flashnum.audit.standard import standard_attention

# the share of the kernel's values a model must equal bit for bit to count as reproducing it
REPRODUCES = 0.99
# the flash candidates scanned over models.TILINGS: the best SCANNED by share, and fa2
SCANNED = 2

QUANTITIES = {"out": ("err_max", "fa_bound", "std_err_max"),
              **{g: (f"{g}_err_max", f"{g}_bound", f"{g}_std_err_max") for g in gradients.GRADS}}


def worst_case(table: pd.DataFrame) -> dict | None:
    """The (case, quantity) with the largest error / limit, all quoted from that row."""
    best = None
    for _, r in table.iterrows():
        for qty, (e, b, s) in QUANTITIES.items():
            if e not in r or b not in r or not _num(r[e]) or not _num(r[b]):
                continue
            ratio = r[e] / r[b] if r[b] > 0 else (math.inf if r[e] > 0 else 0.0)
            if best is None or ratio > best["ratio"]:
                best = dict(id=r["id"], quantity=qty, err=float(r[e]), bound=float(r[b]),
                            std_err=float(r[s]), ratio=float(ratio))
    return best


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not math.isnan(x)


def _inputs(case, precision):
    """q, k, v in the dtype, the scale, and the dO the kernel's backward received."""
    inp = case.inputs()
    q, k, v = (x.to(DTYPES[precision]) for x in (inp.q, inp.k, inp.v))
    return q, k, v, inp.scale, gradients.upstream(case, inp, q.dtype)


def _equal(a: torch.Tensor, b: torch.Tensor) -> int:
    a, b = a.double(), b.double()
    return int(((a == b) | (a.isnan() & b.isnan())).sum())


class Runs:
    """The candidates' bit-for-bit agreement with the kept answers. Each case's inputs are
    made once, and each model is run once per case and distinct values: candidates whose
    models.Candidate.bits_key is equal there share one run (`runs` counts the model
    calls, `reused` the counts taken from another candidate's run)."""

    def __init__(self, kept, case_list, precision, alignment, backward):
        self.kept, self.precision, self.alignment, self.backward = (kept, precision,
                                                                    alignment, backward)
        self.cases = [c for c in case_list if c.id in kept and kept[c.id][0] is not None]
        self.inputs = {}
        self.counts = {}  # (bits_key, case id) -> (eq, tot) per quantity, or None: refused
        self.runs = self.reused = 0

    def _count(self, c, case):
        q, k, v, scale, do = self.inputs.get(case.id) or self.inputs.setdefault(
            case.id, _inputs(case, self.precision))
        cz = models._causal(c, case.causal, self.alignment, q.shape[-2], k.shape[-2])
        if cz is None:
            return None  # the model cannot take the kernel's mask
        key = (c.bits_key(q.shape[-2], k.shape[-2], cz, self.backward), case.id)
        if key in self.counts:
            self.reused += 1
            return self.counts[key]
        self.runs += 1
        out, grads = self.kept[case.id]
        kw = dict(precision=self.precision, causal=case.causal, alignment=self.alignment,
                  scale=scale)
        try:  # a model that refuses this case's shape (a ValueError) does not model it
            mo = models.forward(c, q, k, v, **kw)
            g = None
            if self.backward and grads is not None:
                g = models.backward(c, q, k, v, do, **kw)
        except ValueError:
            mo = None
        got = None
        if mo is not None:
            eq, tot = {"out": _equal(out, mo)}, {"out": out.numel()}
            for name, kg in zip(gradients.GRADS, grads if g is not None else (), strict=False):
                eq[name], tot[name] = _equal(kg, getattr(g, name)), kg.numel()
            got = (eq, tot)
        self.counts[key] = got
        return got

    def shares(self, c) -> dict:
        """Candidate c's shares: per quantity, and pooled (`bitwise`), over the cases its
        model took (`cases`)."""
        eq = dict.fromkeys(QUANTITIES, 0)
        tot = dict.fromkeys(QUANTITIES, 0)
        n = 0
        for case in self.cases:
            got = self._count(c, case)
            if got is None:
                continue
            n += 1
            for qty in got[0]:
                eq[qty] += got[0][qty]
                tot[qty] += got[1][qty]
        row = dict(model=c.label, policy=c.policy, variant=c.variant,
                   block_n=c.block_n if c.tiled else math.nan,
                   order=c.order if c.tiled else math.nan, cases=n)
        for qty in QUANTITIES:
            if qty == "out" or self.backward:
                row[f"{qty}_bitwise"] = eq[qty] / tot[qty] if tot[qty] else math.nan
        row["bitwise"] = sum(eq.values()) / sum(tot.values()) if sum(tot.values()) else math.nan
        return row


def _site(c, case, quantity, precision, alignment) -> dict | None:
    """The dominant site of candidate c's error on `case` for `quantity`."""
    from flashnum.numerics.policy import PRESETS

    if c.policy not in PRESETS or c.policy == "exact":
        return None  # a kernel model with its own arithmetic, not a policy of sites
    q, k, v, scale, do = _inputs(case, precision)
    causal = models._causal(c, case.causal, alignment, q.shape[-2], k.shape[-2])
    if causal is None:
        return None
    qkv = (q.double(), k.double(), v.double())
    tiling = c._kw(k.shape[-2])  # its policy, variant, block_n (and order, block_m)
    del tiling["policy"]
    if quantity == "out":
        from flashnum.analysis.attribution import attribute

        ref = aligned_reference(*qkv, causal=case.causal, alignment=alignment, scale=scale,
                                method="fp64").out
        t = attribute(q, k, v, precision=precision, policy=c.policy, ref_out=ref,
                      causal=causal, scale=scale, **tiling)
        t = t[t.metric == "max_abs"]
    else:
        from flashnum.analysis.attribution_backward import attribute_backward

        dq, dk, dv = gradients.reference_gradients(*qkv, do.double(), causal=case.causal,
                                                   alignment=alignment, scale=scale)
        tiling.update(models.backward_kw(c.variant))
        t = attribute_backward(q, k, v, do, precision=precision, policy=c.policy,
                               ref=SimpleNamespace(dq=dq, dk=dk, dv=dv), bound_terms=False,
                               causal=causal, scale=scale, **tiling)
        t = t[(t.metric == "max_abs") & (t.grad == quantity)]
    if t.empty:
        return None
    r = t.loc[t.err_only.abs().idxmax()]
    return dict(site=str(r.site), format=str(r.format), err_only=float(r.err_only),
                err_without=float(r.err_without), total=float(r.total), case=case.id,
                quantity=quantity)


def diagnose(kept: dict, table: pd.DataFrame, case_list, *, precision: str, alignment: str,
             backward: bool = False, candidates=None, progress: bool = False) -> dict:
    """The closest model, whether it reproduces the kernel, its shares table, its dominant
    site (None unless it reproduces the kernel), the worst case and the search's cost
    (see the module docstring). candidates: default models.available(precision,
    backward). A gradient audit of a kernel that gave no gradient (no backward) compares
    the outputs alone, with every forward candidate (`forward_only`)."""
    t0 = time.perf_counter()
    forward_only = backward and not any(g is not None for _, g in kept.values())
    backward = backward and not forward_only
    cands = list(candidates) if candidates is not None else models.available(precision,
                                                                             backward)
    runs = Runs(kept, case_list, precision, alignment, backward)
    scored = {c: runs.shares(c) for c in _progress(cands, progress, "diagnosis")}
    scan = [replace(c, block_n=bn, order=order) for c in _scanned(scored, cands)
            for bn, order in models.TILINGS]
    for c in _progress([c for c in dict.fromkeys(scan) if c not in scored], progress,
                       "tilings"):
        scored[c] = runs.shares(c)
    best_c, best = _best(scored)
    table_ = pd.DataFrame(list(scored.values()))
    if len(table_):
        table_ = table_.sort_values("bitwise", ascending=False, na_position="last",
                                    kind="stable").reset_index(drop=True)
    worst = worst_case(table)
    reproduced = best is not None and best["bitwise"] >= REPRODUCES
    site = _dominant_site(best_c, table, case_list, worst, precision, alignment) \
        if reproduced and worst is not None else None
    return dict(closest=best, reproduced=reproduced, answered=len(runs.cases), shares=table_,
                site=site, worst=worst, candidates=[c.label for c in cands],
                forward_only=forward_only,
                cost=dict(candidates=len(scored), cases=len(runs.cases), model_runs=runs.runs,
                          reused=runs.reused, seconds=time.perf_counter() - t0),
                alignment=other_alignment(kept, table, case_list, precision=precision,
                                          alignment=alignment))


def _scanned(scored: dict, cands) -> list[models.Candidate]:
    """The flash candidates scanned over models.TILINGS: the SCANNED best by share, and
    fa2 (the plain flash recurrence) whatever its share."""
    flash = [c for c in scored if c.tiled and _num(scored[c]["bitwise"])]
    flash.sort(key=lambda c: -scored[c]["bitwise"])
    top = flash[:SCANNED]
    fa2 = models.Candidate("fa2")
    return top + [fa2] if fa2 in cands and fa2 not in top else top


def _dominant_site(c, table, case_list, worst, precision, alignment) -> dict | None:
    """_site of candidate c on the worst case it can take."""
    by_id = {cs.id: cs for cs in case_list}
    for cid in _worst_first(table, worst["quantity"]):
        try:
            site = _site(c, by_id[cid], worst["quantity"], precision, alignment)
        except ValueError:
            site = None
        if site is not None:
            row = table.loc[table["id"] == cid].iloc[0]
            err = row.get(QUANTITIES[worst["quantity"]][0])
            site["kernel_err"] = float(err) if _num(err) else None
            return site
    return None


def _progress(items, progress: bool, desc: str):
    if not progress:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit="model")


def other_alignment(kept: dict, table: pd.DataFrame, case_list, *, precision: str,
                    alignment: str) -> dict | None:
    """The failing causal cases whose answer depends on the mask's alignment (Nq != Nk),
    judged again by the same output rules (nonfinite, masked, fa_rule) under the other
    alignment: its reference and standard attention aligned so. {alignment, cases,
    passed}: passed == cases says the kernel's mask is the other one. None when no such
    case failed."""
    other = next(a for a in ALIGNMENTS if a != alignment)
    failed = set(table.loc[~table["passed"].astype(bool), "id"])
    todo = [c for c in case_list if c.id in failed and c.causal and c.nq != c.nk
            and c.id in kept and kept[c.id][0] is not None]
    if not todo:
        return None
    passed = 0
    for case in todo:
        q, k, v, scale, _ = _inputs(case, precision)
        ref = aligned_reference(q.double(), k.double(), v.double(), causal=True,
                                alignment=other, scale=scale, method="fp64")
        masked = ~torch.isfinite(ref.row_max)
        finite = torch.isfinite(ref.out) & ~masked[..., None].expand_as(ref.out)
        std = standard_attention(q, k, v, causal=True, alignment=other, scale=scale).double()
        row, fails = {}, []
        _, row["fa_bound"] = _bound(std, ref.out, finite)
        _check_out(row, fails, kept[case.id][0].double(), ref, finite, masked)
        passed += not fails
    return dict(alignment=other, given=alignment, cases=len(todo), passed=passed)


def _best(scored: dict):
    """(candidate, row) of the largest pooled share (the first of equals: the candidates
    come before their tilings, forward before partial_first), or (None, None)."""
    good = [c for c in scored if _num(scored[c]["bitwise"])]
    if not good:
        return None, None
    c = max(good, key=lambda c: scored[c]["bitwise"])
    return c, scored[c]


def _worst_first(table: pd.DataFrame, quantity: str) -> list[str]:
    e, b, _ = QUANTITIES[quantity]
    if e not in table or b not in table:
        return []
    ratio = (table[e] / table[b].where(table[b] > 0)).fillna(-1.0)
    return list(table.loc[ratio.sort_values(ascending=False).index, "id"])
