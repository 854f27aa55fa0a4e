"""The emulated engine: a checked call (flashnum.engine.call) through the recurrence, rounded
where its policy says.

    from flashnum.engine.call import call_of
    from flashnum.engine.emulate import emulate
    res = emulate(call_of(q, k, v, precision="bf16", policy="fa2"))   # flashnum.attention's path
    from flashnum.engine import logits, VARIANTS, BACKENDS

Modules, from the entry point down: call (the checked call: every option, declared once),
checks (each option's check), emulate (split-KV, the structures), flash (the blocked loop
and its result), recurrence (the State and its steps: the algorithm as the papers write
it), variants (one class per softmax variant, its parameters and rules), fast (the same
steps in place), fused (the whole loop in C), standard (the `standard` structure), tiles
(inputs as stored, tiles, their logits), arith (rounding on the carrier, in flashnum's own
orders: flashnum.numerics.accumulate), native (the C kernels), backward, splitkv, result.

Arithmetic model. Each elementwise operation (+, -, *, /, exp) is correctly rounded into
its site's format: computed exactly enough in a carrier, then rounded once. Reductions
(the two dots, the block row sum) accumulate in their site's format, in flashnum's own
order (flashnum.numerics.accumulate: a dot is one FMA chain over k from +0 in fp32 or
fp64; a row sum ATen's cascade with a fixed lane count; tf32 rounds the operands to tf32
and sums in fp32, as tensor cores do; narrower formats sum recursively, rounded after
every addition), never a library's: the same bits on every machine (docs/engine.md). A
block's row sum and its P @ V tile are stored in l's and o's formats before they are
added into l and o (what a pure-PyTorch port does with bf16 tensors; a no-op when l and o
are fp32, as in FA2 kernels). The carrier is float32 when every site is fp32 or narrower
(exact for +, -, *, / since 24 >= 2p + 2 for p <= 11 makes the double rounding
innocuous), else float64. exp is the correctly rounded float64 exp
(flashnum.numerics.elementary) rounded once into the format; for a float32 argument
rounded into fp32 (the P site of every policy with fp32 softmax state) that is the
correctly rounded exp on every input (checked exhaustively, `python -m flashnum.run
experiment=exp_exhaustive`). The fp32 exp site runs in flashnum.engine.native's C kernel
when that is built, else in torch: the same values either way. FMA contraction is not
modelled (a GPU kernel may contract s * scale - m).

Variants (flashnum.engine.variants, one class each: fa2, fa1, exp2, lazy, qiu_yao,
qiu_yao_released) change the running max, the base of the exponential, a floor of the
block row sum, or keep o normalised at every step (fa1). Fully masked rows (causal with
Nq > Nk) give out = 0 and are flagged in `res.masked`; l stays 0 and m stays -inf for
them, never NaN.
"""

from flashnum.engine.checks import BACKENDS, VARIANTS
from flashnum.engine.tiles import logits

__all__ = ["logits", "VARIANTS", "BACKENDS"]
