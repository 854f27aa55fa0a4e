"""The emulator on checked arguments: the `standard` structure or the blocked loop, with the
call's info. flashnum.engine.api.run ends here, and so does every split of split-KV
(flashnum.engine.splitkv), which runs on the emulator only (flashnum.engine.checks).

    res = emulate(q, k, v, precision="bf16", policy="fa2", block_m=64, block_n=64,
                  order="forward", variant="fa2", causal=False, scale=None,
                  rounding="nearest", seed=0, trace=False)
"""

from __future__ import annotations

import math

from flashnum.engine.flash import flash
from flashnum.engine.result import Result
from flashnum.engine.standard import standard
from flashnum.engine.variants import variant_of
from flashnum.numerics.policy import make_policy


def emulate(q, k, v, *, precision, policy, block_m, block_n, order, variant, causal, scale,
            rounding, seed, trace, tau=None, beta=None, exp2_scale=None) -> Result:
    """One call of the emulator: policy a name of make_policy or a Policy; variant a
    flashnum.engine.variants.Variant, or its name with tau, beta, exp2_scale."""
    variant = variant_of(variant, tau=tau, beta=beta, exp2_scale=exp2_scale)
    pol = make_policy(policy, precision)
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    if pol.structure == "standard":
        res = standard(q, k, v, pol, causal=causal, scale=scale, rounding=rounding, seed=seed)
    else:
        res = flash(q, k, v, pol, block_m=block_m, block_n=block_n, order=order,
                    variant=variant, causal=causal, scale=scale, rounding=rounding, seed=seed,
                    trace=trace)
    res.info = dict(
        precision=precision, policy=pol.name, block_m=block_m, block_n=block_n,
        order=order if isinstance(order, str) else "permutation", variant=variant.name,
        causal=causal, scale=scale, rounding=rounding, seed=seed,
    )
    return res
