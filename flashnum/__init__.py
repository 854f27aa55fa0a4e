"""flashnum: the floating-point numerics of FlashAttention's online softmax.

    import flashnum
    res = flashnum.attention(q, k, v, precision="bf16", policy="fa2", block_n=64)
    ref = flashnum.reference(q, k, v)            # certified, correctly rounded fp64
    err = (res.out - ref.out).abs().max()
    g = flashnum.attention_backward(q, k, v, do, precision="bf16", policy="fa2")
    gref = flashnum.reference_backward(q, k, v, do)   # certified dQ, dK, dV

Modules: formats (rounding), policy (sites and presets), tiling (blocks, orders,
causal mask), engine (the emulated recurrence), reference (exact attention),
distributions (adversarial inputs), metrics, bounds, attribution, search,
kernels (Triton), store / run (experiments), figures (the paper's figures).
"""

from flashnum.engine import attention
from flashnum.engine.backward import attention_backward
from flashnum.numerics.formats import FORMATS, get_format
from flashnum.numerics.policy import SITES, Policy, make_policy

# imported eagerly: the submodule flashnum.reference would otherwise shadow the function
from flashnum.reference import reference  # noqa: E402  (after engine: no cycle either way)
from flashnum.reference_backward import reference_backward  # noqa: E402  (the same shadowing)

__version__ = "0.1.0"
__all__ = [
    "attention", "attention_backward", "reference", "reference_backward", "get_format",
    "make_policy", "Policy", "SITES", "FORMATS",
]
