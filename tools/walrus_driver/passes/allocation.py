"""Assign an address to every SBUF and PSUM buffer by linear scan, spilling to HBM when SBUF is full.

A buffer is live from the first to the last instruction that touches it (in program.instructions
order, so run this after the scheduler). Buffers are taken in order of their first use; buffers
whose last use is before that point are freed, and the new buffer gets an aligned address where
it fits among the live ones (next fit: the search starts after the last address handed out and
wraps around, which spreads reuse; or first fit).

  SBUF  within target.sbuf_usable_bytes per partition, addresses aligned to `sbuf_align`.
  PSUM  within the PSUM bytes per partition; a buffer of at most one bank (2 KiB) never crosses a
        bank boundary, a larger one starts on a multiple of its largest power-of-two count of
        banks (two banks on an even bank), so that equal accumulators tile PSUM: four of two
        banks placed from banks 1, 3 and 5 left no two free banks side by side for the fourth,
        and allocation sent the LLaMA prefill back to the frontend's order.

Spilling. When an SBUF buffer X does not fit (too many bytes live, or no hole large enough), a
live buffer V that the instruction starting X does not touch and whose next use is furthest away
(Belady's choice) is split at that point: a store dma copies what V holds (the box its writes so
far cover) to a new INTERNAL HBM tensor right after V's last use before X, and a reload dma brings
it back into a new buffer V' right before V's next use; every later use of V reads V' instead.
V' is allocated when the scan reaches it, like any buffer, and may be spilled again. Victims are
taken until X fits, so the scan fails (E403) only when the buffers of one instruction cannot fit
together, and the message then says which constraint failed (size, bank rule). More than
`too_many_spills` spills mark the program `too_many_spills` (dep_reduction skips such programs).
PSUM buffers are never spilled (the scheduler bounds PSUM pressure; a dma cannot read PSUM).
A straight-line program whose scheduled order spills (at most `reschedule_spills` spills) is
scheduled again by pre_sched under the tighter RESCHEDULE_FRACTION and allocated again; the
layout that spills fewer bytes stands (`_allocate_straight`; `reschedule=0` turns it off).

Loops (a static program whose global order keeps loops, analysis/loopnest.py). Positions are
those of the static order, the body once. A buffer used inside a loop whose every iteration does
not hold it afresh (a loop-invariant tile, an accumulator, anything not `private_to` that loop or
a loop within it) is live over the loop's whole body, since every iteration uses it. A buffer
private to a loop gets `rotation` copies (`slots`) side by side, which the loop's iterations take
in turn (address rotation: iteration r uses copy r mod slots), so that an iteration's writes need
not wait for the previous iteration's readers of the same buffer; in PSUM only when the copies
keep the bank rule. When the buffers do not fit with their copies, the scan starts again with one
copy each. Where more than `max_rotating` buffers would rotate, every buffer has one copy from the
start: the dependence analysis after allocation sees a rotating buffer as the bytes of all its
copies, and its cost grows faster than the copies pay back (the 32-layer 7B decoder: 23,332
rotating buffers, 19.5M edges in 66 s against 1.0M in 23 s, a 136 s compile against 86 s).
A buffer used inside a loop is never spilled (its store and reload would run at every
iteration); the others are, at the top level.
Recently freed bytes. A buffer first used in a top-level loop B (or between loops, after B) is
placed, where it can be, away from the bytes of the (at most MAX_AVOIDED) buffers that died most
recently since the loop before B began (`_Layout.avoid_from`): that loop's buffers, and those of
B's body that an earlier instruction of the body is done with. They are dead by then, but
reusing their bytes is a hazard on chip: between the loops (B then waits for the whole loop
before it), and inside B between one iteration's last readers and the next iteration's first
writers of the shared bytes, which keeps the iterations from overlapping. Where nothing fits
away from them, the buffer takes freed bytes as before. Attention at seq 2048, d 512, rolled:
1,008 -> 896 us simulated (unrolled: 819), its softmax loop 368 -> 256 us; two layers at d
1,024: 3,643 -> 3,413 us (unrolled: 3,274). The bound keeps the scan linear: the training step,
whose loops stand among thousands of unrolled instructions, placed each buffer against every
buffer freed since its last loop, and allocation took 243 s instead of 11 (19 s with the bound).

Reusing freed space creates new WAR/WAW hazards between different buffers, so the dependence
graph is no longer valid for addresses: anti_dependency_analyzer must run again before
alloc_semaphores. When spills added instructions, the graph between virtual buffers is rebuilt
(with the spills) when a pass before that second analysis asks for it.
"""

from __future__ import annotations

import bisect
import heapq
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.common import dtypes
from ncc.tools.common.errors import CompileError
from ncc.tools.target import is_dma
from ncc.tools.walrus_driver.analysis import birutil, loopnest
from ncc.tools.walrus_driver.analysis.costs import CostTable
from ncc.tools.walrus_driver.context import PassContext
from ncc.tools.walrus_driver.passes import anti_dependency_analyzer, assign_hwdge_engine
from ncc.tools.walrus_driver.registry import register

NAME = "allocation"
MAX_HOLDERS_SHOWN = 4  # a diagnostic is one line: name the largest live buffers, count the rest
MAX_AVOIDED = 128  # freed buffers a placement keeps off, at most (the most recently freed)

# A position in the final order: (original index, slot, sequence). Original instructions are
# (i, 0, 0); a spill store after instruction i is (i, 1, seq); a reload before i is (i, -1, seq).
Key = tuple[int, int, int]


@dataclass
class Options:
    sbuf_align: int = birutil.SBUF_ALIGN  # bytes
    psum_align: int = 4  # bytes (one fp32)
    policy: str = "next_fit"  # next_fit (rotate through free space) | first_fit (lowest address)
    spill: bool = True  # spill SBUF buffers to HBM when they do not fit (else E403)
    rotation: int = 2  # copies of a buffer private to a loop's iterations (address rotation)
    # more buffers than this that would rotate: one copy each (module docstring, "Loops")
    max_rotating: int = 4096
    too_many_spills: int = 64  # more spills than this mark the program too_many_spills
    # schedule a straight-line program again under RESCHEDULE_FRACTION when pre_sched's spills
    # (at most `reschedule_spills` spills: past that they come from what a schedule does not
    # change, a chain of serial scatters, and the scan costs tens of seconds a try)
    reschedule: bool = True
    reschedule_spills: int = 512


# pre_sched's tighter pressure limit that _allocate_straight schedules again under (0.65 and 0.6
# left ConvNeXt's spills, and no measured program's best)
RESCHEDULE_FRACTION = 0.5


def _policy(text: str) -> bool:
    if text not in ("next_fit", "first_fit"):
        raise CompileError("E400", f"allocation: policy must be next_fit or first_fit, not {text!r}")
    return text == "next_fit"


@dataclass
class _Live:
    name: str
    start: Key
    end: Key
    address: int
    size: int


@dataclass
class _Layout:
    """Where instructions are in the final order and which buffers each touches."""

    instructions: dict[Key, bir_pb2.Instruction]
    uses: dict[str, list[Key]]  # buffer -> sorted keys of the instructions that touch it
    touched: dict[Key, set[str]]
    buffers: dict[str, bir_pb2.Buffer]
    next_id: int
    queue_load: Counter[int] = field(default_factory=Counter)  # bytes per dma queue, for spill dmas
    sequence: int = 0
    spills: int = 0
    spilled_bytes: int = 0
    new_buffers: list[bir_pb2.Buffer] = field(default_factory=list)
    # Loops: a buffer's live range where loops widen it (every use of it inside a loop it is not
    # private to keeps it live over the whole body), and the buffers used inside any loop
    ranges: dict[str, tuple[Key, Key]] = field(default_factory=dict)
    in_loops: set[str] = field(default_factory=set)
    # position -> the first position of the top-level loop before the latest one to start at or
    # before it (absent: before the second top-level loop)
    avoid_from: dict[int, int] = field(default_factory=dict)

    @classmethod
    def of(cls, program: bir_pb2.Program, costs: CostTable, cache: dict[int, Any] | None = None,
           nest: loopnest.LoopNest | None = None) -> _Layout:
        """The layout of the program's order; `cache`: the analyzer's footprints, which name each
        instruction's buffers (birutil.touched_buffers)."""
        instructions: dict[Key, bir_pb2.Instruction] = {}
        uses: dict[str, list[Key]] = {}
        touched: dict[Key, set[str]] = {}
        queue_load: Counter[int] = Counter()
        for position, instr in enumerate(program.instructions):
            key = (position, 0, 0)
            instructions[key] = instr
            names = birutil.touched_buffers(instr, cache)
            touched[key] = names
            for name in names:
                if name in uses:
                    uses[name].append(key)
                else:
                    uses[name] = [key]
            if is_dma(instr.op):
                queue_load[instr.dma_queue] += costs(instr).moved_bytes
        layout = cls(
            instructions,
            uses,
            touched,
            birutil.buffer_map(program),
            birutil.next_instruction_id(program),
            queue_load,
        )
        if nest:
            layout._widen_for_loops(program, nest)
        return layout

    def _widen_for_loops(self, program: bir_pb2.Program, nest: loopnest.LoopNest) -> None:
        live = {name: (keys[0][0], keys[-1][0]) for name, keys in self.uses.items()}
        self.in_loops = loopnest.widen_live_ranges(live, program.instructions, nest, self.buffers)
        for name in self.in_loops:
            first, last = live[name]
            self.ranges[name] = ((first, 0, 0), (last, 0, 0))
        owner = nest.owner_map()
        current = previous = None  # (top-level loop, its first position) now and before it
        for position, instr in enumerate(program.instructions):
            chain = nest.chain(owner[instr.id])
            top = chain[0] if chain else None
            if current is not None and top != current[0]:
                previous, current = current, None
            if top is not None and current is None:
                current = (top, position)
            if previous is not None:
                self.avoid_from[position] = previous[1]

    def next_key(self, anchor: Key, after: bool) -> Key:
        """A key just after `anchor` (a store) or just before it (a reload)."""
        self.sequence += 1
        if after:
            return (anchor[0], anchor[1] if anchor[1] else 1, self.sequence)
        return (anchor[0], -1, self.sequence)


@register(NAME, Options)
def run(ctx: PassContext) -> None:
    options: Options = ctx.options or Options()
    ctx.forbid_after_sync()
    program = ctx.program
    nest = ctx.loops()
    if nest:
        layout = _allocate_loops(ctx, options, nest)
    else:
        layout = _allocate_straight(ctx, options)
    if layout.spills:
        order = sorted(layout.instructions)
        birutil.set_order(program, [layout.instructions[key] for key in order])
        if layout.spills > options.too_many_spills:
            program.attributes["too_many_spills"] = "1"
        ctx.instructions_changed()
        # A pass between here and the analyzer's next run that reads the graph between virtual
        # buffers (assign_hwdge_engine) gets it rebuilt for the program with its spills; the
        # default pipelines run the analyzer next, which needs no such graph.
        ctx.deps_rebuild = lambda: anti_dependency_analyzer.analyze(ctx, use_addresses=False)
    ctx.set_stat("spills", layout.spills)
    ctx.set_stat("spilled_bytes_per_partition", layout.spilled_bytes)
    ctx.allocated = True
    ctx.addresses_changed()


def _allocate_straight(ctx: PassContext, options: Options) -> _Layout:
    """A straight-line program's layout. When the schedule pre_sched kept spills, pre_sched runs
    again on the order it received under a tighter pressure limit (its live-bytes model counts
    whole buffers, not where they fall, so a schedule at its limit may still not fit), and the
    layout that spills fewer bytes is kept: a ConvNeXt block 224 spills, 143 KiB a partition,
    1,578 us at 0.8; none, 869 us at 0.5; a MobileNet-v2 block 94 -> 16 spills, 889 -> 564 us."""
    if not options.reschedule or not ctx.scheduled or not ctx.order_before_schedule:
        return _allocate(ctx, options, None)
    from ncc.tools.walrus_driver.passes import pre_sched  # (it imports nothing of this pass)

    before = bir_pb2.Program()
    before.CopyFrom(ctx.program)
    order, triggers = list(ctx.order_before_schedule), dict(ctx.triggers_before_schedule or {})
    first = _allocate(ctx, options, None)
    if not first.spills or first.spills > options.reschedule_spills:
        return first
    placed = _placed(ctx, first)
    ctx.program.CopyFrom(before)
    ctx.order_before_schedule, ctx.triggers_before_schedule = list(order), dict(triggers)
    ctx.order_changed()
    _restore_order_before_schedule(ctx)  # (False: pre_sched kept that order, which stands as it is)
    pre_sched.schedule(ctx, pre_sched.Options(pressure_fraction=RESCHEDULE_FRACTION), ctx.require_deps(),
                       ctx.unpooled_dmas)
    second = _allocate(ctx, options, None)
    if second.spilled_bytes < first.spilled_bytes:
        ctx.set_stat("rescheduled_at", RESCHEDULE_FRACTION)
        return second
    ctx.program.CopyFrom(placed)  # the first schedule's layout stands
    ctx.order_before_schedule, ctx.triggers_before_schedule = order, triggers
    ctx.order_changed()
    first.instructions = dict(zip(sorted(first.instructions), ctx.program.instructions, strict=True))
    return first


def _placed(ctx: PassContext, layout: _Layout) -> bir_pb2.Program:
    """A copy of the program in `layout`'s order, spills included."""
    birutil.set_order(ctx.program, [layout.instructions[key] for key in sorted(layout.instructions)])
    placed = bir_pb2.Program()
    placed.CopyFrom(ctx.program)
    return placed


def _allocate_loops(ctx: PassContext, options: Options, nest: loopnest.LoopNest) -> _Layout:
    """A program that keeps loops: its private buffers with `rotation` copies, else with one;
    and if neither fits (a buffer used in a loop is never spilled), the same again in the order
    pre_sched received, whose live buffers the frontend's order bounds."""
    # (copies, back to the frontend's order, keep off recently freed bytes): the last is a
    # preference only, so it is dropped first (scattered buffers can leave no hole large enough)
    attempts = [(options.rotation, False, True), (options.rotation, False, False), (1, False, False),
                (options.rotation, True, False), (1, True, False)]
    if _set_slots(ctx, options.rotation) > options.max_rotating:
        attempts = [attempt for attempt in attempts if attempt[0] == 1]
    before = bir_pb2.Program()
    before.CopyFrom(ctx.program)  # what an attempt that fails leaves behind is undone from this
    for number, (copies, restore, avoid) in enumerate(attempts):
        if number:  # a failed attempt's spills renamed operands and added buffers and instructions
            ctx.program.CopyFrom(before)
            ctx.order_changed()
        if restore and not _restore_order_before_schedule(ctx):
            break
        _set_slots(ctx, copies)
        for buffer in ctx.program.buffers:
            if buffer.memory in birutil.ONCHIP:
                buffer.address = -1
        try:
            layout = _allocate(ctx, options, ctx.loops() if restore else nest, avoid)
        except CompileError as err:
            if err.code != "E403" or number == len(attempts) - 1:
                raise
            last = err
            continue
        ctx.set_stat("allocation_attempt", number + 1)
        return layout
    raise last


def _set_slots(ctx: PassContext, copies: int) -> int:
    """Give every buffer private to a loop up to `copies` slots: the most that divide the loop's
    trip count, so that the copies an iteration takes follow on across the iterations of the
    loops around it (loop_deps: then the loop's own rotation waits order those too); in PSUM
    only where each copy keeps the bank rule. Returns how many buffers rotate."""
    bank = ctx.target.psum_bank_bytes
    loops = {loop_id: int(entry.trip_count) for loop_id, entry in ctx.loop_entries.items()}
    rotating = 0
    for buffer in ctx.program.buffers:
        if not buffer.HasField("private_to") or buffer.memory not in birutil.ONCHIP:
            continue
        trip = loops.get(buffer.private_to, 1)
        slots = next((n for n in range(copies, 1, -1) if trip % n == 0), 1)
        size = buffer.bytes_per_partition
        if buffer.memory == birutil.PSUM and size and not (size % bank == 0 or bank % size == 0):
            slots = 1
        buffer.slots = slots if slots > 1 else 0
        rotating += slots > 1
    ctx.set_stat("rotating_buffers", rotating)
    return rotating


def _allocate(ctx: PassContext, options: Options, nest: loopnest.LoopNest, avoid: bool = False) -> _Layout:
    """PSUM, then SBUF (with spills); the layout of the order it allocated. `avoid`: keep a
    loop's buffers off recently freed bytes where they fit elsewhere (module docstring)."""
    program = ctx.program
    layout = _Layout.of(program, ctx.costs(), ctx.footprint_cache, nest)
    if not avoid:
        layout.avoid_from.clear()
    try:
        _allocate_psum(ctx, options, layout)
    except CompileError:
        # The scheduler interleaved more accumulation groups than PSUM holds. The order it was
        # given (the frontend's, one group at a time) is a valid order of the same program:
        # fall back to it rather than refuse the program.
        if not _restore_order_before_schedule(ctx):
            raise
        ctx.set_stat("psum_fallback_to_program_order", 1)
        layout = _Layout.of(program, ctx.costs(), ctx.footprint_cache, nest)
        if not avoid:
            layout.avoid_from.clear()
        _allocate_psum(ctx, options, layout)
    _scan(ctx, options, layout, birutil.SBUF, spill=options.spill).run(
        [b for b in program.buffers if b.memory == birutil.SBUF], _policy(options.policy)
    )
    return layout


def _scan(ctx: PassContext, options: Options, layout: _Layout, memory: int, spill: bool) -> _Scan:
    target = ctx.target
    if memory == birutil.SBUF:
        capacity, align, bank = target.sbuf_usable_bytes, options.sbuf_align, 0
    else:
        capacity, align, bank = target.psum_bytes_per_partition, options.psum_align, target.psum_bank_bytes
    return _Scan(ctx, ctx.program, layout, birutil.memory_name(memory), capacity, max(1, align), bank, spill)


def _allocate_psum(ctx: PassContext, options: Options, layout: _Layout) -> None:
    """PSUM first: it never spills, so the layout it reads is the one SBUF's scan starts from."""
    buffers = [b for b in ctx.program.buffers if b.memory == birutil.PSUM]
    _scan(ctx, options, layout, birutil.PSUM, spill=False).run(buffers, _policy(options.policy))


def _restore_order_before_schedule(ctx: PassContext) -> bool:
    """Put the instructions back in the order pre_sched received, and the stores it moved to other
    trigger engines back on theirs; False if there is no order to go back to."""
    saved = ctx.order_before_schedule
    program = ctx.program
    if not saved or len(saved) != len(program.instructions):
        return False
    by_id = {instr.id: instr for instr in program.instructions}
    if [instr.id for instr in program.instructions] == saved or set(by_id) != set(saved):
        return False
    birutil.set_order(program, [by_id[node] for node in saved])
    for node, instr in (ctx.triggers_before_schedule or {}).items():
        by_id[node].CopyFrom(instr)
    ctx.order_before_schedule = ctx.triggers_before_schedule = None
    ctx.order_changed()
    return True


class _Scan:
    """The linear scan of one memory."""

    def __init__(
        self,
        ctx: PassContext,
        program: bir_pb2.Program,
        layout: _Layout,
        memory: str,
        capacity: int,
        align: int,
        bank: int,
        spill: bool,
    ):
        self.ctx, self.program, self.layout = ctx, program, layout
        self.memory, self.capacity, self.align, self.bank, self.spill = memory, capacity, align, bank, spill
        # Buffers to place, smallest (first use, -size, name) first: the ones given to run() as
        # one sorted list, the reloads that spills make during the scan in a heap; taking the
        # smaller head of the two is the order one heap of all would give (the keys are unique)
        # at a fraction of the comparisons of 100k heap operations.
        self.queued: list[tuple[Key, int, str, bir_pb2.Buffer]] = []
        self.next_queued = 0
        self.pending: list[tuple[Key, int, str, bir_pb2.Buffer]] = []

    def _entry(self, buffer: bir_pb2.Buffer) -> tuple[Key, int, str, bir_pb2.Buffer]:
        name = buffer.name
        start = self._range(name)[0]  # an untouched buffer's is before everything: it constrains none
        return (start, -_footprint(buffer), name, buffer)

    def _push(self, buffer: bir_pb2.Buffer) -> None:
        heapq.heappush(self.pending, self._entry(buffer))

    def _pop(self) -> tuple[Key, int, str, bir_pb2.Buffer] | None:
        """The next buffer to place (smallest key of both queues), or None when both are empty."""
        queued, position, pending = self.queued, self.next_queued, self.pending
        if position < len(queued) and not (pending and pending[0] < queued[position]):
            self.next_queued = position + 1
            return queued[position]
        return heapq.heappop(pending) if pending else None

    def _range(self, name: str) -> tuple[Key, Key]:
        widened = self.layout.ranges.get(name)
        if widened is not None:
            return widened
        uses = self.layout.uses.get(name)
        return (uses[0], uses[-1]) if uses else ((-1, 0, 0), (-1, 0, 0))

    def run(self, buffers: list[bir_pb2.Buffer], next_fit: bool) -> None:
        self.queued = sorted(self._entry(buffer) for buffer in buffers)
        self.next_queued = 0
        live: list[_Live] = []
        used_ever = bytearray(self.capacity // self.align + 1)  # per aligned slot: ever handed out
        peak = reused = cursor = count = 0
        freed: list[_Live] = []  # dead buffers whose bytes a buffer of the loop after theirs avoids
        while (item := self._pop()) is not None:
            start, _, _, buffer = item
            count += 1
            kept: list[_Live] = []
            for entry in live:
                (kept if entry.end >= start else freed).append(entry)
            live = kept
            size = _footprint(buffer)
            avoid_from = self.layout.avoid_from.get(start[0])
            freed = [entry for entry in freed if avoid_from is not None and entry.end[0] >= avoid_from]
            del freed[:-MAX_AVOIDED]  # the most recently freed: each placement sorts what it avoids
            address = _fit(live, size, self.capacity, self.align, self.bank, cursor if next_fit else 0, freed)
            while address is None:
                victim = self._victim(live, start) if self.spill else None
                if victim is None:
                    self._fail(buffer, live, start)
                live.remove(victim)
                self._spill(victim, start)
                address = _fit(live, size, self.capacity, self.align, self.bank, cursor if next_fit else 0)
            buffer.address = address
            cursor = address + size
            slots = slice(address // self.align, -(-(address + size) // self.align))
            if any(used_ever[slots]):
                reused += 1
            used_ever[slots] = b"\x01" * (slots.stop - slots.start)
            end = self._range(buffer.name)[1]
            live.append(_Live(buffer.name, start, end, address, size))
            # the peak over the live set: every entry still live was counted when it came in
            peak = max(peak, address + size)
        prefix = self.memory.lower()
        self.ctx.set_stat(f"{prefix}_buffers", count)
        self.ctx.set_stat(f"{prefix}_peak_bytes", peak)
        self.ctx.set_stat(f"{prefix}_reused_buffers", reused)
        self.ctx.set_stat(f"{prefix}_total_bytes_unshared", sum(b.bytes_per_partition for b in buffers))

    def _consumer(self, at: Key) -> Key:
        """The original instruction a position serves: a reload serves the instruction it precedes."""
        return (at[0], 0, 0) if at[1] < 0 else at

    def _victim(self, live: list[_Live], at: Key) -> _Live | None:
        """The live buffer that neither the instruction at `at` nor the one it serves uses, used
        before and again after that, whose next use is furthest away."""
        consumer = self._consumer(at)
        busy = self.layout.touched.get(at, set()) | self.layout.touched.get(consumer, set())
        best: tuple[Key, _Live] | None = None
        for entry in live:
            if entry.name in busy or entry.start >= at or entry.name in self.layout.in_loops:
                continue
            uses = self.layout.uses[entry.name]
            later = bisect.bisect_right(uses, consumer)
            if later == len(uses):
                continue
            if best is None or uses[later] > best[0]:
                best = (uses[later], entry)
        return best[1] if best is not None else None

    def _spill(self, victim: _Live, at: Key) -> None:
        """Split `victim` at `at`: store after its last use before, reload before its next use."""
        layout, program = self.layout, self.program
        uses = layout.uses[victim.name]
        before = [key for key in uses if key < at]
        after = [key for key in uses if key > at]
        buffer = layout.buffers[victim.name]
        layout.spills += 1
        reloaded = program.buffers.add()
        reloaded.CopyFrom(buffer)
        reloaded.name = f"{buffer.name}.reload{layout.spills}"
        reloaded.address = -1
        layout.buffers[reloaded.name] = reloaded
        for key in after:  # later uses read the reloaded copy
            instr = layout.instructions[key]
            for ap in [*instr.inputs, *instr.outputs]:
                if ap.memory in birutil.ONCHIP and ap.tensor == victim.name:
                    ap.tensor = reloaded.name
            layout.touched[key] = (layout.touched[key] - {victim.name}) | {reloaded.name}
        box = _written_box(victim.name, [layout.instructions[key] for key in before])
        reload_uses: list[Key] = []
        if box is not None:
            first_partition, partitions, offset, dtype, count = box
            scratch = f"spill.{layout.spills}.{buffer.name}"
            program.hbm.add(name=scratch, dtype=dtype, shape=[partitions, count], role=bir_pb2.INTERNAL)
            hbm = bir_pb2.AccessPattern(
                memory=common_pb2.HBM,
                tensor=scratch,
                dtype=dtype,
                dims=[bir_pb2.Dim(stride=count, count=partitions), bir_pb2.Dim(stride=1, count=count)],
            )

            def onchip(name: str) -> bir_pb2.AccessPattern:
                return bir_pb2.AccessPattern(
                    memory=common_pb2.SBUF,
                    tensor=name,
                    dtype=dtype,
                    offset=offset,
                    partition_start=first_partition,
                    partition_count=partitions,
                    dims=[bir_pb2.Dim(stride=1, count=count)],
                )

            next_id = layout.next_id
            layout.next_id += 2
            store_key = layout.next_key(before[-1], after=True)
            reload_key = layout.next_key(after[0], after=False)
            store = bir_pb2.Instruction(
                id=next_id, name=f"spill{layout.spills}.store/{buffer.name}", op="dma", engine=common_pb2.SP
            )
            store.inputs.append(onchip(buffer.name))
            store.outputs.append(hbm)
            store.attributes["inserted_by"] = NAME
            reload = bir_pb2.Instruction(
                id=next_id + 1,
                name=f"spill{layout.spills}.reload/{buffer.name}",
                op="dma",
                engine=common_pb2.SP,
            )
            reload.inputs.append(hbm)
            reload.outputs.append(onchip(reloaded.name))
            reload.attributes["inserted_by"] = NAME
            if self.ctx.queues_assigned:
                assign_hwdge_engine.queue_new_dma(self.ctx, store, layout.queue_load)
                assign_hwdge_engine.queue_new_dma(self.ctx, reload, layout.queue_load)
            layout.instructions[store_key] = store
            layout.instructions[reload_key] = reload
            layout.touched[store_key] = {buffer.name}
            layout.touched[reload_key] = {reloaded.name}
            before.append(store_key)
            reload_uses.append(reload_key)
            layout.spilled_bytes += count * dtypes.itemsize(dtype)
        layout.uses[victim.name] = before
        layout.uses[reloaded.name] = reload_uses + after
        victim.end = before[-1]
        self._push(reloaded)

    def _fail(self, buffer: bir_pb2.Buffer, live: list[_Live], at: Key) -> None:
        size = _footprint(buffer)
        free = _largest_gap(live, self.capacity)
        consumer = self.layout.instructions.get(self._consumer(at))
        together = sorted(self.layout.touched.get(self._consumer(at), set()) | {buffer.name})
        needed = sum(self.layout.buffers[name].bytes_per_partition for name in together)
        if size > self.capacity:
            why = f"is larger than the {self.capacity} bytes of a partition"
        elif self.spill and consumer is not None and needed > self.capacity:
            why = (
                f"instruction {consumer.name} uses {', '.join(together)} at once: {needed} bytes per "
                f"partition together, more than the {self.capacity} bytes of {self.memory}"
            )
        elif self.bank and size <= self.bank and free >= size:
            why = f"fits no free range without crossing a {self.bank}-byte bank boundary"
        else:
            biggest = sorted(live, key=lambda e: -e.size)[:MAX_HOLDERS_SHOWN]
            holders = ", ".join(f"{e.name}@{e.address}+{e.size}" for e in biggest)
            if len(live) > len(biggest):
                holders += f" and {len(live) - len(biggest)} more ({sum(e.size for e in live)} bytes in all)"
            kept = "that cannot be spilled " if self.spill else ""
            why = (
                f"finds only {free} contiguous bytes of {self.capacity} free beside the live buffers "
                f"{kept}({holders or 'none'})"
            )
        raise CompileError(
            "E403",
            f"allocation: {self.memory} buffer '{buffer.name}' needs {size} bytes per partition: {why}",
            buffer.name,
        )


def _footprint(buffer: bir_pb2.Buffer) -> int:
    """Bytes per partition a buffer takes: every copy of a rotating one."""
    return buffer.bytes_per_partition * max(1, buffer.slots)


def _written_box(name: str, instructions: list[bir_pb2.Instruction]) -> tuple[int, int, int, int, int] | None:
    """(first partition, partitions, byte offset, dtype, elements per partition) of the hull that
    `instructions` wrote into buffer `name`; None if they wrote nothing. The dtype is the writes'
    own when they agree and the hull is a whole number of its elements, else U8 (raw bytes)."""
    p0 = b0 = 1 << 62
    p1 = b1 = -1
    kinds: set[int] = set()
    for instr in instructions:
        for ap in instr.outputs:
            if ap.memory not in birutil.ONCHIP or ap.tensor != name:
                continue
            span = birutil.element_span(ap)
            if span is None or ap.partition_count <= 0:
                continue
            size = dtypes.itemsize(ap.dtype)
            p0, p1 = min(p0, ap.partition_start), max(p1, ap.partition_start + ap.partition_count)
            b0, b1 = min(b0, ap.offset + span[0] * size), max(b1, ap.offset + (span[1] + 1) * size)
            kinds.add(ap.dtype)
    if p1 < 0:
        return None
    dtype = kinds.pop() if len(kinds) == 1 else common_pb2.U8
    size = dtypes.itemsize(dtype)
    if b0 % size or (b1 - b0) % size:
        dtype, size = common_pb2.U8, 1
    return p0, p1 - p0, b0, dtype, (b1 - b0) // size


def _fit(live: list[_Live], size: int, capacity: int, align: int, bank: int, cursor: int,
         avoided: list[_Live] | None = None) -> int | None:
    """The first aligned address at or after `cursor` (wrapping around to 0) where `size` bytes fit
    among the live buffers and obey the bank rule, away from the `avoided` ones where any such
    place exists; None if there is none."""
    if size > capacity:
        return None
    occupied = sorted((e.address, e.address + e.size) for e in live)
    ends = [hi for _, hi in occupied]
    blocked = _merged(sorted((e.address, e.address + e.size) for e in avoided or ()))
    for keep_clear in ([blocked, []] if blocked else [[]]):  # where nothing fits clear of them: anywhere
        for start in (cursor, 0) if cursor else (0,):
            found = _search(occupied, ends, keep_clear, size, capacity, align, bank, start)
            if found is not None:
                return found
    return None


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted spans with the overlapping ones joined (freed buffers may share bytes)."""
    merged: list[tuple[int, int]] = []
    for lo, hi in spans:
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def _search(occupied: list[tuple[int, int]], ends: list[int], blocked: list[tuple[int, int]], size: int,
            capacity: int, align: int, bank: int, candidate: int) -> int | None:
    blocked_ends = [hi for _, hi in blocked]
    while candidate + size <= capacity:
        candidate = _round_up(candidate, align)
        if bank:
            if size <= bank and candidate // bank != (candidate + size - 1) // bank:
                candidate = _round_up(candidate, bank)
            elif size > bank:
                banks = -(-size // bank)
                candidate = _round_up(candidate, bank * (banks & -banks))
        if candidate + size > capacity:
            return None
        # Live buffers never share bytes, so sorted by start they are sorted by end too: the
        # first one ending after the candidate is the only one that can clash first (and so
        # with the merged spans kept clear).
        first = bisect.bisect_right(ends, candidate)
        if first < len(occupied) and occupied[first][0] < candidate + size:
            candidate = occupied[first][1]
            continue
        first = bisect.bisect_right(blocked_ends, candidate)
        if first < len(blocked) and blocked[first][0] < candidate + size:
            candidate = blocked[first][1]
            continue
        return candidate
    return None


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def _largest_gap(live: list[_Live], capacity: int) -> int:
    gap, cursor = 0, 0
    for lo, hi in sorted((e.address, e.address + e.size) for e in live):
        gap = max(gap, lo - cursor)
        cursor = max(cursor, hi)
    return max(gap, capacity - cursor)
