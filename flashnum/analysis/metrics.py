"""Error measures: how far a computed attention output is from the exact one.

    from flashnum.analysis.metrics import summary
    row = summary(res.out, ref.out, "bf16", naive_out=naive.out, masked=res.masked)
    row["max_abs_err"], row["rmse"], row["max_ulp_err"], row["signed_err_z"], ...

Every measure is computed in float64 from `out` (the computed output) and `ref`
(the certified reference, flashnum.reference), both (..., Nq, dv); every sum over the
entries is flashnum.numerics.accumulate's cascade over them in row-major order (the
order torch's own sum takes on one thread; a mean is that sum divided by n), so a
measure is the same on every machine. Definitions (e = out - ref, entries indexed by
row i and column c; docs/metrics.md):

    max_abs_err        max |e|                                (Golden et al. 2024)
    rmse               sqrt(mean e^2)                         (FlashAttention-3, Table 3)
    normwise_rel_err   ||e||_F / ||ref||_F
    max_row_rel_err    max_i ||e_i||_inf / ||ref_i||_inf      (per-row infinity norm)
    max_rel_err        max |e_ic| / max(|ref_ic|, floor_i)    floor_i = u_out * ||ref_i||_inf
                       unless `rel_floor` (an absolute floor) is given: componentwise
                       relative error, with outputs far below their row's scale measured
                       against that scale instead of against ~0
    max_ulp_err        max |e_ic| / ulp_out(ref_ic)           ulp of the output format at
                       the exact value (flashnum.numerics.formats.Format.ulp): a correctly rounded
                       output has max_ulp_err <= 0.5
    mean_signed_err    mean e                                  bias (Qiu & Yao 2025)
    signed_err_stderr  std(e) / sqrt(n)                        (sample std, ddof=1, two
                       passes: sum (e - mean)^2 / (n - 1))
    signed_err_z       mean_signed_err / signed_err_stderr     the bias z-score, treating
                       the n entries as independent draws; |z| >> 3 means a systematic sign
    naive_ratio        max_abs_err / max_abs_err(naive_out)    the flash-attention oracle
                       (their tests require <= 2); present only when naive_out is given
    naive_rmse_ratio   rmse / rmse(naive_out)

Quotients with a zero denominator: 0/0 is 0 for the relative and ulp errors (an exact
zero output of an exactly zero reference, e.g. a fully masked row, has no error) and 1
for the naive ratios (both exact); x/0 with x > 0 is inf. So no measure is ever NaN on
finite inputs. `masked` (bool, (..., Nq)) drops rows from every measure (pass
Result.masked so that fully masked rows do not dilute means); by default every row counts.
"""

from __future__ import annotations

import math

import torch

from flashnum.numerics.accumulate import mean, rowsum, std
from flashnum.numerics.formats import EXACT, FORMATS, Exact, Format, get_format


def _as64(x) -> torch.Tensor:
    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(x)
    return t.detach().to("cpu", torch.float64)


def _pair(out, ref):
    out, ref = _as64(out), _as64(ref)
    if out.shape != ref.shape:
        raise ValueError(f"out {tuple(out.shape)} and ref {tuple(ref.shape)} shapes differ")
    if out.ndim < 2:
        raise ValueError(f"out must have shape (..., Nq, dv), got {tuple(out.shape)}")
    return out, ref


def _ratio(num: torch.Tensor, den: torch.Tensor, zero_over_zero: float = 0.0) -> torch.Tensor:
    """num / den elementwise with 0/0 -> zero_over_zero and x/0 -> inf (num, den >= 0)."""
    safe = torch.where(den > 0, den, torch.ones_like(den))
    r = num / safe
    r = torch.where(den > 0, r, torch.where(num > 0, torch.full_like(r, math.inf), r))
    return torch.where((den == 0) & (num == 0), torch.full_like(r, zero_over_zero), r)


def _fmt(out_format) -> Format:
    f = get_format(out_format)
    if isinstance(f, Exact) or f is EXACT:
        return FORMATS["fp64"]  # an unrounded output is a float64 carrier value
    if not isinstance(f, Format):
        raise ValueError(f"out_format {out_format!r} has no ulp; valid: {', '.join(FORMATS)}")
    return f


def _keep(x: torch.Tensor, masked) -> torch.Tensor:
    """x (..., Nq, dv) -> (n_rows, dv) of the rows not masked."""
    x = x.reshape(-1, x.shape[-1])
    if masked is None:
        return x
    m = torch.as_tensor(masked, dtype=torch.bool).reshape(-1)
    if m.numel() != x.shape[0]:
        raise ValueError(f"masked has {m.numel()} rows, out has {x.shape[0]}")
    return x[~m]


def _total(x: torch.Tensor) -> torch.Tensor:
    """The sum of every entry in flashnum's order (the cascade over the flattened entries)."""
    return rowsum(x.reshape(-1), "fp64")


def max_abs_err(out, ref) -> float:
    out, ref = _pair(out, ref)
    e = (out - ref).abs()
    return float(e.max()) if e.numel() else 0.0


def rmse(out, ref) -> float:
    out, ref = _pair(out, ref)
    e = out - ref
    return float((_total(e * e) / e.numel()).sqrt()) if e.numel() else 0.0


def head_rmse(out, ref) -> tuple[float, float]:
    """RMSE over all entries and its standard error from the spread of per-head MSEs.

    Heads are independent draws of Q, K, V, so the per-head MSEs are i.i.d.; the delta
    method turns se(MSE) into se(RMSE) = se(MSE) / (2 RMSE).
    """
    e2 = (out - ref).pow(2)
    per_head = mean(e2, (-1, -2)).reshape(-1)
    mse = float(mean(per_head))
    n = per_head.numel()
    se_mse = float(std(per_head)) / math.sqrt(n) if n > 1 else math.nan
    r = math.sqrt(mse)
    return r, (se_mse / (2 * r) if r > 0 else 0.0)


def normwise_rel_err(out, ref) -> float:
    """||out - ref||_F / ||ref||_F."""
    out, ref = _pair(out, ref)
    e = out - ref
    return float(_ratio(_total(e * e).sqrt(), _total(ref * ref).sqrt()))


def row_rel_errs(out, ref) -> torch.Tensor:
    """(..., Nq): ||out_i - ref_i||_inf / ||ref_i||_inf per row (0 for exact zero rows)."""
    out, ref = _pair(out, ref)
    return _ratio((out - ref).abs().amax(-1), ref.abs().amax(-1))


def max_row_rel_err(out, ref) -> float:
    r = row_rel_errs(out, ref)
    return float(r.max()) if r.numel() else 0.0


def rel_errs(out, ref, out_format="fp64", rel_floor: float | None = None) -> torch.Tensor:
    """Componentwise |out - ref| / max(|ref|, floor): floor = u_out ||ref_i||_inf per row.

    The floor keeps outputs that are tiny next to their row (whose relative error is
    dominated by the absolute error of the row's large entries) from reading as huge.
    """
    out, ref = _pair(out, ref)
    if rel_floor is None:
        floor = _fmt(out_format).u * ref.abs().amax(-1, keepdim=True)
    else:
        if not (rel_floor >= 0 and math.isfinite(rel_floor)):
            raise ValueError(f"rel_floor must be a finite number >= 0, got {rel_floor!r}")
        floor = torch.full_like(ref[..., :1], float(rel_floor))
    return _ratio((out - ref).abs(), torch.maximum(ref.abs(), floor))


def max_rel_err(out, ref, out_format="fp64", rel_floor: float | None = None) -> float:
    r = rel_errs(out, ref, out_format, rel_floor)
    return float(r.max()) if r.numel() else 0.0


def ulp_errs(out, ref, out_format) -> torch.Tensor:
    """|out - ref| in ulps of the output format at the exact value ref."""
    out, ref = _pair(out, ref)
    return (out - ref).abs() / _fmt(out_format).ulp(ref)


def max_ulp_err(out, ref, out_format) -> float:
    r = ulp_errs(out, ref, out_format)
    return float(r.max()) if r.numel() else 0.0


def signed_err(out, ref) -> dict[str, float]:
    """Mean signed error, its standard error and z-score (entries as independent draws)."""
    out, ref = _pair(out, ref)
    e = (out - ref).reshape(-1)
    n = e.numel()
    if n == 0:
        return dict(mean_signed_err=0.0, signed_err_stderr=0.0, signed_err_z=0.0)
    mean = _total(e) / n
    dev = e - mean
    se = (_total(dev * dev) / (n - 1)).sqrt() / math.sqrt(n) if n > 1 else torch.zeros(
        (), dtype=e.dtype)
    z = _ratio(mean.abs(), se) * torch.sign(mean)
    return dict(mean_signed_err=float(mean), signed_err_stderr=float(se), signed_err_z=float(z))


def summary(out, ref_out, out_format, *, naive_out=None, rel_floor=None, masked=None):
    """Every measure of the module docstring as a flat dict of floats (one results row)."""
    out, ref = _pair(out, ref_out)
    o, r = _keep(out, masked), _keep(ref, masked)
    row = dict(
        max_abs_err=max_abs_err(o, r),
        rmse=rmse(o, r),
        normwise_rel_err=normwise_rel_err(o, r),
        max_row_rel_err=max_row_rel_err(o, r),
        max_rel_err=max_rel_err(o, r, out_format, rel_floor),
        max_ulp_err=max_ulp_err(o, r, out_format),
        **signed_err(o, r),
    )
    if naive_out is not None:
        nv, _ = _pair(naive_out, ref)
        nv = _keep(nv, masked)
        f64 = lambda x: torch.tensor(x, dtype=torch.float64)
        row["naive_ratio"] = float(
            _ratio(f64(row["max_abs_err"]), f64(max_abs_err(nv, r)), 1.0)
        )
        row["naive_rmse_ratio"] = float(_ratio(f64(row["rmse"]), f64(rmse(nv, r)), 1.0))
    return row


__all__ = [
    "summary", "max_abs_err", "rmse", "normwise_rel_err", "row_rel_errs", "max_row_rel_err",
    "rel_errs", "max_rel_err", "ulp_errs", "max_ulp_err", "signed_err",
]
