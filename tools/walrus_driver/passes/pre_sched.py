"""Reorder instructions by a time-aware list scheduler over the dependence graph.

Kahn's algorithm over the dependence DAG with a model of the machine (costs.py): each engine runs
one instruction at a time, DVE/POOL share the SBUF port and DVE/ACT the PSUM port, a dma occupies
its trigger engine for the issue and then, for the transfer, the queue of its trigger engine's
pool (chosen by assign_hwdge_engine, which runs first; any queue for a dma nothing waits for
when it says so) that frees first; that queue is written
into the dma, so the program runs on the queues the schedule was planned with. A ready
instruction waits in its engine's ready list keyed by earliest start (the latest finish of its
predecessors); the engine's next instruction is the ready one of highest priority among those
that can start when the engine is free, else the one that can start soonest, and the engine whose
choice starts first is scheduled. Priority is the critical path to the end of the program.

Engine choice. An instruction that another engine can run as well waits in every such engine's
ready list; when one of them takes it, it runs on the engine that finishes it first (earliest
finish time, as HEFT assigns processors), and it is rewritten for that engine if the schedule is
kept (engine_choice.py):
  * `spread_to_act`: a DVE instruction with an exact ACT form (tensor_scalar by a float scalar,
    x·x, tensor_copy). Elementwise chains put nearly all their work on DVE; this lets ACT, idle
    between activations, share it (gelu: DVE was busy 23.7 of 28.6 µs, ACT 1.5).
  * `choose_triggers`: a store may be triggered by any engine that has a queue pool (SP and the
    engine assign_hwdge_engine spread stores to); finish is then the transfer's end. A choice
    made for this order only: if allocation goes back to the order pre_sched received, the
    stores go back to their engines too (on SP, in that order, a store waiting for its data held
    up the loads behind it: a D = 2048 MLP took 2541 µs without that, 2341 with it).

Live-bytes pressure: when the chosen instruction would make the live SBUF (or PSUM) bytes per
partition exceed `pressure_fraction` of the memory (its buffers count as live while it runs; a
PSUM buffer as the bytes the bank rule keeps from others, `psum_footprint`), the
scheduler takes instead a ready or soon-ready instruction that stays within the limit, else one
that does not grow the live set (it frees a buffer by being its last user), else the one earliest
in the input (program) order, so that allocation afterwards fits. A schedule whose live SBUF
or PSUM bytes pass the whole memory while the input order stays within the limit is abandoned,
and the input order kept (counter `schedules_abandoned`): past SBUF it could win only by
spilling, which the model does not price, and past PSUM allocation would go back to the input
order anyway. The kept input order still runs a DVE instruction on ACT where that finishes it
sooner, chosen in program order (the D = 2048 and 4096 MLPs, whose schedules pass PSUM, took
1111.8 and 3787.6 µs with the choices of the whole schedule they built; 1090.3 and 3765.0 now).

Released loads. A load that depends on nothing (an input's or a weight's tile) is ready at time
0, and the engine that triggers it is mostly idle, so the list scheduler issued every such load
first: a BERT layer's 21 MB of feed-forward and projection weights went onto the queues and the
HBM channel ahead of the attention's intermediates that the critical path waited for (50 µs with
every compute engine idle, in the model), and held SBUF until the schedule outgrew it and was
abandoned for the input order, whose streams finish one tile's chain before the next tile's
starts. So each pressure limit is tried twice: as above, and with each such load released (its
earliest start) when the input order's placement issues it; the schedule of least estimated
makespan is kept (counter `loads_released`: the loads held back in the kept schedule). Releasing
every program's loads was tried: it lost where prefetching them is what wins (the LLaMA decode
cut 36.7 -> 59.0 µs, an RNN 13.5 -> 18.8), where the model itself prefers the plain schedule.
Only a program scheduled whole holds loads back: in one that keeps loops each block is scheduled
apart, where a block's loads that depend only on other blocks would count as depending on
nothing, and GPT-2's twelve layers ran 1.7 % longer with it.

A program that keeps loops (analysis/loopnest.py) is scheduled block by block: each maximal run
of the static order whose instructions share their innermost loop (a loop body between its inner
loops, or the top level between loops) is scheduled on its own, over the dependences within it,
and no instruction leaves its block, so every body stays one run of the order. Iterations
overlap at run time through the engines' separate streams and rotating buffers, not through this
order. A block's live-bytes limit leaves out what allocation keeps live over the whole block
without the block's order deciding it (`_surroundings`: buffers live before or after the
block, or over a whole loop body), so the block's schedule fits beside them; a loop body's limit
is LOOP_PRESSURE_FRACTION of that, as its buffers rotate through two copies. A block's model
starts with every DMA queue free, but a body's transfers hold their queues at every run: so a block
starts from the load the blocks before left on each queue (`Surroundings.queue_load`, each
transfer counted once per run) and, of queues equally free, a transfer takes the one fewest of the
block's trigger engines can use, then the least loaded (`_queue_rank`). Scheduled on fresh queues,
every body had put its first transfers on queues 0, 1, ... in turn (a rolled max pool: queue 0 busy
286 us, queue 15 15 us; ResNet stage 1 6,062.6 -> 5,664.2 us with this).

The new order is written to program.instructions (the input order stays when the model says it
is faster). With `tries` > 1 (--optlevel 3) the scheduler runs again under other pressure limits
and keeps the order of least estimated makespan. Counters: the estimated makespan of the input
order and of the new order under the same model (`walrus.est_makespan_ns`); codegen stamps the
final program's lower bound, at every optimization level.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from ncc.schemas import bir_pb2
from ncc.tools.common import forked
from ncc.tools.common.errors import CompileError
from ncc.tools.target import is_dma
from ncc.tools.walrus_driver.analysis import birutil, costs, engine_choice, loopnest
from ncc.tools.walrus_driver.analysis.depgraph import DepGraph
from ncc.tools.walrus_driver.context import PassContext
from ncc.tools.walrus_driver.registry import register

NAME = "pre_sched"


@dataclass
class Options:
    pressure_fraction: float = 0.8  # live bytes / capacity above which the pressure term applies
    pressure_window: int = 32  # ready instructions per engine examined under pressure
    tries: int = 1  # schedules made under different pressure limits; the fastest is kept
    spread_to_act: bool = True  # DVE instructions with an exact ACT form may run on ACT
    choose_triggers: bool = True  # a dma may be triggered by any engine with a queue pool
    release_loads: bool = True  # also try holding back the loads that depend on nothing (docstring)


EXTRA_FRACTIONS = (0.9, 0.65, 0.5)  # the other pressure limits that tries > 1 schedules under
NO_PRESSURE_LIMIT = 2.0  # a pressure_fraction over 1 turns the live-bytes term off
# A loop body's live-bytes limit: its private buffers get two rotating copies (allocation), which
# the model counts once, and the next iteration needs room to start while this one ends. At 0.8
# the LLaMA prefill's softmax body (16 row tiles of 8 KiB intermediates) filled SBUF and each
# iteration's loads waited for the last one's stores: 20,689.4 -> 19,820.1 us at 0.65.
LOOP_PRESSURE_FRACTION = 0.65


class _QueueTimeline:
    """One DMA queue's busy intervals, sorted and merged where they touch. A queue runs transfers in
    the order they arrive, so a transfer issued at t starts in the first idle stretch from t on
    that holds it, even if the scheduler already placed a later-issued one (a store whose data is
    ready late) further on: keeping only the end of the last placed transfer made every load
    issued before that store wait behind it, and pre_sched then crowded SP's loads onto the queues
    no store had touched (the D = 8192 MLP at -O1: 6 queues each moved 7x what the other 10 did).

    An idle stretch shorter than `min_gap` (the dma fixed latency, the least any transfer takes)
    can hold no transfer, so it is merged into its neighbours: a backlogged queue is then one
    interval instead of slivers between transfers issued a few ns apart, which every later
    search walked.

    A second, coarse list merges every idle stretch shorter than `COARSE_GAPS` x `min_gap` too.
    A transfer at least that long fits only where the coarse list has a gap, at the same place,
    so its search walks the coarse list: the D = 8192 MLP's searches had walked nine intervals
    on average, most of them across gaps too short for the transfer. The answer is the same."""

    __slots__ = ("starts", "ends", "min_gap", "coarse_starts", "coarse_ends", "coarse_gap")

    def __init__(self, min_gap: float) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.min_gap = min_gap
        self.coarse_starts: list[float] = []
        self.coarse_ends: list[float] = []
        self.coarse_gap = COARSE_GAPS * min_gap

    def slot(self, t: float, length: float, bound: float = math.inf) -> tuple[float, int]:
        """(the earliest start >= t of an idle stretch `length` long, the interval index it
        precedes); (inf, -1) as soon as that start is known to be later than `bound`."""
        ends = self.ends
        if not ends or t >= ends[-1]:
            return t, len(ends)
        coarse = length >= self.coarse_gap
        starts, walked = (self.coarse_starts, self.coarse_ends) if coarse else (self.starts, ends)
        index = bisect.bisect_right(walked, t)
        count = len(starts)
        while index < count and starts[index] < t + length:
            if walked[index] > t:
                t = walked[index]
                if t > bound:
                    return math.inf, -1
            index += 1
        if coarse:  # its place among the intervals: every one before it ends by t, the next after
            index = bisect.bisect_right(ends, t)
        return t, index

    def occupy(self, start: float, end: float, index: int) -> None:
        """Mark [start, end) busy; `index` from slot()."""
        _insert(self.starts, self.ends, start, end, index, self.min_gap)
        coarse_ends = self.coarse_ends
        at = bisect.bisect_right(coarse_ends, start)
        if at < len(coarse_ends) and self.coarse_starts[at] <= start:
            return  # inside a coarse interval: the stretch it fills was shorter than coarse_gap
        _insert(self.coarse_starts, coarse_ends, start, end, at, self.coarse_gap)


# The coarse list of a queue timeline merges idle stretches shorter than this x min_gap (1.5 us):
# every piece split_dma cuts (32 KiB or more: 1.71 us on a queue) is searched on it.
COARSE_GAPS = 3


def _insert(starts: list[float], ends: list[float], start: float, end: float, index: int, gap: float) -> None:
    """Add [start, end) before interval `index`, merged with a neighbour less than `gap` away."""
    joins_before = index > 0 and start - ends[index - 1] < gap
    joins_after = index < len(starts) and starts[index] - end < gap
    if joins_before and joins_after:
        ends[index - 1] = ends[index]
        del starts[index], ends[index]
    elif joins_before:
        ends[index - 1] = end
    elif joins_after:
        starts[index] = start
    else:
        starts.insert(index, start)
        ends.insert(index, end)


@dataclass
class _Machine:
    """Resource timelines of the cost model: engines, shared ports and the DMA queues. A dma
    transfers on the queue of its trigger engine's pool (ctx.queue_pools; every queue when no
    pools were chosen yet) where it can start first; `queue_of` records that choice."""

    table: costs.CostTable
    engine_free: dict[int, float]
    port_free: dict[str, float]
    queues: list[_QueueTimeline]
    pools: dict[int, list[int]]
    every_queue: list[int]
    queue_of: dict[int, int] = field(default_factory=dict)
    start_of: dict[int, float] = field(default_factory=dict)  # id -> when it was placed to start
    # per queue, how much it is wanted (_queue_rank): of queues equally free, the least wanted
    # takes a transfer
    queue_rank: tuple[tuple[int, float], ...] = ()

    @classmethod
    def fresh(cls, table: costs.CostTable, pools: dict[int, list[int]] | None = None,
              queue_rank: tuple[tuple[int, float], ...] = ()) -> _Machine:
        queues = max(1, table.target.dma_queues)
        every = list(range(queues))
        return cls(
            table,
            defaultdict(float),
            defaultdict(float),
            [_QueueTimeline(table.target.dma_fixed_latency_ns) for _ in range(queues)],
            defaultdict(lambda: every, pools or {}),
            every,
            queue_rank=queue_rank or ((0, 0.0),) * queues,
        )

    def start_time(self, engine: int, cost: costs.Cost, earliest: float) -> float:
        """When an instruction of this cost can start on `engine` and its ports."""
        start = max(earliest, self.engine_free[engine])
        for port in cost.ports:
            start = max(start, self.port_free[port])
        return start

    def _transfer_slot(self, form: _Form, issue_end: float) -> tuple[float, int, int]:
        """(transfer start, queue, interval index) on the queue of the dma's pool (every queue
        for one nothing waits for) where it starts first; among queues where it starts equally
        soon, the one idle longest (of those whose last transfer ends before it), so idle queues
        take turns as they did when only that end was kept; then the least wanted (`queue_rank`)."""
        best_start = best_tail = math.inf
        best_queue = best_index = -1
        queues, length, rank = self.queues, form.cost.transfer_ns, self.queue_rank
        for queue in self.every_queue if form.any_queue else self.pools[form.engine]:
            timeline = queues[queue]
            ends = timeline.ends
            tail = ends[-1] if ends else 0.0
            if tail <= issue_end:  # idle from issue_end on: no gap to look for
                start, index = issue_end, len(ends)
            elif best_start <= issue_end:  # nothing starts sooner, and this one ends later
                continue
            else:  # a queue that cannot start it sooner than the best so far is left early
                start, index = timeline.slot(issue_end, length, best_start)
            if start < best_start or (start == best_start and (
                    tail < best_tail or (tail == best_tail and rank[queue] < rank[best_queue]))):
                best_start, best_tail, best_queue, best_index = start, tail, queue, index
        return best_start, best_queue, best_index

    def finish_time(self, form: _Form, start: float) -> float:
        """When an instruction started at `start` (start_time) would complete if placed now (a
        dma: its transfer, on the queue of its pool where it can start first), without placing it."""
        issue_end = start + form.cost.engine_ns
        if not form.dma:
            return issue_end
        return self._transfer_slot(form, issue_end)[0] + form.cost.transfer_ns

    def first_to_finish(
        self, own: _Form, alternatives: list[_Form] | None, ready_at: float
    ) -> tuple[_Form, float]:
        """(form, start) of an instruction ready at `ready_at`: its own form or, of its
        alternatives, the one that finishes it first if placed now (ties keep its own)."""
        start = self.start_time(own.engine, own.cost, ready_at)
        if not alternatives:
            return own, start
        form, best_finish = own, self.finish_time(own, start)
        for other in alternatives:
            other_start = self.start_time(other.engine, other.cost, ready_at)
            finish = self.finish_time(other, other_start)
            if finish < best_finish:
                best_finish, form, start = finish, other, other_start
        return form, start

    def place(self, node: int, form: _Form, start: float) -> float:
        """Occupy the resources from `start`; returns the completion time."""
        self.start_of[node] = start
        issue_end = start + form.cost.engine_ns
        self.engine_free[form.engine] = issue_end
        for port in form.cost.ports:
            self.port_free[port] = issue_end
        if not form.dma:
            return issue_end
        begin, queue, index = self._transfer_slot(form, issue_end)
        finish = begin + form.cost.transfer_ns
        self.queues[queue].occupy(begin, finish, index)
        self.queue_of[node] = queue
        return finish


class _Form(NamedTuple):
    """An engine an instruction may run on, with its cost there: its own (`rewrite` None), a
    store's copy on another trigger engine, or the ACT form of a DVE instruction, applied only if
    the kept schedule runs it there. A dma that needs no semaphore (ctx.unpooled_dmas: nothing
    waits for it) may take any queue, not only its trigger engine's pool (assign_hwdge_engine).
    (A tuple: one is made per instruction per run.)"""

    engine: int
    cost: costs.Cost
    dma: bool
    rewrite: bir_pb2.Instruction | engine_choice.ActForm | None = None
    any_queue: bool = False


def _place_in_order(
    order: list[int],
    deps: DepGraph,
    own: dict[int, _Form],
    table: costs.CostTable,
    pools: dict[int, list[int]] | None,
    alternatives: dict[int, list[_Form]] | None = None,
    queue_rank: tuple[tuple[int, float], ...] = (),
) -> tuple[float, _Machine, dict[int, _Form]]:
    """(makespan, machine, forms chosen) of executing the instructions in this order (in order per
    engine); with `alternatives`, each runs on the engine of its forms that finishes it first."""
    machine = _Machine.fresh(table, pools, queue_rank)
    finish: dict[int, float] = {}
    chosen: dict[int, _Form] = {}
    for node in order:
        ready = max((finish.get(p, 0.0) for p in deps.predecessors(node)), default=0.0)
        form, start = machine.first_to_finish(own[node], alternatives and alternatives.get(node), ready)
        if form.rewrite is not None:
            chosen[node] = form
        finish[node] = machine.place(node, form, start)
    return max(finish.values(), default=0.0), machine, chosen


@register(NAME, Options)
def run(ctx: PassContext) -> None:
    ctx.forbid_after_sync()
    if ctx.loop_entries:
        schedule_blocks(ctx, ctx.options or Options(), ctx.require_deps(), ctx.unpooled_dmas)
        return
    schedule(ctx, ctx.options or Options(), ctx.require_deps(), ctx.unpooled_dmas)


def schedule_blocks(
    ctx: PassContext,
    options: Options,
    deps: DepGraph,
    unpooled: set[int],
    acceptable: Callable[[list[bir_pb2.Instruction]], bool] | None = None,
) -> None:
    """schedule() for a program that keeps loops: each block apart (the module docstring), the
    whole order checked by `acceptable` at the end (refused: the input order stays)."""
    program = ctx.program
    nest = ctx.loops()
    input_order = list(program.instructions)
    blocks: list[list[bir_pb2.Instruction]] = []
    for instr in input_order:
        if blocks and nest.owner(blocks[-1][-1].id) == nest.owner(instr.id):
            blocks[-1].append(instr)
        else:
            blocks.append([instr])
    by_id = {instr.id: instr for instr in input_order}
    buffers = birutil.buffer_map(program)
    cache = ctx.footprint_cache
    touched_by_block = [{name for instr in block for name in birutil.touched_buffers(instr, cache)}
                        for block in blocks]
    around = _surroundings(ctx, blocks, touched_by_block, input_order, buffers)
    new_order: list[bir_pb2.Instruction] = []
    saved = {node: _copy(instr) for node, instr in by_id.items()}
    triggers: dict[int, bir_pb2.Instruction] = {}
    totals: dict[str, float] = {}
    # Inside a loop a store keeps the trigger engine assign_hwdge_engine gave it: one iteration
    # scheduled alone looks no worse with its stores on SP, but there they would hold up the
    # loads SP issues for the next iterations (an engine runs its stream in order). And a body
    # keeps to LOOP_PRESSURE_FRACTION of what is left around it.
    # Loads are not held back in blocks (the module docstring, Released loads).
    options = Options(**{**options.__dict__, "release_loads": False})
    in_loop = Options(**{**options.__dict__, "choose_triggers": False,
                         "pressure_fraction": min(options.pressure_fraction, LOOP_PRESSURE_FRACTION)})
    queue_load = [0.0] * max(1, ctx.target.dma_queues)
    for block, touched, surroundings in zip(blocks, touched_by_block, around, strict=True):
        runs = nest.runs(block[0].id)
        if len(block) < 2:
            new_order += block
            _load_queues(queue_load, block, runs, ctx.costs())
            continue
        surroundings = surroundings._replace(queue_load=tuple(queue_load))
        sub_program = bir_pb2.Program(name=program.name, target=program.target,
                                      buffers=[buffers[name] for name in touched if name in buffers])
        sub = PassContext(program=sub_program,
                          target=ctx.target, queues_assigned=ctx.queues_assigned, queue_pools=ctx.queue_pools,
                          unpooled_dmas=ctx.unpooled_dmas, footprint_cache=ctx.footprint_cache)
        sub._cost_table = ctx.costs()
        sub.current_pass, sub.current_label = ctx.current_pass, ctx.current_label
        sub.program.instructions.extend(block)
        ids = {instr.id for instr in block}
        graph = DepGraph()
        for instr in block:
            preds = deps.pred_codes(instr.id)
            graph.set_predecessors(instr.id, {p: code for p, code in preds.items() if p in ids})
        schedule(sub, in_loop if nest.owner(block[0].id) in nest.loops else options, graph, unpooled,
                 around=surroundings)
        for instr in sub.program.instructions:  # the block's order and the forms it chose
            by_id[instr.id].CopyFrom(instr)
            new_order.append(by_id[instr.id])
        _load_queues(queue_load, block, runs, ctx.costs())
        triggers.update(sub.triggers_before_schedule or {})
        for name, value in sub.stats.get(ctx.current_label, {}).items():
            summed = name.startswith("est_makespan") or name.endswith("_moved")
            if summed or name in ("instructions", "moved_to_act"):
                totals[name] = totals.get(name, 0) + value
    if acceptable is not None and not acceptable(new_order):
        for node, instr in by_id.items():
            instr.CopyFrom(saved[node])
        ctx.set_stat("schedules_refused", 1)
        return
    birutil.set_order(program, new_order)
    ctx.order_before_schedule = [instr.id for instr in input_order]
    ctx.triggers_before_schedule = {node: saved[node] for node in triggers}
    ctx.scheduled = True
    ctx.order_changed()
    for name, value in totals.items():
        ctx.set_stat(name, value)
    ctx.set_stat("blocks", len(blocks))


def _queue_rank(instructions: list[bir_pb2.Instruction], pools: dict[int, list[int]] | None,
                load: tuple[float, ...], queues: int) -> tuple[tuple[int, float], ...]:
    """Per queue, how much it is wanted: how many of the engines triggering these instructions'
    dmas have it in their pool, then what the blocks before left on it (`load`). Of idle queues a
    transfer takes the least wanted, leaving shared ones to engines with fewer choices: a rolled
    body's loads (SP: 13 queues) took 4 of the 8 its stores (ACT) could use, and those 4 carried
    both at every iteration, 115 us against 23 on queues the block's stores could not use."""
    queues = max(1, queues)
    wanted = [0] * queues
    for engine in {instr.engine for instr in instructions if is_dma(instr.op)}:
        for queue in (pools or {}).get(engine, range(queues)):
            if queue < queues:
                wanted[queue] += 1
    return tuple(zip(wanted, load or (0.0,) * queues, strict=True))


def _load_queues(load: list[float], block: list[bir_pb2.Instruction], runs: int,
                 table: costs.CostTable) -> None:
    """Add to `load` (ns per queue) the transfers of a block whose instructions run `runs` times."""
    for instr in block:
        if is_dma(instr.op) and 0 <= instr.dma_queue < len(load):
            load[instr.dma_queue] += runs * table(instr).transfer_ns


class Surroundings(NamedTuple):
    """What allocation keeps live around a block of a program that keeps loops (`_surroundings`)."""

    reserved: dict[int, int]  # memory -> bytes counted as live over the whole block
    counted: frozenset[str]  # the buffers among them that the block touches
    # ns each DMA queue transfers, over every iteration, for the blocks before this one: a block
    # scheduled alone starts with every queue free, and each body's transfers went to queues 0, 1,
    # ... in turn until the loops' bodies piled onto the first queues (a rolled max-pool: queue 0
    # busy 286 us, queue 15 15 us)
    queue_load: tuple[float, ...] = ()


def _surroundings(
    ctx: PassContext,
    blocks: list[list[bir_pb2.Instruction]],
    touched_by_block: list[set[str]],
    input_order: list[bir_pb2.Instruction],
    buffers: dict[str, bir_pb2.Buffer],
) -> list[Surroundings]:
    """Each block's Surroundings (`touched_by_block`: the buffers each block names): every on-chip
    buffer whose live range, as allocation will see it, reaches beyond the block (live before it,
    after it, or over a whole loop body it is not private to: loopnest.widen_live_ranges) counts
    as live over the whole block. The block's own
    model would count such a buffer only between its first and last use in the block, and one
    the block does not touch not at all; and it cannot price the holes that buffers placed around
    it leave. Scheduled as if it held SBUF alone, the LLaMA prefill's softmax loop did not fit
    beside what stays live around it (a buffer used in a loop is never spilled), and allocation
    sent the whole program back to the frontend's order. (Counting a buffer the block touches
    only from the block's start, or to its end, was not enough there: allocation still failed.)"""
    live = birutil.live_ranges(input_order, ctx.footprint_cache)
    loopnest.widen_live_ranges(live, input_order, ctx.loops(), buffers)
    block_at: list[int] = []  # position -> index of its block
    for index, block in enumerate(blocks):
        block_at += [index] * len(block)
    memories = (birutil.SBUF, birutil.PSUM)
    spread = {m: [0] * (len(blocks) + 1) for m in memories}  # difference arrays over block indices
    spanning: set[str] = set()
    for name, (first, last) in live.items():
        buffer = buffers.get(name)
        low, high = block_at[first], block_at[last]
        if buffer is None or buffer.memory not in memories or low == high:
            continue  # within one block: its own model counts it
        size = _live_bytes(ctx, buffer)
        spread[buffer.memory][low] += size
        spread[buffer.memory][high + 1] -= size
        spanning.add(name)
    found: list[Surroundings] = []
    running = dict.fromkeys(memories, 0)
    for index, touched in enumerate(touched_by_block):
        for m in memories:
            running[m] += spread[m][index]
        found.append(Surroundings(dict(running), frozenset(touched & spanning)))
    return found


def _copy(instr: bir_pb2.Instruction) -> bir_pb2.Instruction:
    copy = bir_pb2.Instruction()
    copy.CopyFrom(instr)
    return copy


def schedule(
    ctx: PassContext,
    options: Options,
    deps: DepGraph,
    unpooled: set[int],
    acceptable: Callable[[list[bir_pb2.Instruction]], bool] | None = None,
    around: Surroundings | None = None,
) -> None:
    """Reorder ctx.program by the list scheduler over `deps` (or keep its order, if the model says
    that is faster); `unpooled`: the dmas that may take any queue. post_sched calls it too, with
    `acceptable`: a schedule whose order it refuses is dropped, as an abandoned one is.
    `around`: what stays live around the instructions (schedule_blocks: a block of a program that
    keeps loops), which the live-bytes model then counts."""
    program = ctx.program
    instructions = list(program.instructions)
    input_order = [instr.id for instr in instructions]  # ids read once: each read is a lookup
    by_id = dict(zip(input_order, instructions, strict=True))
    if set(by_id) != set(deps.nodes):
        ctx.fail_needs("anti_dependency_analyzer (the graph does not match the instructions)")
    table = ctx.costs()
    own: dict[int, _Form] = {}  # each instruction's form as it stands: engine, cost, dma or not
    alternatives: dict[int, list[_Form]] = {}
    trigger_costs = costs.CostTable(ctx.target)  # a store's copies share its id: priced apart
    triggers = []
    if options.choose_triggers and ctx.queues_assigned and ctx.queue_pools:
        triggers = sorted(e for e in ctx.queue_pools if e in engine_choice.HWDGE_ENGINES)
    for node, instr in zip(input_order, instructions, strict=True):
        cost, dma = table(instr), is_dma(instr.op)
        any_queue = node in unpooled
        own[node] = _Form(instr.engine, cost, dma, None, any_queue)
        forms = []
        if triggers and dma:
            forms = [
                _Form(copy.engine, trigger_costs(copy), True, copy, any_queue)
                for copy in engine_choice.trigger_alternatives(instr, triggers)
            ]
        if options.spread_to_act:
            act = engine_choice.act_form(instr)
            if act is not None:  # priced from the DVE cost's operand facts, rewritten only if kept
                inputs = act.inputs if act.inputs is not None else cost.operands.inputs
                act_cost = table.priced_as(instr, act.op, engine_choice.ACT, inputs)
                forms.append(_Form(engine_choice.ACT, act_cost, False, act))
        if forms:
            alternatives[node] = forms
    original_index = {node: position for position, node in enumerate(input_order)}
    # (a block of a program that keeps loops; a straight-line program keeps the pools' order)
    rank = _queue_rank(instructions, ctx.queue_pools, around.queue_load, ctx.target.dma_queues) \
        if around is not None else ()
    priority: dict[int, float] = {}
    for node in reversed(deps.topological_order()):
        latency = own[node].cost.latency_ns
        priority[node] = latency + max((priority[s] for s in deps.successors(node)), default=0.0)

    # The input order's live set: a list schedule is abandoned once its own outgrows SBUF or
    # PSUM while the input order's stays within the pressure limit. Past SBUF it could only
    # spill its way to a win the model does not see (the D = 8192 MLP: every weight load is
    # ready at the start, the schedule grew to 29 times SBUF over 123k searches under pressure,
    # then lost anyway); past PSUM, which never spills, allocation would fall back to the input
    # order (stacked attention passed PSUM at step 598 of 115k and searched on for 4 s).
    capacity = {birutil.SBUF: ctx.target.sbuf_usable_bytes, birutil.PSUM: ctx.target.psum_bytes_per_partition}
    if around is not None:
        for memory, size in around.reserved.items():
            capacity[memory] = max(0, capacity[memory] - size)

    # Measured only when needed (once): most schedules never pass SBUF or PSUM and are kept.
    @functools.cache
    def in_order_pressure() -> _Pressure:
        pressure = _Pressure.build(ctx, instructions, options.pressure_fraction, capacity, around)
        for node in input_order:
            pressure.scheduled(node)
        return pressure

    def input_order_fits(fraction: float) -> bool:
        peak = in_order_pressure().peak
        return all(peak[m] <= fraction * capacity[m] for m in capacity)

    # The input order placed as it stands, to compare with and to release the loads nothing
    # produces from: in a forked child while the list scheduler runs here (its makespan, queue
    # choices and those loads' start times come back, dicts cheap to send).
    def place_input_order() -> tuple[float, dict[int, int], dict[int, float]]:
        makespan, machine, _ = _place_in_order(input_order, deps, own, table, ctx.queue_pools,
                                               queue_rank=rank)
        starts = {node: machine.start_of[node] for node in sources}
        return makespan, machine.queue_of, starts

    sources = [node for node in input_order if own[node].dma and deps.in_degree(node) == 0] \
        if options.release_loads else []

    as_it_stands = forked.Forked(place_input_order, parallel=len(input_order) >= forked.MIN_INSTRUCTIONS)

    # More effort (tries > 1): schedule again under other pressure limits, keep the fastest.
    fractions = [options.pressure_fraction] + [f for f in EXTRA_FRACTIONS if f != options.pressure_fraction]
    best: _Schedule | None = None
    abandoned = refused = 0
    released = False
    for fraction in fractions[: max(1, options.tries)]:
        # Each limit is tried as it is and with the loads that depend on nothing released as the
        # input order issues them (the module docstring, Released loads).
        for held_back in (False, True) if sources else (False,):
            release = as_it_stands.result()[2] if held_back else {}
            made = _list_schedule(
                ctx,
                deps,
                instructions,
                original_index,
                own,
                priority,
                fraction,
                options.pressure_window,
                alternatives,
                capacity,
                around,
                # (a fraction over 1 turns the pressure term off, and this with it)
                (capacity, functools.partial(input_order_fits, fraction)) if fraction <= 1 else None,
                release,
                rank,
            )
            if made is not None and acceptable is not None and not acceptable([by_id[n] for n in made.order]):
                made, refused = None, refused + 1
            if made is None:
                abandoned += 1
            elif best is None or made.makespan < best.makespan:
                best, released = made, held_back

    with_act = None
    if best is None and alternatives:
        # Every schedule was abandoned: the input order is kept, and its DVE instructions may
        # still run on ACT, chosen in that order by earliest finish (allocation's fallback after
        # a schedule PSUM cannot hold keeps such choices too). Not the stores' trigger engines:
        # chosen in program order they made the D = 2048 MLP's estimate 1072 -> 1307 µs.
        # Placed here while the child may still place the plain input order (a schedule is
        # mostly abandoned early: stacked attention's at step 598 of 115k).
        act_forms = {node: [f for f in forms if not f.dma] for node, forms in alternatives.items()}
        with_act = _place_in_order(input_order, deps, own, table, ctx.queue_pools, act_forms, rank)
    makespan_before, in_order_queues, _ = as_it_stands.result()
    in_order_makespan, in_order_chosen = makespan_before, {}
    if with_act is not None and with_act[0] < makespan_before:
        in_order_makespan, machine, in_order_chosen = with_act
        in_order_queues = machine.queue_of
    if best is None or in_order_makespan < best.makespan:
        # The list scheduler is a heuristic: keep the input order when the model says it is
        # faster, unless it holds more on chip than the schedule does (the model does not count
        # the spills that would cost).
        fraction = best.fraction if best is not None else options.pressure_fraction
        in_order = in_order_pressure()
        in_order.limit = {m: fraction * capacity[m] for m in capacity}
        if best is None or all(
            in_order.peak[m] <= max(best.pressure.peak[m], in_order.limit[m]) for m in in_order.peak
        ):
            best = _Schedule(
                input_order, in_order_makespan, 0, in_order, fraction, in_order_queues, in_order_chosen
            )
            ctx.set_stat("kept_input_order", 1)
            released = False
    ctx.triggers_before_schedule = {}
    for node, form in best.chosen.items():  # rewritten for the engine that ran it in the kept schedule
        if isinstance(form.rewrite, engine_choice.ActForm):
            form.rewrite.apply(by_id[node])
        elif form.rewrite is not None:  # a store on another trigger engine
            ctx.triggers_before_schedule[node] = bir_pb2.Instruction()
            ctx.triggers_before_schedule[node].CopyFrom(by_id[node])
            by_id[node].CopyFrom(form.rewrite)
        table.put(node, form.cost)
    new_order = [by_id[node] for node in best.order]
    moved = sum(1 for position, node in enumerate(best.order) if original_index[node] != position)
    ctx.order_before_schedule = list(input_order)
    if ctx.queues_assigned:  # plan and program agree: each dma goes where the schedule put it
        for node in best.order:
            if own[node].dma:
                by_id[node].dma_queue = best.queue_of[node]
    birutil.set_order(program, new_order)
    ctx.scheduled = True
    ctx.order_changed()

    ctx.set_stat("instructions", len(best.order))
    ctx.set_stat("instructions_moved", moved)
    ctx.set_stat("schedules_tried", min(len(fractions), max(1, options.tries)) * (2 if sources else 1))
    ctx.set_stat("loads_released", len(sources) if released else 0)
    ctx.set_stat("schedules_abandoned", abandoned)
    ctx.set_stat("schedules_refused", refused)
    ctx.set_stat("pressure_fraction_kept", best.fraction)
    ctx.set_stat("pressured_picks", best.pressured_picks)
    ctx.set_stat("moved_to_act", sum(1 for form in best.chosen.values() if not form.dma))
    ctx.set_stat("triggers_moved", sum(1 for form in best.chosen.values() if form.dma))
    ctx.set_stat("peak_live_sbuf_bytes", best.pressure.peak[birutil.SBUF])
    ctx.set_stat("peak_live_psum_bytes", best.pressure.peak[birutil.PSUM])
    ctx.set_stat("est_makespan_before_ns", round(makespan_before, 1))
    ctx.set_stat("est_makespan_ns", round(best.makespan, 1))
    program.attributes["walrus.est_makespan_ns"] = f"{best.makespan:.1f}"


@dataclass
class _Schedule:
    order: list[int]
    makespan: float  # under the cost model, as placed
    pressured_picks: int
    pressure: _Pressure
    fraction: float
    queue_of: dict[int, int]  # dma id -> the queue it was planned on
    chosen: dict[int, _Form]  # id -> the alternative form it was placed in


def _list_schedule(
    ctx: PassContext,
    deps: DepGraph,
    instructions: list[bir_pb2.Instruction],
    original_index: dict[int, int],
    own: dict[int, _Form],
    priority: dict[int, float],
    fraction: float,
    window: int,
    alternatives: dict[int, list[_Form]],
    capacity: dict[int, int],
    around: Surroundings | None,
    abandon: tuple[dict[int, int], Callable[[], bool]] | None,
    release: dict[int, float],
    rank: tuple[tuple[int, float], ...] = (),
) -> _Schedule | None:
    """One run of the list scheduler under a live-bytes limit of `fraction` of each memory. An
    instruction runs as `own` says or, with entries in `alternatives`, waits on their engines too.
    With `abandon` (bytes per memory, whether the input order fits): None as soon as the live
    bytes of a memory pass its size and the input order fits (the caller keeps the input order)."""
    table = ctx.costs()
    pressure = _Pressure.build(ctx, instructions, fraction, capacity, around)
    machine = _Machine.fresh(table, ctx.queue_pools, rank)
    indegree = {node: deps.in_degree(node) for node in deps.nodes}
    earliest: dict[int, float] = defaultdict(float, release)
    # Per engine: "waiting" heap keyed by earliest start, "available" heap keyed by priority.
    waiting: dict[int, list[tuple[float, float, int, int]]] = defaultdict(list)
    available: dict[int, list[tuple[float, int, int]]] = defaultdict(list)
    engines: list[int] = []  # every engine with a heap, in the order they first got one
    taken: set[int] = set()

    def push(node: int) -> None:
        entry = (earliest[node], -priority[node], original_index[node], node)
        for form in (own[node], *alternatives.get(node, ())):
            if form.engine not in waiting:
                engines.append(form.engine)
            heapq.heappush(waiting[form.engine], entry)

    for node in sorted((n for n, d in indegree.items() if d == 0), key=original_index.__getitem__):
        push(node)

    order: list[int] = []
    chosen: dict[int, _Form] = {}
    pressured_picks = 0
    makespan = 0.0
    engine_free = machine.engine_free
    while len(order) < len(instructions):
        candidates = []
        for engine in engines:
            free = engine_free[engine]
            heap, ready = waiting[engine], available[engine]
            while heap and heap[0][0] <= free:
                _, neg_prio, index, node = heapq.heappop(heap)
                if node not in taken:
                    heapq.heappush(ready, (neg_prio, index, node))
            while heap and heap[0][3] in taken:
                heapq.heappop(heap)
            while ready and ready[0][2] in taken:
                heapq.heappop(ready)
            if ready:
                candidates.append((free, ready[0][0], ready[0][1], ready[0][2]))
            elif heap:
                candidates.append((heap[0][0], heap[0][1], heap[0][2], heap[0][3]))
        if not candidates:
            raise CompileError("E405", "pre_sched: the dependence graph has a cycle", NAME)
        start, _, _, node = min(candidates)
        if not pressure.fits(node):
            better = pressure.pick(waiting, available, taken, window, machine)
            if better is not None and better != node:
                node = better
                pressured_picks += 1
        form, start = machine.first_to_finish(own[node], alternatives.get(node), earliest[node])
        if form.rewrite is not None:
            chosen[node] = form
        finish = machine.place(node, form, start)
        makespan = max(makespan, finish)
        taken.add(node)
        order.append(node)
        pressure.scheduled(node)
        if abandon is not None and any(pressure.live[m] > size for m, size in abandon[0].items()):
            if abandon[1]():
                return None
            abandon = None  # the input order does not fit either: nothing to abandon for
        for succ in deps.successors(node):
            earliest[succ] = max(earliest[succ], finish)
            indegree[succ] -= 1
            if indegree[succ] == 0:
                push(succ)
    return _Schedule(order, makespan, pressured_picks, pressure, fraction, machine.queue_of, chosen)


def _live_bytes(ctx: PassContext, buffer: bir_pb2.Buffer) -> int:
    """The bytes per partition a live buffer takes as allocation will place it: in PSUM what the
    bank rule keeps from others. (Counting the copies a buffer private to a loop rotates through
    too was tried: it changed the LLaMA prefill's schedules, 28.6 -> 29.6 ms.)"""
    if buffer.memory != birutil.PSUM:
        return buffer.bytes_per_partition
    return psum_footprint(buffer.bytes_per_partition, ctx.target.psum_bank_bytes)


def psum_footprint(size: int, bank: int) -> int:
    """The PSUM bytes a buffer of `size` bytes keeps from others under allocation's bank rule (one
    of at most a bank never crosses a bank boundary, a larger one starts on one): a larger one
    whole banks, a smaller one the power of two that holds it, so that the live bytes the pressure
    model counts are ones allocation can place (ViT's block: 12,840 live bytes in 16 KiB that
    allocation could not place, which sent it back to the frontend's order, 286 -> 322 us)."""
    if size <= 0 or bank <= 0:
        return size
    if size > bank:
        return -(-size // bank) * bank
    return min(bank, 1 << (size - 1).bit_length())


def _first(heap: list[tuple], count: int, taken: set[int], node_at: int) -> list[tuple]:
    """The `count` smallest entries of `heap` whose node is not taken, in O(count log n): popped
    and pushed back (entries of taken nodes are dropped on the way, as the main loop would)."""
    found: list[tuple] = []
    while heap and len(found) < count:
        entry = heapq.heappop(heap)
        if entry[node_at] not in taken:
            found.append(entry)
    for entry in found:
        heapq.heappush(heap, entry)
    return found


@dataclass
class _Pressure:
    """Live on-chip bytes per partition as the schedule grows, and who would free or grow them."""

    users_left: dict[str, int]
    live: dict[int, int]
    peak: dict[int, int]
    limit: dict[int, float]
    touches: dict[int, tuple[tuple[str, int, int], ...]]  # id -> on-chip (buffer, memory, bytes)
    users: dict[str, list[int]]  # buffer -> the ids that touch it
    live_names: set[str] = field(default_factory=set)
    # id -> (SBUF bytes it would make live, PSUM bytes, -1 for none; net growth of the live set).
    # Valid until one of its buffers becomes live or is down to its last user (scheduled() drops
    # it then): the only changes that move these numbers, as its buffers cannot die before it runs.
    effects: dict[int, tuple[int, int, int]] = field(default_factory=dict)

    @classmethod
    def build(cls, ctx: PassContext, instructions: list[bir_pb2.Instruction], fraction: float,
              capacity: dict[int, int], around: Surroundings | None = None) -> _Pressure:
        """The pressure before the first instruction runs, under `fraction` of each memory's
        `capacity`; the analyzer's footprints (ctx.footprint_cache) name each instruction's
        buffers (birutil.touched_buffers). The buffers `around` counts are left out."""
        counted = around.counted if around is not None else frozenset()
        onchip = {b.name: (b.name, b.memory, _live_bytes(ctx, b)) for b in ctx.program.buffers
                  if b.name not in counted}
        users: dict[str, list[int]] = defaultdict(list)
        touches = {}
        for instr in instructions:
            names = birutil.touched_buffers(instr, ctx.footprint_cache)
            touched = tuple([onchip[name] for name in names if name in onchip])
            touches[instr.id] = touched
            for name, _, _ in touched:
                users[name].append(instr.id)
        return cls(
            users_left={name: len(ids) for name, ids in users.items()},
            live={birutil.SBUF: 0, birutil.PSUM: 0},
            peak={birutil.SBUF: 0, birutil.PSUM: 0},
            limit={memory: fraction * size for memory, size in capacity.items()},
            touches=touches,
            users=dict(users),
        )

    def _delta(self, node: int) -> tuple[bool, int]:
        """(whether running the instruction keeps every memory's live bytes within the limit, net
        growth of the live set). The scheduler's innermost question under pressure, asked about
        the same ready instructions step after step: their effects are kept (`effects`)."""
        effect = self.effects.get(node)
        if effect is None:
            live_names, users_left = self.live_names, self.users_left
            new_sbuf = new_psum = -1
            growth = 0
            for name, memory, size in self.touches.get(node, ()):
                if name not in live_names:
                    if memory == birutil.SBUF:
                        new_sbuf = size + max(new_sbuf, 0)
                    else:
                        new_psum = size + max(new_psum, 0)
                    growth += size
                if users_left[name] == 1:
                    growth -= size
            effect = self.effects[node] = (new_sbuf, new_psum, growth)
        new_sbuf, new_psum, growth = effect
        live, limit = self.live, self.limit
        fits = (new_sbuf < 0 or live[birutil.SBUF] + new_sbuf <= limit[birutil.SBUF]) and (
            new_psum < 0 or live[birutil.PSUM] + new_psum <= limit[birutil.PSUM]
        )
        return fits, growth

    def fits(self, node: int) -> bool:
        """Whether running the instruction keeps every memory's live bytes within the limit."""
        return self._delta(node)[0]

    def pick(
        self,
        waiting: dict[int, list[tuple[float, float, int, int]]],
        available: dict[int, list[tuple[float, int, int]]],
        taken: set[int],
        window: int,
        machine: _Machine,
    ) -> int | None:
        """The default choice would push the live set over the limit: rather take, among the first
        `window` ready instructions of each engine, one that fits, else one that does not grow the
        live set (it frees what it makes live), earliest start first; else the one earliest in the
        input order, which is the frontend's program order: it finishes one tile before it starts
        the next, so following it bounds the live set even when every ready instruction grows it
        (e.g. all first operands of many tiles were loaded and no tile has its second yet)."""
        entries: list[tuple[float, float, int, int]] = []
        for engine in available.keys() | waiting.keys():
            free = machine.engine_free[engine]
            entries += [(free, p, i, n) for p, i, n in _first(available.get(engine, []), window, taken, 2)]
            entries += [
                (max(e, free), p, i, n) for e, p, i, n in _first(waiting.get(engine, []), window, taken, 3)
            ]
        # Earliest start first: the first that fits is the choice, and the first that does not grow
        # the live set is the choice if none fits (so most picks look at a few entries only).
        entries.sort(key=lambda entry: (entry[0], entry[1], entry[3]))
        shrinking: int | None = None
        earliest_in_input: tuple[int, int] | None = None
        for _, _, index, node in entries:
            if node in taken:
                continue
            fits, growth = self._delta(node)
            if fits:
                return node
            if shrinking is None and growth <= 0:
                shrinking = node
            if earliest_in_input is None or (index, node) < earliest_in_input:
                earliest_in_input = (index, node)
        if shrinking is not None:
            return shrinking
        return earliest_in_input[1] if earliest_in_input is not None else None

    def scheduled(self, node: int) -> None:
        """Instruction `node` runs next: its buffers become live, those it used last die."""
        touched = self.touches.get(node, ())
        effects = self.effects
        for name, memory, size in touched:  # its buffers are live while it runs ...
            if name not in self.live_names:
                self.live_names.add(name)
                self.live[memory] += size
                for user in self.users[name]:
                    effects.pop(user, None)
        for memory, value in self.live.items():
            self.peak[memory] = max(self.peak[memory], value)
        for name, memory, size in touched:  # ... and those it used last are dead after it
            left = self.users_left[name] = self.users_left[name] - 1
            if left == 1:  # its last user now frees it
                for user in self.users[name]:
                    effects.pop(user, None)
            elif not left:
                self.live_names.discard(name)
                self.live[memory] -= size
