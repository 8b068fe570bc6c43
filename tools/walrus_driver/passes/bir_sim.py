"""Execute the compiled program in the simulator on seeded random inputs; races or deadlock fail.

Runs ncc.tools.sim.api.simulate_program with race checking on inputs drawn from a seeded RNG
(normal floats, small integers, random predicates). A race or a deadlock is E411 naming the first
finding. With `compare_sequential` (default) the program the driver received is also executed
one instruction at a time in its original order (every instruction waits for the previous one on
a single semaphore, buffers unallocated, i.e. private) and the outputs must be bit-identical: E412
otherwise. Counters: simulated_ns, races, simulated_ns over the schedule's lower bound.

Golden mode (`golden=golden.pb`, what `ncc bisect` appends to each prefix of the pipeline): the
program as it stands after the passes before it is run on the TensorSet's inputs (arg*) and its
outputs compared with the TensorSet's (out*) under --verify's tolerance (ncc.tools.sim.check):
E412 when one differs. It needs no earlier pass: a program with semaphores runs with them (a
race or deadlock is E411), one without runs one instruction at a time in its current order, with
its addresses if it has them (so a pass that reorders, allocates or rewrites wrongly shows before
any semaphore exists). `report=FILE.json` writes, before the verdict, what ncc bisect reads:
the verdict and its message, the first race's instruction ids, each instruction's result digest
in the order results landed, and the program's text (printer.py).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.common import dtypes
from ncc.tools.common.errors import CompileError
from ncc.tools.common.protoio import write_bytes_atomic
from ncc.tools.walrus_driver import printer
from ncc.tools.walrus_driver.analysis import birutil, costs, syncmodel
from ncc.tools.walrus_driver.context import PassContext
from ncc.tools.walrus_driver.registry import register

NAME = "bir_sim"


@dataclass
class Options:
    seed: int = 0
    compare_sequential: bool = True
    check_races: bool = True
    golden: str = ""  # a TensorSet (golden.pb): run on its inputs, compare with its outputs
    report: str = ""  # golden mode: write the verdict, per-instruction trace and program text (JSON)


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


def sequential_program(program: bir_pb2.Program, keep_addresses: bool = False) -> bir_pb2.Program:
    """The program with every instruction waiting for the previous one: the reference semantics
    (buffers private unless `keep_addresses`). In a program that uses both DVE and POOL, the wait
    of an instruction on either rides on a `drain` just before it, so that no instruction holds
    their shared SBUF port while it waits for the other engine (sync_dve_pool)."""
    reference = bir_pb2.Program()
    reference.CopyFrom(program)
    del reference.streams[:]
    reference.num_semaphores = 1
    for buffer in reference.buffers if not keep_addresses else ():
        buffer.address = -1
    order: list[bir_pb2.Instruction] = []
    next_id = birutil.next_instruction_id(reference)
    drained = syncmodel.PORT_PARTNER if syncmodel.both_port_partners(reference) else {}
    for position, instr in enumerate(reference.instructions):
        del instr.waits[:]
        del instr.updates[:]
        if position:
            waiter = instr
            if instr.engine in drained:
                waiter = bir_pb2.Instruction(
                    id=next_id, name=f"{instr.name}.drain", op="drain", engine=instr.engine
                )
                next_id += 1
                order.append(waiter)
            waiter.waits.add(semaphore=0, value=position)
        instr.updates.add(semaphore=0, increment=1)
        order.append(instr)
    birutil.set_order(reference, order)
    return reference


@register(NAME, Options)
def run(ctx: PassContext) -> None:
    options: Options = ctx.options or Options()
    if options.golden:
        run_golden(ctx, options)
        return
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
    bound = costs.lower_bound_ns(ctx.program.instructions, ctx.valid_deps(), ctx.target)
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


# -- golden mode ----------------------------------------------------------------------------------


class _Trace:
    """What each instruction's result was, in the order results landed (the simulator's observer)."""

    def __init__(self) -> None:
        self.rows: list[list[Any]] = []

    def __call__(self, instr: bir_pb2.Instruction, outputs: list[np.ndarray]) -> None:
        digest = hashlib.blake2b(digest_size=8)
        shapes = []
        for array in outputs:
            digest.update(np.ascontiguousarray(array).tobytes())
            shapes.append("x".join(map(str, array.shape)) + ":" + str(array.dtype))
        self.rows.append([instr.name, int(instr.id), ",".join(shapes), digest.hexdigest()])


def run_golden(ctx: PassContext, options: Options) -> None:
    """Run the program as it stands on the golden inputs; E411/E412 unless it matches the golden outputs."""
    from ncc.tools.sim.api import simulate_program
    from ncc.tools.sim.check import ATOL, compare, default_rtol, read_tensors

    inputs = read_tensors(options.golden, "golden inputs", "arg")
    expected = read_tensors(options.golden, "golden outputs", "out")
    if not expected:  # nothing to compare would make every program match
        raise CompileError("E602", f"bir_sim: {options.golden} holds no golden outputs (out0, ...)", NAME)
    synchronized = ctx.synchronized
    program = ctx.program if synchronized else sequential_program(ctx.program, keep_addresses=True)
    trace = _Trace() if options.report else None
    result = simulate_program(
        program, inputs, check_races=synchronized and options.check_races, target=ctx.target, observe=trace
    )
    races = max(result.race_count, len(result.races))
    ctx.set_stat("simulated_ns", round(result.simulated_ns, 1))
    ctx.set_stat("races", races)
    ctx.set_stat("deadlock", int(result.deadlock is not None))
    rtol = default_rtol(ctx.program)
    comparisons = [
        compare(name, result.outputs.get(name), expected[name], ATOL, rtol) for name in sorted(expected)
    ]
    ctx.set_stat("outputs_compared", len(comparisons))
    wrong = [comparison.message(ATOL, rtol) for comparison in comparisons if not comparison.ok]
    execution = "parallel" if synchronized else "sequential"
    if options.report:
        _write_report(options.report, ctx.program, execution, result, trace, wrong)
    if result.deadlock is not None:
        raise CompileError("E411", f"bir_sim: the program deadlocks: {result.deadlock}", NAME)
    if races:
        raise CompileError("E411", f"bir_sim: {races} race(s); first: {result.races[0].describe()}", NAME)
    if wrong:
        how = "with its semaphores" if synchronized else "one instruction at a time"
        raise CompileError("E412", f"bir_sim: {wrong[0]} (expected: {options.golden}; run {how})", NAME)


def _race_ids(program: bir_pb2.Program, race: Any) -> list[int]:
    """The ids of the two instructions of a race (the simulator names them `'name' (ENGINE)`)."""
    labels = {race.first.rsplit(" (", 1)[0], race.second.rsplit(" (", 1)[0]}
    return [int(i.id) for i in program.instructions if repr(i.name or f"#{i.id}") in labels]


def _write_report(
    path: str, program: bir_pb2.Program, execution: str, result: Any, trace: _Trace | None, wrong: list[str]
) -> None:
    if result.deadlock is not None:
        verdict, message = "deadlock", result.deadlock
    elif result.races:
        verdict, message = "race", result.races[0].describe()
    elif wrong:
        verdict, message = "mismatch", "; ".join(wrong)
    else:
        verdict, message = "ok", ""
    ids = {int(instr.id) for instr in program.instructions}
    report = {
        "verdict": verdict,
        "message": message,
        "execution": execution,
        "race_count": max(result.race_count, len(result.races)),
        "race_ids": _race_ids(program, result.races[0]) if result.races else [],
        # the program's own instructions (not the drains a sequential run adds)
        "trace": [row for row in trace.rows if row[1] in ids] if trace is not None else [],
        # The program's text in program order: [id, name, printer line].
        "ir": [[int(i.id), i.name, printer.format_instruction(i)] for i in program.instructions],
    }
    write_bytes_atomic(path, (json.dumps(report) + "\n").encode())
