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
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.target import WAIT_VALUE_LIMIT, wait_words

LOOP_OP = "loop"
MAX_LOOP_DEPTH = 8
MAX_ROTATION = 16


def variation_value(variation: bir_pb2.LoopVariation, r: int) -> int:
    """What `variation` adds at iteration r of its loop."""
    rotation = variation.rotation
    if rotation:
        n = len(rotation)
        return rotation[r % n] + (r // n) * variation.step
    return r * variation.step


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


def expand_streams(
    streams: Sequence[bir_pb2.Stream], code: str, step_limit: int, limit_code: str | None = None
) -> list[bir_pb2.Stream]:
    """The streams with every loop expanded (the same objects when none has a loop). More than
    `step_limit` executed instructions is `limit_code` (default `code`), before any expansion."""
    if not has_loops(streams):
        return list(streams)
    executed = executed_instructions(streams, code)
    if executed > step_limit:
        raise CompileError(
            limit_code or code,
            f"the streams' loops execute {executed:,} instructions (at most {step_limit:,})",
        )
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
_ONCHIP = (common_pb2.SBUF, common_pb2.PSUM)


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
                if not -_INT64 <= offset < _INT64:
                    raise CompileError(code, f"instruction {result.name!r}: an offset {offset} outside int64")
                ap.offset = offset
                del ap.loop[:]
    for wait in result.waits:
        if wait.loop_steps:
            value = wait.value + sum(s * r for s, r in zip(wait.loop_steps, point, strict=True))
            if value >= min(WAIT_VALUE_LIMIT, _INT64):
                raise CompileError(
                    code,
                    f"instruction {result.name!r}: a wait threshold {value} outside 0 .. 2^63 - 1",
                    result.name,
                )
            # below 0: an earlier iteration that does not exist (a rotation wait of the first
            # iterations), so the wait holds at once
            value = max(0, value)
            wait.value = value
            if wait.HasField("value_lo"):
                wait.value_lo, wait.value_hi = wait_words(value)
            del wait.loop_steps[:]
    return result
