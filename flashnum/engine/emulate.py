"""The emulator on a checked call: split-KV, the `standard` structure or the blocked loop.

    from flashnum.engine.call import call_of
    from flashnum.engine.emulate import emulate
    res = emulate(call_of(q, k, v, precision="bf16", policy="fa2", block_n=32))

flashnum.attention (flashnum.api) ends here for backend "emulate", and so does every
split of split-KV (flashnum.engine.splitkv), which runs on the emulator only.
"""

from __future__ import annotations

from flashnum.engine.call import Call
from flashnum.engine.flash import flash
from flashnum.engine.result import Result
from flashnum.engine.splitkv import split_attention
from flashnum.engine.standard import standard


def emulate(call: Call) -> Result:
    """One call of the emulator (see the module docstring); its Result records the call."""
    q, k = call.q, call.k
    gqa = q.ndim >= 3 and k.ndim >= 3 and q.shape[-3] != k.shape[-3]
    if call.num_splits != 1 or gqa:  # each split comes back through this function
        return split_attention(call, emulate)
    pol = call.pol
    res = standard(call, pol) if pol.structure == "standard" else flash(call, pol)
    res.info = call.info()
    return res
