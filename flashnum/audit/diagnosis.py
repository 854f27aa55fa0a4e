"""Why a kernel fails: the flashnum model that reproduces it most closely, the site that
makes that model's error, and the case where the kernel is worst.

    from flashnum.audit.diagnosis import diagnose, worst_case
    d = diagnose(kept, table, case_list, precision="bf16", alignment="top_left")
    d["closest"], d["shares"], d["site"], d["worst"]

The closest model: every candidate the installed flashnum runs (flashnum.audit.models:
each preset with its variants, torch_cpu, triton_tutorial) is run on every case the
kernel answered, and the share of the kernel's values it equals bit for bit is counted
(the output, and dQ, dK, dV in a gradient audit; `bitwise` pools every value of every
case the model could take). The best candidate with a flash structure is then tried with
the other key block sizes (models.BLOCK_NS). A share near 100% says what the kernel
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
from types import SimpleNamespace

import pandas as pd
import torch

from flashnum.audit import gradients, models
from flashnum.audit.rules import ALIGNMENTS, DTYPES, _bound, _check_out, aligned_reference
from flashnum.audit.standard import standard_attention

# the share of the kernel's values a model must equal bit for bit to count as reproducing it
REPRODUCES = 0.99

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


def shares(c, kept, case_list, precision, alignment, backward) -> dict:
    """Candidate c's bit-for-bit agreement with the kept answers: per quantity, pooled."""
    eq = dict.fromkeys(QUANTITIES, 0)
    tot = dict.fromkeys(QUANTITIES, 0)
    n = 0
    for case in case_list:
        if case.id not in kept:
            continue
        out, grads = kept[case.id]
        q, k, v, scale, do = _inputs(case, precision)
        kw = dict(precision=precision, causal=case.causal, alignment=alignment, scale=scale)
        try:  # a model that refuses this case's shape (a ValueError) does not model it
            mo = models.forward(c, q, k, v, **kw)
            g = None
            if mo is not None and backward and grads is not None:
                g = models.backward(c, q, k, v, do, **kw)
        except ValueError:
            continue
        if mo is None:
            continue
        n += 1
        eq["out"] += _equal(out, mo)
        tot["out"] += out.numel()
        if g is not None:
            for name, kg in zip(gradients.GRADS, grads, strict=True):
                eq[name] += _equal(kg, getattr(g, name))
                tot[name] += kg.numel()
    row = dict(model=c.label, policy=c.policy, variant=c.variant,
               block_n=c.block_n if c.tiled else math.nan, cases=n)
    for qty in QUANTITIES:
        if qty == "out" or backward:
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
    if quantity == "out":
        from flashnum.analysis.attribution import attribute

        ref = aligned_reference(*qkv, causal=case.causal, alignment=alignment, scale=scale,
                                method="fp64").out
        t = attribute(q, k, v, precision=precision, policy=c.policy, ref_out=ref,
                      variant=c.variant, block_n=c.block_n, causal=causal, scale=scale)
        t = t[t.metric == "max_abs"]
    else:
        from flashnum.analysis.attribution_backward import attribute_backward

        dq, dk, dv = gradients.reference_gradients(*qkv, do.double(), causal=case.causal,
                                                   alignment=alignment, scale=scale)
        kw = models.backward_kw(c.variant)
        t = attribute_backward(q, k, v, do, precision=precision, policy=c.policy,
                               ref=SimpleNamespace(dq=dq, dk=dk, dv=dv), bound_terms=False,
                               block_n=c.block_n, causal=causal, scale=scale, **kw)
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
    site (None unless it reproduces the kernel) and the worst case (see the module
    docstring). candidates: default models.available(precision, backward)."""
    cands = list(candidates) if candidates is not None else models.available(precision,
                                                                             backward)
    it = cands
    if progress:
        from tqdm import tqdm

        it = tqdm(cands, desc="diagnosis", unit="model")
    rows = [shares(c, kept, case_list, precision, alignment, backward) for c in it]
    key = "bitwise"
    best = _best(rows, key)
    if best is not None:
        c = _candidate(best)
        if c.tiled:
            for bn in models.BLOCK_NS:
                if bn != c.block_n:
                    rows.append(shares(models.Candidate(c.policy, c.variant, bn), kept,
                                       case_list, precision, alignment, backward))
            best = _best(rows, key)
    table_ = pd.DataFrame(rows)
    if len(table_):
        table_ = table_.sort_values(key, ascending=False, na_position="last",
                                    kind="stable").reset_index(drop=True)
    worst = worst_case(table)
    reproduced = best is not None and best[key] >= REPRODUCES
    site = None
    if reproduced and worst is not None:
        c = _candidate(best)
        by_id = {cs.id: cs for cs in case_list}
        order = _worst_first(table, worst["quantity"])
        for cid in order:  # the worst case the model can take
            try:
                site = _site(c, by_id[cid], worst["quantity"], precision, alignment)
            except ValueError:
                site = None
            if site is not None:
                row = table.loc[table["id"] == cid].iloc[0]
                err = row.get(QUANTITIES[worst["quantity"]][0])
                site["kernel_err"] = float(err) if _num(err) else None
                break
    answered = sum(1 for c in case_list if c.id in kept and kept[c.id][0] is not None)
    return dict(closest=best, reproduced=reproduced, answered=answered, shares=table_,
                site=site, worst=worst,
                candidates=[c.label for c in cands],
                alignment=other_alignment(kept, table, case_list, precision=precision,
                                          alignment=alignment))


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


def _best(rows, key):
    good = [r for r in rows if _num(r.get(key))]
    return max(good, key=lambda r: r[key]) if good else None


def _candidate(row) -> models.Candidate:
    bn = row["block_n"]
    return models.Candidate(row["policy"], row["variant"], 64 if not _num(bn) else int(bn))


def _worst_first(table: pd.DataFrame, quantity: str) -> list[str]:
    e, b, _ = QUANTITIES[quantity]
    if e not in table or b not in table:
        return []
    ratio = (table[e] / table[b].where(table[b] > 0)).fillna(-1.0)
    return list(table.loc[ratio.sort_values(ascending=False).index, "id"])
