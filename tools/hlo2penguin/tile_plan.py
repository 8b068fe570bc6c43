"""The dimension plan of a tiled elementwise or copy nest: which dimensions to merge and which two
become a tile's partitions and free elements.

A tiled nest works on the canonical shape (leading..., rows, cols) and steps its leading
dimensions one at a time, so an odd high-rank shape tiled as written is one tiny tile per leading
index: u16[6,3,12,14,3] is 216 tiles of [14, 3], f32[128,64,112,112] 8,192 tiles of [112, 112],
an im2col copy [11,2,3,4,30,11,18,14] 104,544 tiles of [18, 14]. An elementwise op or a copy may
walk its elements in any order as long as every operand and the result walk them alike, so the
plan (1) walks the dimensions in the result's memory order and merges neighbours that every view
strides contiguously (each view then re-strides without a copy: a reshape of a view, not of
data), (2) may cut a merged run into (rows, columns), and (3) picks the two merged
dimensions whose tile covers most, putting them last (partitions, then free), the others as
loops. The result is the same for any order; only the number of tiles changes (the three above:
1, 448 and 2,904).

A plan is taken only for a shape whose tiles as written leave partitions empty (fewer than 128
rows) or are many slivers (more than MANY_TILES tiles of fewer than NARROW_FREE columns: a batch
of RGB images [8, 224, 224, 3] was 3,584 tiles of [128, 3], 1.5 KB a DMA, for the copy into
ResNet's padded input), and that is not cheap (at most FEW_TILES tiles of at most FEW_COLUMNS columns and
FEW_ELEMENTS elements in all: a decode step's attention scores [1, 8, 4, 1, 2048], 32 tiles of
one partition, or its [1, 4096] activations, are not), and when it cuts the tile count or the
columns at least PLAN_GAIN-fold, so modules whose shapes already fill the partitions or are
small (the bundled models: matrices, a [2048, 64] chain asking to be pipelined along its row
tiles, a CNN's [2, 16, 16, 8] activations) keep their nests, and with them which nests fuse and
what loops they have.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from ncc.tools.hlo2penguin.nest_builder import PARTITIONS, canonical_shape, ceil_div
from ncc.tools.hlo2penguin.values import Splat, Value
from ncc.tools.hlo2penguin.views import View

NARROW_FREE = 8  # a tile of fewer columns than this is a sliver...
MANY_TILES = 1_024  # ...and more slivers than this are planned even when their rows fill the partitions
PLAN_GAIN = 4  # a plan must need at most a quarter of the tiles the shape as written needs
FEW_TILES = 32  # a shape as written of at most this many tiles is cheap enough to keep as it is...
FEW_COLUMNS = 2_048  # ...when its tiles' columns (the engines' passes) add up to at most this many...
FEW_ELEMENTS = 16_384  # ...and it has at most this many elements
FOLLOW_COST = 2  # a nest follows its producer's plan at up to this many times its own tiles and columns
MAX_SPREAD = 64  # a planned tile spans at most this many times its elements in the written view (_compact)


@dataclass(frozen=True)
class TilePlan:
    """Walk a shape as `atoms` (its size-1 dimensions dropped, put in `memory` order, the
    dimensions every view strides contiguously merged, a merged run possibly cut in two)
    permuted by `order`."""

    kept: tuple[int, ...]       # the original shape without its size-1 dimensions
    memory: tuple[int, ...]     # the kept dimensions in the result's memory order (largest stride first)
    atoms: tuple[int, ...]      # the kept dimensions merged and cut, in memory order
    order: tuple[int, ...]      # the atoms' new order: loops..., partitions, free

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape the nest tiles."""
        return tuple(self.atoms[a] for a in self.order)

    def apply(self, view: View) -> View:
        """`view` walked by the plan. Always a re-striding: the plan merges only dimensions that
        every view it was made for strides contiguously, and cuts only what it merged."""
        squeezed = view.reshape(self.kept)
        atoms = squeezed.transpose(self.memory).reshape(self.atoms) if squeezed is not None else None
        assert atoms is not None, "a plan merges only dimensions every view strides contiguously"
        return atoms.transpose(self.order)

    def fits(self, view: View) -> bool:
        """Whether `view` (of the shape the plan was made for) walks by the plan as a re-striding."""
        squeezed = view.reshape(self.kept)
        return squeezed is not None and squeezed.transpose(self.memory).reshape(self.atoms) is not None

    def walk(self, value: Value) -> Value:
        """A view through `apply`, a constant over the plan's shape."""
        return self.apply(value) if isinstance(value, View) else Splat(value.value, value.dtype, self.shape)


def tile_count(shape: tuple[int, ...], free_tile: int) -> int:
    """Tiles a nest over `shape` steps through: its canonical shape's leading extents times the
    row and column tiles."""
    canon = canonical_shape(shape)
    if 0 in canon:
        return 0
    cols = ceil_div(canon[-1], min(canon[-1], free_tile))
    return math.prod(canon[:-2]) * ceil_div(canon[-2], PARTITIONS) * cols


def column_count(shape: tuple[int, ...]) -> int:
    """The free elements of all the tiles a nest over `shape` steps through: what an engine's
    time grows with when the tiles leave partitions empty."""
    canon = canonical_shape(shape)
    return math.prod(canon[:-2]) * ceil_div(canon[-2], PARTITIONS) * canon[-1]


def kept_as_written(shape: tuple[int, ...], free_tile: int) -> bool:
    """Whether a nest over `shape` keeps the shape as written: its tiles fill the partitions (and
    are not many slivers), or it is cheap (few tiles of few columns) whatever its partitions."""
    canon = canonical_shape(shape)
    if canon[-2] >= PARTITIONS:
        return canon[-1] >= NARROW_FREE or tile_count(shape, free_tile) <= MANY_TILES
    return (tile_count(shape, free_tile) <= FEW_TILES and column_count(shape) <= FEW_COLUMNS
            and math.prod(shape) <= FEW_ELEMENTS)


def plan_tiling(shape: tuple[int, ...], views: list[View], free_tile: int) -> TilePlan | None:
    """The plan for a nest over `shape` whose operands and result are `views` (each of `shape`),
    or None when the shape as written is as good (within PLAN_GAIN) or has no elements."""
    if 0 in shape or len(shape) < 2:
        return None
    if kept_as_written(shape, free_tile):
        return None
    best = best_plan(shape, views, free_tile)
    if best is None:
        return None
    tiles, plan = best
    if tiles * PLAN_GAIN > tile_count(shape, free_tile) and \
            column_count(plan.shape) * PLAN_GAIN > column_count(shape):
        return None  # it gains neither tiles nor engine time enough to change the nests
    return plan


def followed_plan(own: TilePlan | None, producers: list[TilePlan], shape: tuple[int, ...],
                  views: list[View], free_tile: int) -> TilePlan | None:
    """The plan for an elementwise nest over `shape` whose operands were written by planned nests
    (`producers`' plans): the first producer's plan that every view walks and that needs at most
    FOLLOW_COST times the tiles and columns of the nest's `own` plan (or of the shape as written),
    else `own`. Walked alike, the two nests iterate one space and `fusion` joins them: a ReLU after
    a batch norm over channel-major tiles ([64, 2048]: the norm's vectors one per partition) took
    its own row-major plan ([128, 1024]) and sent the norm's output through HBM to read it back."""
    mine = own.shape if own is not None else shape
    for plan in producers:
        if own is not None and plan == own:
            return own
        if plan.kept != tuple(n for n in shape if n != 1) or not all(plan.fits(v) for v in views):
            continue
        if tile_count(plan.shape, free_tile) <= FOLLOW_COST * tile_count(mine, free_tile) and \
                column_count(plan.shape) <= FOLLOW_COST * column_count(mine):
            return plan
    return own


def best_plan(shape: tuple[int, ...], views: list[View], free_tile: int) -> tuple[int, TilePlan] | None:
    """(tiles, plan): the plan of fewest tiles for a nest over `shape` whose result is `views[0]`
    and whose operands are the other views, whatever the shape as written takes (plan_tiling
    decides whether a plan is worth changing a nest for; a lowering that owns all its nests, such
    as a sorting network, takes the best one always). None for a shape of no elements, of rank
    below 2 or of a single element, or when no order keeps the written tiles compact."""
    if 0 in shape or len(shape) < 2:
        return None
    dims = [d for d in range(len(shape)) if shape[d] != 1]
    if not dims:
        return None
    # walk in the result's memory order, so a dimension the views have permuted alike still merges
    memory = sorted(range(len(dims)), key=lambda k: -abs(views[0].strides[dims[k]]))
    walk = [dims[k] for k in memory]
    groups: list[list[int]] = [[walk[0]]]
    for d in walk[1:]:
        previous = groups[-1][-1]
        if all(v.strides[previous] == v.strides[d] * shape[d] for v in views):
            groups[-1].append(d)
        else:
            groups.append([d])
    sizes = [math.prod(shape[d] for d in g) for g in groups]
    cuts = [_cut(n) for n in sizes]
    best: tuple[int, tuple[int, ...], tuple[int, ...]] | None = None
    cuttable = [g for g, cut in enumerate(cuts) if cut is not None][:_MAX_CUT]
    # per view, the stride of each group: that of its last (innermost) dimension
    group_strides = [[abs(v.strides[g[-1]]) for g in groups] for v in views]
    for chosen in itertools.product((False, True), repeat=len(cuttable)):
        cut_now = {g for g, c in zip(cuttable, chosen, strict=True) if c}
        atoms = tuple(n for g, n in enumerate(sizes) for n in (cuts[g] if g in cut_now else (sizes[g],)))
        strides = [[t for g, s in enumerate(view) for t in ((s * cuts[g][1], s) if g in cut_now else (s,))]
                   for view in group_strides]
        for order in _orders(len(atoms)):
            tiles = tile_count(tuple(atoms[a] for a in order), free_tile)
            if (best is None or tiles < best[0]) and _compact(atoms, strides[:1], order, free_tile):
                best = (tiles, atoms, order)
    if best is None:
        return None
    tiles, atoms, order = best
    return tiles, TilePlan(tuple(shape[d] for d in dims), tuple(memory), atoms, order)


def _compact(atoms: tuple[int, ...], strides: list[list[int]], order: tuple[int, ...],
             free_tile: int) -> bool:
    """Whether a tile of the order (its last two atoms) spans at most MAX_SPREAD times its
    elements in each of the written views `strides` describes, unless it has a run of consecutive
    elements there. Why: the backend compares HBM accesses by their hulls when they are not boxes
    of consecutive elements, and a write retires or keeps parts of every access its hull meets, so
    a copy into an interior-padded tensor tiled across its outer dimensions (every tile's hull the
    whole tensor) made its dependence analysis grow with the square of the writes (a
    1,768-instruction module ran it for minutes). Reads of such a tile are only compared with the
    tensor's few writes, so they may spread (an im2col view does: it repeats the input)."""
    if len(order) < 2:
        rows, cols = _cut(atoms[0]) or (1, atoms[0])
        picked = [[(s * cols, rows), (s, cols)] for s in (view[0] for view in strides)]
    else:
        rows_at, cols_at = order[-2], order[-1]
        picked = [[(view[rows_at], atoms[rows_at]), (view[cols_at], atoms[cols_at])] for view in strides]
    for (row_stride, rows), (col_stride, cols) in picked:
        if min(row_stride, col_stride) <= 1:
            continue  # a run of consecutive (or repeated) elements: the backend's box is exact
        rows, cols = min(rows, PARTITIONS), min(cols, free_tile)
        if row_stride * (rows - 1) + col_stride * (cols - 1) + 1 > MAX_SPREAD * rows * cols:
            return False
    return True


def compact_write(target: View, free_tile: int) -> bool:
    """Whether a nest tiling the written view `target` (rank >= 2) as written keeps every tile
    compact (`_compact`): the test a copy's own reordering (lower.py `_copy_order`) must pass too."""
    shape = target.shape
    order = (len(shape) - 2, len(shape) - 1)
    return _compact(shape, [[abs(s) for s in target.strides]], order, free_tile)


_MAX_CUT = 6  # merged runs considered for cutting (2**6 cut choices, each with its orders)


def _cut(n: int) -> tuple[int, int] | None:
    """A run of n elements as (p, n / p) rows and columns, p the largest divisor up to 128; None
    when that cuts nothing."""
    if n <= PARTITIONS:
        return None
    rows = max(d for d in range(1, PARTITIONS + 1) if n % d == 0)
    return (rows, n // rows) if rows > 1 else None


def _orders(count: int) -> list[tuple[int, ...]]:
    """The atom orders tried: as written first (so ties keep it), then every choice of the two
    atoms that become partitions and free elements, the others as loops in their order."""
    orders = [tuple(range(count))]
    for rows, cols in itertools.permutations(range(count), 2):
        orders.append(tuple(a for a in range(count) if a not in (rows, cols)) + (rows, cols))
    return orders
