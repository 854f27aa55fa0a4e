"""The cases an audit runs: the adversarial catalogue over shapes, masks and head dims.

    from flashnum.audit.cases import cases, Case
    for c in cases("default"):       # ~40 cases, about 2 minutes for a CPU kernel
        inp = c.inputs()             # flashnum.inputs.distributions.Inputs (float64 Q, K, V)

Budgets:
  default  every distribution of the catalogue once (worst_case needs a stored file and
           is left out), shapes rotating through N = 77, 256, 600 (77 and 600 divide by
           no power-of-two block size; 600 = 512 + 88 leaves a ragged key block), head
           dims 64 and 128, (batch, heads) (1, 2) and (2, 1), causal every other case;
           plus cases whose answer depends on the causal alignment (Nq != Nk, both ways),
           a decode shape (4 query rows, 1100 keys) and logits past fp32's exp overflow
           (scaled, temperature 32: a softmax without the max shift overflows there).
  full     every distribution at N = 77, 256, 600, 1024, 2048, d = 64 and 128, causal and
           not, two seeds, plus the same extra cases.
  quick    a handful of the default cases (for tests and smoke runs).
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field

import torch

from flashnum.inputs.distributions import DISTRIBUTIONS, FROM_FILE, Inputs, make

BUDGETS = ("quick", "default", "full")
SEQ_LENS = (77, 256, 600)
FULL_SEQ_LENS = (77, 256, 600, 1024, 2048)
# distributions that set their own mask or need a file
_SKIP = set(FROM_FILE)


@dataclass(frozen=True)
class Case:
    """One audit case: a draw of the catalogue and the call made with it."""

    distribution: str
    nq: int
    nk: int
    d: int
    causal: bool
    batch: int = 1
    heads: int = 2
    seed: int = 0
    params: dict = field(default_factory=dict, hash=False, compare=False)

    @property
    def id(self) -> str:
        extra = "".join(f",{k}={v}" for k, v in sorted(self.params.items()))
        return (f"{self.distribution}{extra}/B{self.batch}H{self.heads}/Nq{self.nq}Nk{self.nk}"
                f"/d{self.d}/{'causal' if self.causal else 'full'}/s{self.seed}")

    def inputs(self) -> Inputs:
        kw = dict(self.params)
        nk_given = self.nk != self.nq
        inp = make(self.distribution, batch=self.batch, heads=self.heads, seq_len_q=self.nq,
                   seq_len_k=self.nk if nk_given else None, head_dim=self.d, seed=self.seed,
                   **kw)
        return inp

    def asdict(self) -> dict:
        out = asdict(self)
        out["params"] = ",".join(f"{k}={v}" for k, v in sorted(self.params.items()))
        return out


def _extra() -> list[Case]:
    """Cases that test one property each, in every budget."""
    return [
        # the causal alignment shows only when Nq != Nk
        Case("gaussian", 100, 300, 64, True, 1, 2),
        Case("gaussian", 300, 100, 64, True, 1, 2),
        # masked rows: fully masked under the bottom-right alignment
        Case("masked", 96, 64, 64, True, 1, 1),
        # decode: a few queries against many keys (three key blocks of 512)
        Case("gaussian", 4, 1100, 128, False, 1, 2),
        # logits up to ~130: exp without the max shift overflows fp32
        Case("scaled", 128, 128, 64, False, 1, 1, params={"temperature": 32.0}),
    ]


def _catalogue() -> list[str]:
    return [n for n in DISTRIBUTIONS if n not in _SKIP]


def _shape_ok(name: str, nq: int, causal: bool) -> bool:
    # masked makes its own causal Nq > Nk rows; it runs in the extra cases
    return name != "masked"


LOGIT_BYTES = 24  # standard attention in the dtype: S, its fp32 copy, the masked copies, P


def case_bytes(path, call: int, shape: tuple[int, int, int, int, int]) -> int:
    """The estimated peak memory of auditing a captured call, from the file's header: the
    call read as float64 (flashnum.inputs.capture_file.load_bytes), the standard attention
    in the dtype that judges it (LOGIT_BYTES per logit: it holds every logit at once) and
    the reference (flashnum.reference.forward.peak_bytes)."""
    from flashnum.inputs.capture_file import load_bytes
    from flashnum.reference.forward import peak_bytes

    b, h, nq, nk, d = shape
    q, k = torch.empty(b, h, nq, d, device="meta"), torch.empty(b, h, nk, d, device="meta")
    return load_bytes(path, call) + LOGIT_BYTES * b * h * nq * nk + peak_bytes(q, k, k)


def _captured_case(path, m: dict) -> Case:
    """The audit's case of one call record, its shape from the header (nothing read);
    ValueError when it cannot be computed or would not fit in memory."""
    from flashnum.engine import checks
    from flashnum.inputs.capture_file import call_shapes

    sh = call_shapes(path, m["index"])
    b, h, nq, d = sh["q"]
    nk, causal = sh["k"][2], m["causal"]
    if causal == "top_left":  # flashnum's bottom-right causal over the keys a query sees
        if nq > nk:
            raise ValueError(f"captured call {m['index']} is top-left causal with Nq = {nq} > "
                             f"Nk = {nk}, which flashnum's bottom-right causal cannot express")
        nk, causal = nq, True
    need, have = case_bytes(path, m["index"], (b, h, nq, nk, d)), checks.available_bytes()
    if have is not None and need > have:
        raise ValueError(f"{path}: auditing captured call {m['index']} (q {sh['q']}, Nk {nk}) "
                         f"needs an estimated {checks.human(need)} of memory and "
                         f"{checks.human(have)} is available; valid: a capture of fewer rows "
                         f"or heads (flashnum.capture(rows=N, heads=[...]))")
    return Case("captured", nq, nk, d, bool(causal), b, h,
                params={"path": str(path), "call": m["index"]})


def captured_cases(path) -> list[Case]:
    """One case per call of a flashnum.capture file, at its own shape, causal flag and scale.

    The file is checked whole and each case's memory estimated (case_bytes) before any
    tensor is read: a malformed file or a call too large is one ValueError. Calls with an
    attn_mask other than causal (flashnum computes none) are left out with one warning
    naming them.
    """
    import warnings

    from flashnum.inputs.capture_file import capture_index

    out, masked = [], []
    for m in capture_index(path):
        if m.get("mask_kind", "none") in ("bool", "additive"):
            masked.append(m["index"])
            continue
        out.append(_captured_case(path, m))
    if masked:
        warnings.warn(f"{path}: calls {masked} have an attn_mask other than causal, which "
                      f"flashnum's references do not compute; left out of the audit",
                      stacklevel=3)
    if not out:
        raise ValueError(f"{path} holds no attention call an audit can run")
    return out


def cases(budget: str = "default") -> list[Case]:
    """The cases of a budget (see the module docstring)."""
    if budget not in BUDGETS:
        raise ValueError(f"unknown budget {budget!r}; valid: {', '.join(BUDGETS)}")
    names = _catalogue()
    out: list[Case] = []
    if budget == "full":
        for name, n, d, causal, seed in itertools.product(
                names, FULL_SEQ_LENS, (64, 128), (False, True), (0, 1)):
            if _shape_ok(name, n, causal):
                out.append(Case(name, n, n, d, causal, 1, 2, seed))
    else:
        shapes = [(1, 2), (2, 1)]
        i = 0
        for name in names:
            if not _shape_ok(name, 0, False):
                continue
            n = SEQ_LENS[i % len(SEQ_LENS)]
            d = (64, 128)[(i // len(SEQ_LENS)) % 2]
            b, h = shapes[i % 2]
            out.append(Case(name, n, n, d, i % 2 == 1, b, h))
            i += 1
    out += _extra()
    if budget == "quick":
        keep = {"gaussian", "late_max", "ties", "scaled", "masked"}
        out = [c for c in out if c.distribution in keep and c.nq <= 300][:8]
    return out
