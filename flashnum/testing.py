"""Helpers for a kernel developer's own test suite.

    from flashnum.testing import assert_attention_accurate

    def test_my_kernel_is_accurate():
        assert_attention_accurate(my_attention, precision="bf16")   # fn(q, k, v, causal, scale)
        assert_attention_accurate(my_attention, precision="bf16", backward=True)  # and dQ, dK, dV

It runs flashnum's audit (flashnum.audit: the adversarial catalogue against the certified
reference, FlashAttention's 2x-standard-attention rule, NaN/Inf, masked rows, the LSE
where returned) and fails with the audit's one-screen summary. budget="quick" keeps it
to a few seconds; "default" is the full catalogue (~2 minutes for a CPU kernel).
"""

from __future__ import annotations


def assert_attention_accurate(fn, precision: str = "bf16", *, budget: str = "quick",
                              alignment: str | None = None, model: str | None = None,
                              reference: str = "auto", backward: bool = False):
    """Raise AssertionError (message: the audit's summary) unless fn passes the audit;
    return the Report otherwise. backward=True checks dQ, dK, dV through autograd too."""
    from flashnum.audit import audit

    report = audit(fn, precision=precision, budget=budget, alignment=alignment, model=model,
                   reference=reference, backward=backward)
    if not report.passed:
        raise AssertionError("\n" + report.summary())
    return report
