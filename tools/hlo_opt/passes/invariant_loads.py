"""Loop-invariant loads: a tile load that reads the same HBM bytes at every step of an axis runs once
(and so does a fill of a tile with one value, which reads nothing: the first case below applies
to it with no source to check).

A broadcast operand (a norm's gamma and beta, a dense layer's bias) reaches a nest as a load
through an HBM view whose stride is 0 along the rows, so every row tile loads the same bytes
again: for a bias add over [4096, 4096] that doubles the HBM traffic. When, along an axis `a` of
the nest,
  * a dma load's source box is the same at every value of `a` (the axis appears only in dimensions
    where the source view's stride is 0),
  * its destination is an on-chip tensor that this load alone writes, used in this nest only, and
    every access to it moves by exactly one block per step of `a` along some dimensions other than
    the free one (start = block * a there),
then the load keeps only `a == 0` and those dimensions of the tile are marked replicated
(TensorDecl.replicated_dims): every value of `a` names the one buffer the first step filled, and a
clipped (partial) last tile reads its first rows. The step a == 0 is the widest tile and comes
first in the nest's order for any fixed value of the other axes, so every reader finds it loaded.
The hoisted tile keeps one block on chip per point of the axes inside `a` that it walks; when
those exceed KEEP_BUDGET_BYTES a partition, `a` moves just inside the last of them if ISL finds
that the new order reverses no dependence (else the load stays): a causal mask [S, S] shared by
the heads of a masked softmax over (head, row tile) kept all S / 128 of its row tiles across the
head loop (128 KiB a partition at S = 2048, which left the 7B decoder's loops no room), and with
the heads inside the row tiles keeps one. Software-pipelined nests are left alone (their ring of
buffers is per iteration), and so is the order tile_order chose for a matmul's row blocks.

A second case needs no replication: along an axis `a` that neither the load's source box nor its
destination mentions at all, every step of `a` reloads the same bytes into the same blocks (a
dot's stationary tile in its column loop, its moving tile in tile_order's inner row loop). When
the destination's block determines the source box (every axis the source walks, the destination
walks one block per step, so no two boxes share a block) and every predicate of the load that
holds at a step of `a` holds at step 0 too (it does not mention `a`, or bounds it from above, as
tile_order's guard does), the load keeps only `a == 0`: each block stays on chip from its first
load to its last reader. The blocks kept at once (one per point of the loops inside `a` that the
destination walks) must fit KEEP_BUDGET_BYTES a partition.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from ncc.schemas import common_pb2, penguin_pb2
from ncc.tools.common import affine
from ncc.tools.common.access_keys import base
from ncc.tools.common.dtypes import itemsize
from ncc.tools.hlo_opt.dependences import axis_names, first_reversed_dependence
from ncc.tools.hlo_opt.passes import fills_one_value, nests_naming
from ncc.tools.hlo_opt.passes.pipelining import ROW_BLOCK


@dataclass
class InvariantLoadStats:
    loads_hoisted: int = 0
    tiles_replicated: int = 0
    loads_kept: int = 0  # loads run once along an axis they do not mention (the second case)


KEEP_BUDGET_BYTES = 64 * 1024  # per partition: the blocks one load keeps on chip across a loop


def hoist_invariant_loads(program: penguin_pb2.Program) -> InvariantLoadStats:
    """Run each loop-invariant load once per nest, in place; returns what changed."""
    tensors = {t.name: t for t in program.tensors}
    nests_of = nests_naming(program)
    stats = InvariantLoadStats()
    for index, nest in enumerate(program.nests):
        if any("pipelined" in axis.attributes for axis in nest.axes):
            continue
        writers: dict[str, int] = defaultdict(int)
        readers: dict[str, list[penguin_pb2.Access]] = defaultdict(list)  # tensor -> its reads in the nest
        for st in nest.statements:
            for access in st.outputs:
                writers[base(tensors, access.tensor)] += 1
            for access in st.inputs:
                readers[access.tensor].append(access)
        for st in nest.statements:
            hoisted = _hoist(nest, st, tensors, writers, readers, nests_of, index)
            if hoisted:
                stats.loads_hoisted += 1
                stats.tiles_replicated += hoisted
            stats.loads_kept += _keep(nest, st, tensors, writers, nests_of, index)
    return stats


def _hoist(nest: penguin_pb2.LoopNest, st: penguin_pb2.Statement, tensors: dict[str, penguin_pb2.TensorDecl],
           writers: dict[str, int], readers: dict[str, list[penguin_pb2.Access]],
           nests_of: dict[str, set[int]], index: int) -> int:
    """Hoist `st` if it is an invariant load (or a constant fill) along some axis; the number of
    axes it was hoisted along. A load that runs at one value of some axes only (equalities: a
    softmax joined to the last column tile of its scores, epilogues' wide rows) is hoisted along
    the others: it then runs at step 0 of `a` at those same values, before every reader there."""
    if any(p.relation != penguin_pb2.EQ for p in st.predicates):
        return 0
    tile = st.outputs[0] if len(st.outputs) == 1 else None
    if _constant_fill(st, tensors, writers, nests_of, index):
        source, strides = None, []
    elif _load_into_own_tile(st, tensors, writers, nests_of, index):
        source = st.inputs[0]
        view = tensors[source.tensor]
        if not view.view_of:
            return 0
        strides = list(view.view_strides)
    else:
        return 0
    dst = tensors[tile.tensor]
    if len(dst.block_shape) != len(dst.shape):
        return 0
    accesses = [tile, *readers[tile.tensor]]
    hoisted = 0
    pinned = {term.var for p in st.predicates for term in p.expr.terms if term.coeff}
    for axis in list(nest.axes):
        if axis.extent <= 1 or axis.name in pinned:
            continue
        if source is not None and any(_uses(start, axis.name) and strides[d] != 0
                                      for d, start in enumerate(source.starts)):
            continue  # the source box moves along the axis
        dims = [d for d, start in enumerate(tile.starts) if _uses(start, axis.name)]
        if not dims or len(dst.shape) - 1 in dims:
            continue
        if any(_uses(start, axis.name) for a in accesses for d, start in enumerate(a.starts)
               if d not in dims):
            continue  # some access moves along the axis in another dimension too
        single = {other.name for other in nest.axes if other.extent == 1}  # always 0
        if not all(_one_block_per_step(a.starts[d], axis.name, dst.block_shape[d], single)
                   for a in accesses for d in dims):
            continue
        if not _fits_across(nest, axis.name, tile, dst, tensors):
            continue
        st.predicates.add().CopyFrom(affine.equals(axis.name, 0))
        dst.replicated_dims.extend(sorted(set(dims) - set(dst.replicated_dims)))
        hoisted += 1
    return hoisted


def _fits_across(nest: penguin_pb2.LoopNest, name: str, tile: penguin_pb2.Access, dst: penguin_pb2.TensorDecl,
                 tensors: dict[str, penguin_pb2.TensorDecl]) -> bool:
    """Whether the blocks a load hoisted along axis `name` keeps on chip across it (one per point of
    the axes inside it that the tile walks) fit KEEP_BUDGET_BYTES a partition; when they do not, the
    axis moves inside those axes if that reverses no dependence (then one block is kept at a time)."""
    position = next(k for k, axis in enumerate(nest.axes) if axis.name == name)
    walked = [k for k in range(position + 1, len(nest.axes)) if _walks(tile, nest.axes[k].name)]
    block_bytes = dst.block_shape[-1] * itemsize(dst.dtype)
    if math.prod(nest.axes[k].extent for k in walked) * block_bytes <= KEEP_BUDGET_BYTES:
        return True
    if ROW_BLOCK in nest.attributes or block_bytes > KEEP_BUDGET_BYTES:
        return False  # tile_order chose this order for the matmul's tiles
    order = list(range(len(nest.axes)))
    order.insert(walked[-1], order.pop(position))  # just inside the last axis the tile walks
    names = axis_names(nest)
    schedule = [", ".join([*(names[k] for k in order), str(s)]) for s in range(len(nest.statements))]
    if first_reversed_dependence(nest, tensors, schedule) is not None:
        return False
    axes = [penguin_pb2.Axis() for _ in order]
    for axis, k in zip(axes, order, strict=True):
        axis.CopyFrom(nest.axes[k])
    del nest.axes[:]
    nest.axes.extend(axes)
    return True


def _constant_fill(st: penguin_pb2.Statement, tensors: dict[str, penguin_pb2.TensorDecl],
                   writers: dict[str, int], nests_of: dict[str, set[int]], index: int) -> bool:
    """Whether `st` fills an on-chip tile with one value (an iota whose every coefficient is 0: a
    select's -inf, written into every score tile of GPT-2's causal softmax), the tile only `st`
    writes and only nest `index` uses: like an invariant load, it need run once along an axis."""
    if not fills_one_value(st):
        return False
    name = st.outputs[0].tensor
    dst = tensors[name]
    return (dst.memory != common_pb2.HBM and writers[name] == 1 and nests_of[name] == {index}
            and dst.num_buffers <= 1 and not dst.replicated_dims)


def _load_into_own_tile(st: penguin_pb2.Statement, tensors: dict[str, penguin_pb2.TensorDecl],
                        writers: dict[str, int], nests_of: dict[str, set[int]], index: int) -> bool:
    """What both cases need: `st` is a dma from HBM that nothing in the nest writes, into an on-chip
    tile (one buffer a block, not yet replicated) that only `st` writes and only nest `index` uses."""
    if st.op != "dma" or len(st.inputs) != 1 or len(st.outputs) != 1:
        return False
    source, tile = st.inputs[0], st.outputs[0]
    view, dst = tensors[source.tensor], tensors[tile.tensor]
    if view.memory != common_pb2.HBM or dst.memory == common_pb2.HBM:
        return False
    if writers[base(tensors, source.tensor)] or writers[tile.tensor] != 1 or nests_of[tile.tensor] != {index}:
        return False
    return dst.num_buffers <= 1 and not dst.replicated_dims


def _keep(nest: penguin_pb2.LoopNest, st: penguin_pb2.Statement, tensors: dict[str, penguin_pb2.TensorDecl],
          writers: dict[str, int], nests_of: dict[str, set[int]], index: int) -> int:
    """Run `st` at step 0 only of each axis neither of its boxes mentions (the second case of the
    module docstring); the number of such axes."""
    if not _load_into_own_tile(st, tensors, writers, nests_of, index):
        return 0
    source, tile = st.inputs[0], st.outputs[0]
    view, dst = tensors[source.tensor], tensors[tile.tensor]
    if list(dst.block_shape) != [*[1] * (len(dst.shape) - 2), *dst.block_shape[-2:]]:
        return 0
    strides = list(view.view_strides) if view.view_of else [1] * len(source.starts)
    extents = {axis.name: axis.extent for axis in nest.axes}
    walked = {term.var for d, start in enumerate(source.starts) for term in start.terms
              if term.coeff and strides[d]}
    if not _blocks_distinct(tile, dst, extents, walked):
        return 0
    kept = 0
    for position, axis in enumerate(nest.axes):
        if axis.extent <= 1 or axis.name in walked or _walks(tile, axis.name):
            continue
        if not all(_holds_at_zero(p, axis.name) for p in st.predicates):
            continue
        inner = [a for a in nest.axes[position + 1:] if _walks(tile, a.name)]
        live = math.prod(a.extent for a in inner) * dst.block_shape[-1] * itemsize(dst.dtype)
        if live > KEEP_BUDGET_BYTES:
            continue
        st.predicates.add().CopyFrom(affine.equals(axis.name, 0))
        kept += 1
    return kept


def _holds_at_zero(predicate: penguin_pb2.Predicate, var: str) -> bool:
    """Whether the predicate holds at var == 0 wherever it holds at a larger var (others fixed)."""
    coeff = sum(t.coeff for t in predicate.expr.terms if t.var == var)
    return coeff == 0 or (predicate.relation == penguin_pb2.GE and coeff < 0)


def _walks(access: penguin_pb2.Access, var: str) -> bool:
    return any(_uses(start, var) for start in access.starts)


def _blocks_distinct(tile: penguin_pb2.Access, dst: penguin_pb2.TensorDecl, extents: dict[str, int],
                     walked: set[str]) -> bool:
    """Whether the destination's block index determines the source box: every axis in `walked`
    moves the destination by whole blocks, and different points name different blocks (per
    dimension the axes are digits of a mixed radix, each in one dimension only)."""
    seen: set[str] = set()
    for d, start in enumerate(tile.starts):
        terms = sorted((abs(t.coeff), t.var) for t in start.terms if t.coeff)
        if start.constant % dst.block_shape[d]:
            return False
        radix = 1
        for coeff, var in terms:
            if var in seen or coeff % dst.block_shape[d] or coeff // dst.block_shape[d] < radix:
                return False
            seen.add(var)
            radix = coeff // dst.block_shape[d] * extents[var]
    return walked <= seen


def _uses(expr: penguin_pb2.AffineExpr, var: str) -> bool:
    return any(term.var == var and term.coeff for term in expr.terms)


def _one_block_per_step(expr: penguin_pb2.AffineExpr, var: str, block: int, single: set[str]) -> bool:
    """start == block * var exactly: each step of the axis is the next block, from block 0. Terms of
    axes in `single` (of extent 1, so always 0: tile_order's row-block axis `io` over a matmul of
    one row block) do not count."""
    terms = [term for term in expr.terms if term.coeff and term.var not in single]
    return expr.constant == 0 and len(terms) == 1 and terms[0].var == var and terms[0].coeff == block
