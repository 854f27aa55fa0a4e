"""Tiling: block sizes, the causal mask, and the order key blocks are visited in.

Shared by every backend so that the engine, the kernel and the reference agree
on which keys a query sees and in which order the key blocks arrive.

Causal masks (`causal=`), two alignments of the diagonal:
  "bottom_right" (FlashAttention >= 2.1; `causal=True` means this one): query i sees
      key j iff j <= i + (Nk - Nq). With Nq > Nk the first Nq - Nk rows see no key at
      all; they are *fully masked* rows: every backend returns 0 for them and flags them.
  "top_left" (torch's scaled_dot_product_attention(is_causal=True)): query i sees key j
      iff j <= i. Every row sees key 0; with Nq < Nk the last Nk - Nq keys are seen by
      no row.
The two agree when Nq == Nk. `check_causal` turns what a caller gave into False, True
(bottom_right) or "top_left", the values every function here takes.

Orders (`order=`): "forward" (key blocks 0, 1, ...), "reverse", "random" (a
seeded permutation, the same for every query block), "max_ascending" /
"max_descending" (per query block, by the block's largest logit over that query
block's rows, ties by block index), "partial_first" (per query block, the tiles the
mask cuts first, then the whole ones, each in forward order, the tiles it hides last:
FlexAttention's kernels, which run a block mask's partial blocks, with the mask
applied, before its full blocks; tile_classes says which is which), or an explicit
permutation of range(n_kb) (a list or 1-D tensor). max_* and partial_first differ
between query blocks (varies_by_query_block).
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch

ORDERS = ("forward", "reverse", "random", "max_ascending", "max_descending", "partial_first")
ALIGNMENTS = ("bottom_right", "top_left")


def n_blocks(n: int, block: int) -> int:
    return max(1, math.ceil(n / block))


def check_block(name: str, block) -> int:
    """A block size: a positive integer (numpy's integers too), returned as an int."""
    if isinstance(block, (bool, np.bool_)) or not isinstance(block, numbers.Integral):
        raise TypeError(f"{name} must be a positive integer, got {block!r} "
                        f"({type(block).__name__})")
    if block <= 0:
        raise ValueError(f"{name} must be a positive integer, got {block!r}")
    return int(block)


# The smallest block a clamp leaves: 16 rows or keys, the height of a tensor-core tile
# (mma m16n8k16), which kernels pad shorter blocks to. Below it the fp32 GEMMs that model a
# tile's dots change their summation order with the tile's shape (one or two rows take
# other BLAS paths): clamping there would change values measured with such blocks.
MIN_BLOCK = 16


def clamp_block(block: int, n: int) -> int:
    """A block of `block` rows or keys for data of n: at most max(n, MIN_BLOCK). A block
    beyond the data holds only padding, which costs memory and adds nothing."""
    return min(block, max(n, MIN_BLOCK))


def check_causal(causal) -> bool | str:
    """False (no mask), True or "bottom_right" (-> True), or "top_left" (-> "top_left")."""
    if isinstance(causal, (bool, np.bool_)):
        return bool(causal)
    if isinstance(causal, str) and causal in ALIGNMENTS:
        return True if causal == "bottom_right" else causal
    raise (ValueError if isinstance(causal, str) else TypeError)(
        f"causal must be True or False, or an alignment 'bottom_right' (= True) or "
        f"'top_left', got {causal!r}")


def diagonal(nq: int, nk: int, causal=True) -> int:
    """The causal mask's offset: query i sees keys j <= i + diagonal (Nk - Nq bottom-right,
    0 top-left)."""
    return 0 if causal == "top_left" else nk - nq


def visible(i, j, nq: int, nk: int, causal=True):
    """Whether query i may attend key j under the causal mask `causal` (True or
    "bottom_right": j <= i + (Nk - Nq); "top_left": j <= i). i, j: ints, arrays or tensors
    (broadcast), or symbolic (the Triton kernel's offsets). The one statement of the
    rule: every backend calls it."""
    return j <= i + diagonal(nq, nk, causal)


def causal_visible(nq: int, nk: int, device=None, causal=True) -> torch.Tensor:
    """(Nq, Nk) bool: True where query i may attend key j (bottom-right aligned unless
    causal="top_left")."""
    i = torch.arange(nq, device=device)[:, None]
    j = torch.arange(nk, device=device)[None, :]
    return visible(i, j, nq, nk, causal)


def visible_count(nq: int, nk: int, causal, start: int = 0, stop: int | None = None):
    """(Nq,) int64: how many of the keys start..stop-1 (default all) each query row sees.
    Under `visible` query i sees keys 0..i + diagonal, a prefix."""
    stop = nk if stop is None else stop
    if not causal:
        return torch.full((nq,), stop - start, dtype=torch.int64)
    return torch.clamp(torch.arange(nq) + diagonal(nq, nk, causal) + 1 - start, 0,
                       stop - start)


def needs_block_max(order) -> bool:
    return isinstance(order, str) and order.startswith("max_")


def needs_tile_classes(order) -> bool:
    return isinstance(order, str) and order == "partial_first"


def varies_by_query_block(order) -> bool:
    """Whether query blocks may visit the key blocks in different orders (no one tall
    GEMM for all query blocks then)."""
    return needs_block_max(order) or needs_tile_classes(order)


# tile_classes' values
HIDDEN, PARTIAL, FULL = 0, 1, 2


def tile_classes(nq: int, nk: int, block_m: int, block_n: int, causal) -> torch.Tensor:
    """(n_qb, n_kb) int8: FULL where every (query, key) of the padded tile exists and is
    visible, HIDDEN where none is, PARTIAL otherwise: a block mask's classes, whose
    padding past Nq or Nk counts as masked (so a ragged last block is partial)."""
    n_qb, n_kb = n_blocks(nq, block_m), n_blocks(nk, block_n)
    i = torch.arange(n_qb * block_m)[:, None]
    j = torch.arange(n_kb * block_n)[None, :]
    seen = (i < nq) & (j < nk)
    if causal:
        seen = seen & visible(i, j, nq, nk, causal)
    tiles = seen.reshape(n_qb, block_m, n_kb, block_n)
    any_, all_ = tiles.any(dim=(1, 3)), tiles.all(dim=(1, 3))
    return torch.where(all_, FULL, torch.where(any_, PARTIAL, HIDDEN)).to(torch.int8)


def key_block_order(order, n_qb: int, n_kb: int, seed: int = 0, block_max=None,
                    classes=None) -> torch.Tensor:
    """(n_qb, n_kb) long: the key block each query block processes at each step.

    block_max: (n_qb, n_kb) float, the largest logit of each (query block, key
    block) tile (-inf for fully masked tiles); needed only for max_* orders.
    classes: (n_qb, n_kb), tile_classes of the call; needed only for partial_first.
    """
    if isinstance(order, str):
        if order == "partial_first":
            if classes is None:
                raise ValueError(f"order {order!r} needs the tiles' classes (tile_classes)")
            rank = torch.as_tensor(classes).to(torch.int64).cpu()
            # partial tiles, then full ones, then hidden ones (they change nothing)
            key = torch.where(rank == PARTIAL, 0, torch.where(rank == FULL, 1, 2))
            return torch.sort(key, dim=-1, stable=True).indices
        if order == "forward":
            perm = torch.arange(n_kb)
        elif order == "reverse":
            perm = torch.arange(n_kb - 1, -1, -1)
        elif order == "random":
            g = torch.Generator().manual_seed(int(seed))
            perm = torch.randperm(n_kb, generator=g)
        elif order in ("max_ascending", "max_descending"):
            if block_max is None:
                raise ValueError(f"order {order!r} needs the block maxima")
            bm = block_max.to(torch.float64).cpu()
            # fully masked tiles (-inf) go last either way: they change nothing
            key = torch.where(torch.isfinite(bm), bm, torch.full_like(bm, math.inf))
            if order == "max_descending":
                key = torch.where(torch.isfinite(bm), -bm, key)
            return torch.sort(key, dim=-1, stable=True).indices
        else:
            raise ValueError(
                f"unknown order {order!r}; valid: {', '.join(ORDERS)}, or a permutation of "
                f"range({n_kb})"
            )
        return perm.expand(n_qb, n_kb).clone()
    perm = torch.as_tensor(order, dtype=torch.long).cpu()
    if perm.ndim != 1 or perm.numel() != n_kb or not torch.equal(
        torch.sort(perm).values, torch.arange(n_kb)
    ):
        raise ValueError(
            f"order {list(perm.flatten().tolist())[:16]} is not a permutation of range({n_kb}) "
            f"(there are {n_kb} key blocks); valid: {', '.join(ORDERS)}, or such a permutation"
        )
    return perm.expand(n_qb, n_kb).clone()
