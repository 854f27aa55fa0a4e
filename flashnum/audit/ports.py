"""Two pure-PyTorch FlashAttention ports, audited without naming a model: the table of the
experiment audit_ports (conf/table/audit_ports.yaml; docs/audit.md quotes it through
flashnum.figures.docs.audit), and the targets of tests/test_audit_diagnosis.py.

    python -m flashnum.run experiment=audit_ports

`bf16_port` is FlashAttention-2's forward over 64-key chunks on bf16 tensors (m, l and o in
bf16); `forgets_to_rescale_l` is the same with l never rescaled. Each is audited with
flashnum.audit.audit(fn, precision="bf16", budget=...) and no model; the diagnosis runs
because the audit fails. One row per port: the cases and how many kept every rule, the
rules broken (case counts), the worst case (its quantity, error, limit, ratio), the closest
model and its bit-for-bit share, the next three candidates, the dominant site.
"""

from __future__ import annotations

import json
import math

import pandas as pd
import torch

CHUNK = 64


def bf16_port(q, k, v, causal=False, scale=None, *, rescale_l=True):
    """FlashAttention-2's forward over CHUNK keys at a time, plain torch, every tensor in
    the inputs' dtype (causal top-left, as torch's is_causal)."""
    nq, nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    m = torch.full(q.shape[:-1], -math.inf, dtype=q.dtype)
    l = torch.zeros(q.shape[:-1], dtype=q.dtype)
    o = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=q.dtype)
    i = torch.arange(nq)[:, None]
    for j0 in range(0, nk, CHUNK):
        kb, vb = k[..., j0 : j0 + CHUNK, :], v[..., j0 : j0 + CHUNK, :]
        s = (q @ kb.transpose(-1, -2)) * scale
        if causal:
            s = s.masked_fill(torch.arange(j0, j0 + kb.shape[-2])[None, :] > i, -math.inf)
        m_new = torch.maximum(m, s.amax(-1))
        alpha = torch.exp(m - m_new)
        p = torch.exp(s - m_new[..., None])
        l = (l * alpha if rescale_l else l) + p.sum(-1)
        o = o * alpha[..., None] + p @ vb
        m = m_new
    return o / l[..., None]


def forgets_to_rescale_l(q, k, v, causal=False, scale=None):
    return bf16_port(q, k, v, causal, scale, rescale_l=False)


PORTS = {"bf16_port": bf16_port, "forgets_to_rescale_l": forgets_to_rescale_l}


def port_row(name: str, budget: str) -> dict:
    """The audit of one port and what its diagnosis says, flattened into one row."""
    from flashnum.audit import audit

    rep = audit(PORTS[name], precision="bf16", budget=budget)
    d = rep.diagnosis
    w, c, s = d["worst"], d["closest"], d["site"]
    return dict(port=name, budget=budget, cases=len(rep.table),
                kept=int(rep.table["passed"].sum()),
                broken=json.dumps({k: len(v) for k, v in rep.broken().items()},
                                  sort_keys=True),
                worst_id=w["id"], worst_quantity=w["quantity"], worst_err=float(w["err"]),
                worst_bound=float(w["bound"]), worst_ratio=float(w["ratio"]),
                closest_model=c["model"], closest_cases=int(c["cases"]),
                closest_bitwise=float(c["bitwise"]),
                next=json.dumps([dict(model=r.model, bitwise=float(r.bitwise))
                                 for r in d["shares"].iloc[1:4].itertuples()]),
                reproduced=bool(d["reproduced"]),
                # a site only where the closest model reproduces the port (diagnosis)
                site=s and s["site"], site_format=s and s["format"],
                site_err_only=float(s["err_only"]) if s else math.nan,
                site_total=float(s["total"]) if s else math.nan,
                site_kernel_err=float(s["kernel_err"]) if s else math.nan)


def audit_ports_table(budget: str = "default") -> pd.DataFrame:
    """One row per port of PORTS, audited at `budget`."""
    return pd.DataFrame([port_row(name, budget) for name in PORTS])
