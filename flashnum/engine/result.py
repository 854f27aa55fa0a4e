"""What a backend returns: the output, the final softmax state, and its trace.

Every backend (the `emulate` engine, the `triton` kernel, the `mp` recurrence)
returns a `Result`, so metrics, tests and the runner never ask which one ran.

    res.out          (..., Nq, dv) float64; each value representable in the output format
    res.m, res.l     (..., Nq) final running max and normaliser, float64
    res.lse          (..., Nq) natural-log log-sum-exp of the scaled logits, m + log l
                     (for the exp2 variant converted back from base 2)
    res.masked       (..., Nq) bool: rows whose every key is masked (their out is 0)
    res.n_rescales   (..., Nq) int: times the state was rescaled by a growing max
    res.nonfinite    (..., Nq) bool: rows whose output holds inf or NaN, which a format's
                     overflow produces (fp16 logits beyond 65504, say): reported, never hidden
    res.trace        a Trace when asked for (trace=True), else None

For the exp2 variant m and l are in the base-2 units the kernel keeps
(m = max of log2(e) * scale * QK^T), as Triton's tutorial stores them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Trace:
    """The softmax state after every processed key block.

    m, l: (..., n_key_blocks, Nq) float64; step t is the state after the t-th key
    block *in processing order* (not in key order). order: (n_query_blocks,
    n_key_blocks) long, the key block processed at each step by each query block.
    """

    m: torch.Tensor
    l: torch.Tensor
    order: torch.Tensor


@dataclass
class Result:
    """Output and final state of one attention call (see the module docstring)."""

    out: torch.Tensor
    m: torch.Tensor
    l: torch.Tensor
    lse: torch.Tensor
    masked: torch.Tensor
    n_rescales: torch.Tensor
    trace: Trace | None = None
    nonfinite: torch.Tensor | None = None
    backend: str = "emulate"
    info: dict = field(default_factory=dict)  # what ran: policy, tiling, variant, ...

    def __post_init__(self):
        if self.nonfinite is None:
            self.nonfinite = ~torch.isfinite(self.out).all(dim=-1)


@dataclass
class Gradients:
    """dQ, dK, dV of one backward call (flashnum.engine.backward's docstring)."""

    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    lse: torch.Tensor
    delta: torch.Tensor
    out: torch.Tensor
    masked: torch.Tensor
    ds_rowsum: torch.Tensor | None
    info: dict = field(default_factory=dict)
