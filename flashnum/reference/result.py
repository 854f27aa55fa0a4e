"""What a reference returns: Reference (attention) and ReferenceGradients (its gradients),
all float64, leading dims as the inputs; `empty` is a batch of rows that see no key."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


@dataclass
class Reference:
    """Attention of the exact inputs, in float64 (leading dims as the inputs).

    out (..., Nq, dv); lse, row_max, err_bound (..., Nq): natural log-sum-exp and max
    of the scaled logits of each row, and a bound on max_j |out_ij - exact_ij|.
    """

    out: torch.Tensor
    lse: torch.Tensor
    row_max: torch.Tensor
    method: str
    err_bound: torch.Tensor
    bits: int
    info: dict = field(default_factory=dict)  # max precision used, uncertain rows, ...

    @property
    def masked(self) -> torch.Tensor:
        """Rows that see no key (their out is 0)."""
        return torch.isneginf(self.lse)


@dataclass
class ReferenceGradients:
    """dQ (..., Nq, d), dK (..., Nk, d), dV (..., Nk, dv), D (..., Nq), all float64."""

    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    delta: torch.Tensor
    method: str
    bits: int
    info: dict = field(default_factory=dict)


def empty(B, nq, dv):
    out = torch.zeros(B, nq, dv, dtype=torch.float64)
    minf = torch.full((B, nq), -math.inf, dtype=torch.float64)
    return out, minf.clone(), minf.clone(), torch.zeros(B, nq, dtype=torch.float64)
