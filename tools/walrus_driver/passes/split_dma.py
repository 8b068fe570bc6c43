"""Split large DMAs by partition ranges so that several DMA queues move one tile together.

A dma moves its bytes on one queue (target.dma_queue_bandwidth_gbps, ~27 GB/s), and a core has 16
queues: one 128-partition x 4 KiB tile load holds one queue for ~20 us while the engine that needs
it idles. This pass cuts a dma whose on-chip side spans P partitions into up to `max_parts` dmas
over consecutive partition ranges, each moving at least `min_bytes`, so that assign_hwdge_engine
(which hands a trigger engine's dmas to its queues round-robin) spreads the pieces over queues.

A dma is split only when its HBM side's outermost dimension walks the on-chip partitions (the
form the frontend writes: partition p of the tile is HBM row p); then a piece over partitions
[a, b) reads HBM rows [a, b): the same dims with offset + a * stride and count b - a. The pieces
keep the original's trigger engine and place in the order. It adds instructions, so it runs before
anti_dependency_analyzer and assign_hwdge_engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.common.dtypes import itemsize
from ncc.tools.target import DMA_SPLIT_MAX_PARTS, DMA_SPLIT_MIN_BYTES, dma_pieces
from ncc.tools.walrus_driver import birutil
from ncc.tools.walrus_driver.context import PassContext
from ncc.tools.walrus_driver.registry import register

NAME = "split_dma"


@dataclass
class Options:
    max_parts: int = DMA_SPLIT_MAX_PARTS  # pieces per dma at most
    min_bytes: int = DMA_SPLIT_MIN_BYTES  # bytes each piece moves at least (smaller ones are latency-bound)


@register(NAME, Options)
def run(ctx: PassContext) -> None:
    options: Options = ctx.options or Options()
    ctx.forbid_after_sync()
    if ctx.queues_assigned:
        ctx.fail_needs_before("assign_hwdge_engine")
    program = ctx.program
    next_id = max((instr.id for instr in program.instructions), default=-1) + 1
    result: list[bir_pb2.Instruction] = []
    split = 0
    for instr in program.instructions:
        ranges = _partition_ranges(instr, options)
        if len(ranges) < 2:
            result.append(instr)
            continue
        split += 1
        pieces = [instr]  # the first piece is the original, narrowed in place (it keeps its id)
        for _ in ranges[1:]:
            piece = bir_pb2.Instruction()
            piece.CopyFrom(instr)
            piece.id = next_id
            next_id += 1
            pieces.append(piece)
        name = instr.name
        for part, (piece, (first, last)) in enumerate(zip(pieces, ranges, strict=True)):
            piece.name = f"{name}/part{part}"
            for ap in [*piece.inputs, *piece.outputs]:
                _narrow(ap, first, last)
        result += pieces
    if split:
        birutil.set_order(program, result)
        ctx.instructions_changed()
    ctx.set_stat("dmas_split", split)
    ctx.set_stat("instructions", len(program.instructions))


def _partition_ranges(instr: bir_pb2.Instruction, options: Options) -> list[tuple[int, int]]:
    """The partition ranges to cut `instr` into ([] when it stays whole)."""
    if instr.op != "dma" or len(instr.inputs) != 1 or len(instr.outputs) != 1:
        return []
    sides = {ap.memory == common_pb2.HBM: ap for ap in (instr.inputs[0], instr.outputs[0])}
    if set(sides) != {True, False}:
        return []  # HBM to HBM or on chip to on chip: no partition walk to split along
    hbm, onchip = sides[True], sides[False]
    partitions = onchip.partition_count
    free = 1
    for dim in onchip.dims:
        free *= dim.count
    rest = 1
    for dim in hbm.dims[1:]:
        rest *= dim.count
    if not hbm.dims or hbm.dims[0].count != partitions or rest != free:
        return []
    total = partitions * free * itemsize(onchip.dtype)
    parts = dma_pieces(partitions, total, options.max_parts, options.min_bytes)
    if parts < 2:
        return []
    bounds = [partitions * k // parts for k in range(parts + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _narrow(ap: bir_pb2.AccessPattern, first: int, last: int) -> None:
    """Restrict an operand to partitions (rows, on the HBM side) [first, last)."""
    if ap.memory == common_pb2.HBM:
        ap.offset += first * ap.dims[0].stride
        ap.dims[0].count = last - first
    else:
        ap.partition_start += first
        ap.partition_count = last - first
