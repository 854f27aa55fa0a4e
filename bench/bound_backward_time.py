"""CPU time of the backward's a-priori bound (flashnum.analysis.bounds_backward) against N.

    python bench/bound_backward_time.py                       # N = 1024 2048, with terms
    python bench/bound_backward_time.py --n 8192 --no-terms   # the full bound alone
    python bench/bound_backward_time.py --before PATH         # also time the module at PATH
                                                              # (e.g. an earlier version from
                                                              # `git show REV:flashnum/...`),
                                                              # same process, values compared

One head, d = 64, 64 x 64 blocks, fa2 in bf16, gaussian inputs on the bf16 grid. A warm-up
call at N = 128 comes first, so that one-off costs (imports, first allocations) are not
counted. Prints the command and the machine as a first JSON line (flashnum.harness.timing),
then one JSON line per (N, version): CPU seconds (time.process_time) and wall; the
versions run one after the other at each N (interleaved).
"""

from __future__ import annotations

import argparse
import importlib.util
import json

import torch

from flashnum.analysis import bounds_backward
from flashnum.harness import timing


def _inputs(n: int):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(1, n, 64, generator=gen).to(torch.bfloat16).float() for _ in range(4)]


def _time(versions: dict, n: int, causal: bool, terms: bool):
    """({version: its bound}, {version: its timing}): one call of each version, in turn."""
    args, got = _inputs(n), {}

    def call(name):
        got[name] = versions[name].bound_backward(*args, policy="fa2", precision="bf16",
                                                  causal=causal, terms=terms)

    t = timing.interleaved({name: lambda name=name: call(name) for name in versions}, 1)
    return got, t


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[1024, 2048])
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--no-terms", dest="terms", action="store_false")
    ap.add_argument("--before", help="path of an earlier bounds_backward.py to time too")
    a = ap.parse_args()
    versions = {"now": bounds_backward}
    if a.before:
        spec = importlib.util.spec_from_file_location("bounds_backward_before", a.before)
        versions["before"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(versions["before"])
    print(json.dumps(timing.facts()), flush=True)
    _time(versions, 128, a.causal, a.terms)
    for n in a.n:
        got, t = _time(versions, n, a.causal, a.terms)
        for name in versions:
            print(json.dumps(dict(n=n, version=name, causal=a.causal, terms=a.terms,
                                  cpu_s=round(t[name]["cpu_s"], 2),
                                  wall_s=round(t[name]["wall_s"], 2),
                                  threads=torch.get_num_threads())), flush=True)
        if "before" in got:
            same = all(torch.equal(got["now"][g], got["before"][g]) for g in ("dq", "dk", "dv"))
            same = same and got["now"]["terms"] == got["before"]["terms"]
            print(json.dumps(dict(n=n, identical=same)), flush=True)


if __name__ == "__main__":
    main()
