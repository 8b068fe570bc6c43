"""Schedule again after allocation, over the dependences of the final addresses (-O3).

pre_sched orders instructions before they have addresses, under a live-bytes limit. When its
schedule would not fit on chip (its live set passes SBUF or PSUM), the frontend's order is kept
and allocated: the D = 2048 MLP (gelu(x@W1)@W2, B = 1024) runs in program order. Once every
buffer has an address, the dependence graph computed for those addresses (the analyzer after
allocation) holds every constraint the allocation adds, a reused address being a WAR or WAW
edge, so any order that graph admits is valid for this allocation. This pass runs pre_sched's
list scheduler once more over it, with no live-bytes limit (the memory is placed already), and
keeps the new order only if the cost model says it is faster and allocation still holds for it;
dma queues and trigger engines
are chosen again on the way, as pre_sched chooses them. A store that pre_sched let take any
queue keeps that freedom only if nothing depends on it now (allocation may have reused its
buffer, so the next writer there waits for it: its thread then needs a semaphore).

The graph orders every access to a reused byte, but not the buffers as wholes: moving a read of a
buffer's other bytes past the first write of the next buffer placed over part of it is safe, yet
it leaves two buffers live at once on the same bytes, which birverifier refuses (a convnet's
training step at -O3: `allocation_overlap`). Such a schedule is dropped (`schedules_refused`)
and the order stays.

It costs one more run of the scheduler, which at 100k instructions is seconds, so --optlevel 3
runs it and 2 does not. Needs allocated addresses and the graph for them; must run before
alloc_semaphores. Counters: those of pre_sched (est_makespan_before_ns / est_makespan_ns of this
run, kept_input_order when the order stays).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass

from ncc.schemas import bir_pb2
from ncc.tools.walrus_driver.analysis import birutil, loopnest
from ncc.tools.walrus_driver.context import PassContext
from ncc.tools.walrus_driver.passes import pre_sched
from ncc.tools.walrus_driver.registry import register

NAME = "post_sched"


@dataclass
class Options:
    pressure_window: int = 32  # ready instructions per engine examined (as pre_sched's)
    spread_to_act: bool = True  # DVE instructions with an exact ACT form may run on ACT
    choose_triggers: bool = True  # a store may be triggered by any engine with a queue pool


@register(NAME, Options)
def run(ctx: PassContext) -> None:
    options: Options = ctx.options or Options()
    ctx.forbid_after_sync()
    ctx.require_allocated()
    deps = ctx.require_deps(for_addresses=True)
    unpooled = {node for node in ctx.unpooled_dmas if node in deps and deps.out_degree(node) == 0}
    settings = pre_sched.Options(
        pressure_fraction=pre_sched.NO_PRESSURE_LIMIT,
        pressure_window=options.pressure_window,
        tries=1,
        spread_to_act=options.spread_to_act,
        choose_triggers=options.choose_triggers,
    )
    holds = functools.partial(_allocation_holds, ctx)
    if ctx.loop_entries:  # block by block, as pre_sched schedules a program that keeps loops
        pre_sched.schedule_blocks(ctx, settings, deps, unpooled, holds)
        return
    pre_sched.schedule(ctx, settings, deps, unpooled, holds)


def _allocation_holds(ctx: PassContext, order: list[bir_pb2.Instruction]) -> bool:
    """Does no pair of buffers that share bytes stay live at once in this order?"""
    live = birutil.live_ranges(order, ctx.footprint_cache)
    if ctx.loop_entries:
        nest = loopnest.LoopNest.of(ctx.loop_entries, order)
        loopnest.widen_live_ranges(live, order, nest, birutil.buffer_map(ctx.program))
    placed: dict[int, list[bir_pb2.Buffer]] = defaultdict(list)
    for buffer in ctx.program.buffers:
        if buffer.memory in birutil.ONCHIP and buffer.address >= 0:
            placed[buffer.memory].append(buffer)
    return not any(birutil.live_together(buffers, live) for buffers in placed.values())
