"""Split the global order into per-engine instruction streams (program.streams) for the packager.

Each engine used gets one Stream holding its instructions in global order (a dma sits in its
trigger engine's stream). program.instructions is kept as the global order, so the verifier and
the simulator can still be run after codegen; streams are what the packager and a NEFF carry.
A program that keeps loops (analysis/loopnest.py) gets them in every stream whose engine runs
some of their body: each such stream holds a `loop` entry with the loop's trip count before its
own part of the body. Inside a loop an on-chip operand names its memory as a whole (`@SBUF`,
`@PSUM`) at its absolute address, and an operand of a buffer that rotates over copies at the
iterations of one of its loops carries that rotation (AddressRotation: copy r mod slots); every
operand and wait inside loops has one variation per enclosing loop (docs/ir.md, Loops).

Needs allocated addresses and inserted semaphores: streams are the executable form. It also
stamps the final program's lower bound (`walrus.lower_bound_ns`: max of the busiest engine's
work, the critical path of true data dependences and bytes moved / DMA bandwidth), which the NEFF
carries so that `ncc run` can report makespan over lower bound at every optimization level.
"""

from __future__ import annotations

from collections import defaultdict

from ncc.schemas import bir_pb2
from ncc.tools.common.loops import LOOP_OP
from ncc.tools.walrus_driver.analysis import birutil, costs
from ncc.tools.walrus_driver.context import PassContext
from ncc.tools.walrus_driver.registry import register

NAME = "codegen"


@register(NAME)
def run(ctx: PassContext) -> None:
    ctx.require_allocated()
    ctx.require_synchronized()
    program = ctx.program
    del program.streams[:]
    per_engine: dict[int, list[bir_pb2.Instruction]] = defaultdict(list)
    waits = nops = 0
    for instr in program.instructions:  # one walk: the streams' contents and the counters
        per_engine[instr.engine].append(instr)
        waits += len(instr.waits)
        nops += instr.op == "nop"
    used = sorted(per_engine)
    if ctx.loop_entries:
        _loop_streams(ctx, per_engine)
    else:
        for engine in used:
            program.streams.add(engine=engine).instructions.extend(per_engine[engine])
    ctx.codegen_done = True
    deps = ctx.valid_deps()
    job, ctx.final_bound = ctx.final_bound, None  # started by alloc_semaphores, on this order
    if job is not None and deps is not None:
        bound = job.result()
    else:
        if job is not None:
            job.cancel()
        # (alloc_semaphores kept the order a topological one of the graph; nothing has moved since)
        runs = None
        if ctx.loop_entries:
            nest = ctx.loops()
            runs = {instr.id: nest.runs(instr.id) for instr in program.instructions}
        bound = costs.lower_bound_ns(program.instructions, deps, ctx.target, ctx.costs(), flow_only=True,
                                     topological=True, runs=runs)
    program.attributes["walrus.lower_bound_ns"] = f"{bound['lower_bound_ns']:.1f}"
    ctx.set_stat("lower_bound_ns", round(bound["lower_bound_ns"], 1))
    ctx.set_stat("streams", len(used))
    ctx.set_stat("instructions", len(program.instructions))
    for engine in used:
        ctx.set_stat(f"instructions_{birutil.engine_name(engine)}", len(per_engine[engine]))
    ctx.set_stat("waits", waits)
    ctx.set_stat("nops", nops)


def _loop_streams(ctx: PassContext, per_engine: dict[int, list[bir_pb2.Instruction]]) -> None:
    """Each engine's stream with the loops its instructions run in (the module docstring)."""
    program = ctx.program
    nest = ctx.loops()
    buffers = birutil.buffer_map(program)
    used: set[int] = set()
    for engine in sorted(per_engine):
        stream = program.streams.add(engine=engine)
        open_entries: list[bir_pb2.Instruction] = []  # this stream's entries of the open loops
        open_chain: tuple[int, ...] = ()
        for instr in per_engine[engine]:
            chain = nest.chain_of(instr.id)
            shared = len(nest.common(chain[-1], open_chain[-1])) if chain and open_chain else 0
            del open_entries[shared:]
            for loop_id in chain[shared:]:
                loop = nest.loops[loop_id]
                for outer in open_entries:  # an inner loop's entry is part of the outer bodies
                    outer.body_length += 1
                entry = stream.instructions.add(id=loop_id, name=loop.name, op=LOOP_OP, engine=engine,
                                                trip_count=loop.trip)
                open_entries.append(entry)
            for entry in open_entries:
                entry.body_length += 1
            open_chain = chain
            copy = stream.instructions.add()
            copy.CopyFrom(instr)
            copy.ClearField("in_loop")
            if chain:
                _loop_operands(copy, chain, nest, buffers, used)
    birutil.add_whole_memories(program, ctx.target, used)


def _loop_operands(instr: bir_pb2.Instruction, chain: tuple[int, ...], nest,
                   buffers: dict[str, bir_pb2.Buffer], used: set[int]) -> None:
    """Rewrite a body instruction's operands and waits for the stream: one variation per
    enclosing loop, on-chip operands at their absolute address in their whole memory, a
    rotating buffer's copies as the rotation of its loop."""
    depth = len(chain)
    for ap in (*instr.outputs, *instr.inputs):
        steps = [v.step for v in ap.loop] if ap.loop else []
        variations = [bir_pb2.LoopVariation(step=steps[k] if k < len(steps) else 0) for k in range(depth)]
        if ap.memory in birutil.ONCHIP:
            buffer = buffers[ap.tensor]
            if buffer.slots > 1 and buffer.HasField("private_to") and buffer.private_to in chain:
                level = chain.index(buffer.private_to)
                size = buffer.bytes_per_partition
                variations[level].rotation.extend(k * size for k in range(buffer.slots))
            ap.offset += buffer.address
            ap.tensor = birutil.WHOLE_MEMORY[ap.memory]
            used.add(ap.memory)
        del ap.loop[:]
        if any(v.step or v.rotation for v in variations):
            ap.loop.extend(variations)
    for wait in instr.waits:
        if wait.loop_steps and len(wait.loop_steps) != depth:
            raise ValueError(
                f"codegen: {instr.name}: a wait with {len(wait.loop_steps)} loop steps in {depth} loops")
