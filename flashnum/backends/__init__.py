"""Backends: the Triton FlashAttention-2 forward (triton.py), the recurrence in mpmath (mp.py).

    from flashnum.backends import attention_triton

Imported lazily: `import flashnum.backends` does not import triton. The first use of
`attention_triton` imports flashnum.backends.triton, which sets
TRITON_INTERPRET=1 when no CUDA GPU is present (see that module's docstring).
"""

__all__ = ["attention_triton"]


def __getattr__(name):
    if name == "attention_triton":
        from flashnum.backends.triton import attention_triton

        return attention_triton
    raise AttributeError(f"module 'flashnum.backends' has no attribute {name!r}")
