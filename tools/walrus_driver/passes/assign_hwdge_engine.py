"""Choose each dma's trigger engine (SP/ACT/DVE hardware DGE) and spread dmas over the DMA queues.

Indirect dmas (dma_gather, dma_scatter) keep POOL, whose software DGE writes their descriptors
from the run-time indices; they take queues like every other dma.

Trigger engine. Every hardware dma is triggered on SP, the sync engine, which has no compute
of its own to delay; if that leaves a single trigger engine for two or more dmas, the issue work
is spread: stores (or, without stores, every other load) move to the less busy of ACT and DVE,
so at least two engines issue dmas. With `follow_producer` a dma is instead triggered on the
engine of its latest compute predecessor when that is ACT or DVE, so it issues right after its
producer with no semaphore wait. That was the default until pre_sched began to spread DVE work
onto ACT: then both are busy, and each trigger taken there delays the compute behind it (gelu
18.2 µs without, 21.0 with; block 78.9 against 88.1; the matmuls and rnn lose 1–3 %).

Queues. Each trigger engine gets a pool of the target's queues, in proportion to the bytes its
dmas move (ctx.queue_pools). Unless the program is bound by DMA throughput, an engine whose pool
is narrower than its widest burst (a run of its dmas adjacent in program order, such as the
pieces of one split tile) then takes queues from engines whose pools exceed their own widest
burst. Within its pool a dma takes the queue that has moved the fewest bytes so far among those
no other dma of its burst took, so a burst moves in one round. A (queue, trigger engine) pair is a
transfer thread with a semaphore of its own, so the pools hold at most `max_transfer_threads`
pairs together (26: with the 5 engines' own and semaphore_reset's end-of-inference barrier, the
target's 32 semaphores); within that budget pools overlap, and a queue fed by two engines
interleaves their transfers in issue order. Only a thread that something waits for needs its
semaphore: when every SBUF buffer fits at once (allocation then reuses no space, so no later
writer waits for a store to have read it), a dma with no dependent (a final store) counts for no
pool and takes any queue (`ctx.unpooled_dmas`). gelu's 32 loads and 32 stores had shared 26
threads, 13 queues each, and three queues ran five transfers where 16 x 4 was possible
(8.7 µs, 1.27x the lower bound); with the stores outside the pools 7.6 µs, 1.11x.
Run before pre_sched (the default pipeline), the scheduler then plans each dma on the queue of
its pool that frees first and writes its choice back; dmas added later (spills) take the least
loaded queue of their engine's pool (`queue_new_dma`). Needs the dependence graph (any, for the
predecessor engines); must run before alloc_semaphores, since it changes which thread every
transfer runs on.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from ncc.schemas import bir_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.target import ENGINES, INDIRECT_DMA_OPS, Target, is_dma
from ncc.tools.walrus_driver.analysis import birutil, costs
from ncc.tools.walrus_driver.context import PassContext
from ncc.tools.walrus_driver.registry import register

NAME = "assign_hwdge_engine"


@dataclass
class Options:
    trigger_engines: str = "SP,ACT,DVE"  # hardware-DGE engines, the first is the default trigger
    follow_producer: bool = False  # trigger on the latest compute predecessor's engine
    min_trigger_engines: int = 2
    max_transfer_threads: int = 26  # (queue, trigger engine) pairs; + 5 engines + 1 barrier <= 32 semaphores


@register(NAME, Options)
def run(ctx: PassContext) -> None:
    options: Options = ctx.options or Options()
    ctx.forbid_after_sync()
    deps = ctx.require_deps()
    program, target = ctx.program, ctx.target
    try:
        engines = [ENGINES[name.strip()] for name in options.trigger_engines.split(",") if name.strip()]
    except KeyError as err:
        raise CompileError(
            "E400", f"{NAME}: unknown trigger engine {err} (engines: {', '.join(ENGINES)})"
        ) from None
    if not engines:
        raise CompileError("E400", f"{NAME}: trigger_engines is empty")
    default = engines[0]
    position = {instr.id: index for index, instr in enumerate(program.instructions)}
    by_id = {instr.id: instr for instr in program.instructions}
    dmas = [instr for instr in program.instructions if is_dma(instr.op)]
    hardware = [dma for dma in dmas if dma.op not in INDIRECT_DMA_OPS]  # SWDGE ones stay on POOL

    followed = 0
    for dma in hardware:
        dma.engine = default
        if not options.follow_producer or dma.id not in deps:
            continue
        preds = (by_id[p] for p in deps.predecessors(dma.id) if p in by_id)
        compute_preds = [pred for pred in preds if not is_dma(pred.op)]
        if compute_preds:
            latest = max(compute_preds, key=lambda p: position[p.id])
            if latest.engine in engines and latest.engine != default:
                dma.engine = latest.engine
                followed += 1

    work = _engine_work(program, ctx.costs())  # each engine's ns, kept up to date as dmas move
    spread = _spread(hardware, engines, default, options.min_trigger_engines, work, ctx.costs())
    # Semaphores: one per engine that others wait for, one per (queue, trigger engine) pair.
    budget = max(1, min(options.max_transfer_threads, target.num_semaphores - len(ENGINES) - 1))
    # Wide bursts matter where transfers are latency on the critical path, not where the queues'
    # throughput is the bound (there every queue an engine gives up slows the whole program).
    widen = not _dma_bound(program, ctx.costs(), target, work)
    # A dma nothing waits for (a final store) needs no semaphore, unless allocation reuses the
    # space it reads (the next writer there must wait for it). When every SBUF buffer fits at
    # once nothing is reused, and such dmas take any queue outside the pools' budget.
    # (In a program that keeps loops a store of a loop body is reused by the next iteration's
    # writer whatever allocation does, and the graph names one store per thread of a loop.)
    sinks: set[int] = set()
    if not ctx.loop_entries and birutil.sbuf_holds_every_buffer(program, target.sbuf_usable_bytes):
        sinks = {dma.id for dma in dmas if deps.out_degree(dma.id) == 0}
    ctx.unpooled_dmas = sinks
    ctx.queue_pools = _assign_queues(
        dmas, target.dma_queues, budget, ctx.costs(), _bursts(program), widen, sinks, _runs(ctx, dmas)
    )
    queues_used = len({d.dma_queue for d in dmas})

    ctx.queues_assigned = True
    ctx.order_changed()
    direction = Counter(birutil.dma_direction(d) for d in dmas)
    ctx.set_stat("dmas", len(dmas))
    for kind, label in (("load", "loads"), ("store", "stores"), ("copy", "copies")):
        ctx.set_stat(label, direction[kind])
    ctx.set_stat("triggers_following_producer", followed)
    ctx.set_stat("triggers_moved_to_spread", spread)
    ctx.set_stat("queues_used", queues_used)
    ctx.set_stat("unpooled_dmas", len(sinks))
    ctx.set_stat("dma_bound", int(not widen))
    for engine, number in sorted(Counter(d.engine for d in dmas).items()):
        ctx.set_stat(f"triggered_on_{birutil.engine_name(engine)}", number)


def _spread(
    dmas: list[bir_pb2.Instruction],
    engines: list[int],
    default: int,
    wanted: int,
    work: Counter[int],
    table: costs.CostTable,
) -> int:
    """Move some dmas off the only trigger engine so at least `wanted` engines issue dmas, to the
    one of the others with the least `work` (ns per engine, updated for the dmas moved)."""
    alternatives = [e for e in engines if e != default]
    if len(dmas) < 2 or wanted < 2 or not alternatives or len({d.engine for d in dmas}) >= wanted:
        return 0
    used = next(iter({d.engine for d in dmas}))
    other = min((e for e in alternatives if e != used), key=lambda e: work[e], default=default)
    if other == used:
        return 0
    stores = [d for d in dmas if birutil.dma_direction(d) == "store"]
    movers = stores if stores and len(stores) < len(dmas) else dmas[1::2]
    for dma in movers:
        work[used] -= table(dma).engine_ns
        dma.engine = other
        work[other] += table(dma).engine_ns  # (a dma's issue time depends on its engine's clock)
    return len(movers)


def _engine_work(program: bir_pb2.Program, table: costs.CostTable) -> Counter[int]:
    """ns of work each engine runs (a dma counts its trigger's issue)."""
    work: Counter[int] = Counter()
    for instr in program.instructions:
        work[instr.engine] += table(instr).engine_ns
    return work


def _dma_bound(program: bir_pb2.Program, table: costs.CostTable, target: Target, work: Counter[int]) -> bool:
    """Do the program's transfers at the core's full DMA bandwidth take at least as long as the
    busiest engine's `work` (ns per engine)?"""
    moved = sum(table(instr).moved_bytes for instr in program.instructions)
    busiest = max(work.values(), default=0.0)
    return moved / costs.dma_bandwidth_bytes_per_ns(target) >= busiest


def _bursts(program: bir_pb2.Program) -> dict[int, int]:
    """Each dma's burst: the run of dmas of its trigger engine adjacent in program order that it
    belongs to (the pieces split_dma cut from one tile, and loads the frontend put side by side),
    issued together and needed together. Returns dma id -> burst number."""
    burst_of: dict[int, int] = {}
    engine, number = None, 0
    for instr in program.instructions:
        if not is_dma(instr.op):
            engine = None
            continue
        if instr.engine != engine:
            engine, number = instr.engine, number + 1
        burst_of[instr.id] = number
    return burst_of


def _runs(ctx: PassContext, dmas: list[bir_pb2.Instruction]) -> dict[int, int]:
    """How many times each dma of a program that keeps loops runs (the product of its loops'
    trips; none listed: once each)."""
    if not ctx.loop_entries:
        return {}
    nest = ctx.loops()
    return {dma.id: nest.runs(dma.id) for dma in dmas}


def _assign_queues(
    dmas: list[bir_pb2.Instruction],
    num_queues: int,
    budget: int,
    table: costs.CostTable,
    burst_of: dict[int, int] | None = None,
    widen: bool = True,
    sinks: set[int] | None = None,
    runs: dict[int, int] | None = None,
) -> dict[int, list[int]]:
    """Give each trigger engine a pool of queues in proportion to its bytes (`widen`: then as wide
    as its widest burst where others can spare queues), and each dma the least loaded queue (by
    bytes) of its engine's pool that no other dma of its burst took yet; returns the pools. A dma
    in `sinks` (nothing waits for it) needs no semaphore: it takes any queue and counts for no
    pool, though its engine still gets one (pre_sched may move stores to any engine with a pool).
    `runs`: how many times a dma of a loop body runs, which its bytes count that many times (the
    body's few transfers carry most of a rolled program's bytes: counted once, the engine
    triggering them got a pool of 4 queues, busy 104 us each, while 12 moved 27-60 us)."""
    burst_of, sinks, runs = burst_of or {}, sinks or set(), runs or {}
    moved = [max(1, table(dma).moved_bytes) * runs.get(dma.id, 1) for dma in dmas]
    demand: Counter[int] = Counter()
    sizes: Counter[int] = Counter(burst_of.values())
    widest: Counter[int] = Counter()
    for dma, size in zip(dmas, moved, strict=True):
        if dma.id in sinks:
            demand[dma.engine] += 0  # the engine is listed, with no demand
            continue
        demand[dma.engine] += size
        widest[dma.engine] = max(widest[dma.engine], sizes.get(burst_of.get(dma.id, -1), 1))
    every = list(range(max(1, num_queues)))
    pools = _bind(every, demand, budget, widest if widen else None)
    load: Counter[int] = Counter()
    taken: dict[int, set[int]] = defaultdict(set)  # burst -> its queues so far
    for dma, size in zip(dmas, moved, strict=True):
        burst = taken[burst_of[dma.id]] if dma.id in burst_of else set()
        pool = every if dma.id in sinks else pools[dma.engine]
        free = [q for q in pool if q not in burst] or pool
        queue = min(free, key=lambda q: (load[q], q))
        dma.dma_queue = queue
        load[queue] += size
        burst.add(queue)
    return pools


def queue_new_dma(ctx: PassContext, dma: bir_pb2.Instruction, load: Counter[int]) -> None:
    """Put a dma made after this pass ran on the least loaded queue of its trigger engine's pool
    (`load`: bytes per queue so far, updated)."""
    pools = ctx.queue_pools or {}
    pool = pools.get(dma.engine) or next(iter(pools.values()), [0])
    dma.dma_queue = min(pool, key=lambda q: (load[q], q))
    load[dma.dma_queue] += max(1, birutil.transfer_bytes(dma))


def _bind(
    pool: list[int], demand: Counter[int], budget: int | None = None, bursts: Counter[int] | None = None
) -> dict[int, list[int]]:
    """Give each trigger engine a window of the queue pool, sized in proportion to its demand.

    Every (queue, trigger engine) pair in use is a transfer thread with a semaphore of its own, so
    the windows together hold at most `budget` pairs (default: one engine per queue); within that
    budget windows may overlap, so a busy engine is not confined to a fraction of the queues. Each
    engine gets at least one queue and at most all of them.

    Then an engine whose window is narrower than its widest burst (a run of adjacent dmas, such as
    the pieces of one split tile) takes queues from engines whose windows are wider than their own
    widest burst, so that a burst moves in one round. In the bundled mlp, ACT's and DVE's shares by
    bytes were 6 and 4 queues for stores cut in 8, so pieces waited for a second round on the
    critical path; SP, whose widest burst is 10 pieces, gave up 6 of its 16 (25.5 -> 24.3 us). An
    engine never gives up queues its own bursts need, and the caller does not ask for this when
    the program is bound by DMA throughput: in a 1024-wide MLP (112 MB moved) SP's loads need all
    16 queues, and giving 6 away cost 25 % (473 -> 594 us)."""
    engines = sorted(demand, key=lambda e: (-demand[e], e))
    if not engines:
        return {}
    size = len(pool)
    budget = max(len(engines), min(budget if budget is not None else size, size * len(engines)))
    share = {e: 1 for e in engines}
    for _ in range(budget - sum(share.values())):
        # the next queue goes to the engine with the most demand per queue that can take one
        open_ = [e for e in engines if share[e] < size]
        if not open_:
            break
        best = max(open_, key=lambda e: (demand[e] / share[e], -e))
        share[best] += 1
    need = {e: max(1, min(size, (bursts or {}).get(e, 1))) for e in engines}
    for taker in engines:
        while share[taker] < need[taker]:
            donors = [e for e in engines if share[e] > need[e]]
            if not donors:
                break
            donor = max(donors, key=lambda e: (share[e] - need[e], -e))
            share[donor] -= 1
            share[taker] += 1
    binding, cursor = {}, 0
    for engine in engines:
        binding[engine] = [pool[(cursor + k) % size] for k in range(share[engine])]
        cursor = (cursor + share[engine]) % size
    return binding
