"""Assign an address to every SBUF and PSUM buffer by linear scan over the current instruction order.

A buffer is live from the first to the last instruction that touches it (in program.instructions
order, so run this after the scheduler). Buffers are taken in order of their first use; buffers
whose last use is strictly before that point are freed, and the new buffer gets the lowest
address where it fits (first fit) among the live ones. Every buffer occupies
[address, address + bytes_per_partition) in each of its partitions, and all buffers start at
partition 0, so the problem is one-dimensional per memory.

  SBUF  within target.sbuf_usable_bytes per partition, addresses aligned to `sbuf_align`.
  PSUM  within the PSUM bytes per partition; a buffer of at most one bank (2 KiB) never crosses a
        bank boundary, a larger one starts on a bank boundary.

Running out of space is E403, naming the buffer and the bytes needed and free. Reusing freed
space creates new WAR/WAW hazards between different buffers, so the dependence graph is no
longer valid for addresses: anti_dependency_analyzer must run again before alloc_semaphores.
"""

from __future__ import annotations

from dataclasses import dataclass

from ncc.schemas import bir_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.walrus_driver import birutil
from ncc.tools.walrus_driver.context import PassContext
from ncc.tools.walrus_driver.registry import register

NAME = "allocation"
MAX_HOLDERS_SHOWN = 4  # a diagnostic is one line: name the largest live buffers, count the rest


@dataclass
class Options:
    sbuf_align: int = 64  # bytes
    psum_align: int = 4  # bytes (one fp32)
    policy: str = "next_fit"  # next_fit (rotate through free space) | first_fit (lowest address)


def _policy(text: str) -> bool:
    if text not in ("next_fit", "first_fit"):
        raise CompileError("E400", f"allocation: policy must be next_fit or first_fit, not {text!r}")
    return text == "next_fit"


@dataclass
class _Live:
    name: str
    start: int
    end: int
    address: int
    size: int


@register(NAME, Options)
def run(ctx: PassContext) -> None:
    options: Options = ctx.options or Options()
    ctx.forbid_after_sync()
    program, target = ctx.program, ctx.target
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for position, instr in enumerate(program.instructions):
        for name in birutil.touched_buffers(instr):
            first.setdefault(name, position)
            last[name] = position

    for memory in birutil.ONCHIP:
        buffers = [b for b in program.buffers if b.memory == memory]
        if memory == birutil.SBUF:
            capacity, align, bank = target.sbuf_usable_bytes, options.sbuf_align, 0
        else:
            capacity, align, bank = (
                target.psum_bytes_per_partition,
                options.psum_align,
                target.psum_bank_bytes,
            )
        next_fit = _policy(options.policy)
        _allocate(
            ctx, birutil.memory_name(memory), buffers, first, last, capacity, max(1, align), bank, next_fit
        )

    ctx.allocated = True
    ctx.addresses_changed()


def _allocate(
    ctx: PassContext,
    memory: str,
    buffers: list[bir_pb2.Buffer],
    first: dict[str, int],
    last: dict[str, int],
    capacity: int,
    align: int,
    bank: int,
    next_fit: bool,
) -> None:
    # Untouched buffers get a live range before everything, so they never constrain the others.
    ordered = sorted(buffers, key=lambda b: (first.get(b.name, -1), -b.bytes_per_partition, b.name))
    live: list[_Live] = []
    used_ever: list[tuple[int, int]] = []
    peak = reused = cursor = 0
    for buffer in ordered:
        start, end = first.get(buffer.name, -1), last.get(buffer.name, -1)
        live = [entry for entry in live if entry.end >= start]
        size = buffer.bytes_per_partition
        address = _fit(live, size, capacity, align, bank, cursor if next_fit else 0)
        if address is None:
            free = _largest_gap(live, capacity)
            biggest = sorted(live, key=lambda e: -e.size)[:MAX_HOLDERS_SHOWN]
            holders = ", ".join(f"{e.name}@{e.address}+{e.size}" for e in biggest)
            if len(live) > len(biggest):
                holders += f" and {len(live) - len(biggest)} more ({sum(e.size for e in live)} bytes in all)"
            raise CompileError(
                "E403",
                f"allocation: {memory} buffer '{buffer.name}' needs {size} bytes per partition but only "
                f"{free} contiguous bytes of {capacity} are free while it is live "
                f"(live: {holders or 'none'})",
                buffer.name,
            )
        buffer.address = address
        cursor = address + size
        if any(a < address + size and address < b for a, b in used_ever):
            reused += 1
        used_ever.append((address, address + size))
        live.append(_Live(buffer.name, start, end, address, size))
        peak = max(peak, max(e.address + e.size for e in live))
    prefix = memory.lower()
    ctx.set_stat(f"{prefix}_buffers", len(buffers))
    ctx.set_stat(f"{prefix}_peak_bytes", peak)
    ctx.set_stat(f"{prefix}_reused_buffers", reused)
    ctx.set_stat(f"{prefix}_total_bytes_unshared", sum(b.bytes_per_partition for b in buffers))


def _fit(live: list[_Live], size: int, capacity: int, align: int, bank: int, cursor: int) -> int | None:
    """The first aligned address at or after `cursor` (wrapping around to 0) where `size` bytes fit
    among the live buffers and obey the bank rule; None if there is none."""
    if size > capacity:
        return None
    occupied = sorted((e.address, e.address + e.size) for e in live)
    found = _search(occupied, size, capacity, align, bank, cursor)
    return found if found is not None or cursor == 0 else _search(occupied, size, capacity, align, bank, 0)


def _search(
    occupied: list[tuple[int, int]], size: int, capacity: int, align: int, bank: int, candidate: int
) -> int | None:
    while candidate + size <= capacity:
        candidate = _round_up(candidate, align)
        if bank:
            if size <= bank and candidate // bank != (candidate + size - 1) // bank:
                candidate = _round_up(candidate, bank)
            elif size > bank:
                candidate = _round_up(candidate, bank)
        if candidate + size > capacity:
            return None
        clash = next((hi for lo, hi in occupied if lo < candidate + size and candidate < hi), None)
        if clash is None:
            return candidate
        candidate = clash
    return None


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def _largest_gap(live: list[_Live], capacity: int) -> int:
    gap, cursor = 0, 0
    for lo, hi in sorted((e.address, e.address + e.size) for e in live):
        gap = max(gap, lo - cursor)
        cursor = max(cursor, hi)
    return max(gap, capacity - cursor)
