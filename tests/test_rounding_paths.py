"""Format.round's two nearest-even paths agree bit for bit.

Rounding to nearest takes every 0 and finite normal of the target format through
`_nearest` (an add-and-mask on float64's bits) and every other element (a subnormal of
the format, an infinity, a NaN) through the scaled-integer path `_round_general`, which
tests/test_formats.py checks against exact rational arithmetic. Here the bit path is
compared with the general one on the values
where a bit trick can go wrong: ties (both parities), values just either side of a tie,
the top of a binade (a carry into the exponent), the smallest normal, the overflow
threshold, negative values and zeros.
"""

from __future__ import annotations

import math

import pytest
import torch

from flashnum.numerics.formats import FORMATS, get_format

NAMES = ["bf16", "fp16", "tf32", "fp8_e4m3", "fp8_e5m2", "p2", "p3", "p13", "p24", "p52"]


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int64)


def hard_values(fmt) -> torch.Tensor:
    """Normals of `fmt` and the float64 values around its rounding boundaries."""
    g = torch.Generator().manual_seed(0)
    e = torch.randint(fmt.emin, min(fmt.emax, 60) + 1, (4000,), generator=g)
    m = torch.randint(0, 2 ** min(fmt.p - 1, 40), (4000,), generator=g).double()
    ulp = torch.exp2((e - (fmt.p - 1)).double())
    on_grid = torch.exp2(e.double()) + m * ulp  # numbers of the format (below its overflow)
    tie = on_grid + ulp / 2  # exact float64 ties: half of them round up (odd last bit)
    near = torch.cat([tie.nextafter(torch.full_like(tie, math.inf)),
                      tie.nextafter(torch.full_like(tie, -math.inf))])
    top = torch.exp2(e.double() + 1) - ulp / 4  # rounds up into the next binade
    edges = torch.tensor([fmt.min_normal, fmt.max, fmt.overflow_threshold,
                          fmt.overflow_threshold * (1 - 2.0**-52), 0.0, -0.0],
                         dtype=torch.float64)
    x = torch.cat([on_grid, tie, near, top, edges,
                   torch.randn(4000, generator=g, dtype=torch.float64) * 2.0**fmt.emax])
    x = x[(x.abs() >= fmt.min_normal) | (x == 0)]
    return torch.cat([x, -x])


@pytest.mark.parametrize("name", NAMES)
def test_bit_path_rounds_every_normal_as_the_scaled_integer_path_does(name):
    fmt = get_format(name)
    x = hard_values(fmt)
    fast = fmt.round(x)  # every element normal or zero: the bit path
    assert not bool(torch.isnan(fast).any())
    general = fmt._round_general(x, "nearest", None)
    over = general.abs() > fmt.max  # the overflow rule is applied after either path
    if fmt.saturate:
        general = torch.where(over, torch.copysign(torch.tensor(fmt.max), general), general)
    elif fmt.has_inf:
        general = torch.where(over, torch.copysign(torch.tensor(math.inf), general), general)
    assert torch.equal(bits(fast), bits(general))


@pytest.mark.parametrize("name", ["bf16", "fp16", "fp8_e4m3", "fp8_e5m2"])
def test_bit_path_matches_torchs_own_cast_of_float32_values(name):
    # float32 -> narrow is one correctly rounded conversion in torch (no double rounding)
    fmt = FORMATS[name]
    if fmt.torch_dtype is None:
        pytest.skip("torch has no such dtype")
    x32 = hard_values(fmt).to(torch.float32)
    x32 = x32[x32.abs() < fmt.max]  # below the overflow rules (torch's e5m2 gives inf)
    x = x32.double()
    x = x[(x.abs() >= fmt.min_normal) | (x == 0)]
    ours = fmt.round(x)
    theirs = x.to(torch.float32).to(fmt.torch_dtype).to(torch.float64)
    assert torch.equal(ours, theirs)


def test_a_subnormal_an_infinity_or_a_nan_goes_down_the_general_path_alone():
    bf16 = FORMATS["bf16"]
    tiny = bf16.min_subnormal * 3  # a bf16 subnormal: the bit path would keep 8 bits of it
    x = torch.tensor([1.0 + 2.0**-9, tiny, math.inf, -math.inf, math.nan, 3.0],
                     dtype=torch.float64)
    y = bf16.round(x)
    assert y[1] == tiny and y[0] == 1.0 and y[2] == math.inf and y[3] == -math.inf
    assert math.isnan(y[4]) and y[5] == 3.0
    # one subnormal among normals: the normals are rounded exactly as alone
    normals = torch.randn(1000, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    both = bf16.round(torch.cat([normals, torch.tensor([tiny])]))
    assert torch.equal(both[:-1], bf16.round(normals))


def test_a_tensor_of_many_chunks_rounds_as_its_elements_do_alone():
    bf16 = FORMATS["bf16"]
    g = torch.Generator().manual_seed(2)
    x = torch.randn(3, 400000, generator=g, dtype=torch.float64)  # 1.2M: two chunks
    whole = bf16.round(x)
    assert torch.equal(whole, bf16._round_general(x, "nearest", None))
    x[2, -1] = bf16.min_subnormal * 5  # a subnormal in the last chunk: the general path
    x[0, 5] = math.nan
    y = bf16.round(x.t())  # not contiguous either
    assert y[-1, 2] == bf16.min_subnormal * 5 and math.isnan(y[5, 0])
    rest = torch.ones_like(x, dtype=torch.bool)
    rest[2, -1] = rest[0, 5] = False
    assert torch.equal(y.t()[rest], whole[rest])


@pytest.mark.parametrize("name", ["fp16", "fp8_e4m3", "fp8_e5m2"])
def test_values_across_the_subnormals_round_as_the_general_path_rounds_them(name):
    fmt = FORMATS[name]
    g = torch.Generator().manual_seed(3)
    x = torch.randn(50000, generator=g, dtype=torch.float64) * 2.0 ** torch.randint(
        fmt.emin - fmt.p - 2, 4, (50000,), generator=g).double()
    x[:2] = torch.tensor([0.0, -0.0])  # (infinities: the overflow rule, tested apart)
    general = fmt._round_general(x, "nearest", None)
    assert torch.equal(bits(fmt.round(x)), bits(general))
