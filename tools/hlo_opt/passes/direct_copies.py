"""Direct copies: a tile loaded from HBM only to be stored back to HBM moves HBM to HBM in one dma.

A copy nest (an im2col copy, a transpose or slice that no fusion absorbed) loads each tile into
SBUF and stores it again: two transfers a tile, the store waiting for the load, and a buffer that
must rotate. A dma moves any box to any box element by element (docs/ir.md), so when, in one
nest, a tile T is written only by a load L from HBM and read only by a store S to HBM of the same
box, under the same predicates, no other nest names T and nothing between L and S writes L's
source, S reads L's source instead and L goes (`dce` drops T). ResNet stage 1's im2col copies:
half the transfers, and none waits for another.

A dma moves a box of any rank, and each one holds its queue for a fixed latency (~0.5 µs) besides
its bytes, so a copy nest that is now one such dma then takes its loops into the box, innermost
first, while the box moves less than WIDE_BYTES, would not pass MAX_WIDE_BYTES, and the dmas left
are at least as many as the target's queues (the bundled cnn_train lost 5 % when its few copies
became fewer than 16 dmas). A loop whose axis steps the box by its own extent along one dimension
of each side (the boxes of its iterations abut) becomes that dimension's extent times the trip
count. ResNet's 7x7 im2col moved 6,272 boxes of [112, 21] (9 KiB, as long on a queue in latency
as in bytes); with the kernel rows in the box, 896 of [112, 7, 21]. Elements are copied once each
whatever the order, so the order of the loops left does not matter. (BIR codegen then orders such
a dma's dimensions as its destination's and merges the contiguous ones: the destination
[112, 147] stays two-dimensional, which the dependence analysis tells apart iteration by
iteration; folded with a three-dimensional destination, ResNet stage 1 took 10.0 ms, not 7.5.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ncc.schemas import common_pb2, penguin_pb2
from ncc.tools.common.access_keys import base
from ncc.tools.common.dtypes import itemsize
from ncc.tools.hlo_opt.passes import nests_naming, same_box, writers_and_readers
from ncc.tools.target import load_target

WIDE_BYTES = 64 * 1024  # a direct copy's box takes loops in until it moves this many bytes...
MAX_WIDE_BYTES = 512 * 1024  # ...and not past this many (one dma holds one queue)
QUEUES = load_target().dma_queues  # a fold leaves at least this many dmas, one per queue
MAX_BOX_DIMS = 4  # dimensions of extent above 1 a widened box may have (a DMA's access pattern)


@dataclass
class DirectCopyStats:
    copies_direct: int = 0
    loops_folded: int = 0  # loops of a direct copy nest taken into its dma's box


def copy_directly(program: penguin_pb2.Program) -> DirectCopyStats:
    """Turn each load-then-store pair of a tile into one HBM-to-HBM dma, in place."""
    tensors = {t.name: t for t in program.tensors}
    nests_of = nests_naming(program)
    stats = DirectCopyStats()
    for index, nest in enumerate(program.nests):
        if any("pipelined" in axis.attributes for axis in nest.axes):
            continue  # its ring of buffers is what the stages hand over
        writers, readers = writers_and_readers(nest)
        dropped: set[int] = set()
        for k, load in enumerate(nest.statements):
            if not _is_dma(load, tensors, from_hbm=True):
                continue
            tile = load.outputs[0]
            alone = writers[tile.tensor] == [k] and len(readers[tile.tensor]) == 1
            if not alone or nests_of[tile.tensor] != {index}:
                continue
            (j,) = readers[tile.tensor]
            store = nest.statements[j]
            if j < k or not _is_dma(store, tensors, from_hbm=False) or store.inputs[0].tensor != tile.tensor:
                continue
            if not same_box(store.inputs[0], tile) or list(store.predicates) != list(load.predicates):
                continue
            if tensors[load.inputs[0].tensor].dtype != tensors[store.outputs[0].tensor].dtype:
                continue
            source = base(tensors, load.inputs[0].tensor)
            if any(k < w < j for name, ks in writers.items() if base(tensors, name) == source for w in ks):
                continue  # the source changes between the load and the store: the store would see it
            store.inputs[0].CopyFrom(load.inputs[0])
            dropped.add(k)
            stats.copies_direct += 1
        if dropped:
            kept = [st for k, st in enumerate(nest.statements) if k not in dropped]
            del nest.statements[:]
            nest.statements.extend(kept)
        if len(nest.statements) == 1 and not any(axis.attributes for axis in nest.axes):
            stats.loops_folded += _widen(nest, tensors)
    return stats


def _widen(nest: penguin_pb2.LoopNest, tensors: dict[str, penguin_pb2.TensorDecl]) -> int:
    """Fold loops of a nest that is one unpredicated HBM-to-HBM dma into its box (module
    docstring); the number folded."""
    (st,) = nest.statements
    if st.op != "dma" or st.predicates or len(st.inputs) != 1 or len(st.outputs) != 1:
        return 0
    sides = (st.inputs[0], st.outputs[0])
    if any(tensors[a.tensor].memory != common_pb2.HBM for a in sides):
        return 0
    size = itemsize(tensors[st.outputs[0].tensor].dtype)
    folded: set[str] = set()
    for name, extent in reversed([(axis.name, int(axis.extent)) for axis in nest.axes]):
        shape = tensors[sides[1].tensor].shape
        moved = math.prod(min(e, n) for e, n in zip(sides[1].extents, shape, strict=True)) * size
        left = math.prod(int(axis.extent) for axis in nest.axes if axis.name not in folded) // extent
        if moved >= WIDE_BYTES or moved * extent > MAX_WIDE_BYTES or left < QUEUES:
            break
        if extent <= 1:
            continue
        dims = [_abutting(a, name, extent, tensors) for a in sides]
        if None in dims or any(sum(e > 1 for e in a.extents) >= MAX_BOX_DIMS for a in sides):
            break
        for access, d in zip(sides, dims, strict=True):
            expr = access.starts[d]
            kept = [t for t in expr.terms if t.var != name]
            del expr.terms[:]
            expr.terms.extend(kept)
            access.extents[d] *= extent
        folded.add(name)
    if folded:
        axes = [axis for axis in nest.axes if axis.name not in folded]
        del nest.axes[:]
        nest.axes.extend(axes)
    return len(folded)


def _abutting(access: penguin_pb2.Access, name: str, extent: int,
              tensors: dict[str, penguin_pb2.TensorDecl]) -> int | None:
    """The dimension of `access` in which axis `name` (of `extent` steps) moves the box by the
    box's extent, appearing in no other dimension, over a range inside the tensor; else None."""
    found = [d for d, start in enumerate(access.starts)
             if any(t.var == name and t.coeff for t in start.terms)]
    if len(found) != 1:
        return None
    (d,) = found
    start = access.starts[d]
    coeff = sum(t.coeff for t in start.terms if t.var == name)
    if coeff != access.extents[d] or any(t.var != name and t.coeff for t in start.terms):
        return None
    inside = 0 <= start.constant and start.constant + coeff * extent <= tensors[access.tensor].shape[d]
    return d if inside else None


def _is_dma(st: penguin_pb2.Statement, tensors: dict[str, penguin_pb2.TensorDecl], from_hbm: bool) -> bool:
    """A plain dma from HBM into a tile (`from_hbm`), or from a tile into HBM."""
    if st.op != "dma" or len(st.inputs) != 1 or len(st.outputs) != 1:
        return False
    source, target = tensors[st.inputs[0].tensor], tensors[st.outputs[0].tensor]
    hbm = common_pb2.HBM
    return (source.memory == hbm) != (target.memory == hbm) and (source.memory == hbm) == from_hbm
