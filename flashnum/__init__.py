"""flashnum: the floating-point numerics of FlashAttention's online softmax.

    import flashnum
    res = flashnum.attention(q, k, v, precision="bf16", policy="fa2", block_n=64)
    ref = flashnum.reference(q, k, v)            # certified, correctly rounded fp64
    err = (res.out - ref.out).abs().max()
    g = flashnum.attention_backward(q, k, v, do, precision="bf16", policy="fa2")
    gref = flashnum.reference_backward(q, k, v, do)   # certified dQ, dK, dV
    with flashnum.capture("acts.safetensors") as cap:  # a model's attention inputs
        model(x)
    call = cap.calls[0]; flashnum.attention(*call.qkv, causal=call.causal, scale=call.scale)

Layers: what each holds is in docs/architecture.md; their order is stated once, as the
import-linter contract in pyproject.toml ([tool.importlinter]), which `lint-imports` checks.
"""

# isort: off
# first of all: a runner's spawned worker ties its life to the runner's (harness.lifeline)
from flashnum.harness import lifeline as _lifeline  # noqa: F401
# isort: on
from flashnum import reference  # a callable package: flashnum.reference(q, k, v, ...)
from flashnum.api import attention, attention_backward
from flashnum.inputs.capture import CapturedCall, capture, load_capture
from flashnum.numerics.formats import FORMATS, get_format
from flashnum.numerics.policy import SITES, Policy, make_policy
from flashnum.reference import reference_backward

__version__ = "0.1.0"


def __getattr__(name: str):
    # flashnum.audit (a module that is also callable: flashnum.audit(fn, ...)) is imported
    # on first use, so that `import flashnum` does not load the audit's layer
    if name == "audit":
        import importlib

        return importlib.import_module("flashnum.audit")
    raise AttributeError(f"module 'flashnum' has no attribute {name!r}")
__all__ = [
    "attention", "attention_backward", "reference", "reference_backward", "get_format",
    "make_policy", "Policy", "SITES", "FORMATS", "capture", "load_capture", "CapturedCall",
]
