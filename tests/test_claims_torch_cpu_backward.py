"""docs/audit.md's figures on the torch_cpu backward are those of its stored bench result.

Each line below is text docs/audit.md carries, rebuilt from
bench/results/torch_cpu_backward.json (written by bench/torch_cpu_backward_agreement.py) with
the document's rounding: a rerun that changes a figure, or an edit of one, fails here until
both agree (the same rule as tests/test_claims.py).
"""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "bench" / "results" / "torch_cpu_backward.json"
GRADS = ("dq", "dk", "dv")


def pct(x, digits):
    return f"{100 * x:.{digits}f}%"


def claims():
    t = json.loads(RESULT.read_text())
    s, cases = t["summary"], t["cases"]
    out = [f"`{t['command'].strip()}`, torch {t['torch']}, {t['threads']} threads, "
           f"{t['cpu_count']}-core {t['machine']}"]
    for p in ("fp32", "bf16", "fp16"):
        b, e = s[p]["backward"], s[p]["end_to_end"]
        worst = min(b[n]["worst"] for n in GRADS)
        cells = [pct(b[n]["share"], 4) for n in GRADS]
        e2e = " / ".join(pct(e[n]["share"], 3) for n in GRADS)
        base = [" / ".join(pct(s[p][w][n]["share"], 1) for n in GRADS) for w in ("fa2", "naive")]
        out.append(f"| {p} | {b['dq']['comparisons']} | " + " | ".join(cells)
                   + f" | {pct(worst, 4)} | {e2e} | {base[0]} | {base[1]} |")
    shapes = sorted({tuple(c["shape"]) for c in cases})
    assert all(sum(c["causal"] for c in cases if tuple(c["shape"]) == sh) == 3 for sh in shapes)
    out.append("Shapes (B x H x Nq x Nk x d): " + ", ".join("x".join(map(str, sh))
                                                            for sh in shapes)
               + "; each causal (top-left) and not, seed 0")
    # the comparison: N = 600, d = 64, bf16 and fp16, fa2 with 64 x 64 blocks
    at600 = [c["fa2"][n] for c in cases if c["shape"] == [1, 2, 600, 600, 64]
             and c["precision"] != "fp32" for n in GRADS]
    out.append(f"at N = 600, d = 64 (bf16 and fp16, causal or not) fa2 equals it on "
               f"{100 * min(at600):.0f}-{100 * max(at600):.0f}% of the dQ, dK, dV entries")
    fwd = min(c["forward_bitwise"] for c in cases)
    e2e = min(s[p]["end_to_end"][n]["worst"] for p in ("fp32", "bf16", "fp16") for n in GRADS)
    out.append(f"with flashnum's own torch_cpu forward (equal to torch's on {pct(fwd, 4)} of "
               f"the outputs in the worst comparison) on {pct(e2e, 4)} or more of the entries "
               f"of each comparison")
    return out


def readme_claims():
    t = json.loads(RESULT.read_text())
    s = t["summary"]
    shares = [s[p][w][n]["share"] for p in ("fp32", "bf16", "fp16") for n in GRADS
              for w in ("backward", "end_to_end")]
    counts = {s[p]["backward"]["dq"]["comparisons"] for p in ("fp32", "bf16", "fp16")}
    assert len(set(shares)) == 1 and len(counts) == 1
    return [f"on {pct(shares[0], 4)} of the dQ, dK and dV entries in fp32, bf16 and fp16",
            f"{counts.pop()} comparisons per dtype",
            f"equals it on {pct(s['bf16']['fa2']['dq']['share'], 1)} of bf16 dQ entries"]


@pytest.mark.parametrize("line", claims())
def test_docs_audit_quotes_the_stored_result(line):
    text = " ".join((ROOT / "docs" / "audit.md").read_text().split())
    assert " ".join(line.split()) in text


@pytest.mark.parametrize("line", readme_claims())
def test_the_readme_quotes_the_stored_result(line):
    text = " ".join((ROOT / "README.md").read_text().split())
    assert " ".join(line.split()) in text
