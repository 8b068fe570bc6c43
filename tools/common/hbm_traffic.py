"""HBM bytes a BIR program's DMAs move, per HBM tensor: the measure the fusion benchmark and the
optimizer's tests judge the Penguin passes by.

Each dma, dma_gather and dma_scatter is counted once, on its HBM side (an HBM -> HBM copy on its
source); an on-chip -> on-chip dma (a broadcast across partitions) moves no HBM bytes. An HBM
access pattern's elements are the product of its dims' counts (docs/ir.md).
"""

from __future__ import annotations

from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.common.dtypes import itemsize

DMA_OPS = frozenset({"dma", "dma_gather", "dma_scatter"})


def hbm_bytes(program: bir_pb2.Program) -> dict[str, int]:
    """{HBM tensor: bytes the program's DMAs read from it or write to it}."""
    moved: dict[str, int] = {}
    for instr in program.instructions:
        if instr.op not in DMA_OPS or not instr.inputs or not instr.outputs:
            continue
        hbm = next((ap for ap in (instr.inputs[0], instr.outputs[0]) if ap.memory == common_pb2.HBM), None)
        if hbm is None:
            continue
        elements = 1
        for dim in hbm.dims:
            elements *= dim.count
        moved[hbm.tensor] = moved.get(hbm.tensor, 0) + elements * itemsize(hbm.dtype)
    return moved
