"""Loading: BIR instruction streams → decoded, validated, costed `Op`s per engine.

A NEFF carries per-engine `Stream`s; a BIR `Program` before codegen carries one global
instruction list, which is split by engine preserving order (the same split codegen makes).
Every static problem is reported here, before simulation starts: a stream whose instructions
belong to another engine, two streams for one engine, semaphores outside the program's
`num_semaphores`, more waits/updates than the target allows (E603), and, through
DeviceMemory.resolve and semantics.validate, bad operands (E601/E603).

A stream with loops is not expanded: each entry is decoded once, as its first instance (a
`Template`), and `EngineStream.ops` creates the Op of each later instance when the simulator
reaches it, from the loop layout (tools/common/loops.py): the name `name@point`, the operands at
their offsets for that point (Access.at, shared by the iterations an address rotation revisits)
and the grown waits (loops.wait_value). Only offsets and thresholds vary with the iteration, so
the static checks of the first instance hold for every instance but bounds, which are checked
for all iterations at once from each operand's offset range (loops.first_point_outside): the
error, if any, is that of the first instance in execution order that fails, decoded as the
expansion would decode it. A loop of a million instructions costs the decoding of its body,
memory for its body, and per executed instance only what differs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import getitem

from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.common import loops
from ncc.tools.common.errors import CompileError
from ncc.tools.sim import semantics
from ncc.tools.sim.instruction import Op, engine_name
from ncc.tools.sim.memory import Access, DeviceMemory
from ncc.tools.sim.timing import CostModel
from ncc.tools.target import ENGINES, Target, encoded_wait_value

_ACCESS_CACHE = 64  # per varying operand: the Accesses kept for the offsets a rotation revisits
_TABLE_TRIPS = 4096  # a loop up to this long has what a variation adds per iteration tabulated


def streams_of_program(program: bir_pb2.Program) -> list[bir_pb2.Stream]:
    """The program's streams, or its instruction list grouped by engine in order if it has none."""
    if program.streams:
        return list(program.streams)
    grouped: dict[int, bir_pb2.Stream] = {}
    for instruction in program.instructions:
        stream = grouped.get(instruction.engine)
        if stream is None:
            stream = grouped[instruction.engine] = bir_pb2.Stream(engine=instruction.engine)
        stream.instructions.append(instruction)
    return [grouped[engine] for engine in sorted(grouped)]


def _instruction_name(instruction: bir_pb2.Instruction, engine: int, position: int) -> str:
    if instruction.name:
        return instruction.name
    if instruction.id:
        return f"#{instruction.id}"
    return f"{engine_name(engine)}[{position}]"


class _Rotated:
    """What a variation adds at iteration r of a loop too long to tabulate, computed when asked."""

    def __init__(self, variation: loops.Variation) -> None:
        self.rotation, self.step = variation

    def __getitem__(self, r: int) -> int:
        return loops.rotated(self.rotation, self.step, r)


Table = list[int] | _Rotated


def _tabulate(variations: Sequence[loops.Variation], trips: Sequence[int]) -> tuple[Table, ...]:
    """Per loop, what its variation adds at each iteration: a list, or for a loop longer than
    _TABLE_TRIPS a _Rotated that computes it."""
    return tuple(
        [loops.rotated(*variation, r) for r in range(trip)] if trip <= _TABLE_TRIPS else _Rotated(variation)
        for variation, trip in zip(variations, trips, strict=True)
    )


@dataclass
class _Varied:
    """An operand of a loop body entry whose offset changes with the iteration: its Access at the
    first point, and those at the offsets met since (a rotation revisits them)."""

    output: bool
    number: int
    variations: list[loops.Variation]
    access: Access
    cache: dict[int, Access] = field(default_factory=dict)

    def at(self, offset: int) -> Access:
        if len(self.cache) >= _ACCESS_CACHE:
            self.cache.clear()
        access = self.cache[offset] = self.access.at(offset)
        return access

    def first_out_of_bounds(self, trips: Sequence[int]) -> loops.Point | None:
        """The first point at which this operand leaves its memory, if any."""
        if self.access.storage is None:
            return None  # an empty operand touches nothing: it is never out of bounds
        low, high = self.access.offset_range
        return loops.first_point_outside(
            trips, self.access.offset, self.variations, lambda offset: low <= offset <= high
        )


class Template:
    """One stream entry decoded once: the Op of its first instance, and what the others change:
    the offsets of `varied` operands and the thresholds of `grown` waits, each its base plus a
    table entry per enclosing loop."""

    def __init__(self, instruction: bir_pb2.Instruction, op: Op, trips: Sequence[int]) -> None:
        self.instruction = instruction
        self.op = op
        self.prefix = f"{instruction.name}@"
        self.varied: list[_Varied] = []
        # (operand, base offset, tables) per varied operand, (number, semaphore, base, tables) per grown wait
        self._offsets: list[tuple[_Varied, int, tuple[Table, ...]]] = []
        self._thresholds: list[tuple[int, int, int, tuple[Table, ...]]] = []
        if not trips:
            return
        sides = ((True, instruction.outputs, op.outputs), (False, instruction.inputs, op.inputs))
        for output, operands, accesses in sides:
            for number, (ap, access) in enumerate(zip(operands, accesses, strict=True)):
                if ap.loop:
                    variations = loops.operand_variations(ap)
                    varied = _Varied(output, number, variations, access)
                    self.varied.append(varied)
                    self._offsets.append((varied, access.offset, _tabulate(variations, trips)))
        for number, wait in enumerate(instruction.waits):
            if wait.loop_steps:
                tables = _tabulate(loops.wait_variations(wait), trips)
                self._thresholds.append((number, op.waits[number][0], int(wait.value), tables))

    def name(self, point: loops.Point) -> str:
        """The name of the instance at `point`, as the expanded instruction's."""
        return self.prefix + ",".join(map(str, point)) if point else self.op.name

    def instance(self, point: loops.Point, uid: int) -> Op:
        """The Op this entry executes at `point` (outside loops: the template's own)."""
        if not point:
            return self.op
        op = _Instance.__new__(_Instance)
        fields = op.__dict__
        fields.update(self.op.__dict__)
        fields["uid"], fields["prefix"], fields["point"] = uid, self.prefix, point
        if self._offsets:
            inputs, outputs = list(op.inputs), list(op.outputs)
            for varied, offset, tables in self._offsets:  # a table per enclosing loop, as many as `point`
                offset += sum(map(getitem, tables, point))
                access = varied.cache.get(offset)
                if access is None:
                    access = varied.at(offset)
                (outputs if varied.output else inputs)[varied.number] = access
            fields["inputs"], fields["outputs"] = inputs, outputs
        if self._thresholds:
            waits = list(op.waits)
            for number, semaphore, value, tables in self._thresholds:
                waits[number] = (semaphore, loops.wait_value(value + sum(map(getitem, tables, point))))
            fields["waits"] = tuple(waits)
        return op


class _Instance(Op):
    """The Op of a loop instance, its name (`prefix` + point) made only when asked for: races,
    deadlocks, traces and observers name few of a long run's instructions."""

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.__dict__["prefix"] + ",".join(map(str, self.__dict__["point"]))


class EngineStream:
    """One engine's decoded stream: the templates of its entries and their layout. It executes
    `length` instructions, numbered (uid) in execution order from `base_uid` on."""

    def __init__(
        self,
        stream: bir_pb2.Stream,
        layout: loops.Layout,
        base_uid: int,
        memory: DeviceMemory,
        target: Target,
        costs: CostModel,
        num_semaphores: int,
    ) -> None:
        self.engine = stream.engine
        self.stream = stream
        self.layout = layout
        self.base_uid = base_uid
        self.length = layout.executed
        self.templates: dict[int, Template] = {}

        def decode(index: int, point: loops.Point) -> Op:
            entry = stream.instructions[index]
            position = layout.position(index, point)
            instruction = loops.instance(entry, point) if point else entry
            uid = base_uid + position
            return _decode(instruction, self.engine, position, uid, memory, target, costs, num_semaphores)

        failures: list[tuple[int, loops.Point]] = []
        for index, instruction in enumerate(stream.instructions):
            if instruction.op == loops.LOOP_OP:
                continue
            trips = layout.trips[index]
            point = (0,) * len(trips)
            try:
                op = decode(index, point)
            except CompileError:
                failures.append((index, point))  # no later entry has an instance that runs before
                break
            template = self.templates[index] = Template(instruction, op, trips)
            for varied in template.varied:
                bad = varied.first_out_of_bounds(trips)
                if bad is not None:
                    failures.append((index, bad))
        failure = loops.first_failure(layout, failures)
        if failure is not None:
            decode(*failure)  # raises the error of the first failing instance, as expanded
            raise AssertionError(f"instance {failure} of the {engine_name(self.engine)} stream should fail")

    def ops(self, start: int = 0) -> Iterator[Op]:
        """The Ops this stream executes, in order, from position `start` on."""
        templates, uid = self.templates, self.base_uid + start
        for index, point in self.layout.instances(start):
            yield templates[index].instance(point, uid)
            uid += 1

    def op_at(self, position: int) -> Op:
        return next(self.ops(position))

    def instruction(self, position: int) -> bir_pb2.Instruction:
        """The BIR instruction executed at `position` (inside loops: loops.instance of its entry)."""
        index, point = next(self.layout.instances(position))
        entry = self.stream.instructions[index]
        return loops.instance(entry, point) if point else entry

    def ids(self) -> Iterator[int]:
        """The BIR id of every instruction executed, in order (an instance carries its entry's)."""
        for index, _ in self.layout.instances():
            yield int(self.stream.instructions[index].id)

    def dma_queues(self) -> set[int]:
        """The dma queues this stream triggers transfers on."""
        return {template.op.queue for template in self.templates.values() if template.op.is_dma}

    def positive_updates(self, start: int) -> list[tuple[str, int, int]]:
        """(first instruction, semaphore, total) of the positive updates still to come from
        position `start` on: per semaphore, the first instruction that makes one and the sum of
        all of them, in the order of those first ones (what a deadlock diagnosis needs)."""
        first: dict[int, str] = {}
        total: dict[int, int] = {}
        for index, point in self.layout.instances(start):
            template = self.templates[index]
            for semaphore, increment in template.op.updates:
                if increment > 0:
                    if semaphore not in first:
                        first[semaphore] = template.name(point)
                        total[semaphore] = 0
                    total[semaphore] += increment
        return [(name, semaphore, total[semaphore]) for semaphore, name in first.items()]


def locate(streams: dict[int, EngineStream], uid: int) -> tuple[EngineStream, int]:
    """The stream that executes instruction `uid`, and its position there."""
    for stream in streams.values():
        if stream.base_uid <= uid < stream.base_uid + stream.length:
            return stream, uid - stream.base_uid
    raise KeyError(uid)


def load_streams(
    streams: Iterable[bir_pb2.Stream],
    layouts: Sequence[loops.Layout] | None,
    memory: DeviceMemory,
    target: Target,
    num_semaphores: int,
) -> dict[int, EngineStream]:
    """Decode every stream (`layouts`: loops.plan_streams', None when no stream has loops); maps
    each engine to its decoded stream, whose instructions are numbered in stream order."""
    costs = CostModel(target)
    result: dict[int, EngineStream] = {}
    uid = 0
    for number, stream in enumerate(streams):
        if stream.engine not in ENGINES.values():
            raise CompileError("E603", f"a stream names no valid engine ({stream.engine})")
        if stream.engine in result:
            raise CompileError("E603", f"two streams for engine {engine_name(stream.engine)}")
        layout = layouts[number] if layouts is not None else loops.Layout.flat(len(stream.instructions))
        result[stream.engine] = EngineStream(stream, layout, uid, memory, target, costs, num_semaphores)
        uid += layout.executed
    return result


def _wait_threshold(wait: bir_pb2.SemaphoreWait) -> int:
    encoded = encoded_wait_value(wait)
    return int(wait.value) if encoded is None else encoded


def _decode(
    instruction: bir_pb2.Instruction,
    engine: int,
    position: int,
    uid: int,
    memory: DeviceMemory,
    target: Target,
    costs: CostModel,
    num_semaphores: int,
) -> Op:
    name = _instruction_name(instruction, engine, position)
    label = f"instruction {name!r} ({engine_name(engine)})"
    if instruction.engine not in (common_pb2.ENGINE_INVALID, engine):
        raise CompileError(
            "E603",
            f"{label} is in the {engine_name(engine)} stream but names engine "
            f"{engine_name(instruction.engine)}",
            name,
        )
    # a lowered wait (walrus lower_sync) runs from the words the instruction encodes, as on the machine
    waits = tuple((int(w.semaphore), _wait_threshold(w)) for w in instruction.waits)
    updates = tuple((int(u.semaphore), int(u.increment)) for u in instruction.updates)
    _check_sync(label, name, waits, updates, target, num_semaphores)
    op = Op(
        uid=uid,
        name=name,
        op=instruction.op,
        engine=engine,
        queue=int(instruction.dma_queue),
        inputs=[memory.resolve(ap, f"{label} input {i}") for i, ap in enumerate(instruction.inputs)],
        outputs=[memory.resolve(ap, f"{label} output {i}") for i, ap in enumerate(instruction.outputs)],
        func=instruction.func,
        scalars=tuple(float(s) for s in instruction.scalars),
        accumulate=bool(instruction.accumulate),
        attributes=dict(instruction.attributes),
        waits=waits,
        updates=updates,
    )
    semantics.validate(op, target)
    op.cost_ns = costs.engine_ns(op)
    op.transfer_ns = costs.transfer_ns(op)
    op.hbm_ns = costs.hbm_ns(op)
    op.ports = costs.ports(op)
    op.dispatch_ports = costs.dispatch_ports(op)
    return op


def _check_sync(
    label: str,
    name: str,
    waits: Sequence[tuple[int, int]],
    updates: Sequence[tuple[int, int]],
    target: Target,
    num_semaphores: int,
) -> None:
    if len(waits) > target.max_waits_per_instruction:
        raise CompileError(
            "E603", f"{label} has {len(waits)} waits (at most {target.max_waits_per_instruction})", name
        )
    if len(updates) > target.max_updates_per_instruction:
        raise CompileError(
            "E603", f"{label} has {len(updates)} updates (at most {target.max_updates_per_instruction})", name
        )
    for semaphore, _ in (*waits, *updates):
        if not 0 <= semaphore < num_semaphores:
            raise CompileError(
                "E603", f"{label} uses semaphore {semaphore} but the program has {num_semaphores}", name
            )
