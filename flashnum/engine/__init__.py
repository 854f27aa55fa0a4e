"""The emulated engine: `attention` (flashnum.engine.api) and the logits it forms.

    from flashnum.engine import attention, logits, VARIANTS, BACKENDS

Modules, from the entry point down: api (argument checks, dispatch to a backend),
flash (the blocked loop and its result), recurrence (the State and its steps: the
algorithm as the papers write it), variants (one class per softmax variant, its
parameters and rules: attention(variant=Lazy(tau=4.0))), fast (the same steps in place),
standard (the `standard` structure), tiles (inputs as stored, tiles, their logits),
arith (rounding on the carrier), native (the C kernel of the fp32 exp site), result.
"""

from flashnum.engine.api import BACKENDS, VARIANTS, attention
from flashnum.engine.tiles import logits

__all__ = ["attention", "logits", "VARIANTS", "BACKENDS"]
