"""The simulator's public API: run a NEFF or a BIR program on user inputs, get outputs and findings.

Inputs are keyed "arg<N>" for the HbmTensor with role INPUT and index N; outputs come back as
"out<N>" for role OUTPUT, index N, as user arrays (bf16 widened to float32, PRED as bool).
CONSTANT tensors start from their data, INTERNAL and OUTPUT tensors and all on-chip memory from
zeros. A missing or misshapen input is CompileError E602; static problems in the program are
E601 (out of bounds) / E603 (malformed), raised before anything runs. Races and deadlocks are
not errors here: they are findings in the SimResult (the CLI turns them into E611/E612).
With `record_schedule=True` the result also holds the `Schedule` (when each instruction waited,
ran and moved data), which `chrome_trace` turns into a Perfetto / chrome://tracing trace.
`inferences=N` runs the program N times back to back on the same device, as a runtime serving
requests does: memory and semaphore counts carry over from one inference to the next (inputs are
bound once), so a program that does not reset its semaphores (walrus pass semaphore_reset) lets
the second inference's waits pass early, which the race detector then reports. The result's
`unreset_semaphores` names the semaphores the first inference left above 0; its outputs are the
last inference's, `simulated_ns` the first one's time (`inference_ns` has each), races, busy
times and instruction counts add up over all, and a schedule or an observer sees the first only.
`observe(instruction, outputs)`, when given, is called as each instruction's effect lands, with
the BIR instruction and a copy of its outputs' storage right then, in simulated order.
`max_steps` bounds the instructions a run executes (limits.MAX_STEPS by default): a NEFF whose
loops would execute more is refused (E605) before anything runs. Loops are not expanded: each
loop body is decoded once and its iterations are created as they run (program.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from ncc.schemas import bir_pb2
from ncc.tools.common import dtypes, loops
from ncc.tools.common.errors import CompileError
from ncc.tools.sim import limits
from ncc.tools.sim.effects import Effects
from ncc.tools.sim.hb import Race
from ncc.tools.sim.instruction import Op
from ncc.tools.sim.memory import DeviceMemory, shape_text
from ncc.tools.sim.program import EngineStream, load_streams, locate, streams_of_program
from ncc.tools.sim.simulator import Simulator
from ncc.tools.sim.trace import Schedule, ScheduleRecorder, chrome_trace
from ncc.tools.target import Target, load_target

__all__ = ["Race", "Schedule", "SimResult", "chrome_trace", "simulate_neff", "simulate_program"]

Observer = Callable[[bir_pb2.Instruction, list[np.ndarray]], None]


@dataclass
class SimResult:
    """Everything one simulated execution produced."""

    outputs: dict[str, np.ndarray]
    simulated_ns: float
    races: list[Race]
    deadlock: str | None
    engine_busy_ns: dict[str, float]
    instruction_count: int
    race_count: int = 0  # distinct racing pairs found (`races` holds at most the first 10000)
    races_capped: bool = False  # the race detector stopped looking after 10000: race_count is a lower bound
    schedule: Schedule | None = None  # only when asked for (record_schedule=True)
    unreset_semaphores: dict[int, int] | None = None  # semaphore -> count the first inference left (not 0)
    inferences: int = 1
    inference_ns: list[float] | None = None  # each inference's simulated time (simulated_ns: the first)
    hbm_bytes: int = 0  # bytes the first inference's transfers moved to or from HBM

    def report(self) -> dict:
        """A JSON-able summary."""
        return {
            "simulated_ns": self.simulated_ns,
            "races": [race.describe() for race in self.races],
            "race_count": max(self.race_count, len(self.races)),
            "race_count_is_lower_bound": self.races_capped,
            "deadlock": self.deadlock,
            "outputs": [
                {"name": name, "shape": list(array.shape), "dtype": str(array.dtype)}
                for name, array in self.outputs.items()
            ],
            "engine_busy_ns": dict(self.engine_busy_ns),
            "instruction_count": self.instruction_count,
            "inferences": self.inferences,
            "inference_ns": list(self.inference_ns or [self.simulated_ns]),
            "hbm_bytes": self.hbm_bytes,
            "unreset_semaphores": {str(s): c for s, c in (self.unreset_semaphores or {}).items()},
        }


def simulate_neff(
    neff: bir_pb2.Neff,
    inputs: Mapping[str, np.ndarray],
    check_races: bool = True,
    target: Target | None = None,
    record_schedule: bool = False,
    inferences: int = 1,
    max_steps: int = limits.MAX_STEPS,
) -> SimResult:
    """Execute a NEFF's streams on `inputs` ("arg0".."argN"), `inferences` times back to back."""
    return _simulate(
        neff.target,
        neff.hbm,
        neff.buffers,
        neff.streams,
        neff.num_semaphores,
        inputs,
        check_races,
        target,
        record_schedule,
        inferences=inferences,
        max_steps=max_steps,
    )


def simulate_program(
    program: bir_pb2.Program,
    inputs: Mapping[str, np.ndarray],
    check_races: bool = True,
    target: Target | None = None,
    record_schedule: bool = False,
    observe: Observer | None = None,
    inferences: int = 1,
    max_steps: int = limits.MAX_STEPS,
) -> SimResult:
    """Execute a BIR program: its streams if codegen filled them, else its instructions grouped
    by engine in order. Buffers not yet allocated (address -1) get private storage each."""
    return _simulate(
        program.target,
        program.hbm,
        program.buffers,
        streams_of_program(program),
        program.num_semaphores,
        inputs,
        check_races,
        target,
        record_schedule,
        observe,
        inferences,
        max_steps,
    )


def _load_target(name: str) -> Target:
    try:
        return load_target(name or "trn1")
    except (OSError, KeyError, ValueError) as err:
        raise CompileError("E603", f"cannot load target {name!r}: {err}", name) from None


def _simulate(
    target_name: str,
    hbm: Iterable[bir_pb2.HbmTensor],
    buffers: Iterable[bir_pb2.Buffer],
    streams: Iterable[bir_pb2.Stream],
    num_semaphores: int,
    inputs: Mapping[str, np.ndarray],
    check_races: bool,
    target: Target | None,
    record_schedule: bool = False,
    observe: Observer | None = None,
    inferences: int = 1,
    max_steps: int = limits.MAX_STEPS,
) -> SimResult:
    target = target or _load_target(target_name)
    hbm, streams = list(hbm), list(streams)
    layouts = loops.plan_streams(streams, "E603", max_steps, limit_code="E605")
    if layouts is None:
        executed = sum(len(stream.instructions) for stream in streams)
    else:
        executed = sum(layout.executed for layout in layouts)
    if executed * inferences > max_steps:  # the bound is on the whole run, every inference in it
        times = f"{inferences:,} inferences of {executed:,} instructions: " if inferences > 1 else ""
        total = f"{executed * inferences:,} instructions (at most {max_steps:,})"
        raise CompileError("E605", f"the streams execute {times}{total}")
    limits.check_program(target, hbm, streams, num_semaphores, layouts=layouts)
    memory = DeviceMemory(target, hbm, buffers)
    _bind_inputs(memory, inputs)
    ops = load_streams(streams, layouts, memory, target, num_semaphores)
    recorder = ScheduleRecorder() if record_schedule else None
    observer = None
    if observe is not None:

        def observer(op: Op) -> None:
            stream, position = locate(ops, op.uid)
            observe(stream.instruction(position), [access.read() for access in op.outputs])

    # an observer reads memory as each effect lands: then they land here, not in a child
    effects = Effects(ops, memory, inferences, in_process=observe is not None)
    try:
        result = _run(ops, target, num_semaphores, check_races, recorder, observer, inferences, effects)
        if recorder is not None:  # load_streams numbers ops (uid) in stream order
            recorder.schedule.ids = [number for stream in ops.values() for number in stream.ids()]
        result.outputs = effects.outputs()
    finally:
        effects.close()
    return result


def _run(
    ops: dict[int, EngineStream],
    target: Target,
    num_semaphores: int,
    check_races: bool,
    recorder: ScheduleRecorder | None,
    observer: Callable[[Op], None] | None,
    inferences: int,
    effects: Effects,
) -> SimResult:
    """The inferences' simulation (outputs left empty: the effects may land in another process)."""
    effect = effects.effect
    outcome = Simulator(ops, target, num_semaphores, check_races, recorder, observer, effect=effect).run()
    result = SimResult(
        outputs={},
        simulated_ns=outcome.simulated_ns,
        races=outcome.races,
        deadlock=outcome.deadlock,
        engine_busy_ns=outcome.engine_busy_ns,
        instruction_count=outcome.instruction_count,
        race_count=outcome.race_count,
        races_capped=outcome.races_capped,
        schedule=recorder.schedule if recorder is not None else None,
        unreset_semaphores={s: c for s, c in enumerate(outcome.final_counts) if c},
        inferences=inferences,
        inference_ns=[outcome.simulated_ns],
        hbm_bytes=outcome.hbm_bytes,
    )
    for _ in range(1, inferences):
        if result.deadlock:
            break
        effects.next_inference()
        outcome = Simulator(
            ops, target, num_semaphores, check_races, initial_counts=outcome.final_counts, effect=effect
        ).run()
        result.inference_ns.append(outcome.simulated_ns)
        result.races += outcome.races
        result.race_count += outcome.race_count
        result.races_capped |= outcome.races_capped
        result.deadlock = outcome.deadlock
        result.instruction_count += outcome.instruction_count
        for name, busy in outcome.engine_busy_ns.items():
            result.engine_busy_ns[name] = result.engine_busy_ns.get(name, 0.0) + busy
    return result


def _bind_inputs(memory: DeviceMemory, inputs: Mapping[str, np.ndarray]) -> None:
    for tensor in memory.tensors.values():
        if tensor.role != bir_pb2.INPUT:
            continue
        key = f"arg{tensor.index}"
        described = f"input {key} (tensor {tensor.name!r}, {shape_text(tensor.dtype, tensor.shape)})"
        if key not in inputs:
            raise CompileError("E602", f"{described} was not given", key)
        array = np.asarray(inputs[key])
        if tuple(array.shape) != tuple(tensor.shape):
            raise CompileError("E602", f"{described} was given with shape {list(array.shape)}", key)
        try:
            storage = dtypes.user_array_to_storage(array, tensor.dtype)
        except (TypeError, ValueError) as err:
            raise CompileError("E602", f"{described} cannot be converted: {err}", key) from None
        memory.store_tensor(tensor.name, storage)
