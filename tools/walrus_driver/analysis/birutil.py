"""Facts about BIR instructions that several passes need: engines, op tables, operand footprints.

A *footprint* is the box of memory one operand touches: a partition range times a byte range for
SBUF/PSUM (relative to the buffer, or absolute once the buffer has an address) and an element
range hull for HBM. Dependence analysis, allocation and the verifier all reason in footprints.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, NamedTuple

from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.common import dtypes
from ncc.tools.common.errors import CompileError
from ncc.tools.target import ENGINE_NAMES
from ncc.tools.target.costs import streamed_inputs

PE, ACT, POOL, DVE, SP = common_pb2.PE, common_pb2.ACT, common_pb2.POOL, common_pb2.DVE, common_pb2.SP
SBUF, PSUM, HBM = common_pb2.SBUF, common_pb2.PSUM, common_pb2.HBM
ONCHIP = (SBUF, PSUM)
ALL_ENGINES = (PE, ACT, POOL, DVE, SP)
MEMORY_NAMES = {SBUF: "SBUF", PSUM: "PSUM", HBM: "HBM"}

# op -> engines allowed to run it (docs/ir.md); None = any engine (dma is triggered anywhere).
OP_ENGINES: dict[str, frozenset[int] | None] = {
    "dma": None,
    "dma_gather": frozenset({POOL}),  # software DGE: descriptors made from run-time indices
    "dma_scatter": frozenset({POOL}),
    "matmul": frozenset({PE}),
    "transpose": frozenset({PE}),  # out[f, p] = in0[p, f], into PSUM
    "activation": frozenset({ACT}),
    "tensor_tensor": frozenset({DVE, POOL}),
    "tensor_scalar": frozenset({DVE, POOL}),
    "tensor_reduce": frozenset({DVE}),
    "tensor_copy": frozenset({DVE, ACT, POOL}),
    "iota": frozenset({POOL}),
    "select": frozenset({POOL, DVE}),
    "affine_select": frozenset({POOL}),  # keeps in0 where offset + p·a + f·b >= 0, else a fill
    "nop": None,
    "drain": frozenset({DVE, POOL}),  # a wait off the shared SBUF port (sync_dve_pool)
    "sem_reset": frozenset({SP}),  # sets every semaphore to 0 (semaphore_reset)
}

# op -> (number of inputs, number of outputs).
OP_ARITY: dict[str, tuple[int, int]] = {
    "dma": (1, 1),
    "dma_gather": (2, 1),  # (HBM table, SBUF indices) -> SBUF rows
    "dma_scatter": (2, 1),  # (SBUF rows, SBUF indices) -> HBM table
    "matmul": (2, 1),
    "transpose": (1, 1),
    "activation": (1, 1),
    "tensor_tensor": (2, 1),
    "tensor_scalar": (1, 1),
    "tensor_reduce": (1, 1),
    "tensor_copy": (1, 1),
    "iota": (0, 1),
    "select": (3, 1),
    "affine_select": (1, 1),
    "nop": (0, 0),
    "drain": (0, 0),
    "sem_reset": (0, 0),
}
# op -> (inputs, outputs) it may take beyond OP_ARITY's: an activation's per-partition scale and
# bias operands and the per-partition sum of what it wrote (docs/ir.md).
OPTIONAL_OPERANDS: dict[str, tuple[int, int]] = {"activation": (2, 1)}


def per_partition(ap: bir_pb2.AccessPattern) -> bool:
    """Whether an on-chip operand holds one element per partition (stride 0 across its free dims)."""
    return all(d.count <= 1 or d.stride == 0 for d in ap.dims)


_MAX_WIDTHS = 8  # row views tried per HBM tensor (hbm_widths)
_ITEMSIZE = {dtype: dtypes.itemsize(dtype) for dtype in (common_pb2.F32, common_pb2.BF16, common_pb2.S32)}


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
    count = 1
    for d in ap.dims:  # free_elements, inlined: the verifier asks for every operand
        count *= d.count
    if ap.memory in ONCHIP:
        return ap.partition_count * count
    return count


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


class Footprint(NamedTuple):
    """A box of memory touched by one operand: [p0, p1) x [b0, b1).

    On chip: partitions [p0, p1) x bytes [b0, b1). In HBM the tensor is seen as rows of its last
    dimension's width W: columns [p0, p1) x rows [b0, b1) (rows second, so that the lookup pages
    of the analyzer cut along rows). A strided access is modelled by its exact box when it is
    one (a tile, a column block, a transposed tile), else by a box that contains it; every
    user compares boxes only with boxes of the same model, so a superset costs an edge, never a
    missed conflict. anti_dependency_analyzer, the one user, compares boxes inline in its hot loop."""

    memory: int
    region: str  # buffer name (virtual), "" (allocated on-chip address space) or HBM tensor name
    p0: int
    p1: int
    b0: int
    b1: int
    write: bool


def hbm_box(ap: bir_pb2.AccessPattern, width: int) -> tuple[int, int, int, int] | None:
    """(col0, col1, row0, row1) of an HBM access in its tensor seen as rows of `width` elements;
    None if it touches nothing. Exact when the access is a box in that view: one dim of stride 1
    within a row, every other stride a multiple of the width (so transposed and column tiles are
    exact); else every column of the rows its element range spans."""
    offset = ap.offset
    lo = hi = 0
    unit_count = 0
    aligned = True
    for d in ap.dims:
        count, stride = d.count, d.stride
        if count <= 0:
            return None
        if count == 1:
            continue
        reach = stride * (count - 1)
        if reach < 0:
            lo += reach
        else:
            hi += reach
        if stride == 1 and not unit_count:
            unit_count = count
        elif stride % width:
            aligned = False
    width = max(1, width)
    col = offset % width
    if aligned:
        inner = unit_count or 1
        if col + inner <= width:
            outer_lo, outer_hi = lo, hi - (inner - 1)
            return col, col + inner, (offset + outer_lo) // width, (offset + outer_hi) // width + 1
    return 0, width, (offset + lo) // width, (offset + hi) // width + 1


def operand_box(
    ap: bir_pb2.AccessPattern,
    buffers: dict[str, bir_pb2.Buffer],
    use_addresses: bool,
    where: str,
    widths: dict[str, int] | None = None,
) -> tuple[str, int, int, int, int] | None:
    """(region, p0, p1, b0, b1) of one operand; None if it touches nothing. HBM boxes use the
    tensor's row width from `widths` (absent: the whole tensor is one row)."""
    memory = ap.memory
    if memory == HBM:
        width = widths.get(ap.tensor, 0) if widths else 0
        box = hbm_box(ap, width or (1 << 62))
        return None if box is None else (ap.tensor, *box)
    if memory != SBUF and memory != PSUM:
        raise CompileError("E405", f"{where}: operand {ap.tensor!r} has no memory class", where)
    buffer = buffers.get(ap.tensor)
    if buffer is None:
        raise CompileError("E405", f"{where}: operand names unknown buffer {ap.tensor!r}", where)
    span = element_span(ap)
    if span is None or ap.partition_count <= 0:
        return None
    lo, hi = span
    size = _ITEMSIZE.get(ap.dtype) or dtypes.itemsize(ap.dtype)
    base, region = (buffer.address, "") if use_addresses else (0, ap.tensor)
    start = ap.partition_start
    first = base + ap.offset
    return region, start, start + ap.partition_count, first + lo * size, first + (hi + 1) * size


def hbm_widths(program: bir_pb2.Program) -> dict[str, int]:
    """Row width of every HBM tensor, the view hbm_box cuts its accesses in: of the widths its shape
    offers (the product of its last k dimensions, k < rank) and the row strides its accesses walk
    (a stride that divides the tensor), the one in which most of the program's writes to it are
    exact boxes, then most of its reads (two reads never conflict); the last dimension on a tie.
    Why: a [128, 4, 64] tensor written as four [128, 64] column blocks (stride 256) is exact in
    rows of 256, while in rows of 64 each block's hull spans every row and the four stores,
    disjoint, would wait for each other. A stride the shape does not offer: a [2048, 8, 128] KV
    cache stored as [128, 2048] tiles, each partition two positions at a stride of sixteen, is
    exact only in rows of 16,384 (eight column blocks side by side)."""
    widths: dict[str, int] = {}
    choices: dict[str, list[int]] = {}
    sizes: dict[str, int] = {}
    for tensor in program.hbm:
        candidates = _suffix_widths(tuple(tensor.shape))
        widths[tensor.name] = candidates[0]
        choices[tensor.name] = candidates
        sizes[tensor.name] = math.prod(max(1, d) for d in tensor.shape)
    accesses = [(ap, write) for instr in program.instructions
                for write, operands in ((False, instr.inputs), (True, instr.outputs))
                for ap in operands if ap.memory == HBM and ap.tensor in choices]
    for ap, _ in accesses:
        candidates, size = choices[ap.tensor], sizes[ap.tensor]
        for d in ap.dims:
            if (d.count > 1 and 1 < d.stride < size and not size % d.stride and d.stride not in candidates
                    and len(candidates) < _MAX_WIDTHS):
                candidates.append(d.stride)
    # per view: (exact writes, exact reads); writes first, since two reads never conflict
    scores = {name: [[0, 0] for _ in views] for name, views in choices.items() if len(views) > 1}
    if not scores:
        return widths
    for ap, write in accesses:
        score = scores.get(ap.tensor)
        if score is not None:
            for k, width in enumerate(choices[ap.tensor]):
                score[k][not write] += exact_in_rows(ap, width)
    for name, score in scores.items():
        widths[name] = choices[name][score.index(max(score))]
    return widths


def _suffix_widths(shape: tuple[int, ...]) -> list[int]:
    """The row widths a shape offers: its last dimension, then the products with the ones before
    it (never the whole tensor), without repeats; [1] for a scalar."""
    widths: list[int] = []
    product = 1
    for dim in reversed(shape[1:] if len(shape) > 1 else shape):
        product *= max(1, dim)
        if product not in widths:
            widths.append(product)
    return widths or [1]


def exact_in_rows(ap: bir_pb2.AccessPattern, width: int) -> bool:
    """Whether the HBM access is exactly a box in rows of `width`: one stride-1 dimension within a
    row, and the other dimensions walking consecutive rows (their strides, smallest first, are the
    width and then each the product of the one before and its count)."""
    unit = 1
    outer: list[tuple[int, int]] = []
    for d in ap.dims:
        if d.count <= 1 or d.stride == 0:
            continue
        if d.stride == 1 and unit == 1:
            unit = d.count
        elif d.stride % width:
            return False
        else:
            outer.append((d.stride, d.count))
    if ap.offset % width + unit > width:
        return False
    expected = width
    for stride, count in sorted(outer):
        if stride != expected:
            return False
        expected = stride * count
    return True


class Operands(NamedTuple):
    """What a compute instruction's cost depends on besides its op and engine (costs.py): its
    number of inputs, the largest operand's free elements per partition, a matmul's moving free
    elements (1 for other ops), whether an input is fp32, and the memories of its operands."""

    inputs: int
    free: int
    moving_free: int
    fp32: bool
    memories: frozenset[int]


_MEMORY_SETS: dict[int, frozenset[int]] = {}  # bit mask of memories -> the one frozenset of them


def memory_set(mask: int) -> frozenset[int]:
    """The memories whose bits (1 << memory) are set in `mask`, one shared frozenset per mask."""
    memories = _MEMORY_SETS.get(mask)
    if memories is None:
        memories = _MEMORY_SETS[mask] = frozenset(m for m in range(mask.bit_length()) if mask >> m & 1)
    return memories


class Footprints(list):
    """footprints()'s boxes, and the on-chip buffers the instruction names (`touched`: what
    touched_buffers gives, in first-use order, every operand counted, even one that touches
    nothing). The analyzer keeps these per instruction (ctx.footprint_cache) for as long as the
    operands stay as they are, so the passes after it read `touched` without walking them again.

    `operands`: the facts the cost model prices the instruction by, read in the same walk (None
    when an operand has a dimension of count <= 0: the cost model then reads them itself). The
    analyzer hands them to the cost table and drops them."""

    __slots__ = ("touched", "operands")

    def __init__(self) -> None:
        super().__init__()
        self.touched: tuple[str, ...] = ()
        self.operands: Operands | None = None


def footprints(
    instr: bir_pb2.Instruction,
    buffers: dict[str, bir_pb2.Buffer],
    use_addresses: bool,
    widths: dict[str, int] | None = None,
) -> Footprints:
    """Every box the instruction reads or writes (a matmul that accumulates also reads its output).

    The boxes operand_box gives operand by operand, with the on-chip case (nearly every operand)
    computed inline, element_span included; the same walk reads the cost model's Operands. The
    analyzer calls this once per instruction: at 100k instructions, every call, tuple and field
    read here is a visible part of the compile."""
    result = Footprints()
    append = result.append
    touched: dict[str, None] = {}
    new = tuple.__new__
    op = instr.op
    accumulating = instr.accumulate and op == "matmul"
    free = 0  # the largest operand's free elements; -1 once a count <= 0 leaves Operands unknown
    mask = 0  # the memories of the operands, a bit each
    fp32 = False
    scalars = 0  # on-chip inputs of one element per partition (target/costs.py: streamed_inputs)
    inputs = instr.inputs
    for write, operands in ((False, inputs), (True, instr.outputs)):
        for ap in operands:
            memory = ap.memory
            mask |= 1 << memory
            if memory != SBUF and memory != PSUM:  # HBM, or no memory class (operand_box raises E405)
                hbm = operand_box(ap, buffers, use_addresses, instr.name, widths)
                if hbm is not None:
                    append(new(Footprint, (memory, *hbm, write)))
                    if write and accumulating:
                        append(new(Footprint, (memory, *hbm, False)))
                elements = free_elements(ap)
                if elements > free >= 0:
                    free = elements
                if not write and ap.dtype == common_pb2.F32:
                    fp32 = True
                continue
            tensor = ap.tensor
            touched[tensor] = None
            buffer = buffers.get(tensor)
            if buffer is None:
                operand_box(ap, buffers, use_addresses, instr.name, widths)  # raises E405
            lo = hi = 0
            elements = 1
            for d in ap.dims:
                count = d.count
                if count <= 0:
                    free = -1
                    break  # it touches nothing
                elements *= count
                reach = d.stride * (count - 1)
                if reach < 0:
                    lo += reach
                else:
                    hi += reach
            else:
                if elements > free >= 0:
                    free = elements
                dtype = ap.dtype
                if not write:
                    fp32 = fp32 or dtype == common_pb2.F32
                    scalars += lo == hi == 0  # every dimension of stride 0 or count 1
                partitions = ap.partition_count
                if partitions <= 0:
                    continue
                size = _ITEMSIZE.get(dtype) or dtypes.itemsize(dtype)
                first, region = (buffer.address + ap.offset, "") if use_addresses else (ap.offset, tensor)
                start, b0, b1 = ap.partition_start, first + lo * size, first + (hi + 1) * size
                append(new(Footprint, (memory, region, start, start + partitions, b0, b1, write)))
                if write and accumulating:
                    append(new(Footprint, (memory, region, start, start + partitions, b0, b1, False)))
    result.touched = tuple(touched)
    if free >= 0:
        count = streamed_inputs(len(inputs), scalars, free)
        moving = moving_free(op, inputs)
        result.operands = Operands(count, free, moving, fp32, memory_set(mask))
    return result


def moving_free(op: str, inputs) -> int:
    """What a PE op streams through the array: a matmul's moving free elements, a transpose's
    identity (its input's partitions); 1 for every other op (costs.Operands.moving_free)."""
    if op == "matmul" and len(inputs) > 1:
        return free_elements(inputs[1])
    if op == "transpose" and inputs:
        return inputs[0].partition_count
    return 1


def touched_buffers(instr: bir_pb2.Instruction, cache: dict[int, Any] | None = None) -> set[str]:
    """The SBUF/PSUM buffers the instruction's operands name. With `cache` (ctx.footprint_cache):
    from its Footprints of the instruction when it holds them, without reading the operands."""
    cached = cache.get(instr.id) if cache else None
    if isinstance(cached, Footprints):
        return set(cached.touched)
    return {ap.tensor for ap in [*instr.inputs, *instr.outputs] if ap.memory in ONCHIP}


def live_ranges(instructions: Iterable[bir_pb2.Instruction], cache: dict[int, Any] | None = None
                ) -> dict[str, tuple[int, int]]:
    """Each on-chip buffer's live range in this order: the positions of the first and last
    instructions that name it (touched_buffers)."""
    live: dict[str, tuple[int, int]] = {}
    for position, instr in enumerate(instructions):
        for name in touched_buffers(instr, cache):
            first, _ = live.get(name, (position, position))
            live[name] = (first, position)
    return live


def live_together(
    buffers: list[bir_pb2.Buffer], live: dict[str, tuple[int, int]]
) -> list[tuple[bir_pb2.Buffer, bir_pb2.Buffer, int]]:
    """Pairs of allocated buffers (of one memory) that share bytes while both are `live` (first,
    last position), as (the one at the lower address, the other, the end of the shared bytes):
    what allocation must never produce for the order it allocated. A sweep over live ranges,
    comparing each buffer only with the buffers live when it starts (a set bounded by the
    memory's size)."""
    used = sorted(
        ((live[b.name][0], live[b.name][1], b) for b in buffers if b.name in live and b.bytes_per_partition),
        key=lambda entry: entry[:2],  # (buffers do not compare: ties keep the given order)
    )
    found = []
    active: list[tuple[int, int, int, bir_pb2.Buffer]] = []  # (last use, address, end address, buffer)
    for start, end, b in used:
        active = [entry for entry in active if entry[0] >= start]
        b_address = b.address
        b_end = b_address + b.bytes_per_partition * max(1, b.slots)  # every copy of a rotating one
        for _, a_address, a_end, a in active:
            if a_address < b_end and b_address < a_end:
                first, second = (a, b) if a_address <= b_address else (b, a)
                found.append((first, second, min(a_end, b_end)))
        active.append((end, b_address, b_end, b))
    return found


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
    """Bytes a dma moves: its on-chip side (an indirect dma names the whole HBM table it may touch)."""
    if instr.op == "dma_scatter":
        return operand_bytes(instr.inputs[0])
    return operand_bytes(instr.outputs[0]) if instr.outputs else 0


def buffer_map(program: bir_pb2.Program) -> dict[str, bir_pb2.Buffer]:
    return {b.name: b for b in program.buffers}


SBUF_ALIGN = 64  # bytes: where allocation places SBUF buffers (its default `sbuf_align`)

# Inside a loop of an engine stream an on-chip operand names its memory as a whole, at its
# absolute address (docs/ir.md, Loops): the buffers that span each memory from address 0.
WHOLE_MEMORY = {SBUF: "@SBUF", PSUM: "@PSUM"}


def add_whole_memories(program: bir_pb2.Program, target: Any, memories: Iterable[int]) -> None:
    """Declare the whole-memory buffers of `memories` (WHOLE_MEMORY) that the program lacks."""
    present = {b.name for b in program.buffers}
    for memory in sorted(set(memories)):
        if WHOLE_MEMORY[memory] not in present:
            size = target.sbuf_usable_bytes if memory == SBUF else target.psum_bytes_per_partition
            program.buffers.add(name=WHOLE_MEMORY[memory], memory=memory, partitions=target.partitions,
                                bytes_per_partition=size, address=0)


def sbuf_holds_every_buffer(program: bir_pb2.Program, capacity: int) -> bool:
    """Do all the program's SBUF buffers, aligned, fit in `capacity` bytes per partition at once?
    Then allocation (next fit) gives each fresh space and no buffer reuses another's."""
    sizes = (b.bytes_per_partition for b in program.buffers if b.memory == SBUF)
    return sum(-(-size // SBUF_ALIGN) * SBUF_ALIGN for size in sizes) <= capacity


def set_order(program: bir_pb2.Program, order: list[bir_pb2.Instruction]) -> None:
    """Make `order` the program's instruction list. Instructions already in it are sorted in place
    and new ones (by id) appended first: rebuilding the list (del + extend) copies every message
    while the old ones are still alive, a gigabyte at a million instructions."""
    ids = [instr.id for instr in order]  # read once: each read of a field costs a message lookup
    present = {instr.id for instr in program.instructions}
    added = [instr for instr, node in zip(order, ids, strict=True) if node not in present]
    if len(present) + len(added) != len(order):
        raise ValueError("set_order: the new order must hold every instruction once")
    for instr in added:
        program.instructions.append(instr)
    rank = {node: position for position, node in enumerate(ids)}
    program.instructions.sort(key=lambda instr: rank[instr.id])


def next_instruction_id(program: bir_pb2.Program) -> int:
    ids = [i.id for i in program.instructions]
    ids += [i.id for s in program.streams for i in s.instructions]
    return max(ids, default=-1) + 1
