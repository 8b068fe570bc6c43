"""Check every BIR rule and report the first broken one as E410 "birverifier: <check>: <instr>: <what>".

Structural checks (always): unique ids and names; known ops with the right operand counts;
engine rules (matmul on PE into PSUM, activation on ACT, POOL never touches PSUM, ...); operands
name existing buffers/tensors of the right memory; partitions within the buffer and the target's
128; accesses within their buffer or tensor; element counts that match per op; dma queues that
exist. Addresses: allocated (once `allocation` has run), within SBUF/PSUM, PSUM bank rule, and no
two buffers sharing bytes while both are live. Synchronization: at most 2 waits and 1 update per
instruction, semaphore ids below num_semaphores (itself within the target), wait thresholds
within 0 .. 2^64 - 1 and encoded as the words that make them up (`wait_value`, lower_sync), per-engine streams
equal to the global order; a program that updates semaphores ends SP's stream with one sem_reset
ordered after every update (`semaphore_reset`; a missing one is reported once codegen ran).

A program that keeps loops (analysis/loopnest.py) is checked as its static program, with three
differences: a buffer used inside a loop it is not private to is live over the loop's whole
body, and a rotating buffer takes every copy (`address_bounds`, `allocation_overlap`); an HBM
operand must stay inside its tensor at its loops' last iteration too (`loop_bounds`); and the
dynamic checks run on the expansion of the streams (codegen's, or the static order's put in
loops as codegen would), up to `max_expanded` executed instructions and `expanded_per_static` per
static one (past EXPANDED_FLOOR), beyond which only the static checks run (counter
`execution_checked`): expanding costs ~45 us an executed instruction, which made a kept 2,000-step
scan's compile follow its trips (2.0 of 4.4 s), and the loop bodies it repeats are the ones already
checked; `ncc run` and `--verify` still execute every iteration with the simulator's race and
deadlock detectors. A wait inside loops may start below 0 (it holds
at once: docs/ir.md, Loops) and its words then encode 0. The dependence coverage check reads the
DAG of one iteration and is left to the simulator's race detector for loops (`--verify`).

Dynamic checks, by abstract execution of the streams (every engine runs while its waits hold,
transfers complete as issued): a deadlock is reported with the blocked instructions; a DVE or POOL
instruction needing the shared SBUF port may not wait for work that can still need the other
engine (`dve_pool_port`: it claims the port at dispatch, sync_dve_pool); and, when
the dependence graph is valid for the final addresses and semaphores were inserted, a vector-
clock walk (syncmodel) proves that every cross-thread dependence edge is ordered by program
order, queue order or semaphore waits — an uncovered edge is a race.
"""

from __future__ import annotations

import bisect
import functools
from collections import defaultdict
from dataclasses import dataclass, field

from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.common import alu, dtypes, forked, loops
from ncc.tools.common.alu import ACT_OPERAND
from ncc.tools.common.errors import CompileError
from ncc.tools.target import INDIRECT_DMA_OPS, WAIT_VALUE_LIMIT, Target, encoded_wait_value, is_dma
from ncc.tools.target.costs import SBUF_PORT
from ncc.tools.walrus_driver.analysis import birutil, loopnest, syncmodel
from ncc.tools.walrus_driver.context import PassContext
from ncc.tools.walrus_driver.registry import register

NAME = "birverifier"
EXPANDED_FLOOR = 20_000  # executed instructions the dynamic checks of a program with loops always afford


@dataclass
class Options:
    require_allocated: str = "auto"  # yes | no | auto (= once allocation has run)
    check_sync: str = "auto"  # yes | no | auto (= when deps are valid for addresses and synchronized)
    # yes | no | auto (= from forked.MIN_INSTRUCTIONS up): the synchronization checks and the
    # abstract execution run in a forked child while this process checks instructions and buffers
    fork: str = "auto"
    max_expanded: int = 250_000  # loops: executed instructions up to which the dynamic checks run ...
    expanded_per_static: int = 4  # ... and at most this many per static instruction (above a floor)


# An instruction's waits as (semaphore, value) and its updates as (semaphore, increment).
_Sync = tuple[list[tuple[int, int]], list[tuple[int, int]]]


@dataclass
class _Report:
    problems: list[tuple[str, str, str]] = field(default_factory=list)
    checks: int = 0
    error: Exception | None = None  # what stopped the checks, raised once the report is read

    def fail(self, check: str, where: str, what: str) -> None:
        self.problems.append((check, where, what))


@register(NAME, Options)
def run(ctx: PassContext) -> None:
    options: Options = ctx.options or Options()
    program = ctx.program
    require_allocated = _decide(options.require_allocated, ctx.allocated)
    check_sync = _decide(options.check_sync, ctx.deps_valid_for_addresses and ctx.synchronized)
    fork = _decide(options.fork, len(program.instructions) >= forked.MIN_INSTRUCTIONS)
    # Two independent halves over the same program: the synchronization half in a child (on the
    # other core) while this process checks instructions and buffers. The problems are reported
    # in the order one process finds them, so the first one named is the same either way.
    report = _Report()
    dynamic = forked.Forked(
        functools.partial(_check_synchronization, ctx, check_sync, report, options.max_expanded,
                          options.expanded_per_static),
        parallel=fork,
    )
    live = _check_instructions(ctx, report)
    if ctx.loop_entries:
        nest = ctx.loops()
        loopnest.widen_live_ranges(live, program.instructions, nest, birutil.buffer_map(program))
        _check_loop_bounds(ctx, nest, report)
    _check_buffers(ctx, report, require_allocated, live)
    limits, execution = dynamic.result()
    limits_ok = not report.problems and not limits.problems
    report.problems += limits.problems
    report.checks += limits.checks
    if limits_ok and execution is not None:  # counts only on a program that passed every other rule
        if execution.error is not None:
            raise execution.error
        report.problems += execution.problems
        report.checks += execution.checks
    ctx.set_stat("checks", report.checks)
    ctx.set_stat("problems", len(report.problems))
    ctx.set_stat("sync_coverage_checked", int(limits_ok and check_sync))
    ctx.set_stat("instructions", len(program.instructions))
    ctx.set_stat("forked", int(dynamic.ran_in_child))
    if report.problems:
        check, where, what = report.problems[0]
        others = sorted({c for c, _, _ in report.problems[1:]})
        more = f" (and {len(report.problems) - 1} more: {', '.join(others)})" if others else ""
        raise CompileError("E410", f"birverifier: {check}: {where}: {what}{more}", where)


def _check_synchronization(
    ctx: PassContext, check_sync: bool, static: _Report, max_expanded: int, per_static: int
) -> tuple[_Report, _Report | None]:
    """The semaphore limits and the engine streams, then, if they and the `static` rules hold,
    the abstract execution: their two reports, the second None when it did not run.

    `static` is the instruction and buffer report as far as it goes when this runs: complete in
    process (after those checks), still empty in a child forked before them (run() then drops
    the execution report if they failed). The execution assumes a program that passed every
    other rule, so in the child an exception it raises is kept in its report, not raised."""
    limits = _Report()
    sync = _check_sync_limits(ctx, limits)
    if ctx.loop_entries:
        _check_loop_streams(ctx, limits)
    else:
        _check_streams(ctx.program, limits)
    if limits.problems or static.problems:
        return limits, None
    execution = _Report()
    try:
        streams = _loop_execution_streams(ctx, max_expanded, per_static) if ctx.loop_entries \
            else _streams(ctx.program)
        if streams is not None:
            _check_execution(ctx, execution, check_sync and not ctx.loop_entries, sync, streams)
    except Exception as error:
        execution.error = error
    return limits, execution


def _check_loop_streams(ctx: PassContext, report: _Report) -> None:
    """A program with loops: each stream, loop entries aside, is the static order of its engine."""
    program = ctx.program
    if not program.streams:
        return
    expected: dict[int, list[str]] = defaultdict(list)
    for instr in program.instructions:
        expected[instr.engine].append(instr.name)
    for stream in program.streams:
        report.checks += 1
        got = [instr.name for instr in stream.instructions if instr.op != loops.LOOP_OP]
        if got != expected.get(stream.engine, []):
            report.fail("streams", birutil.engine_name(stream.engine),
                        "stream differs from the static order filtered by engine")
    missing = set(expected) - {stream.engine for stream in program.streams}
    if missing:
        report.fail("streams", program.name,
                    f"no stream for {', '.join(birutil.engine_name(e) for e in sorted(missing))}")


def _loop_execution_streams(ctx: PassContext, limit: int,
                            per_static: int) -> dict[int, list[bir_pb2.Instruction]] | None:
    """The expanded streams the dynamic checks of a program with loops run on: codegen's, or the
    static order put in loops per engine; None (and counter execution_checked 0) past `limit` or
    `per_static` executed instructions per static one (past EXPANDED_FLOOR)."""
    program = ctx.program
    streams = list(program.streams) or _static_streams(ctx)
    static = sum(len(stream.instructions) for stream in streams)
    limit = min(limit, EXPANDED_FLOOR + per_static * static)
    executed = loops.executed_instructions(streams, "E410")
    ctx.set_stat("executed_instructions", executed)
    if executed > limit:
        ctx.set_stat("execution_checked", 0)
        return None
    ctx.set_stat("execution_checked", 1)
    expanded = loops.expand_streams(streams, "E410", limit)
    return {stream.engine: list(stream.instructions) for stream in expanded}


def _static_streams(ctx: PassContext) -> list[bir_pb2.Stream]:
    """Per engine, its instructions of the static order inside their loops (as codegen writes
    them, operands aside): what the engines execute."""
    nest = ctx.loops()
    streams: dict[int, bir_pb2.Stream] = {}
    open_entries: dict[int, list[tuple[int, bir_pb2.Instruction]]] = defaultdict(list)
    for instr in ctx.program.instructions:
        stream = streams.get(instr.engine)
        if stream is None:
            stream = streams[instr.engine] = bir_pb2.Stream(engine=instr.engine)
        chain = nest.chain_of(instr.id)
        entries = open_entries[instr.engine]
        shared = 0
        while shared < min(len(chain), len(entries)) and entries[shared][0] == chain[shared]:
            shared += 1
        del entries[shared:]
        for loop_id in chain[shared:]:
            loop = nest.loops[loop_id]
            for _, outer in entries:  # an inner loop's entry is part of the outer bodies
                outer.body_length += 1
            entry = stream.instructions.add(id=loop_id, name=loop.name, op=loops.LOOP_OP, engine=instr.engine,
                                            trip_count=loop.trip)
            entries.append((loop_id, entry))
        for _, entry in entries:
            entry.body_length += 1
        stream.instructions.append(instr)
    return [streams[engine] for engine in sorted(streams)]


def _decide(setting: str, auto: bool) -> bool:
    if setting not in ("yes", "no", "auto"):
        raise CompileError("E400", f"birverifier: option value {setting!r} is not yes, no or auto")
    return auto if setting == "auto" else setting == "yes"


def _check_instructions(ctx: PassContext, report: _Report) -> dict[str, tuple[int, int]]:
    """The per-instruction rules. Returns, read in the same walk of the operands, each on-chip
    buffer's live range: the positions of the first and last instructions that name it
    (birutil.touched_buffers), for _check_buffers."""
    program, target = ctx.program, ctx.target
    buffers = birutil.buffer_map(program)
    tensors = {t.name: t for t in program.hbm}
    ids: set[int] = set()
    names: set[str] = set()
    live: dict[str, tuple[int, int]] = {}
    onchip = birutil.ONCHIP
    for position, instr in enumerate(program.instructions):
        instr_id, name, op, engine = instr.id, instr.name, instr.op, instr.engine
        inputs, outputs = list(instr.inputs), list(instr.outputs)  # each operand read once
        operands = inputs + outputs
        memories = [ap.memory for ap in operands]
        for ap, memory in zip(operands, memories, strict=True):
            if memory in onchip:
                tensor = ap.tensor
                first, _ = live.get(tensor, (position, position))
                live[tensor] = (first, position)
        where = name or f"%{instr_id}"
        report.checks += 1
        if instr_id in ids:
            report.fail("unique_ids", where, f"id {instr_id} is used twice")
        if name in names:
            report.fail("unique_ids", where, "name is used twice")
        ids.add(instr_id)
        names.add(name)
        if op not in birutil.OP_ARITY:
            report.fail("known_op", where, f"unknown op {op!r}")
            continue
        allowed = birutil.OP_ENGINES[op]
        if engine not in birutil.ALL_ENGINES:
            report.fail("engine_rule", where, f"engine {engine} is not an engine")
        elif allowed is not None and engine not in allowed:
            wanted = "/".join(sorted(birutil.engine_name(e) for e in allowed))
            report.fail("engine_rule", where, f"{op} runs on {wanted}, not {birutil.engine_name(engine)}")
        n_in, n_out = birutil.OP_ARITY[op]
        more_in, more_out = birutil.OPTIONAL_OPERANDS.get(op, (0, 0))
        if not (n_in <= len(inputs) <= n_in + more_in and n_out <= len(outputs) <= n_out + more_out):
            report.fail(
                "operand_count",
                where,
                f"{op} takes {n_in}{f' to {n_in + more_in}' if more_in else ''} inputs and "
                f"{n_out}{f' to {n_out + more_out}' if more_out else ''} outputs, "
                f"has {len(inputs)} and {len(outputs)}",
            )
            continue
        for ap in operands:
            _check_operand(ap, instr, where, buffers, tensors, target.partitions, report)
        _check_op_shapes(instr, inputs, outputs, where, target, report)
        dma = is_dma(op)
        if dma and not 0 <= instr.dma_queue < target.dma_queues:
            report.fail(
                "dma_queue", where, f"queue {instr.dma_queue} does not exist (target has {target.dma_queues})"
            )
        if not dma:
            pool = engine == birutil.POOL
            for ap, memory in zip(operands, memories, strict=True):
                if memory == birutil.HBM:
                    report.fail("onchip_operands", where, f"{op} cannot access HBM tensor {ap.tensor!r}")
                if memory == birutil.PSUM and pool:
                    report.fail("pool_psum", where, f"POOL cannot access PSUM (operand {ap.tensor!r})")
    return live


def _check_loop_bounds(ctx: PassContext, nest: loopnest.LoopNest, report: _Report) -> None:
    """Rule loop_bounds: an operand that moves with its loops (an HBM one, or an indexed array's
    on chip) stays inside its tensor or buffer at the iterations where it reaches furthest (each
    loop's first or last, by the sign of its step)."""
    tensors = {t.name: t for t in ctx.program.hbm}
    buffers = birutil.buffer_map(ctx.program)
    for instr in ctx.program.instructions:
        chain = nest.chain_of(instr.id)
        for ap in (*instr.inputs, *instr.outputs):
            if not ap.loop:
                continue
            report.checks += 1
            if len(ap.loop) != len(chain):
                report.fail("loop_bounds", instr.name, f"operand {ap.tensor!r} has {len(ap.loop)} loop "
                            "variations "
                            f"inside {len(chain)} loops")
                continue
            span = birutil.element_span(ap)
            low = high = ap.offset
            for variation, loop_id in zip(ap.loop, chain, strict=True):
                reach = variation.step * (nest.loops[loop_id].trip - 1)
                low, high = low + min(0, reach), high + max(0, reach)
            if ap.memory in birutil.ONCHIP:
                buffer = buffers.get(ap.tensor)
                if span is None or buffer is None:
                    continue
                item = dtypes.itemsize(ap.dtype)
                first, last = low + span[0] * item, high + (span[1] + 1) * item
                if first < 0 or last > buffer.bytes_per_partition:
                    report.fail("loop_bounds", instr.name, f"operand {ap.tensor!r} reaches bytes [{first}, "
                                f"{last}) over its loops' iterations, outside its "
                                f"{buffer.bytes_per_partition} bytes per partition")
                continue
            tensor = tensors.get(ap.tensor)
            if span is None or tensor is None:
                continue
            size = 1
            for dim in tensor.shape:
                size *= dim
            if low + span[0] < 0 or high + span[1] >= size:
                report.fail("loop_bounds", instr.name, f"operand {ap.tensor!r} reaches elements "
                            f"[{low + span[0]}, {high + span[1]}] over its loops' iterations, outside "
                            f"its {size} elements")


def _check_operand(
    ap: bir_pb2.AccessPattern,
    instr: bir_pb2.Instruction,
    where: str,
    buffers: dict[str, bir_pb2.Buffer],
    tensors: dict[str, bir_pb2.HbmTensor],
    partitions: int,
    report: _Report,
) -> None:
    report.checks += 1
    dtype, memory = ap.dtype, ap.memory
    if dtype == common_pb2.DTYPE_INVALID:
        report.fail("dtype", where, f"operand {ap.tensor!r} has no dtype")
        return
    span = birutil.element_span(ap)
    if memory in birutil.ONCHIP:
        buffer = buffers.get(ap.tensor)
        if buffer is None:
            report.fail("operand_memory", where, f"no buffer named {ap.tensor!r}")
            return
        if buffer.memory != memory:
            report.fail(
                "operand_memory",
                where,
                f"{ap.tensor!r} is a {birutil.memory_name(buffer.memory)} buffer, "
                f"accessed as {birutil.memory_name(memory)}",
            )
        start, count = ap.partition_start, ap.partition_count
        end = start + count
        if start < 0 or count <= 0 or end > buffer.partitions or end > partitions:
            report.fail(
                "partitions",
                where,
                f"partitions [{start}, {end}) of {ap.tensor!r} exceed its {buffer.partitions} "
                f"(target {partitions})",
            )
        if span is not None:
            size = dtypes.itemsize(dtype)
            offset = ap.offset
            lo, hi = offset + span[0] * size, offset + (span[1] + 1) * size
            if lo < 0 or hi > buffer.bytes_per_partition:
                report.fail(
                    "bounds",
                    where,
                    f"bytes [{lo}, {hi}) of {ap.tensor!r} exceed its "
                    f"{buffer.bytes_per_partition} bytes per partition",
                )
    elif memory == birutil.HBM:
        tensor = tensors.get(ap.tensor)
        if tensor is None:
            report.fail("operand_memory", where, f"no HBM tensor named {ap.tensor!r}")
            return
        numel = 1
        for extent in tensor.shape:
            numel *= extent
        if tensor.dtype != ap.dtype:
            report.fail(
                "dtype",
                where,
                f"HBM tensor {ap.tensor!r} is {dtypes.name(tensor.dtype)}, "
                f"accessed as {dtypes.name(ap.dtype)}",
            )
        if span is not None and (ap.offset + span[0] < 0 or ap.offset + span[1] >= numel):
            report.fail(
                "bounds",
                where,
                f"elements [{ap.offset + span[0]}, {ap.offset + span[1] + 1}) of {ap.tensor!r} "
                f"exceed its {numel}",
            )
    else:
        report.fail("operand_memory", where, f"operand {ap.tensor!r} has no memory class")


def _check_indirect_dma(instr: bir_pb2.Instruction, where: str, report: _Report) -> None:
    """dma_gather (table, indices) -> rows and dma_scatter (rows, indices) -> table: one s32 index per
    partition, each row as wide as the table's row, no conversion, and triggered by POOL's software
    DGE (its descriptors depend on the indices, known only at run time)."""
    if instr.engine != birutil.POOL:
        report.fail("swdge_engine", where, f"{instr.op} must be triggered on POOL (software DGE), "
                                           f"not {birutil.engine_name(instr.engine)}")
    gather = instr.op == "dma_gather"
    table, rows = (instr.inputs[0], instr.outputs[0]) if gather else (instr.outputs[0], instr.inputs[0])
    index = instr.inputs[1]
    if table.memory != birutil.HBM or rows.memory == birutil.HBM or index.memory == birutil.HBM:
        report.fail("indirect_operands", where, f"{instr.op} moves rows between an HBM table and SBUF, "
                                                "indexed from SBUF")
        return
    if index.dtype != common_pb2.S32 or birutil.free_elements(index) != 1:
        report.fail("indirect_index", where, "indices must be one s32 per partition")
    if index.partition_count != rows.partition_count:
        report.fail("indirect_index", where,
                    f"{index.partition_count} indices for {rows.partition_count} rows")
    table_rows = table.dims[0].count if table.dims else 1
    row = birutil.element_count(table) // max(1, table_rows)
    if birutil.free_elements(rows) != row:
        report.fail("element_count", where,
                    f"rows of {birutil.free_elements(rows)} elements, table rows of {row}")
    if table.dtype != rows.dtype:
        report.fail("dtype", where,
                    f"{instr.op} converts {dtypes.name(table.dtype)} to {dtypes.name(rows.dtype)}")


def _check_op_shapes(
    instr: bir_pb2.Instruction,
    inputs: list[bir_pb2.AccessPattern],
    outputs: list[bir_pb2.AccessPattern],
    where: str,
    target: Target,
    report: _Report,
) -> None:
    """Element counts, shapes and dtypes per op; `inputs` and `outputs` are the instruction's operands."""
    report.checks += 1
    count = birutil.element_count
    out = outputs[0] if outputs else None
    op = instr.op
    if op in INDIRECT_DMA_OPS:
        _check_indirect_dma(instr, where, report)
    elif is_dma(op):
        src, dst = inputs[0], outputs[0]
        if count(src) != count(dst):
            report.fail("element_count", where, f"dma moves {count(src)} elements into {count(dst)}")
        if dtypes.itemsize(src.dtype) != dtypes.itemsize(dst.dtype):  # bytes move; values are not converted
            report.fail("dtype", where, f"dma converts {dtypes.name(src.dtype)} to {dtypes.name(dst.dtype)}")
    elif op == "matmul":
        stationary, moving = inputs
        if out.memory != birutil.PSUM:
            report.fail("matmul_psum", where, f"matmul writes {birutil.memory_name(out.memory)}, not PSUM")
        if out.dtype != common_pb2.F32:
            report.fail("matmul_psum", where, f"matmul output is {dtypes.name(out.dtype)}, not f32")
        k, m = stationary.partition_count, birutil.free_elements(stationary)
        n = birutil.free_elements(moving)
        if moving.partition_count != k:
            report.fail(
                "element_count", where, f"matmul contracts {k} partitions with {moving.partition_count}"
            )
        if out.partition_count != m or birutil.free_elements(out) != n:
            report.fail(
                "element_count",
                where,
                f"matmul output is [{out.partition_count},{birutil.free_elements(out)}], expected [{m},{n}]",
            )
        if (
            k > target.partitions
            or m > target.matmul_max_stationary_free
            or n > target.matmul_max_moving_free
        ):
            report.fail(
                "matmul_shape",
                where,
                f"K={k} M={m} N={n} exceed K<={target.partitions} M<={target.matmul_max_stationary_free} "
                f"N<={target.matmul_max_moving_free}",
            )
    elif op == "transpose":
        source = inputs[0]
        if out.memory != birutil.PSUM:
            report.fail("transpose_psum", where,
                        f"transpose writes {birutil.memory_name(out.memory)}, not PSUM")
        if out.dtype != source.dtype:
            report.fail("dtype", where,
                        f"transpose converts {dtypes.name(source.dtype)} to {dtypes.name(out.dtype)}")
        p, f = source.partition_count, birutil.free_elements(source)
        if out.partition_count != f or birutil.free_elements(out) != p:
            report.fail("element_count", where,
                        f"transpose of [{p},{f}] writes [{out.partition_count},{birutil.free_elements(out)}]")
        if max(p, f) > target.partitions:
            report.fail("transpose_shape", where,
                        f"a [{p},{f}] tile: both sides must be at most {target.partitions}")
    elif op == "tensor_reduce":
        source = inputs[0]
        if out.partition_count != source.partition_count or count(out) != source.partition_count:
            report.fail(
                "element_count",
                where,
                f"reduce of {source.partition_count} partitions writes {count(out)} elements",
            )
    elif op in ("activation", "tensor_tensor", "tensor_scalar", "tensor_copy", "select", "affine_select"):
        out_count, out_partitions = count(out), out.partition_count
        if op == "activation":
            problem = alu.act_operand_problem(instr.attributes.get(ACT_OPERAND, "bias"), len(inputs))
            if problem:
                report.fail("element_count", where, problem)
            for ap in inputs[1:]:
                if not birutil.per_partition(ap):
                    report.fail("element_count", where,
                                f"scale or bias operand {ap.tensor!r} is not one element per partition")
        total = outputs[1] if len(outputs) > 1 else None
        if total is not None and (count(total) != out_partitions or total.partition_count != out_partitions):
            report.fail("element_count", where,
                        f"sum {total.tensor!r} has {count(total)} elements for {out_partitions} partitions")
        for ap in inputs:
            if count(ap) != out_count or ap.partition_count != out_partitions:
                report.fail(
                    "element_count",
                    where,
                    f"input {ap.tensor!r} [{ap.partition_count}p x {birutil.free_elements(ap)}] "
                    "does not match output "
                    f"[{out.partition_count}p x {birutil.free_elements(out)}]",
                )


def _check_buffers(
    ctx: PassContext, report: _Report, require_allocated: bool, live: dict[str, tuple[int, int]]
) -> None:
    """The per-buffer rules, and no overlap of buffers `live` (first, last position) at once."""
    program, target = ctx.program, ctx.target
    placed: dict[int, list[bir_pb2.Buffer]] = defaultdict(list)
    for buffer in program.buffers:
        report.checks += 1
        where = buffer.name
        if buffer.memory not in birutil.ONCHIP:
            report.fail("buffer_memory", where, "a buffer must be in SBUF or PSUM")
            continue
        if buffer.partitions <= 0 or buffer.partitions > target.partitions:
            report.fail(
                "partitions", where, f"{buffer.partitions} partitions (target has {target.partitions})"
            )
        if buffer.address < 0:
            if require_allocated:
                report.fail("allocated", where, "buffer has no address (run allocation)")
            continue
        end = buffer.address + buffer.bytes_per_partition * max(1, buffer.slots)
        if buffer.memory == birutil.SBUF and end > target.sbuf_usable_bytes:
            report.fail(
                "address_bounds",
                where,
                f"SBUF bytes [{buffer.address}, {end}) exceed {target.sbuf_usable_bytes}",
            )
        if buffer.memory == birutil.PSUM:
            bank = target.psum_bank_bytes
            if end > target.psum_bytes_per_partition:
                report.fail(
                    "address_bounds",
                    where,
                    f"PSUM bytes [{buffer.address}, {end}) exceed {target.psum_bytes_per_partition}",
                )
            elif any(  # each copy of a rotating buffer is a buffer of its own here
                0 < buffer.bytes_per_partition <= bank
                and start // bank != (start + buffer.bytes_per_partition - 1) // bank
                for start in range(buffer.address, end, buffer.bytes_per_partition or 1)
            ):
                report.fail(
                    "psum_bank",
                    where,
                    f"PSUM bytes [{buffer.address}, {end}) cross a {bank}-byte bank boundary",
                )
        placed[buffer.memory].append(buffer)
    for buffers in placed.values():  # address overlap while both live
        _check_overlap(buffers, live, report)


def _check_overlap(buffers: list[bir_pb2.Buffer], live: dict[str, tuple[int, int]], report: _Report) -> None:
    """No two buffers share bytes while both are live (birutil.live_together)."""
    for first, second, shared_end in birutil.live_together(buffers, live):
        report.fail(
            "allocation_overlap",
            first.name,
            f"shares bytes [{second.address}, {shared_end}) with {second.name!r} while both are live",
        )


def _sync_of(instr: bir_pb2.Instruction) -> _Sync:
    """The instruction's waits and updates as tuples: each wait and update read once."""
    return (
        [(w.semaphore, w.value) for w in instr.waits] if instr.waits else [],
        [(u.semaphore, u.increment) for u in instr.updates] if instr.updates else [],
    )


def _check_sync_limits(ctx: PassContext, report: _Report) -> dict[int, _Sync]:
    """The semaphore limits and ids. Returns every instruction's _sync_of by id, for
    _check_execution (which runs only when no check failed: ids are then unique)."""
    program, target = ctx.program, ctx.target
    if program.num_semaphores > target.num_semaphores:
        report.fail(
            "semaphores",
            program.name,
            f"{program.num_semaphores} semaphores, target has {target.num_semaphores}",
        )
    sync: dict[int, _Sync] = {}
    lowered = ctx.sync_lowered
    for instr in program.instructions:
        report.checks += 1
        waits, updates = sync[instr.id] = _sync_of(instr)
        where = instr.name or f"%{instr.id}"
        if len(waits) > target.max_waits_per_instruction:
            report.fail(
                "wait_limit", where, f"{len(waits)} waits (at most {target.max_waits_per_instruction})"
            )
        if len(updates) > target.max_updates_per_instruction:
            report.fail(
                "update_limit",
                where,
                f"{len(updates)} updates (at most {target.max_updates_per_instruction})",
            )
        for sem, _ in waits + updates:
            if not 0 <= sem < program.num_semaphores:
                report.fail(
                    "semaphore_id",
                    where,
                    f"semaphore {sem} is not below num_semaphores={program.num_semaphores}",
                )
        for sem, increment in updates:
            if increment <= 0:
                report.fail("semaphore_update", where, f"update of semaphore {sem} by {increment}")
        if waits:
            _check_wait_values(instr, where, lowered, report)
    return sync


def _check_wait_values(instr: bir_pb2.Instruction, where: str, lowered: bool, report: _Report) -> None:
    """Rule wait_value: a threshold within 0 .. 2^64 - 1, encoded (lower_sync) as the words that
    make it up; in a lowered program every wait carries its words."""
    for wait in instr.waits:
        value, words = wait.value, encoded_wait_value(wait)
        if wait.loop_steps:  # a loop's wait may start below 0 (it holds at once)
            value = max(0, value)
        what = f"wait for semaphore {wait.semaphore} >= {value}"
        if not 0 <= value < WAIT_VALUE_LIMIT:
            report.fail("wait_value", where, f"{what}: the threshold is outside 0 .. 2^64 - 1")
        elif words is None and lowered:
            report.fail("wait_value", where, f"{what} has no encoded words in a lowered program")
        elif words is not None and words != value:
            report.fail(
                "wait_value",
                where,
                f"{what} is encoded as {words} (value_lo {wait.value_lo}, value_hi {wait.value_hi})",
            )


def _streams(program: bir_pb2.Program) -> dict[int, list[bir_pb2.Instruction]]:
    """The engine streams the execution checks run: the program's own, or, when they hold loops
    (roll_loops), the global order by engine, which `_check_streams` found them to expand to."""
    if program.streams and not loops.has_loops(program.streams):
        return {stream.engine: list(stream.instructions) for stream in program.streams}
    grouped: dict[int, list[bir_pb2.Instruction]] = defaultdict(list)
    for instr in program.instructions:
        grouped[instr.engine].append(instr)
    return dict(grouped)


def _check_streams(program: bir_pb2.Program, report: _Report) -> None:
    if not program.streams:
        return
    expected: dict[int, list[bir_pb2.Instruction]] = defaultdict(list)
    for instr in program.instructions:
        expected[instr.engine].append(instr)
    seen: set[int] = set()
    for stream in program.streams:
        report.checks += 1
        name = birutil.engine_name(stream.engine)
        if stream.engine in seen:
            report.fail("streams", name, "two streams for one engine")
        seen.add(stream.engine)
        wrong = [i.name for i in stream.instructions if i.engine != stream.engine]
        if wrong:
            report.fail("streams", name, f"holds instructions of other engines: {', '.join(wrong[:3])}")
        own = expected.get(stream.engine, [])
        if program.instructions and not _same_stream(program, stream, own, report):
            report.fail("streams", name, "stream differs from the global order filtered by engine")
    missing = set(expected) - seen
    if program.instructions and missing:
        report.fail(
            "streams",
            program.name,
            f"no stream for {', '.join(birutil.engine_name(e) for e in sorted(missing))}",
        )


def _same_stream(
    program: bir_pb2.Program, stream: bir_pb2.Stream, expected: list[bir_pb2.Instruction], report: _Report
) -> bool:
    """Is `stream` the `expected` instructions: the same messages, or, with loops, an expansion
    that executes each of them in turn (loops.canonical)?"""
    if not loops.has_loops([stream]):
        return list(stream.instructions) == expected
    try:
        (expanded,) = loops.expand_streams([stream], "E410", len(expected))
    except CompileError as err:
        report.fail("streams", birutil.engine_name(stream.engine), err.message)
        return True
    if len(expanded.instructions) != len(expected):
        return False
    addresses = {buffer.name: buffer.address for buffer in program.buffers}
    return all(
        loops.canonical(got, addresses) == loops.canonical(want, addresses)
        for got, want in zip(expanded.instructions, expected, strict=True)
    )


def _check_reset(
    streams: dict[int, list[bir_pb2.Instruction]],
    walk: syncmodel.ClockWalk,
    final: bool,
    sync: dict[int, list[_Sync]],
    report: _Report,
) -> None:
    """Rule `semaphore_reset`: a program that updates semaphores ends its SP stream with one
    sem_reset that every update and every wait is ordered before, so each inference starts from
    zero counts and no engine is left waiting for a count the reset took away.
    A missing reset is an error once the program is `final` (codegen made its streams).
    `sync`: per engine, the _sync_of each instruction of its stream."""
    resets = [instr for stream in streams.values() for instr in stream if instr.op == "sem_reset"]
    updaters = [
        instr
        for engine, stream in streams.items()
        for instr, (_, updates) in zip(stream, sync[engine], strict=True)
        if updates
    ]
    if not resets and not (updaters and final):
        return  # between alloc_semaphores and semaphore_reset the program is not finished yet
    report.checks += 1
    if len(resets) != 1:
        where = resets[1].name if resets else "program"
        report.fail(
            "semaphore_reset",
            where,
            f"{len(resets)} sem_reset instructions (a program that updates semaphores ends with 1: "
            "run semaphore_reset after alloc_semaphores)",
        )
        return
    reset = resets[0]
    if streams.get(birutil.SP, [None])[-1] is not reset:
        report.fail("semaphore_reset", reset.name, "is not the last instruction of the SP stream")
        return
    clock = walk.access_clock[reset.id]
    for engine, stream in streams.items():  # an engine blocked on a wait when the counts drop hangs
        last = max((position for position, (waits, _) in enumerate(sync[engine]) if waits), default=-1)
        if engine != reset.engine and last >= 0:
            if clock[walk.space.index[syncmodel.engine_thread(engine)]] < last:
                report.fail(
                    "semaphore_reset",
                    reset.name,
                    f"the waits of {stream[last].name} ({birutil.engine_name(engine)}) are not ordered "
                    "before the reset: it can zero the count they wait for",
                )
                return
    for instr in updaters:
        if not walk.covered(clock, instr.id):
            report.fail(
                "semaphore_reset",
                reset.name,
                f"the update of {instr.name} (semaphore {instr.updates[0].semaphore}) is not ordered "
                "before the reset: it can land after it and leave the next inference a nonzero count",
            )
            return


def _check_port_waits(
    walk: syncmodel.ClockWalk,
    instr: bir_pb2.Instruction,
    wait_clocks: list[list[syncmodel.Clock]],
    report: _Report,
) -> None:
    """Rule dve_pool_port: a DVE or POOL instruction holds the shared SBUF port from its dispatch,
    so none of its waits may be for work that can still need the other engine (sync_dve_pool)."""
    report.checks += 1
    partner = birutil.engine_name(syncmodel.PORT_PARTNER[instr.engine])
    base = walk.base_clock(instr)
    for wait, clocks in zip(instr.waits, wait_clocks, strict=True):
        if any(syncmodel.needs_partner_at_dispatch(walk, instr, clock, base) for clock in clocks):
            report.fail(
                "dve_pool_port",
                instr.name,
                f"holds the {SBUF_PORT} from dispatch while it waits for s{wait.semaphore}>={wait.value}, "
                f"whose producer may still need {partner} work behind that port: the wait must ride "
                "on a drain just before it (sync_dve_pool)",
            )
            return


def _check_execution(
    ctx: PassContext, report: _Report, check_sync: bool, global_sync: dict[int, _Sync],
    streams: dict[int, list[bir_pb2.Instruction]],
) -> None:
    """Abstract execution of the streams: deadlock freedom, then dependence coverage by clocks.
    `global_sync`: _sync_of every instruction of the global order by id (_check_sync_limits)."""
    program = ctx.program
    every = [instr for stream in streams.values() for instr in stream]
    # per engine, _sync_of each instruction of its stream: program.streams hold instructions of
    # their own (equal to the global order's only where _check_streams had one to compare with);
    # an expansion of loops holds instances, each with its own thresholds
    own = bool(program.streams) or bool(ctx.loop_entries)
    sync = {
        engine: [_sync_of(instr) if own else global_sync[instr.id] for instr in stream]
        for engine, stream in streams.items()
    }
    # Per semaphore, per updating thread: cumulative counts in thread order.
    updaters: dict[int, dict[syncmodel.Thread, list[tuple[int, int]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for engine in sorted(streams):
        for instr, (_, updates) in zip(streams[engine], sync[engine], strict=True):
            for semaphore, increment in updates:
                entries = updaters[semaphore][syncmodel.access_thread(instr)]
                entries.append(((entries[-1][0] if entries else 0) + increment, instr.id))
    totals = {sem: {t: e[-1][0] for t, e in threads.items()} for sem, threads in updaters.items()}
    grand_totals = {sem: sum(threads.values()) for sem, threads in totals.items()}

    walk = syncmodel.ClockWalk(syncmodel.ClockSpace.for_instructions(every))
    costs = ctx.costs()
    # between alloc_semaphores and sync_dve_pool the port-holding waits are not moved yet
    check_ports = (ctx.ports_synchronized or bool(program.streams)) and syncmodel.both_port_partners(program)
    counts: dict[int, int] = defaultdict(int)
    heads = dict.fromkeys(streams, 0)

    def implied(semaphore: int, value: int) -> list[syncmodel.Clock]:
        """The completion clocks of the producers that a wait for `semaphore` >= `value` implies."""
        clocks = []
        total = grand_totals.get(semaphore, 0)
        for thread, entries in updaters.get(semaphore, {}).items():
            need = value - (total - totals[semaphore][thread])
            if need <= 0:
                continue
            at = bisect.bisect_left(entries, (need, -1))  # first producer whose running count >= need
            producer = entries[at][1] if at < len(entries) else None
            if producer is not None and producer in walk.completion_clock:
                clocks.append(walk.completion_clock[producer])
        return clocks

    remaining = len(every)
    while remaining:
        progressed = False
        for engine in sorted(streams):
            stream = streams[engine]
            while heads[engine] < len(stream):
                instr = stream[heads[engine]]
                waits, updates = sync[engine][heads[engine]]
                if any(counts[semaphore] < value for semaphore, value in waits):
                    break
                wait_clocks = [implied(semaphore, value) for semaphore, value in waits]
                # waits_holding_port is False without waits: only an instruction that waits is priced
                if check_ports and waits and syncmodel.waits_holding_port(instr, costs(instr).ports):
                    _check_port_waits(walk, instr, wait_clocks, report)
                walk.step(instr, [clock for clocks in wait_clocks for clock in clocks])
                for semaphore, increment in updates:
                    counts[semaphore] += increment
                heads[engine] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            blocked, first = [], ""
            for engine in sorted(streams):
                if heads[engine] < len(streams[engine]):
                    instr = streams[engine][heads[engine]]
                    first = first or instr.name
                    waits = ", ".join(
                        f"s{w.semaphore}>={w.value} (is {counts[w.semaphore]})" for w in instr.waits
                    )
                    blocked.append(f"{birutil.engine_name(engine)} at {instr.name} waiting {waits}")
            report.fail("deadlock", first, "every engine is blocked: " + "; ".join(blocked))
            return
    report.checks += 1
    _check_reset(streams, walk, bool(program.streams), sync, report)
    if not check_sync or ctx.deps is None:
        return
    by_id = {instr.id: instr for instr in every}
    index = {instr.id: position for position, instr in enumerate(program.instructions)}
    edges_checked = 0
    for src, dst in ctx.deps.edges:
        if src not in by_id or dst not in by_id:
            continue
        edges_checked += 1
        if index.get(src, -1) < index.get(dst, -1) and walk.access_covers(dst, src):
            continue  # ordered: the consumer's access clock covers the producer
        producer, consumer = by_id[src], by_id[dst]
        data = ctx.deps.edge_attributes(src, dst)
        if index.get(src, -1) >= index.get(dst, -1):
            report.fail(
                "dependence_order", consumer.name, f"comes before {producer.name}, on which it depends"
            )
            continue
        if not walk.access_covers(dst, src):
            report.fail(
                "unsynchronized_dependence",
                consumer.name,
                f"{data.get('kind', '?')} dependence on {producer.name} ({data.get('memory', '')}) "
                "from thread "
                f"{syncmodel.thread_name(syncmodel.access_thread(producer))} to "
                f"{syncmodel.thread_name(syncmodel.access_thread(consumer))} is not ordered by any wait",
            )
    report.checks += edges_checked
