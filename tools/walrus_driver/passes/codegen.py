"""Split the global order into per-engine instruction streams (program.streams) for the packager.

Each engine used gets one Stream holding its instructions in global order (a dma sits in its
trigger engine's stream). program.instructions is kept as the global order, so the verifier and
the simulator can still be run after codegen; streams are what the packager and a NEFF carry.
Needs allocated addresses and inserted semaphores: streams are the executable form. It also
stamps the final program's lower bound (`walrus.lower_bound_ns`: max of the busiest engine's
work, the critical path of true data dependences and bytes moved / DMA bandwidth), which the NEFF
carries so that `ncc run` can report makespan over lower bound at every optimization level.
"""

from __future__ import annotations

from collections import defaultdict

from ncc.schemas import bir_pb2
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
        bound = costs.lower_bound_ns(program.instructions, deps, ctx.target, ctx.costs(), flow_only=True,
                                     topological=True)
    program.attributes["walrus.lower_bound_ns"] = f"{bound['lower_bound_ns']:.1f}"
    ctx.set_stat("lower_bound_ns", round(bound["lower_bound_ns"], 1))
    ctx.set_stat("streams", len(used))
    ctx.set_stat("instructions", len(program.instructions))
    for engine in used:
        ctx.set_stat(f"instructions_{birutil.engine_name(engine)}", len(per_engine[engine]))
    ctx.set_stat("waits", waits)
    ctx.set_stat("nops", nops)
