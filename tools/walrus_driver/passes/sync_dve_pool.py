"""Break the POOL<->DVE port deadlock: a wait that may need the other engine moves to a `drain`.

Why. DVE and POOL share the SBUF port, and the port is claimed when an instruction is dispatched
(its engine is free and it is next in the stream), before its semaphore waits are checked
(tools/target/costs.py, as the simulator runs it). A DVE instruction that needs the port and waits
for a producer whose completion depends on POOL work not yet done, directly or through other
engines' streams and waits (POOL → SP store → the SP load it waits for), holds the port that POOL
needs to make progress: neither moves. The same holds with DVE and POOL swapped. The simulator
reports such a run as a deadlock that names the port.

What. Walking the synchronized program with vector clocks (syncmodel), when a DVE or POOL
instruction X that needs the SBUF port is reached, everything its engine's clock covers has
completed by the time X is dispatched. A wait of X whose producer's completion clock names a later
instruction of the partner engine (syncmodel.needs_partner_at_dispatch) moves onto a `drain`
inserted on X's engine just before it: a `drain` has no operands, so it waits without holding the
port; X is dispatched only after the drain completed, and its remaining waits need nothing of the
partner. The engine runs in order, so program order carries the drain's completion to X and no
extra semaphore update is needed (the production pass, whose port is arbitrated differently, adds
a second +1 update to the POOL instruction). Waits that cannot need the partner stay on X: most
programs get no drain at all.

In a program that keeps loops a wait's producer may be an earlier iteration's, which the clocks
of the static order do not describe: there every wait of a DVE or POOL instruction that holds
the port moves to its drain (in the same loop body), the safe choice.

Needs: semaphores inserted (alloc_semaphores) and nothing reordered afterwards; run before
semaphore_reset. birverifier's rule `dve_pool_port` checks the result. Counters:
`port_instructions_waiting` (DVE/POOL instructions needing the port that carry waits; 0 when the
program does not use both engines, as nothing then needs checking), `drains`, `waits_moved`.
"""

from __future__ import annotations

from ncc.schemas import bir_pb2
from ncc.tools.walrus_driver.analysis import birutil, syncmodel
from ncc.tools.walrus_driver.context import PassContext
from ncc.tools.walrus_driver.registry import register

NAME = "sync_dve_pool"
DRAIN_OP = "drain"


@register(NAME)
def run(ctx: PassContext) -> None:
    ctx.require_synchronized()
    ctx.forbid_after_lower_sync()
    program = ctx.program
    ctx.ports_synchronized = True
    if not syncmodel.both_port_partners(program):  # no partner, no risk: skip the walk
        for counter in ("port_instructions_waiting", "drains", "waits_moved"):
            ctx.set_stat(counter, 0)
        return
    costs = ctx.costs()
    walk = syncmodel.ClockWalk(syncmodel.ClockSpace.for_instructions(program.instructions))
    producers = syncmodel.SemaphoreProducers()
    next_id = birutil.next_instruction_id(program)
    new_order: list[bir_pb2.Instruction] = []
    checked = moved = 0
    loops = bool(ctx.loop_entries)
    for instr in program.instructions:
        clocks = [] if loops else [walk.completion_clock[producers.producer(w)] for w in instr.waits]
        if syncmodel.waits_holding_port(instr, costs(instr).ports):
            checked += 1
            if loops:
                risky = [True] * len(instr.waits)
            else:
                base = walk.base_clock(instr)
                risky = [syncmodel.needs_partner_at_dispatch(walk, instr, clock, base) for clock in clocks]
            if any(risky):
                drain = bir_pb2.Instruction(
                    id=next_id,
                    name=f"{instr.name}.drain",
                    op=DRAIN_OP,
                    engine=instr.engine,
                    source=instr.source,
                    attributes={"inserted_by": NAME},
                )
                if instr.HasField("in_loop"):
                    drain.in_loop = instr.in_loop
                next_id += 1
                waits = [bir_pb2.SemaphoreWait(semaphore=w.semaphore, value=w.value, loop_steps=w.loop_steps)
                         for w in instr.waits]
                del instr.waits[:]
                for wait, to_drain in zip(waits, risky, strict=True):
                    (drain if to_drain else instr).waits.append(wait)
                if not loops:
                    walk.step(drain, [c for c, r in zip(clocks, risky, strict=True) if r])
                    clocks = [c for c, r in zip(clocks, risky, strict=True) if not r]
                new_order.append(drain)
                if ctx.deps is not None:
                    ctx.deps.add_node(drain.id)  # no operands: no dependence edge
                moved += sum(risky)
        if not loops:
            walk.step(instr, clocks)
        producers.record(instr)
        new_order.append(instr)
    drains = len(new_order) - len(program.instructions)
    if drains:
        birutil.set_order(program, new_order)
        ctx.order_changed()
    ctx.sync_walk = None if loops else walk  # the clocks of exactly this order (semaphore_reset reads them)
    ctx.set_stat("port_instructions_waiting", checked)
    ctx.set_stat("drains", drains)
    ctx.set_stat("waits_moved", moved)
