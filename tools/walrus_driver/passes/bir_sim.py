"""Execute the compiled program in the simulator on seeded random inputs; races or deadlock fail.

Runs ncc.tools.sim.api.simulate_program with race checking on inputs drawn from a seeded RNG
(normal floats, small integers, random predicates). A race or a deadlock is E411 naming the first
finding. With `compare_sequential` (default) the program the driver received is also executed
one instruction at a time in its original order (every instruction waits for the previous one on
a single semaphore, buffers unallocated, i.e. private) and the outputs must be bit-identical: E412
otherwise. Counters: simulated_ns, races, simulated_ns over the schedule's lower bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.common import dtypes
from ncc.tools.common.errors import CompileError
from ncc.tools.walrus_driver import costs
from ncc.tools.walrus_driver.context import PassContext
from ncc.tools.walrus_driver.registry import register

NAME = "bir_sim"


@dataclass
class Options:
    seed: int = 0
    compare_sequential: bool = True
    check_races: bool = True


def random_inputs(program: bir_pb2.Program, seed: int) -> dict[str, np.ndarray]:
    """One array per INPUT tensor, keyed arg<index> as the simulator expects."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for tensor in program.hbm:
        if tensor.role != bir_pb2.INPUT:
            continue
        shape = tuple(tensor.shape)
        if tensor.dtype == common_pb2.PRED:
            array = rng.integers(0, 2, size=shape).astype(bool)
        elif dtypes.is_float(tensor.dtype):
            array = rng.standard_normal(size=shape).astype(np.float32)
        elif not dtypes.is_signed(tensor.dtype):
            array = rng.integers(0, 8, size=shape)
        else:
            array = rng.integers(-8, 8, size=shape)
        inputs[f"arg{tensor.index}"] = array
    return inputs


def sequential_program(program: bir_pb2.Program) -> bir_pb2.Program:
    """The program with every instruction waiting for the previous one: the reference semantics."""
    reference = bir_pb2.Program()
    reference.CopyFrom(program)
    del reference.streams[:]
    reference.num_semaphores = 1
    for buffer in reference.buffers:
        buffer.address = -1
    for position, instr in enumerate(reference.instructions):
        del instr.waits[:]
        del instr.updates[:]
        if position:
            instr.waits.add(semaphore=0, value=position)
        instr.updates.add(semaphore=0, increment=1)
    return reference


@register(NAME, Options)
def run(ctx: PassContext) -> None:
    options: Options = ctx.options or Options()
    ctx.require_allocated()
    try:
        from ncc.tools.sim.api import simulate_program
    except ImportError as err:
        raise CompileError("E411", f"bir_sim: the simulator is not available: {err}", NAME) from None
    inputs = random_inputs(ctx.program, options.seed)
    result = simulate_program(ctx.program, inputs, check_races=options.check_races, target=ctx.target)
    races = max(result.race_count, len(result.races))
    ctx.set_stat("simulated_ns", round(result.simulated_ns, 1))
    ctx.set_stat("races", races)
    ctx.set_stat("deadlock", int(result.deadlock is not None))
    bound = costs.lower_bound_ns(ctx.program.instructions, ctx.deps if ctx.deps_valid else None, ctx.target)
    if bound["lower_bound_ns"]:
        ctx.set_stat("simulated_over_lower_bound", round(result.simulated_ns / bound["lower_bound_ns"], 3))
    ctx.program.attributes["walrus.simulated_ns"] = f"{result.simulated_ns:.1f}"
    if result.deadlock is not None:
        raise CompileError("E411", f"bir_sim: the program deadlocks: {result.deadlock}", NAME)
    if races:
        raise CompileError("E411", f"bir_sim: {races} race(s); first: {result.races[0].describe()}", NAME)
    if options.compare_sequential and ctx.input_program is not None:
        reference = simulate_program(
            sequential_program(ctx.input_program), inputs, check_races=False, target=ctx.target
        )
        ctx.set_stat("sequential_ns", round(reference.simulated_ns, 1))
        for key, expected in reference.outputs.items():
            got = result.outputs.get(key)
            if (
                got is None
                or got.shape != expected.shape
                or not np.array_equal(got, expected, equal_nan=_nan_ok(got))
            ):
                where = _first_difference(got, expected)
                raise CompileError(
                    "E412",
                    f"bir_sim: output {key} differs from sequential execution of the input order{where}",
                    NAME,
                )
        ctx.set_stat("outputs_compared", len(reference.outputs))


def _nan_ok(array: np.ndarray | None) -> bool:
    return array is not None and np.issubdtype(array.dtype, np.floating)


def _first_difference(got: np.ndarray | None, expected: np.ndarray) -> str:
    if got is None:
        return " (missing)"
    if got.shape != expected.shape:
        return f" (shape {list(got.shape)}, expected {list(expected.shape)})"
    same = got == expected
    if _nan_ok(got):
        same |= np.isnan(got) & np.isnan(expected)
    diff = np.argwhere(~same)
    if not len(diff):
        return ""
    index = tuple(int(i) for i in diff[0])
    return f" (first at {list(index)}: {got[index]!r} != {expected[index]!r})"
