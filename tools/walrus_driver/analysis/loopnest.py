"""The loops of a program's global order: which loop each instruction runs in, and how often.

Before codegen, `Program.instructions` may hold `loop` entries as an engine stream does (the
frontend keeps loops rolled; docs/ir.md, "Loops in the global order"): a loop entry's body is the
run of instructions after it, and each body instruction names its innermost loop (`in_loop`).
While walrus_driver runs, the entries are kept apart (`extract` when the program is read,
`restore` before it is written: PassContext.loop_entries), so every pass sees the *static*
program, the body once, as straight-line code; what runs is its expansion, every body
instruction once per iteration, in loop order. The static order is itself a valid order of one
iteration, which is what lets the scheduler, the allocator and the semaphore walk treat a body as
straight-line code and account for the iterations apart:

  * an instruction before a loop runs before every iteration of it, one after it after all;
  * a value that grows by u per iteration of a loop (a semaphore's count) is its value at the
    loop's first iteration plus r * u at iteration r, plus (trip - 1) * u after the loop.

Passes that reorder keep each body one contiguous run of the static order, and an instruction a
pass inserts takes the `in_loop` of the instruction it was put beside. `LoopNest.of` checks
that (E405) and says, per instruction, its chain of enclosing loops.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ncc.schemas import bir_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.common.loops import BARRIER, CARRIED, LOOP_OP

ROOT = -1  # the loop id of the top level


@dataclass(frozen=True)
class Loop:
    id: int
    name: str
    trip: int
    parent: int  # ROOT at the top level
    depth: int  # 1 for a top-level loop
    barrier: bool = False  # its carried dependences are kept as a barrier between iterations (ir.md)


def owner_of(instr: bir_pb2.Instruction) -> int:
    """The loop id an instruction names (ROOT at the top level)."""
    return instr.in_loop if instr.HasField("in_loop") else ROOT


class LoopNest:
    """The loop structure of a static program: its loop entries and its instructions' `in_loop`."""

    def __init__(self, loops: dict[int, Loop], owner: dict[int, int]) -> None:
        self.loops = loops
        self._owner = owner  # instruction id -> its innermost loop id (ROOT: none)
        self._chains: dict[int, tuple[int, ...]] = {ROOT: ()}

    @classmethod
    def of(cls, entries: dict[int, bir_pb2.Instruction],
           instructions: Sequence[bir_pb2.Instruction]) -> LoopNest:
        """Index the structure; E405 when an instruction names an unknown loop or a body is not
        one contiguous run of `instructions`."""
        loops: dict[int, Loop] = {}

        def loop(loop_id: int) -> Loop:
            found = loops.get(loop_id)
            if found is None:
                entry = entries.get(loop_id)
                if entry is None:
                    raise CompileError("E405", f"an instruction names loop id {loop_id}, which has no entry")
                parent = owner_of(entry)
                depth = loop(parent).depth + 1 if parent != ROOT else 1
                if depth > len(entries):
                    raise CompileError("E405", f"loop {entry.name!r} encloses itself", entry.name)
                barrier = entry.attributes.get(CARRIED) == BARRIER
                found = loops[loop_id] = Loop(loop_id, entry.name, int(entry.trip_count), parent, depth,
                                              barrier)
            return found

        for loop_id in entries:
            loop(loop_id)
        owners = [owner_of(instr) for instr in instructions]  # read once (a protobuf HasField each)
        nest = cls(loops, dict(zip((instr.id for instr in instructions), owners, strict=True)))
        nest._check_contiguous(instructions, owners)
        return nest

    def _check_contiguous(self, instructions: Sequence[bir_pb2.Instruction], owners: list[int]) -> None:
        open_chain: tuple[int, ...] = ()
        closed: set[int] = set()
        for instr, owner in zip(instructions, owners, strict=True):
            chain = self.chain(owner)
            if chain != open_chain:
                shared = len(self._shared(open_chain, chain))
                closed.update(open_chain[shared:])
                for loop_id in chain[shared:]:
                    if loop_id in closed:
                        raise CompileError(
                            "E405",
                            f"instruction {instr.name!r} of loop {self.loops[loop_id].name!r} stands outside "
                            "that loop's body (a body must be one run of the order)",
                            instr.name,
                        )
                open_chain = chain

    def __bool__(self) -> bool:
        return bool(self.loops)

    def owner(self, instruction_id: int) -> int:
        """The innermost loop holding the instruction (ROOT at the top level)."""
        return self._owner.get(instruction_id, ROOT)

    def owner_map(self) -> Mapping[int, int]:
        """Instruction id -> its innermost loop (ROOT at the top level; read-only): `owner` without
        a call per lookup, for walks over every edge."""
        return self._owner

    def chain(self, loop_id: int) -> tuple[int, ...]:
        """The loops from the outermost down to `loop_id` (empty for ROOT)."""
        chain = self._chains.get(loop_id)
        if chain is None:
            loop = self.loops[loop_id]
            chain = self._chains[loop_id] = (*self.chain(loop.parent), loop_id)
        return chain

    def chain_of(self, instruction_id: int) -> tuple[int, ...]:
        return self.chain(self.owner(instruction_id))

    def trips(self, loop_id: int) -> int:
        """How many times an instruction directly in `loop_id` runs: the product of the trips."""
        count = 1
        for loop in self.chain(loop_id):
            count *= self.loops[loop].trip
        return count

    def runs(self, instruction_id: int) -> int:
        """How many times an instruction runs (1 at the top level)."""
        return self.trips(self.owner(instruction_id))

    @staticmethod
    def _shared(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
        shared = []
        for x, y in zip(a, b, strict=False):
            if x != y:
                break
            shared.append(x)
        return tuple(shared)

    def common(self, a: int, b: int) -> tuple[int, ...]:
        """The loops enclosing both loop `a` and loop `b` (ROOT for none), outermost first."""
        return self._shared(self.chain(a), self.chain(b))


def widen_live_ranges(live: dict[str, tuple[int, int]], instructions: Sequence[bir_pb2.Instruction],
                      nest: LoopNest, buffers: dict[str, bir_pb2.Buffer]) -> set[str]:
    """Widen static live ranges (buffer -> first and last position of an instruction naming it)
    for loops: a buffer used inside a loop that does not hold it afresh at every iteration (it is
    not private to that loop or to one inside it) is live over the loop's whole body, since
    every iteration uses it. Returns the buffers used inside some loop."""
    span: dict[int, tuple[int, int]] = {}  # loop id -> first and last position of its body
    loops_of: dict[str, set[int]] = {}  # buffer -> the loops of the instructions naming it
    for position, instr in enumerate(instructions):
        chain = nest.chain_of(instr.id)
        for loop_id in chain:
            first, _ = span.get(loop_id, (position, position))
            span[loop_id] = (first, position)
        if chain:
            for ap in (*instr.inputs, *instr.outputs):
                loops_of.setdefault(ap.tensor, set()).update(chain)
    for name, loops in loops_of.items():
        if name not in live:
            continue
        buffer = buffers.get(name)
        fresh: set[int] = set()  # loops whose every iteration holds the buffer afresh
        if buffer is not None and buffer.HasField("private_to") and buffer.private_to in nest.loops:
            fresh = set(nest.chain(buffer.private_to))
        first, last = live[name]
        for loop_id in loops - fresh:
            first, last = min(first, span[loop_id][0]), max(last, span[loop_id][1])
        live[name] = (first, last)
    return {name for name in loops_of if name in live}


def extract(program: bir_pb2.Program) -> dict[int, bir_pb2.Instruction]:
    """Take the loop entries out of `program.instructions` (their structure checked: each entry's
    body is the run after it that names it), and return them by id."""
    instructions = program.instructions
    if not any(instr.op == LOOP_OP for instr in instructions):
        return {}
    entries: dict[int, bir_pb2.Instruction] = {}
    open_loops: list[tuple[int, int]] = []  # (loop id, index one past its body)
    for index, instr in enumerate(instructions):
        while open_loops and index >= open_loops[-1][1]:
            open_loops.pop()
        parent = open_loops[-1][0] if open_loops else ROOT
        if owner_of(instr) != parent:
            where = f"loop {entries[parent].name!r}" if parent != ROOT else "no loop"
            raise CompileError(
                "E405",
                f"instruction {instr.name!r} names loop id {owner_of(instr)} but stands in {where} "
                "(a loop body is the run of instructions after its entry)",
                instr.name,
            )
        if instr.op != LOOP_OP:
            continue
        if instr.trip_count < 1 or instr.body_length < 1:
            raise CompileError("E405", f"loop {instr.name!r}: trip count {instr.trip_count} and body length "
                               f"{instr.body_length} must both be at least 1", instr.name)
        end = index + 1 + instr.body_length
        if end > (open_loops[-1][1] if open_loops else len(instructions)):
            raise CompileError("E405", f"loop {instr.name!r}: its body runs past its enclosing body",
                               instr.name)
        if instr.id in entries:
            raise CompileError("E405", f"instruction id {instr.id} is used twice ({instr.name})", instr.name)
        copy = bir_pb2.Instruction()
        copy.CopyFrom(instr)
        entries[instr.id] = copy
        open_loops.append((instr.id, end))
    kept = [instr for instr in instructions if instr.op != LOOP_OP]
    copies = [bir_pb2.Instruction() for _ in kept]
    for copy, instr in zip(copies, kept, strict=True):
        copy.CopyFrom(instr)
    del program.instructions[:]
    program.instructions.extend(copies)
    return entries


def restore(instructions, entries: dict[int, bir_pb2.Instruction]) -> None:
    """Put the loop entries back into the static order `instructions` (a repeated field), each
    before the first instruction of its body, with body lengths recounted."""
    if not entries:
        return
    nest = LoopNest.of(entries, instructions)
    order: list[bir_pb2.Instruction] = []
    open_chain: tuple[int, ...] = ()
    lengths: dict[int, int] = {}
    for instr in instructions:
        chain = nest.chain(owner_of(instr))
        shared = len(nest._shared(open_chain, chain))
        for loop_id in chain[shared:]:
            order.append(entries[loop_id])
            for outer in chain[:chain.index(loop_id)]:
                lengths[outer] += 1
            lengths[loop_id] = 0
        for loop_id in chain:
            lengths[loop_id] += 1
        order.append(instr)
        open_chain = chain
    for loop_id, entry in entries.items():
        entry.body_length = lengths.get(loop_id, 0)  # 0: every body instruction went; not restored
    rebuilt = []
    for instr in order:
        copy = bir_pb2.Instruction()
        copy.CopyFrom(instr)
        rebuilt.append(copy)
    del instructions[:]
    instructions.extend(rebuilt)
