"""End the program with a semaphore group reset, so that the NEFF can run inference after inference.

Semaphores are counters that only grow during an inference: a consumer waits until its producer's
thread reached that producer's running count (alloc_semaphores). The runtime starts the next
inference on the same core without touching them, so a program that leaves its counts where they
ended lets every wait of the next inference pass at once, before its producer ran. This pass
appends, on the SP (sync) engine, one `sem_reset` instruction that sets every semaphore of the
program to 0, behind an all-engine barrier:

  * every update has landed: the reset waits for each semaphore's final count (an update lands
    only after its instruction completed, so once every count reached its total none is to come);
  * every wait has been seen: an engine still blocked on a wait when the counts drop to 0 would
    wait forever. Each engine other than SP whose last wait is not otherwise ordered before the
    reset ends with an arrival `nop` that adds 1 to a barrier semaphore of its own (a new one: a
    semaphore shared by several threads would break alloc_semaphores' "count k = the first k
    producers of one thread"), and the reset waits for all the arrivals. SP's own waits precede
    the reset in program order.

The reset carries at most `max_waits_per_instruction` waits; the others ride on `nop`s just before
it on SP, as alloc_semaphores does for wide joins. Waits are elided by the same vector clocks
(syncmodel): an update already ordered before SP's end, or implied by another awaited completion
(an arrival covers its whole engine), needs no wait, and an engine whose last wait the awaited
updates already order needs no arrival. The barrier semaphore is one more than alloc_semaphores
used; a program already at the target's limit is E404.

A program that keeps loops gets the plain barrier: each engine other than SP that waits at all
arrives, and the reset waits for every semaphore's final count, each update counted once per
iteration of its loops (the clocks of the static order do not say which waits an iteration's
updates already cover).

Needs: semaphores inserted (alloc_semaphores) and nothing reordered afterwards. birverifier's rule
`semaphore_reset` checks the result: every update and every wait is ordered before the reset,
which is the last instruction of SP's stream. A program without semaphores needs no reset and gets none.
"""

from __future__ import annotations

from ncc.schemas import bir_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.walrus_driver.analysis import birutil, syncmodel
from ncc.tools.walrus_driver.context import PassContext
from ncc.tools.walrus_driver.registry import register

NAME = "semaphore_reset"
RESET_OP = "sem_reset"


@register(NAME)
def run(ctx: PassContext) -> None:
    ctx.require_synchronized()
    ctx.forbid_after_lower_sync()
    program = ctx.program
    if any(instr.op == RESET_OP for instr in program.instructions):
        raise CompileError("E402", f"pass {NAME}: the program already ends with a semaphore reset", NAME)
    if program.num_semaphores == 0:
        ctx.set_stat("reset_waits", 0)
        return
    if ctx.loop_entries:
        _loop_barrier(ctx)
        return
    walk, value_of = _walk(program, ctx.sync_walk)
    sp_clock = walk.base_clock(bir_pb2.Instruction(engine=birutil.SP))
    highest: dict[int, tuple[int, int]] = {}  # semaphore -> (its final count, the producer of it)
    for (semaphore, count), producer in value_of.items():
        if count > highest.get(semaphore, (count - 1,))[0]:
            highest[semaphore] = (count, producer)
    last_updater = {semaphore: highest[semaphore][1] for semaphore in sorted(highest)}

    def needed(clocks: list[syncmodel.Clock]) -> list[int]:
        """Last updaters that SP's order and the given completions do not already cover, minus
        those implied by another one's completion (as alloc_semaphores elides waits)."""
        left = [p for p in last_updater.values() if not any(walk.covered(c, p) for c in (sp_clock, *clocks))]
        return [p for p in left if not any(q != p and walk.completion_covers(q, p) for q in left)]

    # Engines whose last wait the data waits would not order before the reset arrive at a barrier.
    reached = sp_clock.copy()
    for producer in needed([]):
        syncmodel.join_into(reached, walk.completion_clock[producer])
    arriving = []
    for engine, last_wait in sorted(_last_waiting_position(program).items()):
        if engine != birutil.SP and reached[walk.space.index[syncmodel.engine_thread(engine)]] < last_wait:
            arriving.append(engine)
    next_id = birutil.next_instruction_id(program)
    waits: list[tuple[int, int]] = []
    arrivals = []
    if arriving:
        for arrival in _arrivals(ctx, next_id, arriving, waits):
            walk.step(arrival, [])
            arrivals.append(walk.completion_clock[arrival.id])
        next_id += len(arriving)
    final = {semaphore: count for semaphore, (count, _) in highest.items()}
    semaphore_of = {producer: semaphore for semaphore, producer in last_updater.items()}
    waits += [(semaphore_of[p], final[semaphore_of[p]]) for p in needed(arrivals)]
    _add_reset(ctx, next_id, waits)
    ctx.set_stat("barrier_arrivals", len(arriving))


def _loop_barrier(ctx: PassContext) -> None:
    """The reset of a program that keeps loops (the module docstring): every waiting engine but SP
    arrives at a barrier; the reset waits for it and for each semaphore's final count."""
    program = ctx.program
    nest = ctx.loops()
    final: dict[int, int] = {}
    for instr in program.instructions:
        for update in instr.updates:
            final[update.semaphore] = final.get(update.semaphore, 0) + update.increment * nest.runs(instr.id)
    arriving = sorted(engine for engine in _last_waiting_position(program) if engine != birutil.SP)
    next_id = birutil.next_instruction_id(program)
    waits = sorted(final.items())
    if arriving:
        _arrivals(ctx, next_id, arriving, waits)
        next_id += len(arriving)
    _add_reset(ctx, next_id, waits)
    ctx.set_stat("barrier_arrivals", len(arriving))


def _arrivals(ctx: PassContext, next_id: int, engines: list[int],
              waits: list[tuple[int, int]]) -> list[bir_pb2.Instruction]:
    """An arrival nop on each of `engines` adding 1 to a new barrier semaphore (ids from
    `next_id`), and the reset's wait for all of them appended to `waits`."""
    program, target = ctx.program, ctx.target
    barrier = program.num_semaphores
    if barrier >= target.num_semaphores:
        raise CompileError(
            "E404",
            f"{NAME}: the end-of-inference barrier needs a semaphore, but alloc_semaphores used all "
            f"{target.num_semaphores} of target {target.name}",
            NAME,
        )
    program.num_semaphores += 1
    arrivals = []
    for number, engine in enumerate(engines):
        arrival = _add(ctx, next_id + number, f"{NAME}.arrive.{birutil.engine_name(engine)}", "nop", engine)
        arrival.updates.add(semaphore=barrier, increment=1)
        arrivals.append(arrival)
    waits.append((barrier, len(engines)))
    return arrivals


def _add_reset(ctx: PassContext, next_id: int, waits: list[tuple[int, int]]) -> None:
    """The reset on SP, with `waits` ((semaphore, value)) on it and on nops just before it."""
    target = ctx.target
    waits.sort()
    per_instruction = max(1, target.max_waits_per_instruction)
    groups = [waits[i : i + per_instruction] for i in range(0, len(waits), per_instruction)] or [[]]
    for number, group in enumerate(groups):
        last = number == len(groups) - 1
        name, op = (NAME, RESET_OP) if last else (f"{NAME}.wait{number}", "nop")
        instr = _add(ctx, next_id, name, op, birutil.SP)
        next_id += 1
        for semaphore, value in group:
            instr.waits.add(semaphore=semaphore, value=value)
    ctx.order_changed()
    ctx.set_stat("reset_waits", len(waits))
    ctx.set_stat("reset_nops", len(groups) - 1)


def _walk(
    program: bir_pb2.Program, walked: syncmodel.ClockWalk | None
) -> tuple[syncmodel.ClockWalk, dict[tuple[int, int], int]]:
    """The program's clocks (syncmodel; alloc_semaphores' own when it ran just before) and, per
    (semaphore, count), the instruction whose update brings the semaphore to that count.
    alloc_semaphores gives each semaphore one thread and +1 updates, so counts follow program
    order."""
    walk = walked or syncmodel.ClockWalk(syncmodel.ClockSpace.for_instructions(program.instructions))
    producers = syncmodel.SemaphoreProducers()
    for instr in program.instructions:
        if walked is None:
            walk.step(instr, [walk.completion_clock[producers.producer(w)] for w in instr.waits])
        producers.record(instr)
    return walk, producers.by_count


def _last_waiting_position(program: bir_pb2.Program) -> dict[int, int]:
    """Per engine, the position in its stream of its last instruction that waits."""
    position: dict[int, int] = {}
    last: dict[int, int] = {}
    for instr in program.instructions:
        engine = instr.engine
        at = position[engine] = position.get(engine, -1) + 1
        if instr.waits:
            last[engine] = at
    return last


def _add(ctx: PassContext, instr_id: int, name: str, op: str, engine: int) -> bir_pb2.Instruction:
    """Append an instruction without memory accesses (no dependence edge: the graph stays valid)."""
    instr = ctx.program.instructions.add(
        id=instr_id, name=name, op=op, engine=engine, source=NAME, attributes={"inserted_by": NAME}
    )
    if ctx.deps is not None:
        ctx.deps.add_node(instr_id)
    return instr
