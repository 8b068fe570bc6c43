"""Loading: BIR instruction streams → decoded, validated, costed `Op`s per engine.

A NEFF carries per-engine `Stream`s; a BIR `Program` before codegen carries one global
instruction list, which is split by engine preserving order (the same split codegen makes).
Every static problem is reported here, before simulation starts: a stream whose instructions
belong to another engine, two streams for one engine, semaphores outside the program's
`num_semaphores`, more waits/updates than the target allows (E603), and, through
DeviceMemory.resolve and semantics.validate, bad operands (E601/E603).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.sim import semantics
from ncc.tools.sim.instruction import Op, engine_name
from ncc.tools.sim.memory import DeviceMemory
from ncc.tools.sim.timing import CostModel
from ncc.tools.target import ENGINES, Target, encoded_wait_value


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


def load_streams(
    streams: Iterable[bir_pb2.Stream],
    memory: DeviceMemory,
    target: Target,
    num_semaphores: int,
) -> dict[int, list[Op]]:
    """Decode every stream; the result maps each engine to its ops in program order."""
    costs = CostModel(target)
    result: dict[int, list[Op]] = {}
    uid = 0
    for stream in streams:
        if stream.engine not in ENGINES.values():
            raise CompileError("E603", f"a stream names no valid engine ({stream.engine})")
        if stream.engine in result:
            raise CompileError("E603", f"two streams for engine {engine_name(stream.engine)}")
        ops: list[Op] = []
        for position, instruction in enumerate(stream.instructions):
            ops.append(
                _decode(instruction, stream.engine, position, uid, memory, target, costs, num_semaphores)
            )
            uid += 1
        result[stream.engine] = ops
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
