"""Loop-invariant loads: a tile load that reads the same HBM bytes at every step of an axis runs once.

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
Software-pipelined nests are left alone (their ring of buffers is per iteration).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ncc.schemas import common_pb2, penguin_pb2
from ncc.tools.common import affine
from ncc.tools.common.access_keys import base


@dataclass
class InvariantLoadStats:
    loads_hoisted: int = 0
    tiles_replicated: int = 0


def hoist_invariant_loads(program: penguin_pb2.Program) -> InvariantLoadStats:
    """Run each loop-invariant load once per nest, in place; returns what changed."""
    tensors = {t.name: t for t in program.tensors}
    nests_of: dict[str, set[int]] = defaultdict(set)
    for index, nest in enumerate(program.nests):
        for st in nest.statements:
            for access in [*st.inputs, *st.outputs]:
                nests_of[access.tensor].add(index)
    stats = InvariantLoadStats()
    for index, nest in enumerate(program.nests):
        if any("pipelined" in axis.attributes for axis in nest.axes):
            continue
        writers: dict[str, int] = defaultdict(int)
        for st in nest.statements:
            for access in st.outputs:
                writers[base(tensors, access.tensor)] += 1
        for st in nest.statements:
            hoisted = _hoist(nest, st, tensors, writers, nests_of, index)
            if hoisted:
                stats.loads_hoisted += 1
                stats.tiles_replicated += hoisted
    return stats


def _hoist(nest: penguin_pb2.LoopNest, st: penguin_pb2.Statement, tensors: dict[str, penguin_pb2.TensorDecl],
           writers: dict[str, int], nests_of: dict[str, set[int]], index: int) -> int:
    """Hoist `st` if it is an invariant load along some axis; the number of axes it was hoisted along."""
    if st.op != "dma" or st.predicates or len(st.inputs) != 1 or len(st.outputs) != 1:
        return 0
    source, tile = st.inputs[0], st.outputs[0]
    view, dst = tensors[source.tensor], tensors[tile.tensor]
    if view.memory != common_pb2.HBM or dst.memory == common_pb2.HBM or not view.view_of:
        return 0
    if writers[base(tensors, source.tensor)] or writers[tile.tensor] != 1 or nests_of[tile.tensor] != {index}:
        return 0
    if dst.num_buffers > 1 or list(dst.replicated_dims) or len(dst.block_shape) != len(dst.shape):
        return 0
    strides = list(view.view_strides)
    readers = [a for other in nest.statements for a in other.inputs if a.tensor == tile.tensor]
    hoisted = 0
    for axis in nest.axes:
        if axis.extent <= 1:
            continue
        if any(_uses(start, axis.name) and strides[d] != 0 for d, start in enumerate(source.starts)):
            continue  # the source box moves along the axis
        dims = [d for d, start in enumerate(tile.starts) if _uses(start, axis.name)]
        if not dims or len(dst.shape) - 1 in dims:
            continue
        accesses = [tile, *readers]
        if any(_uses(start, axis.name) for a in accesses for d, start in enumerate(a.starts)
               if d not in dims):
            continue  # some access moves along the axis in another dimension too
        if not all(_one_block_per_step(a.starts[d], axis.name, dst.block_shape[d])
                   for a in accesses for d in dims):
            continue
        st.predicates.add().CopyFrom(affine.equals(axis.name, 0))
        dst.replicated_dims.extend(sorted(set(dims) - set(dst.replicated_dims)))
        hoisted += 1
    return hoisted


def _uses(expr: penguin_pb2.AffineExpr, var: str) -> bool:
    return any(term.var == var and term.coeff for term in expr.terms)


def _one_block_per_step(expr: penguin_pb2.AffineExpr, var: str, block: int) -> bool:
    """start == block * var exactly: each step of the axis is the next block, from block 0."""
    terms = [term for term in expr.terms if term.coeff]
    return expr.constant == 0 and len(terms) == 1 and terms[0].var == var and terms[0].coeff == block
