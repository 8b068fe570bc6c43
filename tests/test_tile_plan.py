"""Tiling plans (hlo2penguin/tile_plan.py): an elementwise or copy nest over an odd high-rank shape
walks a merged, permuted form of it, every view alike, so it needs far fewer tiles; a shape that
already tiles well keeps its nests."""

from __future__ import annotations

import numpy as np
import pytest

from ncc.tools.hlo2penguin.nest_builder import canonical_shape
from ncc.tools.hlo2penguin.tile_plan import plan_tiling, tile_count
from ncc.tools.hlo2penguin.values import FREE_TILE
from ncc.tools.hlo2penguin.views import View


def addresses(view: View) -> np.ndarray:
    """The element address each index of `view` reads, in its row-major index order."""
    grid = np.indices(view.shape).reshape(len(view.shape), -1)
    return view.offset + np.tensordot(np.asarray(view.strides), grid, axes=1) if view.shape else \
        np.asarray([view.offset])


def walked(view: View, shape: tuple[int, ...]) -> np.ndarray:
    """Addresses of `view` walked through its canonical 2-D-or-more form (what a nest tiles)."""
    canon = view.reshape(canonical_shape(shape))
    assert canon is not None
    return addresses(canon)


@pytest.mark.parametrize("shape,make_views,most_tiles", [
    # u16[6,3,12,14,3] elementwise: 216 tiles of [14, 3] -> one
    ((6, 3, 12, 14, 3), lambda s: [View.whole("out", 0, s), View.whole("x", 0, s)], 1),
    # one operand transposed (every dimension reversed): no merge, the two largest as the tile
    ((6, 3, 12, 14, 3), lambda s: [View.whole("out", 0, s),
                                   View.whole("z", 0, s[::-1]).transpose((4, 3, 2, 1, 0))], 54),
    # a batch-norm broadcast along dim 1 (of [128, 64, 112, 112] in the slow class; smaller here):
    # 256 tiles of [12, 12] -> 8 of [32, 144]
    ((32, 8, 12, 12), lambda s: [View.whole("out", 0, s), View.whole("m", 0, (8,)).broadcast(s, (1,))], 8),
    # a 1 in the middle and a contiguous run that is cut into rows and columns
    ((13, 1, 11, 9, 11), lambda s: [View.whole("out", 0, s), View.whole("x", 0, s).reverse((0, 2))], 13),
])
def test_a_plan_walks_every_view_alike_with_fewer_tiles(shape, make_views, most_tiles: int) -> None:
    views = make_views(shape)
    plan = plan_tiling(shape, views, FREE_TILE)
    assert plan is not None
    assert tile_count(plan.shape, FREE_TILE) <= most_tiles < tile_count(shape, FREE_TILE)
    # element k of the plan's walk is the same logical element in every view: the pairs of
    # addresses (result, operand) are those of the original walk, each once
    original = np.stack([addresses(v) for v in views], axis=1)
    planned = np.stack([walked(plan.apply(v), plan.shape) for v in views], axis=1)
    assert planned.shape == original.shape
    assert sorted(map(tuple, planned.tolist())) == sorted(map(tuple, original.tolist()))


@pytest.mark.parametrize("shape,columns", [
    # a decode step's attention scores, 32 tiles of [1, 2048] as written: one [128, 512]
    ((1, 8, 4, 1, 2048), 512),
    # its activations, a row of 4096 on one partition: [128, 32]
    ((1, 4096), 32),
])
def test_few_tiles_that_leave_the_partitions_empty_are_planned(shape, columns: int) -> None:
    """Few tiles are not cheap when each is an engine pass over a handful of partitions."""
    from ncc.tools.hlo2penguin.tile_plan import FEW_TILES, column_count

    views = [View.whole("out", 0, shape), View.whole("x", 0, shape)]
    assert tile_count(shape, FREE_TILE) <= FEW_TILES
    plan = plan_tiling(shape, views, FREE_TILE)
    assert plan is not None and canonical_shape(plan.shape)[-2:] == (128, columns)
    assert column_count(plan.shape) == columns


@pytest.mark.parametrize("shape", [(256, 1024), (2, 128, 512), (1024,), (3, 5), (2, 16, 16, 8), (2048, 64),
                                   (4, 128), (8, 2048)])
def test_shapes_that_tile_well_keep_their_nests(shape: tuple[int, ...]) -> None:
    views = [View.whole("out", 0, shape), View.whole("x", 0, shape)]
    assert plan_tiling(shape, views, FREE_TILE) is None


@pytest.mark.parametrize("shape,keep", [
    ((8, 224, 224, 3), False),  # a batch of RGB images: 3,584 slivers of [128, 3] as written
    ((8, 230, 230, 3), False),  # ResNet's padded input (its fill)
    ((4096, 1), True),  # a column of row statistics: 32 tiles, the shape its readers tile by
    ((64, 256, 4), True),  # 128 slivers: few enough to keep
])
def test_many_slivers_are_planned_though_their_rows_fill_the_partitions(shape, keep: bool) -> None:
    views = [View.whole("out", 0, shape), View.whole("x", 0, shape)]
    plan = plan_tiling(shape, views, FREE_TILE)
    assert (plan is None) == keep
    if plan is not None:
        assert tile_count(plan.shape, FREE_TILE) * 100 < tile_count(shape, FREE_TILE)
