"""Constants of the arithmetic, one home each."""

import math

LOG2E = 1.4426950408889634  # log2(e) as the nearest float64 (folded into the scale by exp2 kernels)
assert LOG2E == 1 / math.log(2)
