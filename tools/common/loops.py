"""Loops in an engine stream: their structure, the instructions they execute, and their expansion.

An engine stream (`bir.Stream`) may hold `loop` entries: a loop runs the `body_length` entries
after it (nested loops and their bodies included) `trip_count` times. An instruction inside
loops names, for each operand offset and each wait threshold, how the value changes with the
iteration of each enclosing loop, outermost first (`LoopVariation`, `SemaphoreWait.loop_steps`;
docs/ir.md, Loops). The executed program is the expansion: every body instruction once per
iteration point, with its values for that point, in loop order. This module is the one
definition of that meaning: the packager validates a stream with it, the simulator expands
streams with it, and walrus's `roll_loops` pass is checked against it.

Errors are CompileErrors with the caller's code (the packager's E503, the simulator's E603):
a trip count or body length below 1, a body that runs past its stream or its enclosing body,
loops nested deeper than MAX_LOOP_DEPTH, a variation list whose length is neither 0 nor the
instruction's loop depth, a rotation longer than MAX_ROTATION or not starting at 0. A stream
that would execute more than a step limit is refused before anything is expanded (E605 in the
simulator), so a hostile trip count cannot make a run that never ends.

`plan_streams` is what the simulator runs instead of `expand_streams`: the same checks and the
same errors (named after the same first failing instance), without expanding anything. A
`Layout` says where each entry's instances fall in the expansion, and enumerates them in order,
so a consumer can decode a loop body once and derive each iteration's instance from it.
`first_point_outside` finds the first iteration point at which a value that varies with the
iterations (an offset, a threshold) leaves a range, from the variation's extremes, in time
independent of the trip counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.target import WAIT_VALUE_LIMIT, wait_words

LOOP_OP = "loop"
# Penguin: the nest attribute that names the Repeat region (a while loop kept as a loop) a nest
# belongs to (penguin.proto, Repeat); bir_codegen emits the region as one `loop` entry
REPEAT = "repeat"
# BIR: a `loop` entry with attributes[CARRIED] == BARRIER has its carried dependences synchronized
# as a barrier between iterations (every thread's first instruction waits for every other thread's
# last one at the iteration before) rather than pair by pair: a Repeat region's loop, one trip a
# whole program run (docs/ir.md)
CARRIED = "carried"
BARRIER = "barrier"
MAX_LOOP_DEPTH = 8
MAX_ROTATION = 16


def variation_value(variation: bir_pb2.LoopVariation, r: int) -> int:
    """What `variation` adds at iteration r of its loop."""
    return rotated(variation.rotation, variation.step, r)


def rotated(rotation: Sequence[int], step: int, r: int) -> int:
    """What a variation of `rotation` and `step` (a wait's step: no rotation) adds at iteration r."""
    if rotation:
        n = len(rotation)
        return rotation[r % n] + (r // n) * step
    return r * step


@dataclass(frozen=True)
class _Loop:
    """A loop of a stream: entries (start, start + body_length] after its own at `start`."""

    start: int
    trip_count: int
    end: int  # one past the last body entry


def has_loops(streams: Iterable[bir_pb2.Stream]) -> bool:
    return any(instruction.op == LOOP_OP for stream in streams for instruction in stream.instructions)


def _where(stream: bir_pb2.Stream, index: int) -> str:
    instruction = stream.instructions[index]
    return f"stream entry {index} ({instruction.name or instruction.op!r})"


def execution_counts(stream: bir_pb2.Stream, code: str) -> list[int]:
    """Validate the loop structure of `stream`; how many times each entry runs (a loop entry:
    how many times the loop is entered). Python integers: a hostile trip count cannot overflow."""
    instructions = stream.instructions
    open_loops: list[_Loop] = []
    multiplier = 1
    counts: list[int] = []
    for index, instruction in enumerate(instructions):
        while open_loops and index >= open_loops[-1].end:
            multiplier //= open_loops.pop().trip_count
        counts.append(multiplier)
        depth = len(open_loops)
        if instruction.op != LOOP_OP:
            _check_variations(stream, index, depth, code)
            continue
        trip, length = int(instruction.trip_count), int(instruction.body_length)
        what = _where(stream, index)
        if trip < 1:
            raise CompileError(code, f"{what}: loop trip count {trip} (at least 1)", instruction.name)
        if length < 1:
            raise CompileError(code, f"{what}: loop body of {length} entries (at least 1)", instruction.name)
        limit = open_loops[-1].end if open_loops else len(instructions)
        if index + 1 + length > limit:
            outer = "its enclosing loop's body" if open_loops else "the stream"
            raise CompileError(
                code,
                f"{what}: loop body of {length} entries runs past the end of {outer} (entry {limit - 1})",
                instruction.name,
            )
        if depth + 1 > MAX_LOOP_DEPTH:
            raise CompileError(
                code, f"{what}: loops nested {depth + 1} deep (at most {MAX_LOOP_DEPTH})", instruction.name
            )
        open_loops.append(_Loop(index, trip, index + 1 + length))
        multiplier *= trip
    return counts


def check_stream(stream: bir_pb2.Stream, code: str) -> int:
    """Validate the loop structure of `stream`; the instructions it executes (loops not counted)."""
    counts = execution_counts(stream, code)
    instructions = stream.instructions
    return sum(n for n, instruction in zip(counts, instructions, strict=True) if instruction.op != LOOP_OP)


def _check_variations(stream: bir_pb2.Stream, index: int, depth: int, code: str) -> None:
    instruction = stream.instructions[index]

    def refuse(what: str, problem: str) -> None:
        raise CompileError(code, f"{_where(stream, index)}{what}: {problem}", instruction.name)

    for kind, operands in (("output", instruction.outputs), ("input", instruction.inputs)):
        for number, ap in enumerate(operands):
            where = f" {kind} {number}"
            if len(ap.loop) not in (0, depth):
                refuse(where, f"{len(ap.loop)} loop variations inside {depth} loops (0 or {depth})")
            for variation in ap.loop:
                rotation = variation.rotation
                if len(rotation) > MAX_ROTATION or (rotation and rotation[0] != 0):
                    problem = f"a rotation of {len(rotation)} entries must start at 0, at most {MAX_ROTATION}"
                    refuse(where, problem)
    for wait in instruction.waits:
        if len(wait.loop_steps) not in (0, depth):
            refuse("", f"a wait with {len(wait.loop_steps)} loop steps inside {depth} loops (0 or {depth})")


def executed_instructions(streams: Iterable[bir_pb2.Stream], code: str) -> int:
    """Instructions the streams execute, loops expanded (each stream validated)."""
    return sum(check_stream(stream, code) for stream in streams)


def _check_step_limit(executed: int, step_limit: int, code: str) -> None:
    if executed > step_limit:
        raise CompileError(
            code, f"the streams' loops execute {executed:,} instructions (at most {step_limit:,})"
        )


def expand_streams(
    streams: Sequence[bir_pb2.Stream], code: str, step_limit: int, limit_code: str | None = None
) -> list[bir_pb2.Stream]:
    """The streams with every loop expanded (the same objects when none has a loop). More than
    `step_limit` executed instructions is `limit_code` (default `code`), before any expansion."""
    if not has_loops(streams):
        return list(streams)
    _check_step_limit(executed_instructions(streams, code), step_limit, limit_code or code)
    expanded = []
    for stream in streams:
        flat = bir_pb2.Stream(engine=stream.engine)
        flat.instructions.extend(_expand(stream.instructions, 0, len(stream.instructions), (), code))
        expanded.append(flat)
    return expanded


def _expand(
    entries: Sequence[bir_pb2.Instruction], start: int, end: int, point: tuple[int, ...], code: str
) -> Iterator[bir_pb2.Instruction]:
    index = start
    while index < end:
        entry = entries[index]
        if entry.op == LOOP_OP:
            body_end = index + 1 + int(entry.body_length)
            for r in range(int(entry.trip_count)):
                yield from _expand(entries, index + 1, body_end, (*point, r), code)
            index = body_end
            continue
        yield entry if not point else instance(entry, point, code)
        index += 1


_INT64 = 1 << 63
_WAIT_LIMIT = min(WAIT_VALUE_LIMIT, _INT64)
_ONCHIP = (common_pb2.SBUF, common_pb2.PSUM)


def offset_in_range(offset: int) -> bool:
    """Can a loop instance's operand have this offset (int64)?"""
    return -_INT64 <= offset < _INT64


def wait_value(value: int) -> int | None:
    """The threshold of a wait inside loops whose base plus its steps come to `value` at an
    iteration point; None when that is no threshold (2^63 or more), which refuses the instance.
    Below 0 it is 0: an earlier iteration that does not exist (a rotation wait of the first
    iterations), so the wait holds at once. The one definition of a grown threshold: expansion
    and the simulator use it."""
    return max(value, 0) if value < _WAIT_LIMIT else None


def wait_in_range(value: int) -> bool:
    return wait_value(value) is not None


def canonical(instruction: bir_pb2.Instruction, addresses: Mapping[str, int]) -> bytes:
    """What an instruction does, as bytes: without its name, id and source (a loop instance
    carries its body's) and with each on-chip operand at its absolute address (`addresses`:
    buffer name -> address), so an instance and the unrolled instruction it stands for compare
    equal exactly when they execute alike."""
    copy = bir_pb2.Instruction()
    copy.CopyFrom(instruction)
    copy.name, copy.id, copy.source = "", 0, ""
    for ap in (*copy.outputs, *copy.inputs):
        if ap.memory in _ONCHIP:
            ap.offset += addresses.get(ap.tensor, 0)
            ap.tensor = ""
    return copy.SerializeToString(deterministic=True)



def instance(body: bir_pb2.Instruction, point: tuple[int, ...], code: str = "E603") -> bir_pb2.Instruction:
    """The instruction a loop body entry executes at iteration point `point` (outermost first).
    An offset outside int64 or a threshold outside 0 .. 2^63 - 1 at that point is `code`."""
    result = bir_pb2.Instruction()
    result.CopyFrom(body)
    result.name = f"{body.name}@{','.join(str(r) for r in point)}"
    for operands in (result.outputs, result.inputs):
        for ap in operands:
            if ap.loop:
                offset = ap.offset + sum(variation_value(v, r) for v, r in zip(ap.loop, point, strict=True))
                if not offset_in_range(offset):
                    raise CompileError(code, f"instruction {result.name!r}: an offset {offset} outside int64")
                ap.offset = offset
                del ap.loop[:]
    for wait in result.waits:
        if wait.loop_steps:
            grown = wait.value + sum(s * r for s, r in zip(wait.loop_steps, point, strict=True))
            value = wait_value(grown)
            if value is None:
                raise CompileError(
                    code,
                    f"instruction {result.name!r}: a wait threshold {grown} outside 0 .. 2^63 - 1",
                    result.name,
                )
            wait.value = value
            if wait.HasField("value_lo"):
                wait.value_lo, wait.value_hi = wait_words(value)
            del wait.loop_steps[:]
    return result


# ---- the expansion without expanding ----------------------------------------------------------

Point = tuple[int, ...]
Variation = tuple[Sequence[int], int]  # (rotation, step): what a LoopVariation or a wait step adds


@dataclass
class _Body:
    """A loop of a layout: its entry, trip count, the instructions one iteration of its body
    executes (`period`), and its body's items (entry indices and nested loops) in order."""

    index: int
    trip: int
    period: int = 0
    items: list[int | _Body] = field(default_factory=list)


@dataclass
class Layout:
    """Where a validated stream's instances fall in its expansion.

    `loops[i]`: the enclosing loop entries of entry i, outermost first; `trips[i]` their trip
    counts; `first[i]` the expanded position of a non-loop entry's first instance (at the point
    of all zeros); `period[j]` what one iteration of loop entry j's body executes. The instance
    of entry i at point p is at `first[i] + sum(p[k] * period[loops[i][k]])`."""

    loops: list[tuple[int, ...]]
    trips: list[tuple[int, ...]]
    first: list[int]
    period: dict[int, int]
    executed: int
    items: list[int | _Body]

    @classmethod
    def of(cls, stream: bir_pb2.Stream, code: str) -> Layout:
        """Validate `stream` (as `execution_counts`) and lay it out: O(entries), whatever it executes."""
        execution_counts(stream, code)
        instructions = stream.instructions
        top: list[int | _Body] = []
        open_bodies: list[tuple[_Body, int]] = []  # (loop, one past its body)
        loops: list[tuple[int, ...]] = []
        for index, instruction in enumerate(instructions):
            while open_bodies and index >= open_bodies[-1][1]:
                open_bodies.pop()
            loops.append(tuple(body.index for body, _ in open_bodies))
            siblings = open_bodies[-1][0].items if open_bodies else top
            if instruction.op == LOOP_OP:
                body = _Body(index, int(instruction.trip_count))
                siblings.append(body)
                open_bodies.append((body, index + 1 + int(instruction.body_length)))
            else:
                siblings.append(index)
        period: dict[int, int] = {}

        def extent(item: int | _Body) -> int:
            if isinstance(item, int):
                return 1
            item.period = sum(extent(child) for child in item.items)
            period[item.index] = item.period
            return item.trip * item.period

        executed = sum(extent(item) for item in top)
        first = [-1] * len(instructions)

        def place(items: list[int | _Body], at: int) -> None:
            for item in items:
                if isinstance(item, int):
                    first[item] = at
                    at += 1
                else:
                    place(item.items, at)
                    at += item.trip * item.period

        place(top, 0)
        trips = [tuple(int(instructions[j].trip_count) for j in enclosing) for enclosing in loops]
        return cls(loops, trips, first, period, executed, top)

    @classmethod
    def flat(cls, entries: int) -> Layout:
        """The layout of a stream without loops (nothing checked: see `plan_streams`)."""
        return cls([()] * entries, [()] * entries, list(range(entries)), {}, entries, list(range(entries)))

    def position(self, index: int, point: Point) -> int:
        """Where the instance of entry `index` at `point` runs in the expanded stream."""
        periods = (self.period[j] for j in self.loops[index])
        return self.first[index] + sum(r * period for r, period in zip(point, periods, strict=True))

    def instances(self, start: int = 0) -> Iterator[tuple[int, Point]]:
        """(entry index, point) of every instance in expansion order, from position `start` on."""
        return _walk(self.items, (), start)


def _walk(items: list[int | _Body], point: Point, skip: int) -> Iterator[tuple[int, Point]]:
    for item in items:
        if isinstance(item, int):
            if skip:
                skip -= 1
                continue
            yield item, point
            continue
        if skip >= item.trip * item.period:
            skip -= item.trip * item.period
            continue
        first, skip = divmod(skip, item.period)
        for r in range(first, item.trip):
            yield from _walk(item.items, (*point, r), skip)
            skip = 0


def _value_range(variation: Variation, trip: int) -> tuple[int, int]:
    """Least and greatest of what `variation` adds over iterations 0 .. trip - 1."""
    rotation, step = variation
    n = len(rotation) or 1
    values = []
    for j in range(min(n, trip)):
        start = rotation[j] if rotation else 0
        values += [start, start + (trip - 1 - j) // n * step]
    return min(values), max(values)


def first_point_outside(
    trips: Sequence[int], base: int, variations: Sequence[Variation], inside: Callable[[int], bool]
) -> Point | None:
    """The first iteration point (in expansion order) at which `base` plus what each loop's
    variation adds is not `inside`, or None. `inside` must hold on an interval of integers (a
    range check), so a value between two that are inside is inside: then each loop's least and
    greatest contributions say whether some completion of a point fails, and the first failing
    iteration of each loop in turn is found by bisection over each rotation slot's arithmetic
    progression: O(depth x rotation x log trip) calls, whatever the trip counts."""
    depth = len(trips)
    ranges = [_value_range(v, t) for v, t in zip(variations, trips, strict=True)]
    low, high = [0] * (depth + 1), [0] * (depth + 1)
    for k in reversed(range(depth)):
        low[k], high[k] = low[k + 1] + ranges[k][0], high[k + 1] + ranges[k][1]

    def fails(value: int, k: int) -> bool:  # some completion of loops k.. from `value` leaves the range
        return not inside(value + low[k]) or not inside(value + high[k])

    if not fails(base, 0):
        return None
    point: list[int] = []
    prefix = base
    for k, ((rotation, step), trip) in enumerate(zip(variations, trips, strict=True)):
        n = len(rotation) or 1
        best = trip
        for j in range(min(n, trip)):
            start = prefix + (rotation[j] if rotation else 0)
            count = (trip - 1 - j) // n + 1
            if fails(start, k + 1):
                best = min(best, j)
                continue
            good, bad = 0, count  # the passing q form an interval from 0: bisect its end
            while bad - good > 1:
                middle = (good + bad) // 2
                good, bad = (good, middle) if fails(start + middle * step, k + 1) else (middle, bad)
            if bad < count:
                best = min(best, j + n * bad)
        point.append(best)
        prefix += rotated(rotation, step, best)
    return tuple(point)


def operand_variations(ap: bir_pb2.AccessPattern) -> list[Variation]:
    return [(tuple(v.rotation), int(v.step)) for v in ap.loop]


def wait_variations(wait: bir_pb2.SemaphoreWait) -> list[Variation]:
    return [((), int(step)) for step in wait.loop_steps]


def first_failure(layout: Layout, failures: Iterable[tuple[int, Point]]) -> tuple[int, Point] | None:
    """Of (entry index, point) instances, the one that runs first."""
    return min(failures, key=lambda failure: layout.position(*failure), default=None)


def _first_invalid_instance(stream: bir_pb2.Stream, layout: Layout) -> tuple[int, Point] | None:
    failures = []
    for index, instruction in enumerate(stream.instructions):
        trips = layout.trips[index]
        if not trips or instruction.op == LOOP_OP:
            continue
        points = [
            first_point_outside(trips, ap.offset, operand_variations(ap), offset_in_range)
            for ap in (*instruction.outputs, *instruction.inputs)
            if ap.loop
        ]
        points += [
            first_point_outside(trips, wait.value, wait_variations(wait), wait_in_range)
            for wait in instruction.waits
            if wait.loop_steps
        ]
        failures += [(index, point) for point in points if point is not None]
    return first_failure(layout, failures)


def plan_streams(
    streams: Sequence[bir_pb2.Stream], code: str, step_limit: int, limit_code: str | None = None
) -> list[Layout] | None:
    """What `expand_streams` checks, in its order and with its errors, without expanding: the
    structure of every stream, the step limit, then every instance's offsets and thresholds
    (the first instance that `instance` refuses is refused). None when no stream has a loop
    (`expand_streams` checks nothing then); else each stream's layout."""
    if not has_loops(streams):
        return None
    layouts = [Layout.of(stream, code) for stream in streams]
    _check_step_limit(sum(layout.executed for layout in layouts), step_limit, limit_code or code)
    for stream, layout in zip(streams, layouts, strict=True):
        failure = _first_invalid_instance(stream, layout)
        if failure is not None:
            index, point = failure
            instance(stream.instructions[index], point, code)  # raises: the point is out of range
            raise AssertionError(f"instance {point} of entry {index} was expected to be refused")
    return layouts
