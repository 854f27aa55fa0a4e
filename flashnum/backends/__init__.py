"""Backends: the Triton FlashAttention-2 forward (triton.py), the recurrence in mpmath (mp.py).

    import flashnum
    res = flashnum.attention(q, k, v, backend="triton")   # or backend="mp", mp_bits=256
    from flashnum.backends import attention_triton

The backends sit above the engine (they return its Result and compare with its emulator),
so the engine's door flashnum.engine.api.attention does not import them: this package puts
their entry points into flashnum.engine.api.RUNS, and `import flashnum` imports this package.
Imported lazily: `import flashnum.backends` does not import triton or mpmath's backend. The
first triton call imports flashnum.backends.triton, which sets TRITON_INTERPRET=1 when no
CUDA GPU is present (see that module's docstring).
"""

from flashnum.engine import api
from flashnum.numerics.policy import make_policy

__all__ = ["attention_triton"]


def _mp(q, k, v, *, precision, policy, rounding, mp_bits, exp2_scale, **kw):
    # the recurrence itself at mp_bits: no per-site formats, no rounding mode
    from flashnum.backends.mp import attention_mp

    return attention_mp(q, k, v, bits=mp_bits, **kw)


def _triton(q, k, v, *, precision, policy, mp_bits, tau, beta, **kw):
    from flashnum.backends.triton import attention_triton

    return attention_triton(q, k, v, policy=make_policy(policy, precision), precision=precision,
                            **kw)


api.RUNS.update(mp=_mp, triton=_triton)


def __getattr__(name):
    if name == "attention_triton":
        from flashnum.backends.triton import attention_triton

        return attention_triton
    raise AttributeError(f"module 'flashnum.backends' has no attribute {name!r}")
