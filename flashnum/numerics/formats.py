"""Every format by name: `get_format` over the plain binary formats (flashnum.numerics.floats,
which holds `Format` and how it rounds), the block-scaled ones (blockscaled) and the
hardware-arithmetic ones (hwarith), plus mp<bits>, p<bits> and <format>*<factor>.

    from flashnum.numerics.formats import get_format
    get_format("bf16").round(x); get_format("mxfp8_e4m3"); get_format("fp8_e4m3*256")

The names below floats' are imported here so that flashnum.numerics.formats stays the one
place a caller imports a format from; floats, blockscaled and hwarith sit beneath it and
never import it (no cycle).
"""

from __future__ import annotations

import math

from flashnum.numerics import blockscaled, hwarith
from flashnum.numerics.floats import (  # noqa: F401  (the names callers import from here)
    EXACT,
    FORMAT_NAMES,
    FORMATS,
    MP,
    PRECISIONS,
    ROUNDINGS,
    Exact,
    Format,
)


def get_format(name, mp_bits: int | None = None):
    """Look a format up by name ('bf16', 'exact', 'mp', 'p11' for p-bit/fp32-range)."""
    if isinstance(name, (Format, Exact, MP)) or hasattr(name, "block"):
        return name
    if not isinstance(name, str):
        valid = ", ".join(FORMAT_NAMES)
        raise ValueError(f"format must be a name, got {name!r}; valid: {valid}, mp")
    key = name.lower()
    if key in FORMATS:
        return FORMATS[key]
    if key == "exact":
        return EXACT
    if key == "mp" or key.startswith("mp") and key[2:].isdigit():
        bits = int(key[2:]) if key[2:] else (mp_bits or 256)
        if bits < 2:
            raise ValueError(f"mp_bits must be >= 2, got {bits}")
        return MP(bits)
    if key in blockscaled.BLOCK_FORMATS:
        return blockscaled.BLOCK_FORMATS[key]
    if "*" in key:  # a cast with a static scale, e.g. fp8_e4m3*256 (blockscaled.scaled)
        base, _, factor = key.partition("*")
        try:
            f = float(factor)
        except ValueError:
            f = math.nan
        if base not in FORMATS or not (math.isfinite(f) and f > 0):
            raise ValueError(f"format {name!r}: want <format>*<positive factor>, format one "
                             f"of {', '.join(FORMATS)}")
        return blockscaled.scaled(FORMATS[base], f)
    if key in hwarith.HW_FORMATS:  # fp32 with FA4's polynomial exp2; the fp8 MMA accumulator
        return hwarith.HW_FORMATS[key]
    if key.startswith("p") and key[1:].isdigit():
        # p-bit significand with fp32's exponent range: the precision_bits studies
        p = int(key[1:])
        if not 2 <= p <= 52:
            raise ValueError(f"format {name!r}: p must be in 2..52")
        return Format(key, p, -126, 127)
    raise ValueError(
        f"unknown format {name!r}; valid: {', '.join(FORMAT_NAMES)}, mp, mp<bits>, p<bits>, "
        f"{', '.join(blockscaled.BLOCK_FORMATS)}, {', '.join(hwarith.HW_FORMATS)}"
    )
