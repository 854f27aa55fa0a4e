"""Work kept across the cases of one input (flashnum.analysis.memo): the bound and the
invariants give the same numbers, bit for bit, with a kept dict as without, whatever the
order of the calls; a dict of one input is refused for another."""

import math
from dataclasses import replace

import pytest
import torch

from flashnum.analysis.bounds import bound
from flashnum.analysis.invariants import invariants
from flashnum.analysis.memo import kept
from flashnum.api import attention
from flashnum.harness.grid import Case
from flashnum.harness.run import policy_of
from flashnum.reference import reference

CASE = Case(distribution="gaussian", dist_params="{}", batch=1, heads=1, seq_len_q=64,
            seq_len_k=256, head_dim=32, precision="bf16", policy="fa2", policy_sites="{}",
            block_m=32, block_n=32, order="forward", variant="fa2", tau=0.0, beta=1.0,
            rounding="nearest", backend="emulate", mp_bits=64, causal=False, seed=0)


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, 1, n, 32, generator=g, dtype=torch.float64).bfloat16().double()
            for n in (64, 256, 256)]


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[x], b[x]) for x in a)
    return a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b))


CALLS = [dict(policy="fa2", block_n=32), dict(policy="lowp", block_n=64, prob=True),
         dict(policy="naive", block_n=32, prob=True), dict(policy="fa2", block_n=64,
         causal=True), dict(policy="fa2", block_n=32, prob=True, variant="exp2")]


def test_the_bound_with_a_kept_dict_is_the_bound_without_it():
    q, k, v = _inputs()
    rows = {}
    for kw in CALLS + CALLS[::-1]:  # each key computed once, then taken from the dict
        assert _same(bound(q, k, v, precision="bf16", rows=rows, **kw),
                     bound(q, k, v, precision="bf16", **kw))
    # the inputs' data once per (causal, prob, variant): lowp and naive share theirs; the
    # key blocks' once per (causal, block_n, scale in its base): fa2 and naive share theirs
    assert sum(1 for key in rows if key[0] == "bound") == 4
    assert sum(1 for key in rows if key[0] == "bound_blocks") == 4


def test_the_invariants_with_a_kept_dict_are_the_invariants_without_it():
    q, k, v = _inputs()
    ref = reference(q, k, v, method="fp64")
    rows = {}
    for policy in ("fa2", "lowp", "fa2"):
        case = replace(CASE, policy=policy)
        prec, pol = policy_of(case)
        res = attention(q, k, v, precision=prec, policy=pol, block_m=32, block_n=32,
                        trace=True)
        assert invariants(case, pol, prec, q, k, res, ref, False, None, rows=rows) == (
            invariants(case, pol, prec, q, k, res, ref, False, None)) == (True, True)
        bad = res.m.clone()
        bad[..., 5] += 0.5  # far outside the proven window: the kept data must still say so
        assert invariants(case, pol, prec, q, k, replace(res, m=bad, trace=None), ref, False,
                          None, rows=rows)[0] is False


def test_a_kept_dict_refuses_the_tensors_of_another_input():
    q, k, v = _inputs()
    rows = {}
    bound(q, k, v, policy="fa2", precision="bf16", block_n=32, rows=rows)
    q2, k2, v2 = (x.clone() for x in (q, k, v))  # equal values, other tensors
    with pytest.raises(ValueError, match="one dict per input"):
        bound(q2, k2, v2, policy="fa2", precision="bf16", block_n=32, rows=rows)


def test_kept_computes_each_key_once_and_nothing_without_a_dict():
    calls = []

    def compute():
        calls.append(1)
        return len(calls)

    q, k, v = _inputs()
    rows = {}
    assert [kept(rows, (q, k), ("a",), compute) for _ in range(3)] == [1, 1, 1]
    assert kept(rows, (q, k, v), ("b",), compute) == 2  # (q, k) first, then (q, k, v)
    assert kept(None, (q, k), ("a",), compute) == 3
