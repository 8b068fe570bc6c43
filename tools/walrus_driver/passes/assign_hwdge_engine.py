"""Choose each dma's trigger engine (SP/ACT/DVE hardware DGE) and spread dmas over the DMA queues.

Trigger engine. Engines run their streams in order, so a dma that must wait for a producer blocks
every later instruction of its trigger engine; on SP that stalls the loads of the next tiles
behind a store still waiting for its data. The heuristic therefore triggers a dma on the engine
of its latest compute predecessor (the engine that last wrote what a store sends, or last read
the buffer a load overwrites) when that engine is a hardware-DGE engine other than SP (ACT or
DVE): the dma then issues right after its producer, in program order, with no semaphore wait.
Every other dma is triggered on SP. If that leaves a single trigger engine for two or more dmas,
the issue work is spread: stores (or, without stores, every other load) move to the less busy of
ACT and DVE, so at least two engines issue dmas.

Queues. Loads (and on-chip copies) and stores get separate halves of the target's queues when the
program has both, so write-back never queues behind prefetch. Within a half, each trigger engine
gets its own queues, in proportion to its dma count; an engine's dmas take its queues round-robin.
Keeping one trigger engine per queue keeps the queue's FIFO order equal to that engine's program
order. Needs the dependence graph (any, for the predecessor engines); must run before
alloc_semaphores, since it changes which thread every transfer runs on.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from ncc.schemas import bir_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.target import ENGINES, Target
from ncc.tools.walrus_driver import birutil, costs
from ncc.tools.walrus_driver.context import PassContext
from ncc.tools.walrus_driver.registry import register

NAME = "assign_hwdge_engine"


@dataclass
class Options:
    trigger_engines: str = "SP,ACT,DVE"  # hardware-DGE engines, the first is the default trigger
    follow_producer: bool = True  # trigger on the latest compute predecessor's engine
    min_trigger_engines: int = 2


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
    dmas = [instr for instr in program.instructions if instr.op == "dma"]

    followed = 0
    for dma in dmas:
        dma.engine = default
        if not options.follow_producer or dma.id not in deps:
            continue
        compute_preds = [by_id[p] for p in deps.predecessors(dma.id) if p in by_id and by_id[p].op != "dma"]
        if compute_preds:
            latest = max(compute_preds, key=lambda p: position[p.id])
            if latest.engine in engines and latest.engine != default:
                dma.engine = latest.engine
                followed += 1

    spread = _spread(program, dmas, engines, default, options.min_trigger_engines, target)
    queues_used = _assign_queues(dmas, target.dma_queues)

    ctx.queues_assigned = True
    ctx.order_changed()
    direction = Counter(birutil.dma_direction(d) for d in dmas)
    ctx.set_stat("dmas", len(dmas))
    for kind, label in (("load", "loads"), ("store", "stores"), ("copy", "copies")):
        ctx.set_stat(label, direction[kind])
    ctx.set_stat("triggers_following_producer", followed)
    ctx.set_stat("triggers_moved_to_spread", spread)
    ctx.set_stat("queues_used", queues_used)
    for engine, number in sorted(Counter(d.engine for d in dmas).items()):
        ctx.set_stat(f"triggered_on_{birutil.engine_name(engine)}", number)


def _spread(
    program: bir_pb2.Program,
    dmas: list[bir_pb2.Instruction],
    engines: list[int],
    default: int,
    wanted: int,
    target: Target,
) -> int:
    """Move some dmas off the only trigger engine so at least `wanted` engines issue dmas."""
    alternatives = [e for e in engines if e != default]
    if len(dmas) < 2 or wanted < 2 or not alternatives or len({d.engine for d in dmas}) >= wanted:
        return 0
    work: dict[int, float] = defaultdict(float)
    for instr in program.instructions:
        work[instr.engine] += costs.engine_ns(instr, target)
    used = next(iter({d.engine for d in dmas}))
    other = min((e for e in alternatives if e != used), key=lambda e: work[e], default=default)
    if other == used:
        return 0
    stores = [d for d in dmas if birutil.dma_direction(d) == "store"]
    movers = stores if stores and len(stores) < len(dmas) else dmas[1::2]
    for dma in movers:
        dma.engine = other
    return len(movers)


def _assign_queues(dmas: list[bir_pb2.Instruction], num_queues: int) -> int:
    """Separate load and store queue pools, one set of queues per trigger engine, round-robin."""
    num_queues = max(1, num_queues)
    classes: dict[str, list[bir_pb2.Instruction]] = defaultdict(list)
    for dma in dmas:
        classes["store" if birutil.dma_direction(dma) == "store" else "load"].append(dma)
    if len(classes) == 2 and num_queues >= 2:
        half = num_queues // 2
        pools = {"load": list(range(half)), "store": list(range(half, num_queues))}
    else:
        pools = {name: list(range(num_queues)) for name in classes}
    used: set[int] = set()
    for name, members in classes.items():
        binding = _bind(pools[name], Counter(d.engine for d in members))
        turn: Counter[int] = Counter()
        for dma in members:
            queues = binding[dma.engine]
            dma.dma_queue = queues[turn[dma.engine] % len(queues)]
            turn[dma.engine] += 1
            used.add(dma.dma_queue)
    return len(used)


def _bind(pool: list[int], demand: Counter[int]) -> dict[int, list[int]]:
    """Split a queue pool among trigger engines in proportion to their dma counts (≥1 each)."""
    engines = sorted(demand, key=lambda e: (-demand[e], e))
    if len(pool) < len(engines):  # too few queues: engines share them (still correct, see syncmodel)
        return {e: [pool[i % len(pool)]] for i, e in enumerate(engines)}
    share = {e: 1 for e in engines}
    for _ in range(len(pool) - len(engines)):
        # give the next queue to the engine with the most dmas per queue
        best = max(engines, key=lambda e: (demand[e] / share[e], -e))
        share[best] += 1
    binding, cursor = {}, 0
    for engine in engines:
        binding[engine] = pool[cursor : cursor + share[engine]]
        cursor += share[engine]
    return binding
