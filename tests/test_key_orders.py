"""The order key blocks are visited in: partial_first, FlexAttention's per-query-block order
(the tiles its block mask marks partial, with the mask applied, then the full ones).

The expected orders are written out by hand from the block mask's classes: a tile is full
when each of its (query, key) pairs exists and is visible, partial when some is, and a
ragged last block (padding past N) is partial.
"""

import pytest
import torch

import flashnum
from flashnum.numerics.tiling import FULL, HIDDEN, PARTIAL, key_block_order, tile_classes

# per query block, the key blocks in the order visited (block 128)
CAUSAL_384 = [[0, 1, 2],   # the diagonal tile; tiles 1 and 2 hidden
              [1, 0, 2],   # the diagonal (partial) first, then full block 0
              [2, 0, 1]]
CAUSAL_300 = [[0, 1, 2],
              [1, 0, 2],
              [0, 1, 2]]   # rows 256..299 of 384: every tile partial, in forward order
FULL_300 = [[2, 0, 1],     # the ragged key block (256..299) is partial: it comes first
            [2, 0, 1],
            [0, 1, 2]]


@pytest.mark.parametrize("n,causal,expected", [(384, True, CAUSAL_384), (300, True, CAUSAL_300),
                                               (300, False, FULL_300)])
def test_partial_first_visits_the_cut_tiles_first(n, causal, expected):
    classes = tile_classes(n, n, 128, 128, causal)
    order = key_block_order("partial_first", 3, 3, classes=classes)
    assert order.tolist() == expected


def test_tile_classes_of_a_causal_384_row():
    c = tile_classes(384, 384, 128, 128, True).tolist()
    assert c == [[PARTIAL, HIDDEN, HIDDEN], [FULL, PARTIAL, HIDDEN], [FULL, FULL, PARTIAL]]


def test_partial_first_needs_the_classes():
    with pytest.raises(ValueError, match="'partial_first' needs the tiles' classes"):
        key_block_order("partial_first", 3, 3)


@pytest.mark.parametrize("path", ["fused", "in_place", "readable"])
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("n,causal,expected", [(300, True, CAUSAL_300), (300, False, FULL_300)])
def test_the_engine_visits_each_query_block_in_that_order(monkeypatch, path, precision, n,
                                                          causal, expected):
    # the trace records the order; each query block's rows equal a run of the whole call
    # with that block's order given as an explicit permutation (one order for every
    # block: one tall GEMM over all query blocks), on each of the engine's three paths
    import flashnum.engine.flash
    import flashnum.engine.fused

    if path != "fused":
        monkeypatch.setattr(flashnum.engine.fused, "_enabled", False)
    if path == "readable":
        monkeypatch.setattr(flashnum.engine.flash, "in_place_ok", lambda ar: False)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, n, 32, generator=g, dtype=torch.float64) for _ in range(3))
    kw = dict(precision=precision, policy="fa2", block_m=128, block_n=128, causal=causal)
    res = flashnum.attention(q, k, v, order="partial_first", trace=True, **kw)
    assert res.trace.order[0, 0].tolist() == expected
    for qb, perm in enumerate(expected):
        rows = slice(128 * qb, min(n, 128 * (qb + 1)))
        one = flashnum.attention(q, k, v, order=perm, **kw)
        assert torch.equal(res.out[..., rows, :], one.out[..., rows, :]), (qb, perm)


def test_an_unknown_order_names_partial_first_among_the_valid_ones():
    q = torch.zeros(1, 1, 8, 4)
    with pytest.raises(ValueError, match="partial_first"):
        flashnum.attention(q, q, q, order="sideways")


def test_the_mp_backend_visits_in_the_same_order():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 1, 40, 4, generator=g, dtype=torch.float64) for _ in range(3))
    kw = dict(block_m=16, block_n=16, causal=True, order="partial_first", trace=True)
    mp = flashnum.attention(q, k, v, precision="mp", mp_bits=64, **kw)
    em = flashnum.attention(q, k, v, precision="fp32", **kw)
    # N = 40 in blocks of 16: rows 32..39 of the last block cut every tile
    assert mp.trace.order[0, 0].tolist() == em.trace.order[0, 0].tolist() == [
        [0, 1, 2], [1, 0, 2], [0, 1, 2]]
