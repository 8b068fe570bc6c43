"""Insert semaphore waits and updates so that every cross-thread dependence is ordered at run time.

Scheme: one semaphore per producing thread (an engine, or a dma queue thread = queue x trigger
engine, see syncmodel). Each producer that some consumer must wait for adds +1 to its thread's
semaphore when it completes (for a dma: when its transfer completes); a consumer waits until that
semaphore reaches the producer's running count on its thread. Threads complete in order, so the
count reaching k means the thread's first k waited-on producers are done.

Which waits are needed is decided by walking the final order with vector clocks (syncmodel): a
dependence is already ordered when the consumer's access clock covers the producer, which is
the case for same-thread edges (program order, queue FIFO), for a dma triggered on the engine
that produced its source (the trigger issues after the producer completed), and for anything
implied by earlier waits on the same engine or through other threads' waits (transitively).
Among the remaining producers, those implied by another one's completion are dropped. At most
`max_waits_per_instruction` waits stay on the instruction; the others go on `nop`s inserted on
the same engine just before it.

Loops (a program that keeps them, analysis/loopnest.py): the walk is over the static order, one
iteration of each body, which orders each iteration's dependences as it orders straight-line
code; the dependences a loop carries from one iteration to a later one (ctx.carried) get waits
of their own unless one thread runs both ends (they stay out of the clocks: their producer may
come later in the static order). Every threshold then becomes the producer's count at the
consumer's iteration, growing by `loop_steps` (analysis/loop_sync.py).

Needs: allocated addresses, a dependence graph computed for them, and the final order (nothing
may reorder, reallocate or change dma queues afterwards). Sets program.num_semaphores. When the
program has more threads than the target has semaphores (less the one semaphore_reset needs),
transfer threads are merged first: a trigger engine's least-loaded queue gives its dmas to its
next least-loaded one. More engine threads than semaphores is E404.
"""

from __future__ import annotations

import functools
from collections import Counter, defaultdict

from ncc.schemas import bir_pb2
from ncc.tools.common import forked
from ncc.tools.common.errors import CompileError
from ncc.tools.target import is_dma
from ncc.tools.walrus_driver.analysis import birutil, costs, loop_sync, loopnest, syncmodel
from ncc.tools.walrus_driver.analysis.depgraph import DepGraph
from ncc.tools.walrus_driver.analysis.loop_deps import Carried
from ncc.tools.walrus_driver.context import PassContext
from ncc.tools.walrus_driver.registry import register

NAME = "alloc_semaphores"


@register(NAME)
def run(ctx: PassContext) -> None:
    if ctx.synchronized:
        raise CompileError("E402", "pass alloc_semaphores: the program already has semaphores", NAME)
    ctx.require_allocated()
    deps = ctx.require_deps(for_addresses=True)
    program, target = ctx.program, ctx.target
    merged = _merge_transfer_threads(program, deps, target.num_semaphores - 1)  # 1 for semaphore_reset
    # The order is final from here on: codegen's lower bound of it is computed meanwhile on the
    # spare core (what this pass and the ones after it add carries only synchronization)
    if not ctx.loop_entries:  # (with loops codegen bounds the iterations itself)
        ctx.final_bound = forked.Forked(
            functools.partial(costs.lower_bound_ns, program.instructions, deps, target, ctx.costs(),
                              flow_only=True, topological=True),
            parallel=len(program.instructions) >= forked.MIN_INSTRUCTIONS,
        )
    try:
        _insert(ctx, deps, merged)
    except BaseException:
        if ctx.final_bound is not None:
            ctx.final_bound.cancel()
        ctx.final_bound = None
        raise


def _insert(ctx: PassContext, deps: DepGraph, merged: int) -> None:
    """The waits, nops and updates of the order as it stands (see the module's docstring)."""
    program, target = ctx.program, ctx.target
    by_id = {instr.id: instr for instr in program.instructions}
    space = syncmodel.ClockSpace.for_instructions(program.instructions)
    walk = syncmodel.ClockWalk(space)
    max_waits = max(1, target.max_waits_per_instruction)
    next_id = birutil.next_instruction_id(program)

    new_order: list[bir_pb2.Instruction] = []
    # instruction id -> producer ids it waits for (with the Carried dependence, or None)
    wait_for: dict[int, list[tuple[int, Carried | None]]] = {}
    carried_into = _carried_waits(ctx, by_id) if ctx.loop_entries else {}
    nops = needed_total = implied = cross_covered = same_thread = 0
    thread_index, position = walk.thread_index, walk.position
    rows, threads, positions = walk.rows, walk.threads, walk.positions
    for instr in program.instructions:
        node = instr.id
        base = walk.base_clock(instr).tolist()  # read per predecessor: a list indexes faster
        mine = space.index[syncmodel.access_thread(instr)]
        needed: list[int] = []
        for pred in deps.predecessors(node) if node in deps else ():
            if pred not in by_id:
                continue
            row = rows.get(pred)
            if row is None:
                ctx.fail_needs("anti_dependency_analyzer (the order is not a topological order of the graph)")
            thread = threads[row]
            if thread == mine:
                same_thread += 1
            if base[thread] >= positions[row]:  # already ordered (program order, queue FIFO, waits)
                cross_covered += thread != mine
                continue
            needed.append(pred)
        needed_total += len(needed)
        kept_ids = needed
        if len(needed) > 1:  # one producer implies no other
            kept_ids = [
                p
                for p in needed
                if not any(q != p and walk.completion_covers(q, p) for q in needed)
            ]
            implied += len(needed) - len(kept_ids)
            kept_ids.sort(key=lambda p: (thread_index[p], position[p]))
        kept: list[tuple[int, Carried | None]] = [(p, None) for p in kept_ids]
        kept += [(c.src, c) for c in carried_into.get(node, ())]
        groups = [kept[i : i + max_waits] for i in range(0, len(kept), max_waits)] or [[]]
        for group in groups[:-1]:  # extra waits ride on nops just before the instruction
            nop = bir_pb2.Instruction(
                id=next_id,
                name=f"{instr.name}.wait{nops}",
                op="nop",
                engine=instr.engine,
                source=instr.source,
                attributes={"inserted_by": NAME},
            )
            if instr.HasField("in_loop"):
                nop.in_loop = instr.in_loop
            next_id += 1
            nops += 1
            walk.step(nop, _clocks(walk, group))
            wait_for[nop.id] = group
            new_order.append(nop)
            deps.add_node(nop.id)
        walk.step(instr, _clocks(walk, groups[-1]))
        if groups[-1]:
            wait_for[instr.id] = groups[-1]
        new_order.append(instr)

    # Running counts: the k-th waited-on producer of a thread brings its semaphore to k.
    waited = {pid for producers in wait_for.values() for pid, _ in producers}
    semaphore: dict[syncmodel.Thread, int] = {}
    count: dict[syncmodel.Thread, int] = {}
    value: dict[int, tuple[int, int]] = {}  # producer id -> (its semaphore, the count it brings)
    for instr in new_order:
        if instr.id not in waited:
            continue
        thread = syncmodel.access_thread(instr)
        semaphore.setdefault(thread, len(semaphore))
        count[thread] = count.get(thread, 0) + 1
        value[instr.id] = (semaphore[thread], count[thread])
        instr.updates.add(semaphore=semaphore[thread], increment=1)
    if len(semaphore) > target.num_semaphores:
        names = ", ".join(syncmodel.thread_name(t) for t in semaphore)
        raise CompileError(
            "E404",
            f"alloc_semaphores: the program needs {len(semaphore)} semaphores (one per producing thread: "
            f"{names}) but target {target.name} has {target.num_semaphores}",
            NAME,
        )
    updated = {i.id: i for i in new_order}
    if ctx.loop_entries:
        _loop_waits(ctx, new_order, waited, wait_for, semaphore, updated)
    else:
        for consumer, producers in wait_for.items():
            waits = updated[consumer].waits
            for sem, val in sorted(value[p] for p, _ in producers):
                waits.add(semaphore=sem, value=val)

    birutil.set_order(program, new_order)
    program.num_semaphores = len(semaphore)
    ctx.synchronized = True
    ctx.ports_synchronized = False  # until sync_dve_pool moved the port-holding waits
    ctx.order_changed()
    # Nothing may change addresses or order from here on, so no analysis runs again: the
    # analyzer's footprint memo (hundreds of MB at a million instructions) can go.
    ctx.footprint_cache = {}
    ctx.hbm_edges = None
    ctx.sync_walk = walk  # the clocks of exactly this order (semaphore_reset reads them)
    ctx.set_stat("dependence_edges", deps.number_of_edges())
    ctx.set_stat("edges_same_thread", same_thread)
    ctx.set_stat("edges_cross_thread_already_ordered", cross_covered)
    ctx.set_stat("waits_needed", needed_total)
    ctx.set_stat("waits_elided_implied", implied)
    ctx.set_stat("waits", sum(len(p) for p in wait_for.values()))
    ctx.set_stat("updates", len(waited))
    ctx.set_stat("nops_inserted", nops)
    ctx.set_stat("semaphores", len(semaphore))
    ctx.set_stat("transfer_threads_merged", merged)
    if ctx.loop_entries:
        ctx.set_stat("carried_waits", sum(1 for ws in wait_for.values() for _, c in ws if c is not None))


def _clocks(walk: syncmodel.ClockWalk, group: list[tuple[int, Carried | None]]) -> list[syncmodel.Clock]:
    """The completion clocks the walk joins for a group of waits: a carried dependence's producer
    is an earlier iteration's, which the clocks of one iteration do not describe."""
    return [walk.completion_clock[p] for p, carried in group if carried is None]


def _carried_waits(ctx: PassContext, by_id: dict[int, bir_pb2.Instruction]) -> dict[int, list[Carried]]:
    """The carried dependences that need a wait, by consumer: not those one thread orders (a
    queue thread, an engine, or a dma triggered on the engine that produced its source), of
    several on one producing thread and loop only the one at the shortest distance from the
    latest producer, and not one that an earlier instruction of the consumer's stream waits for
    already: a stream runs in order, so once it has waited for the producing thread's count at
    some iteration, what that thread did up to then is done for every instruction after it (a
    layer loop's body had every instruction wait on every thread of the iteration before)."""
    best: dict[tuple[int, syncmodel.Thread, int, int | None], Carried] = {}
    position = {instr.id: index for index, instr in enumerate(ctx.program.instructions)}
    # per instruction id: its access thread, and its engine where it is not a dma (a dma's trigger
    # engine does not order its completion)
    threads = {node: syncmodel.access_thread(instr) for node, instr in by_id.items()}
    engines = {node: None if is_dma(instr.op) else instr.engine for node, instr in by_id.items()}
    for dependence in ctx.carried:
        thread, consumer_thread = threads.get(dependence.src), threads.get(dependence.dst)
        if thread is None or consumer_thread is None or thread == consumer_thread:
            continue
        if engines[dependence.src] is not None and engines[dependence.src] == by_id[dependence.dst].engine:
            continue  # the consumer's engine (or its trigger) runs after the producer completed
        key = (dependence.dst, thread, dependence.loop, dependence.src_loop)
        old = best.get(key)
        rank = (dependence.distance, -position[dependence.src])
        if old is None or rank < (old.distance, -position[old.src]):
            best[key] = dependence
    result: dict[int, list[Carried]] = {}
    waited: dict[tuple, tuple[int, int]] = {}  # (stream, thread, loop, src_loop) -> (distance, producer)
    for (consumer, thread, loop, src_loop), dependence in sorted(best.items(),
                                                                 key=lambda item: position[item[0][0]]):
        stream = (by_id[consumer].engine, thread, loop, src_loop)
        mine, before = (dependence.distance, position[dependence.src]), waited.get(stream)
        if before is not None and (before[0] < mine[0] or before[0] == mine[0] and before[1] >= mine[1]):
            continue
        waited[stream] = mine
        result.setdefault(consumer, []).append(dependence)
    return result


def _loop_waits(ctx: PassContext, order: list[bir_pb2.Instruction], waited: set[int],
                wait_for: dict[int, list[tuple[int, Carried | None]]],
                semaphore: dict[syncmodel.Thread, int], updated: dict[int, bir_pb2.Instruction]) -> None:
    """The waits of a program with loops: thresholds at every iteration (analysis/loop_sync.py)."""
    nest = loopnest.LoopNest.of(ctx.loop_entries, order)
    counts = loop_sync.LoopCounts(nest, order, waited, syncmodel.access_thread)
    for consumer, producers in wait_for.items():
        found = []
        for producer, carried in producers:
            if carried is None:
                value, steps = counts.threshold(producer, consumer)
            else:
                value, steps = counts.threshold(producer, consumer, carried.loop, carried.distance,
                                                carried.src_loop, carried.scale)
            found.append((semaphore[counts.thread[producer]], value, steps))
        waits = updated[consumer].waits
        for sem, value, steps in sorted(found):
            waits.add(semaphore=sem, value=value, loop_steps=steps)


def _merge_transfer_threads(program: bir_pb2.Program, deps: DepGraph, limit: int) -> int:
    """The fallback when the program has more signalling threads than semaphores: a trigger
    engine's dmas on its least-loaded queue move to its next least-loaded one (a transfer thread
    is a (queue, trigger engine) pair), until the threads fit `limit` or every engine is down to
    one queue. Only a thread with a dma that something depends on can need a semaphore: one that
    carries only final stores has none, and is neither counted nor merged. Any queue moves a
    dma's bytes; what changes is only how many transfers run at once. Returns the number of
    threads merged away (E404 remains for what engines alone cannot fit)."""
    queues: dict[int, Counter[int]] = defaultdict(Counter)  # trigger engine -> queue -> bytes
    engines = {instr.engine for instr in program.instructions}
    for instr in program.instructions:
        if is_dma(instr.op) and deps.out_degree(instr.id):
            queues[instr.engine][instr.dma_queue] += birutil.transfer_bytes(instr) or 1
    merged = 0
    moves: dict[tuple[int, int], int] = {}  # (engine, queue) -> the queue its dmas go to
    while len(engines) + sum(len(used) for used in queues.values()) > limit:
        engine = max((e for e in queues if len(queues[e]) > 1), key=lambda e: len(queues[e]), default=None)
        if engine is None:
            break
        (lightest, moved), (into, _) = sorted(queues[engine].items(), key=lambda item: (item[1], item[0]))[:2]
        queues[engine][into] += moved
        del queues[engine][lightest]
        for key, target_queue in moves.items():
            if key[0] == engine and target_queue == lightest:
                moves[key] = into
        moves[(engine, lightest)] = into
        merged += 1
    if moves:
        for instr in program.instructions:
            if is_dma(instr.op):
                instr.dma_queue = moves.get((instr.engine, instr.dma_queue), instr.dma_queue)
    return merged
