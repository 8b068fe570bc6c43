"""Common-subexpression elimination inside a nest: a load or fill that repeats one already done in
the same iteration reuses its tile.

After fusion one nest often loads the same input tile several times (gelu reads x in four of its
ops) or fills the same constant tile again and again; each repeat is a DMA or an instruction with
nothing new in it. A repeat is the same op on the same HBM box (or the same fill scalars) into a tile
of the same shape, block and type. It is dropped and its tile's later uses read the first tile,
provided nothing in the nest writes that HBM tensor (so both loads see the same data) and nothing
else writes either tile (so the first still holds the value when the repeat's readers run).
"""

from __future__ import annotations

from dataclasses import dataclass

from ncc.schemas import common_pb2, penguin_pb2
from ncc.tools.common.access_keys import base, box_key, view_key


@dataclass
class CseStats:
    loads_removed: int = 0
    fills_removed: int = 0


def eliminate_common_loads(program: penguin_pb2.Program) -> CseStats:
    tensors = {t.name: t for t in program.tensors}
    stats = CseStats()
    for nest in program.nests:
        _nest(nest, tensors, stats)
    return stats


def _nest(nest: penguin_pb2.LoopNest, tensors: dict[str, penguin_pb2.TensorDecl], stats: CseStats) -> None:
    writers: dict[str, int] = {}
    for st in nest.statements:
        for access in st.outputs:
            writers[access.tensor] = writers.get(access.tensor, 0) + 1
    written_hbm = {base(tensors, a.tensor) for st in nest.statements for a in st.outputs
                   if tensors[a.tensor].memory == common_pb2.HBM}
    first: dict[tuple, str] = {}
    replaced: dict[str, str] = {}
    kept: list[penguin_pb2.Statement] = []
    for st in nest.statements:
        for access in st.inputs:
            access.tensor = replaced.get(access.tensor, access.tensor)
        key = _key(st, tensors, written_hbm, writers)
        if key is not None and key in first:
            replaced[st.outputs[0].tensor] = first[key]
            if st.op == "dma":
                stats.loads_removed += 1
            else:
                stats.fills_removed += 1
            continue
        if key is not None:
            first[key] = st.outputs[0].tensor
        kept.append(st)
    if replaced:
        del nest.statements[:]
        nest.statements.extend(kept)


def _key(st: penguin_pb2.Statement, tensors: dict[str, penguin_pb2.TensorDecl], written_hbm: set[str],
         writers: dict[str, int]) -> tuple | None:
    """What makes two statements the same load or fill, or None when this one is neither."""
    if st.predicates or len(st.outputs) != 1:
        return None
    out = st.outputs[0]
    tile = tensors[out.tensor]
    if tile.memory == common_pb2.HBM or writers.get(out.tensor, 0) != 1:
        return None
    shape = (tile.dtype, tuple(tile.shape), tuple(tile.block_shape), box_key(out))
    if st.op == "dma" and len(st.inputs) == 1:
        source = tensors[st.inputs[0].tensor]
        if source.memory != common_pb2.HBM or (source.view_of or source.name) in written_hbm:
            return None
        return ("load", view_key(source), box_key(st.inputs[0]), shape)
    if st.op == "iota" and not st.inputs and "iota_dimension" not in st.attributes:
        return ("fill", tuple(st.scalars), shape)
    return None
