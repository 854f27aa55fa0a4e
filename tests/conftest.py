"""Test-session set-up: Triton must be told to interpret before it is first imported."""

import os

import torch

if not torch.cuda.is_available():
    # triton.language builds tl.sum / tl.max at import: the variable must come first
    os.environ.setdefault("TRITON_INTERPRET", "1")
