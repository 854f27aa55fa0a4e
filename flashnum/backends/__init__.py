"""Backends: the Triton FlashAttention-2 forward (triton.py), the recurrence in mpmath (mp.py).

    import flashnum
    res = flashnum.attention(q, k, v, backend="triton")   # or backend="mp", mp_bits=256
    from flashnum.backends.triton import attention_triton  # the kernel's own options too

The backends sit above the engine (they return its Result and compare with its emulator);
flashnum.api, above them, hands a checked call to each (`run_call`). Imported lazily: the
first triton call imports flashnum.backends.triton, which sets TRITON_INTERPRET=1 when no
CUDA GPU is present (see that module's docstring).
"""
