"""Retile: an elementwise nest with too few tiles to overlap its engines gets narrower free tiles.

The lowering tiles the free dimension by up to 2048 elements, which suits wide reductions and keeps
the per-instruction overhead small. But an elementwise nest over [256, 1024] is then two tiles: the
second tile's load cannot hide behind anything, every engine waits for the one before it in the
chain, and the last store runs alone (gelu ran at 4.4x its first-principles bound with DVE idle
a third of the time). When a nest
  * has one free axis `j` that every access of every statement walks in its last dimension alone,
    start = B·j and extent B, and no other dimension or predicate mentions `j`,
  * does only elementwise work and dmas (no reduction, matmul or transpose changes the free
    dimension's meaning),
  * owns every on-chip tensor it touches (no other nest names them; one buffer each, block width B),
and has fewer than `min_tiles` tiles in all, its tile width becomes B / k for the smallest power
of two k that reaches `min_tiles`, but no narrower than `min_width` elements (below that the fixed
cost of an instruction, ~60 cycles, outweighs the overlap). Only the free dimension changes; the
partition tiling, and so every fusion decision already taken, stays as it was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ncc.schemas import common_pb2, penguin_pb2
from ncc.tools.hlo_opt.passes import nests_naming
from ncc.tools.hlo_opt.passes.pipelining import requests_pipelining

ELEMENTWISE_OPS = frozenset({"dma", "tensor_tensor", "tensor_scalar", "activation", "tensor_copy"})
MIN_TILES = 8  # tiles a nest needs for its loads, compute and stores to overlap
MIN_WIDTH = 512  # elements per partition below which a tile's fixed costs dominate


@dataclass
class RetileStats:
    nests_retiled: int = 0
    tiles_before: int = 0
    tiles_after: int = 0


def retile_nests(
    program: penguin_pb2.Program, min_tiles: int = MIN_TILES, min_width: int = MIN_WIDTH
) -> RetileStats:
    """Narrow the free tiles of the nests that qualify, in place; returns what changed."""
    tensors = {t.name: t for t in program.tensors}
    nests_of = nests_naming(program)
    stats = RetileStats()
    for index, nest in enumerate(program.nests):
        found = _free_axis(nest, tensors, nests_of, index)
        if found is None:
            continue
        axis, width, logical = found
        tiles = math.prod(a.extent for a in nest.axes)
        k = 1
        while tiles * k < min_tiles and width % (2 * k) == 0 and width // (2 * k) >= min_width:
            k *= 2
        if k == 1:
            continue
        narrow = width // k
        stats.nests_retiled += 1
        stats.tiles_before += tiles
        axis.extent = math.ceil(logical / narrow)
        stats.tiles_after += math.prod(a.extent for a in nest.axes)
        for st in nest.statements:
            for access in (*st.inputs, *st.outputs):
                last = access.starts[-1]
                last.terms[0].coeff = narrow
                access.extents[-1] = narrow
                tensor = tensors[access.tensor]
                if tensor.memory != common_pb2.HBM:
                    tensor.block_shape[-1] = narrow
    return stats


def _free_axis(
    nest: penguin_pb2.LoopNest,
    tensors: dict[str, penguin_pb2.TensorDecl],
    nests_of: dict[str, set[int]],
    index: int,
) -> tuple[penguin_pb2.Axis, int, int] | None:
    """(the free axis, the tile width B, the tensors' common last dimension) when the nest
    qualifies (see the module docstring), else None."""
    if requests_pipelining(nest):  # it keeps the tiling its request was made on
        return None
    name: str | None = None
    width = logical = 0
    for st in nest.statements:
        if st.op not in ELEMENTWISE_OPS or st.predicates:
            return None
        for access in (*st.inputs, *st.outputs):
            tensor = tensors[access.tensor]
            if not access.starts:
                return None
            last = access.starts[-1]
            if len(last.terms) != 1 or last.constant or last.terms[0].coeff <= 0:
                return None
            var, coeff = last.terms[0].var, last.terms[0].coeff
            if name is None:
                name, width, logical = var, coeff, tensor.shape[-1]
            if (var, coeff, tensor.shape[-1]) != (name, width, logical) or access.extents[-1] != width:
                return None
            if any(t.var == var for start in access.starts[:-1] for t in start.terms):
                return None
            if tensor.memory != common_pb2.HBM and (
                nests_of[tensor.name] != {index}
                or tensor.num_buffers > 1
                or tensor.replicated_dims
                or tensor.block_shape[-1] != width
            ):
                return None
    axes = [a for a in nest.axes if a.name == name]
    if not axes or axes[0].extent != math.ceil(logical / width):
        return None
    return axes[0], width, logical
