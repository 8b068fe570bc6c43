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

from collections import Counter

from ncc.tools.walrus_driver import birutil, costs
from ncc.tools.walrus_driver.context import PassContext
from ncc.tools.walrus_driver.registry import register

NAME = "codegen"


@register(NAME)
def run(ctx: PassContext) -> None:
    ctx.require_allocated()
    ctx.require_synchronized()
    program = ctx.program
    del program.streams[:]
    used = sorted({instr.engine for instr in program.instructions})
    streams = {engine: program.streams.add(engine=engine) for engine in used}
    for instr in program.instructions:
        streams[instr.engine].instructions.append(instr)
    ctx.codegen_done = True
    deps = ctx.valid_deps()
    bound = costs.lower_bound_ns(program.instructions, deps, ctx.target, ctx.costs(), flow_only=True)
    program.attributes["walrus.lower_bound_ns"] = f"{bound['lower_bound_ns']:.1f}"
    ctx.set_stat("lower_bound_ns", round(bound["lower_bound_ns"], 1))
    per_engine = Counter(instr.engine for instr in program.instructions)
    ctx.set_stat("streams", len(used))
    ctx.set_stat("instructions", len(program.instructions))
    for engine, number in sorted(per_engine.items()):
        ctx.set_stat(f"instructions_{birutil.engine_name(engine)}", number)
    ctx.set_stat("waits", sum(len(i.waits) for i in program.instructions))
    ctx.set_stat("nops", sum(1 for i in program.instructions if i.op == "nop"))
