"""Direct copies: a tile loaded from HBM only to be stored back to HBM moves HBM to HBM in one dma.

A copy nest (an im2col copy, a transpose or slice that no fusion absorbed) loads each tile into
SBUF and stores it again: two transfers a tile, the store waiting for the load, and a buffer that
must rotate. A dma moves any box to any box element by element (docs/ir.md), so when, in one
nest, a tile T is written only by a load L from HBM and read only by a store S to HBM of the same
box, under the same predicates, no other nest names T and nothing between L and S writes L's
source, S reads L's source instead and L goes (`dce` drops T). ResNet stage 1's im2col copies:
half the transfers, and none waits for another.
"""

from __future__ import annotations

from dataclasses import dataclass

from ncc.schemas import common_pb2, penguin_pb2
from ncc.tools.common.access_keys import base
from ncc.tools.hlo_opt.passes import nests_naming, same_box, writers_and_readers


@dataclass
class DirectCopyStats:
    copies_direct: int = 0


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
    return stats


def _is_dma(st: penguin_pb2.Statement, tensors: dict[str, penguin_pb2.TensorDecl], from_hbm: bool) -> bool:
    """A plain dma from HBM into a tile (`from_hbm`), or from a tile into HBM."""
    if st.op != "dma" or len(st.inputs) != 1 or len(st.outputs) != 1:
        return False
    source, target = tensors[st.inputs[0].tensor], tensors[st.outputs[0].tensor]
    hbm = common_pb2.HBM
    return (source.memory == hbm) != (target.memory == hbm) and (source.memory == hbm) == from_hbm
