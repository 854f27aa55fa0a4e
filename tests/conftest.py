"""Test-session set-up: Triton must be told to interpret before it is first imported."""

import os

import torch

# one thread per test process: on a small shared machine two OpenMP threads make tiny
# matmuls ~1000x slower (measured: 12 ms vs 5 us); pytest -n runs processes in parallel
torch.set_num_threads(1)

if not torch.cuda.is_available():
    # triton.language builds tl.sum / tl.max at import: the variable must come first
    os.environ.setdefault("TRITON_INTERPRET", "1")
