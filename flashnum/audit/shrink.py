"""Shrink a failing audit case to a small input that still breaks the same rule.

    from flashnum.audit.shrink import Instance, shrink, judge
    inst = Instance.of_case(case, "bf16")              # the case's q, k, v, dO in the dtype
    small = shrink(fn, inst, "dk_rule", alignment="top_left", max_calls=120)
    small.instance, small.ratio, small.calls, small.steps
    verdict = judge(fn, small.instance, "dk_rule", alignment="top_left")   # (broken, ratio)

As property-based testers shrink: greedy, one candidate at a time, a step kept when the
kernel still breaks the rule on it; at most max_calls kernel calls in all (the first
judges the instance as given). The rule on each candidate is the audit's own
(flashnum.audit.rules.evaluate on the candidate's exact tensors: the same reference, the
same standard attention in the dtype, the same limit). The passes, repeated until one
round keeps nothing:

  heads    one (batch, head) slice: B = H = 1
  length   Nq and Nk halved (both, then each), then stepped down by a quarter and by
           one; the first rows and keys kept (under either causal alignment a query
           keeps the keys it saw, top-left when Nq = Nk), then the last ones
  dim      d halved, then stepped down by a quarter (the scale kept as the case's); then
           the value dim dv (V's and dO's columns) alike
  bits     each of q, k, v, dO rounded to 1, 2, 3, 4, 6 or 8 significant bits
  zero     halves, then quarters, of each tensor's rows set to 0
  copies   each tensor's rows replaced by copies of its first row
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from flashnum.audit.rules import DTYPES, evaluate
from flashnum.inputs.draws import Inputs

GRAD_RULES = ("grad_crash", "grad_nonfinite", "grad_masked", "dq_rule", "dk_rule", "dv_rule")
SHRINKABLE = ("nonfinite", "masked", "fa_rule", "lse", "grad_nonfinite", "grad_masked",
              "dq_rule", "dk_rule", "dv_rule")
BITS = (1, 2, 3, 4, 6, 8)
MAX_CALLS = 120  # the default bound on kernel calls per shrink


@dataclass(frozen=True)
class Instance:
    """One concrete call: q, k, v (and dO for a gradient rule) in the audited dtype."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    do: torch.Tensor | None
    causal: bool
    scale: float | None
    precision: str
    origin: str = ""  # the audit case it came from

    @classmethod
    def of_case(cls, case, precision: str) -> Instance:
        from flashnum.audit.gradients import upstream

        inp = case.inputs()
        dt = DTYPES[precision]
        q, k, v = (x.to(dt) for x in (inp.q, inp.k, inp.v))
        return cls(q, k, v, upstream(case, inp, dt), case.causal, inp.scale, precision,
                   case.id)

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        """(B, H, Nq, Nk, d)."""
        b, h, nq, d = self.q.shape
        return b, h, nq, self.k.shape[-2], d

    @property
    def id(self) -> str:
        b, h, nq, nk, d = self.shape
        return (f"shrunk/B{b}H{h}/Nq{nq}Nk{nk}/d{d}/{'causal' if self.causal else 'full'}")

    def inputs(self) -> Inputs:
        return Inputs(self.q.double(), self.k.double(), self.v.double(), self.causal,
                      scale=self.scale, do=None if self.do is None else self.do.double())

    def asdict(self) -> dict:
        b, h, nq, nk, d = self.shape
        return dict(distribution="shrunk", nq=nq, nk=nk, d=d, causal=self.causal, batch=b,
                    heads=h, seed=0, params=self.origin)


def ratio_of(row: dict, rule: str) -> float:
    """The rule's measure over its limit in one audit row: error / bound for the error
    rules, the offending value itself (limit 0: inf when positive) for the others."""
    if rule in ("fa_rule", "lse", "dq_rule", "dk_rule", "dv_rule"):
        e, b = {"fa_rule": ("err_max", "fa_bound"), "lse": ("lse_err_max", "lse_bound")}.get(
            rule, (f"{rule[:2]}_err_max", f"{rule[:2]}_bound"))
        err, bound = float(row.get(e, math.nan)), float(row.get(b, math.nan))
        if math.isnan(err):
            return math.inf
        return err / bound if bound > 0 else (math.inf if err > 0 else 0.0)
    value = {"nonfinite": "n_nonfinite", "masked": "masked_max", "grad_nonfinite":
             "grad_nonfinite", "grad_masked": "grad_masked_max"}[rule]
    x = float(row.get(value, 0.0))
    return math.inf if (x > 0 or math.isnan(x)) else 0.0


def judge(fn, inst: Instance, rule: str, *, alignment: str, reference: str = "auto",
          isolate: bool = False) -> tuple[bool, float, dict]:
    """(broken, ratio, row): the audit's evaluation of inst, and whether it broke rule."""
    row = evaluate(fn, inst, precision=inst.precision, alignment=alignment,
                   reference_method=reference, isolate=isolate,
                   backward=rule in GRAD_RULES)
    return rule in row["failed"].split(","), ratio_of(row, rule), row


@dataclass
class Shrunk:
    instance: Instance
    ratio: float           # the rule's measure on the shrunk instance (ratio_of)
    calls: int             # kernel calls spent (each one audit evaluation)
    steps: list[str]       # the steps kept, in order
    row: dict              # the audit's row of the shrunk instance


def _round_bits(x: torch.Tensor, bits: int) -> torch.Tensor:
    """x rounded to `bits` significant bits (nearest, in float64), back in x's dtype."""
    d = x.double()
    m, e = torch.frexp(d)
    r = torch.ldexp(torch.round(m * 2.0**bits) / 2.0**bits, e)
    return torch.where(torch.isfinite(d), r, d).to(x.dtype)


def _slice(inst: Instance, rows_q: slice, rows_k: slice) -> Instance:
    do = None if inst.do is None else inst.do[..., rows_q, :]
    return replace(inst, q=inst.q[..., rows_q, :].contiguous(),
                   k=inst.k[..., rows_k, :].contiguous(),
                   v=inst.v[..., rows_k, :].contiguous(),
                   do=None if do is None else do.contiguous())


def _heads(inst: Instance):
    b, h = inst.q.shape[:2]
    if b * h == 1:
        return
    for i in range(b):
        for j in range(h):
            yield f"slice B{i} H{j}", replace(
                inst, **{n: getattr(inst, n)[i:i + 1, j:j + 1].contiguous()
                         for n in ("q", "k", "v")},
                do=None if inst.do is None else inst.do[i:i + 1, j:j + 1].contiguous())


def _smaller(n: int) -> list[int]:
    return sorted({m for m in (n // 2, (3 * n) // 4, n - 1) if 1 <= m < n})


def _length(inst: Instance):
    _, _, nq, nk, _ = inst.shape
    pairs = [(a, b) for a, b in ((nq // 2, nk // 2), (nq // 2, nk), (nq, nk // 2))]
    pairs += [(a, nk) for a in _smaller(nq)] + [(nq, b) for b in _smaller(nk)]
    seen = set()
    for a, b in pairs:
        if a < 1 or b < 1 or (a, b) == (nq, nk) or (a, b) in seen:
            continue
        seen.add((a, b))
        yield f"first {a} queries, {b} keys", _slice(inst, slice(0, a), slice(0, b))
        yield f"last {a} queries, {b} keys", _slice(inst, slice(nq - a, nq), slice(nk - b, nk))


def _dim(inst: Instance):
    d = inst.q.shape[-1]
    scale = inst.scale if inst.scale is not None else 1.0 / math.sqrt(d)
    for e in _smaller(d):
        yield f"d {e}", replace(inst, q=inst.q[..., :e].contiguous(),
                                k=inst.k[..., :e].contiguous(), scale=scale)
    for e in _smaller(inst.v.shape[-1]):  # the value dim: V's columns and dO's
        yield f"dv {e}", replace(inst, v=inst.v[..., :e].contiguous(), do=None if (
            inst.do is None) else inst.do[..., :e].contiguous())


def _values(inst: Instance):
    names = ("q", "k", "v") + (("do",) if inst.do is not None else ())
    for name in names:
        x = getattr(inst, name)
        for bits in BITS:
            y = _round_bits(x, bits)
            if not torch.equal(y, x):
                yield f"{name} to {bits} bits", replace(inst, **{name: y})
                break  # the fewest bits first; more bits are tried in a later round
    for name in names:
        x = getattr(inst, name)
        n = x.shape[-2]
        for parts in (2, 4):
            step = -(-n // parts)
            for a in range(0, n, step):
                y = x.clone()
                y[..., a:a + step, :] = 0
                if not torch.equal(y, x):
                    yield f"{name} rows {a}..{min(n, a + step) - 1} zero", replace(
                        inst, **{name: y})
        y = x[..., :1, :].expand_as(x).contiguous()
        if not torch.equal(y, x):
            yield f"{name} rows copies of row 0", replace(inst, **{name: y})


PASSES = (_heads, _length, _dim, _values)


def shrink(fn, inst: Instance, rule: str, *, alignment: str, max_calls: int = MAX_CALLS,
           reference: str = "auto", isolate: bool = False) -> Shrunk:
    """The smallest instance the greedy passes reach that still breaks rule (module
    docstring); ValueError when inst does not break it to begin with."""
    if rule not in SHRINKABLE:
        raise ValueError(f"rule {rule!r} cannot be shrunk; valid: {', '.join(SHRINKABLE)}")
    if rule not in GRAD_RULES:  # a forward rule: no dO to carry or to simplify
        inst = replace(inst, do=None)
    broken, ratio, row = judge(fn, inst, rule, alignment=alignment, reference=reference,
                               isolate=isolate)
    if not broken:
        raise ValueError(f"{inst.origin or inst.id} does not break {rule}")
    calls, steps = 1, []
    changed = True
    while changed and calls < max_calls:
        changed = False
        for make in PASSES:
            for what, cand in make(inst):
                if calls >= max_calls:
                    break
                calls += 1
                ok, r, rw = judge(fn, cand, rule, alignment=alignment, reference=reference,
                                  isolate=isolate)
                if ok:
                    inst, ratio, row, changed = cand, r, rw, True
                    steps.append(what)
                    break  # a kept step: the pass starts again on the smaller instance
    return Shrunk(inst, ratio, calls, steps, row)
