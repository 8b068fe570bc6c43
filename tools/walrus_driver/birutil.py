"""Facts about BIR instructions that several passes need: engines, op tables, operand footprints.

A *footprint* is the box of memory one operand touches: a partition range times a byte range for
SBUF/PSUM (relative to the buffer, or absolute once the buffer has an address) and an element
range hull for HBM. Dependence analysis, allocation and the verifier all reason in footprints.
"""

from __future__ import annotations

from dataclasses import dataclass

from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.common import dtypes
from ncc.tools.common.errors import CompileError
from ncc.tools.target import ENGINE_NAMES

PE, ACT, POOL, DVE, SP = common_pb2.PE, common_pb2.ACT, common_pb2.POOL, common_pb2.DVE, common_pb2.SP
SBUF, PSUM, HBM = common_pb2.SBUF, common_pb2.PSUM, common_pb2.HBM
ONCHIP = (SBUF, PSUM)
ALL_ENGINES = (PE, ACT, POOL, DVE, SP)
MEMORY_NAMES = {SBUF: "SBUF", PSUM: "PSUM", HBM: "HBM"}

# op -> engines allowed to run it (docs/ir.md); None = any engine (dma is triggered anywhere).
OP_ENGINES: dict[str, frozenset[int] | None] = {
    "dma": None,
    "matmul": frozenset({PE}),
    "activation": frozenset({ACT}),
    "tensor_tensor": frozenset({DVE, POOL}),
    "tensor_scalar": frozenset({DVE, POOL}),
    "tensor_reduce": frozenset({DVE}),
    "tensor_copy": frozenset({DVE, ACT, POOL}),
    "iota": frozenset({POOL}),
    "select": frozenset({POOL, DVE}),
    "nop": None,
}

# op -> (number of inputs, number of outputs).
OP_ARITY: dict[str, tuple[int, int]] = {
    "dma": (1, 1),
    "matmul": (2, 1),
    "activation": (1, 1),
    "tensor_tensor": (2, 1),
    "tensor_scalar": (1, 1),
    "tensor_reduce": (1, 1),
    "tensor_copy": (1, 1),
    "iota": (0, 1),
    "select": (3, 1),
    "nop": (0, 0),
}


def engine_name(engine: int) -> str:
    return ENGINE_NAMES.get(engine, f"engine{engine}")


def memory_name(memory: int) -> str:
    return MEMORY_NAMES.get(memory, f"memory{memory}")


def free_elements(ap: bir_pb2.AccessPattern) -> int:
    """Elements per partition (on chip) or in total (HBM) that the dims walk."""
    count = 1
    for d in ap.dims:
        count *= d.count
    return count


def element_count(ap: bir_pb2.AccessPattern) -> int:
    """Elements of the operand's logical shape: [partition_count, counts...] on chip, [counts...] in HBM."""
    if ap.memory in ONCHIP:
        return ap.partition_count * free_elements(ap)
    return free_elements(ap)


def element_span(ap: bir_pb2.AccessPattern) -> tuple[int, int] | None:
    """(lowest, highest) element index the dims reach relative to the offset; None if empty."""
    lo = hi = 0
    for d in ap.dims:
        if d.count <= 0:
            return None
        reach = d.stride * (d.count - 1)
        if reach < 0:
            lo += reach
        else:
            hi += reach
    return lo, hi


def operand_bytes(ap: bir_pb2.AccessPattern) -> int:
    return element_count(ap) * dtypes.itemsize(ap.dtype)


@dataclass(frozen=True)
class Footprint:
    """A box of memory touched by one operand: partitions [p0, p1) x bytes (or HBM elements) [b0, b1)."""

    memory: int
    region: str  # buffer name (virtual), "" (allocated on-chip address space) or HBM tensor name
    p0: int
    p1: int
    b0: int
    b1: int
    write: bool

    def overlaps(self, other: Footprint) -> bool:
        return self.p0 < other.p1 and other.p0 < self.p1 and self.b0 < other.b1 and other.b0 < self.b1

    def covers(self, other: Footprint) -> bool:
        return self.p0 <= other.p0 and other.p1 <= self.p1 and self.b0 <= other.b0 and other.b1 <= self.b1


def operand_box(
    ap: bir_pb2.AccessPattern, buffers: dict[str, bir_pb2.Buffer], use_addresses: bool, where: str
) -> tuple[str, int, int, int, int] | None:
    """(region, p0, p1, b0, b1) of one operand; None if it touches nothing."""
    span = element_span(ap)
    if span is None:
        return None
    lo, hi = span
    if ap.memory in ONCHIP:
        buffer = buffers.get(ap.tensor)
        if buffer is None:
            raise CompileError("E405", f"{where}: operand names unknown buffer {ap.tensor!r}", where)
        if ap.partition_count <= 0:
            return None
        size = dtypes.itemsize(ap.dtype)
        base, region = (buffer.address, "") if use_addresses else (0, ap.tensor)
        return (
            region,
            ap.partition_start,
            ap.partition_start + ap.partition_count,
            base + ap.offset + lo * size,
            base + ap.offset + (hi + 1) * size,
        )
    if ap.memory == HBM:
        return ap.tensor, 0, 1, ap.offset + lo, ap.offset + hi + 1
    raise CompileError("E405", f"{where}: operand {ap.tensor!r} has no memory class", where)


def footprints(
    instr: bir_pb2.Instruction, buffers: dict[str, bir_pb2.Buffer], use_addresses: bool
) -> list[Footprint]:
    """Every box the instruction reads or writes (a matmul that accumulates also reads its output)."""
    result = []
    operands = [(ap, False) for ap in instr.inputs] + [(ap, True) for ap in instr.outputs]
    if instr.op == "matmul" and instr.accumulate:
        operands += [(ap, False) for ap in instr.outputs]
    for ap, write in operands:
        box = operand_box(ap, buffers, use_addresses and ap.memory in ONCHIP, instr.name)
        if box is not None:
            result.append(Footprint(ap.memory, *box, write=write))
    return result


def touched_buffers(instr: bir_pb2.Instruction) -> set[str]:
    return {ap.tensor for ap in [*instr.inputs, *instr.outputs] if ap.memory in ONCHIP}


def dma_direction(instr: bir_pb2.Instruction) -> str:
    """'load' (HBM -> chip), 'store' (chip -> HBM) or 'copy' (anything else)."""
    src = instr.inputs[0].memory if instr.inputs else HBM
    dst = instr.outputs[0].memory if instr.outputs else HBM
    if src == HBM and dst in ONCHIP:
        return "load"
    if src in ONCHIP and dst == HBM:
        return "store"
    return "copy"


def transfer_bytes(instr: bir_pb2.Instruction) -> int:
    return operand_bytes(instr.outputs[0]) if instr.outputs else 0


def buffer_map(program: bir_pb2.Program) -> dict[str, bir_pb2.Buffer]:
    return {b.name: b for b in program.buffers}


def next_instruction_id(program: bir_pb2.Program) -> int:
    ids = [i.id for i in program.instructions]
    ids += [i.id for s in program.streams for i in s.instructions]
    return max(ids, default=-1) + 1
