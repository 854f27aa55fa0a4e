"""Real kernels: the Triton FlashAttention-2 forward (triton_flash.py).

    from flashnum.kernels import attention_triton

Imported lazily: `import flashnum.kernels` does not import triton. The first use of
`attention_triton` imports flashnum.kernels.triton_flash, which sets
TRITON_INTERPRET=1 when no CUDA GPU is present (see that module's docstring).
"""

__all__ = ["attention_triton"]


def __getattr__(name):
    if name == "attention_triton":
        from .triton_flash import attention_triton

        return attention_triton
    raise AttributeError(f"module 'flashnum.kernels' has no attribute {name!r}")
