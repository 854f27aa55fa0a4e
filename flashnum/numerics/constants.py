"""Constants of the arithmetic, one home each.

    from flashnum.numerics.constants import LOG2E, gamma
    gamma(n, u)    # Higham's gamma_n = n u / (1 - n u), inf once n u >= 1
"""

import math

LOG2E = 1.4426950408889634  # log2(e) as the nearest float64 (folded into the scale by exp2 kernels)
assert LOG2E == 1 / math.log(2)


def gamma(n: float, u: float) -> float:
    """Higham's gamma_n = n u / (1 - n u): the relative error of n roundings at unit
    roundoff u (Accuracy and Stability of Numerical Algorithms, Lemma 3.1); inf when
    n u >= 1, where the lemma says nothing."""
    return n * u / (1 - n * u) if n * u < 1 else math.inf
