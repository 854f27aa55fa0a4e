"""Audit two pure-PyTorch FlashAttention ports without naming a model, and store what the
diagnosis says about each (docs/audit.md quotes it; tests/test_quoted.py checks).

    python bench/audit_ports.py    # default budget, bf16: bench/results/audit_ports.json
    python bench/audit_ports.py --budget quick --out /tmp/ports.json

The ports are tests/test_audit_diagnosis.py's (one source for the test and the figures):
`bf16_port`, FlashAttention-2's forward over 64-key chunks on bf16 tensors (m, l and o in
bf16), and `forgets_to_rescale_l`, the same with l never rescaled. Each is audited with
flashnum.audit(fn, precision="bf16", budget=...) and no model; the diagnosis runs because
the audit fails. Stored per port: cases and how many kept every rule, the rules broken
(case counts), the worst case (its quantity, error, limit, ratio), the closest model and
its bit-for-bit share, the next three candidates, the dominant site, wall seconds.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import time
from pathlib import Path

import torch

import flashnum

ROOT = Path(__file__).resolve().parents[1]


def _ports():
    spec = importlib.util.spec_from_file_location(
        "audit_ports_source", ROOT / "tests" / "test_audit_diagnosis.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return {"bf16_port": mod.bf16_port, "forgets_to_rescale_l": mod.forgets_to_rescale_l}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", default="default", choices=("quick", "default", "full"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "audit_ports.json"))
    args = ap.parse_args(argv)
    runs = {}
    for name, fn in _ports().items():
        t0 = time.perf_counter()
        rep = flashnum.audit(fn, precision="bf16", budget=args.budget)
        d = rep.diagnosis
        shares = d["shares"] if d is not None else None
        runs[name] = dict(
            cases=len(rep.table), kept=int(rep.table["passed"].sum()),
            broken={k: len(v) for k, v in rep.broken().items()},
            worst=d["worst"] if d else None,
            closest=None if d is None or d["closest"] is None else {
                k: d["closest"][k] for k in ("model", "policy", "variant", "block_n", "cases",
                                             "bitwise")},
            next=[] if shares is None else [
                dict(model=r.model, bitwise=r.bitwise) for r in shares.iloc[1:4].itertuples()],
            site=d["site"] if d else None,
            summary=rep.summary(), wall_s=time.perf_counter() - t0)
        print(rep.summary())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(
        budget=args.budget, torch=torch.__version__, machine=platform.processor() or
        platform.machine(), runs=runs), indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
