"""Exact attention: the reference every error in flashnum is measured against.

    import flashnum
    ref = flashnum.reference(q, k, v)                  # certified, correctly rounded fp64
    ref = flashnum.reference(q, k, v, method="fp64")   # careful fp64, an a-priori bound
    ref.out, ref.lse, ref.row_max, ref.err_bound, ref.masked
    g = flashnum.reference_backward(q, k, v, do)       # dQ, dK, dV (reference.backward)
    from flashnum.reference import reference, reference_backward, plain64   # the functions

Options (defaults first):
  causal=False     True or "bottom_right": key j visible to query i iff j <= i + Nk - Nq;
                   "top_left": j <= i (torch's is_causal); flashnum.numerics.tiling.visible.
                   A row that sees no key gives out = 0, lse = row_max = -inf, err_bound = 0.
  scale=None       None is exactly 1/sqrt(d) (an exact ball in arb, not a rounded
                   float); a float is taken as the exact value it holds.
  method="certified"
     certified     every output is the float64 nearest to the exact attention of the
                   given inputs. First a double-double fast path with a rigorous error
                   bound per value (fast.py); a row with a value whose bound does not
                   settle its rounding goes to arb ball arithmetic (python-flint): a
                   value is accepted only when its ball's relative radius is below
                   2^-60 and both ends of the ball round to the same float64; otherwise
                   the row is recomputed at twice the precision (up to 16 * bits).
     fp64          float64 attention arranged for a small, stated error bound
                   (max-shifted softmax, blocked + pairwise sums); err_bound is the
                   a-priori bound of docs/reference.md evaluated per row. The row
                   max and lse of this method are the float64 values (no bound).
     mpmath        a plain row loop in mpmath at `bits` bits (an explicit context,
                   never the global mp): the independent cross-check of certified.
  plain64(q, k, v, scale=, causal=) is plain max-shifted float64 attention without a bound
  (the reproductions' "attention in FP64" and the search's quick objective).
  bits=256         the working precision (certified: the starting precision).
  cache=True       an in-memory LRU keyed by input_hash(...); with
                   reference_cache_dir(path) or the environment variable
                   FLASHNUM_CACHE set, results also persist as <path>/<hash>.pt.
  workers=None     processes for the rows certified leaves to arb (default: every core
                   when they hold more than 2^21 logits).

Inputs are taken as the exact values they hold (converted to float64, which is
exact for every float format); any leading batch/head dims, Nq != Nk allowed.
err_bound (..., Nq) bounds max_j |out_ij - exact_ij| for each row, where exact is
the real-number attention of the inputs with the exact scale.

Where it lives: forward.py (reference), backward.py (reference_backward), one method per
module (certified.py, fp64.py with plain64, mp.py), the certified fast path (fast.py;
dd.py double-double arithmetic and exp, slices.py exact GEMM products by splitting,
rounding.py certified rounding of a double-double), balls.py (rounding a ball or an mpf
to float64), inputs.py (checks and the hash), cache.py (the one cache of both),
result.py (Reference, ReferenceGradients). This package is callable: flashnum.reference(
q, k, v, ...) is reference(q, k, v, ...).

Certified, the fast path (fast.py's docstring derives every bound): S = Q K^T and
P [V | 1] from float64 GEMMs on Ozaki slices (exact) plus float64 GEMMs of the small
remainders (gamma_n bounds), exp in double-double (a 2^16-entry table and a degree-5
polynomial), o / l and log l in double-double; a value is final when its interval lies
strictly inside one float64 rounding cell; err_bound is then round_ball's for a
certain value (its half-ulp term, a function of the output alone). Used from bits >= 128.

Certified, the arb path (per block of query rows, see certified._arb_rows): the row max
D* = max_j q.k_j is located with float64 and a proven margin, then evaluated
exactly; X = scale * (Q K^T - D*) comes out of one arb_mat product (the shift is an
extra column, so the largest logit gives exp(0) = 1 exactly); P = exp(X) entry by
entry; [o | l] = P [V | 1] is a second arb_mat product. Entries whose logit lies
more than (prec + 30) ln 2 below the max are not exponentiated: they are replaced
by the ball [0 +- 2^-(prec + 30)], which contains them. Rows are spread over
processes; flint's precision (a process-wide setting) is set and restored around
every block.
"""

import sys
import types

from flashnum.reference.backward import reference_backward
from flashnum.reference.cache import cache_info, clear_cache, reference_cache_dir
from flashnum.reference.forward import reference
from flashnum.reference.fp64 import plain64
from flashnum.reference.inputs import METHODS, check_scale, input_hash
from flashnum.reference.result import Reference, ReferenceGradients


class _CallableModule(types.ModuleType):
    """flashnum.reference(q, k, v, ...) calls reference(q, k, v, ...), as the docs write it."""

    def __call__(self, q, k, v, **kw) -> Reference:
        return reference(q, k, v, **kw)


sys.modules[__name__].__class__ = _CallableModule

__all__ = ["reference", "reference_backward", "plain64", "Reference", "ReferenceGradients",
           "METHODS", "input_hash", "check_scale", "reference_cache_dir", "cache_info",
           "clear_cache"]
