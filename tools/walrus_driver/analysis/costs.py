"""Instruction costs in ns, from the target's cost model (docs/ir.md, DESIGN.md "The target machine").

The scheduler uses them to estimate start times and the critical path; the lower bound of a
schedule is max(busiest engine's work, busiest shared port, critical path, bytes moved / DMA
bandwidth). The formulas are the target's cost model (tools/target/costs.py), shared with the simulator.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.target import Target, is_dma
from ncc.tools.target import costs as target_costs
from ncc.tools.walrus_driver.analysis import birutil
from ncc.tools.walrus_driver.analysis.birutil import Operands
from ncc.tools.walrus_driver.analysis.depgraph import DepGraph


@dataclass(frozen=True, slots=True)
class Cost:
    """One instruction's costs, computed once: engine time, queue time, ports, bytes moved; a
    compute instruction's also keeps the operand facts it was priced from (`operands`), so the
    same instruction rewritten for another engine is priced without reading its operands again."""

    engine: int
    engine_ns: float
    transfer_ns: float
    ports: tuple[str, ...]
    moved_bytes: int
    operands: Operands | None = None  # None for a dma

    @property
    def latency_ns(self) -> float:
        return self.engine_ns + self.transfer_ns


class CostTable:
    """Memoized costs by instruction id. An entry is recomputed when the instruction's engine
    changed (a dma's trigger engine sets its issue time); nothing else a pass changes after the
    first lookup moves a cost.

    Compute instructions with the same op, engine and operand facts share one Cost (`_priced`):
    an elementwise program has a handful of distinct ones, so pricing is a dict lookup after
    the operand walk, and the table holds a reference per instruction rather than a Cost."""

    def __init__(self, target: Target):
        self.target = target
        self._costs: dict[int, Cost] = {}
        self._priced: dict[tuple[str, int, Operands], Cost] = {}
        self._rewritten: dict[tuple[str, int, Operands, int], Cost] = {}  # priced_as's memo

    def __call__(self, instr: bir_pb2.Instruction) -> Cost:
        engine = instr.engine
        cost = self._costs.get(instr.id)
        if cost is None or cost.engine != engine:
            op = instr.op
            if is_dma(op):  # most instructions: the issue on the trigger, the bytes on a queue
                target = self.target
                moved = birutil.transfer_bytes(instr)
                issue = target.cycles_to_ns(engine, float(target.dma_issue_cycles))
                cost = Cost(engine, issue, target.dma_ns(moved), (), moved)
            else:
                cost = self.price(op, engine, _operands(instr))
            self._costs[instr.id] = cost
        return cost

    def price(self, op: str, engine: int, operands: Operands) -> Cost:
        """The cost of a compute instruction `op` on `engine` with these operand facts."""
        key = (op, engine, operands)
        cost = self._priced.get(key)
        if cost is None:
            cost = self._priced[key] = _compute_cost(op, engine, operands, self.target)
        return cost

    def priced_as(self, instr: bir_pb2.Instruction, op: str, engine: int, inputs: int) -> Cost:
        """The cost of compute instruction `instr` rewritten as `op` on `engine` reading its first
        `inputs` inputs, from the operand facts of its own cost (not stored under its id). Exact
        when the inputs it drops repeat one it keeps (x·x as square(x)): the largest operand,
        the memories and whether an input is fp32 are then unchanged."""
        operands = self(instr).operands
        if operands is None:
            raise ValueError(f"priced_as: {instr.name} is a dma, not a compute instruction")
        key = (op, engine, operands, inputs)
        cost = self._rewritten.get(key)
        if cost is None:
            cost = self._rewritten[key] = self.price(op, engine, operands._replace(inputs=inputs))
        return cost

    def seed(self, instr: bir_pb2.Instruction, operands: Operands) -> None:
        """Price compute instruction `instr` from operand facts read elsewhere (the analyzer's
        footprint walk reads the same fields), unless it is priced already: its first lookup
        then costs no walk of its operands. A dma is left to its first lookup."""
        if instr.id not in self._costs:
            op = instr.op
            if not is_dma(op):
                self._costs[instr.id] = self.price(op, instr.engine, operands)

    def put(self, instr_id: int, cost: Cost) -> None:
        """Record `cost` for `instr_id`: the instruction was rewritten into the form it prices."""
        self._costs[instr_id] = cost


def _operands(instr: bir_pb2.Instruction) -> Operands:
    """The operand facts of a compute instruction, its operands read once (the first lookup of an
    instruction the analyzer did not seed lands here: birutil.footprints reads the same facts)."""
    free = 0
    memories = set()
    fp32 = False
    inputs = instr.inputs
    count = len(inputs)
    scalars = 0  # inputs of one element per partition
    for position, ap in enumerate((*inputs, *instr.outputs)):
        elements = 1
        varies = False
        for dim in ap.dims:
            elements *= dim.count
            varies = varies or (dim.stride != 0 and dim.count > 1)
        if elements > free:
            free = elements
        memories.add(ap.memory)
        if position < count:
            scalars += not varies
            if ap.dtype == common_pb2.F32:  # inputs decide fp32
                fp32 = True
    streamed = target_costs.streamed_inputs(count, scalars, free)
    return Operands(streamed, free, birutil.moving_free(instr.op, inputs), fp32, frozenset(memories))


def _compute_cost(op: str, engine: int, operands: Operands, target: Target) -> Cost:
    """engine_ns and ports of compute `op` on `engine` with these operand facts."""
    cycles = target_costs.engine_cycles(
        target,
        op=op,
        engine=engine,
        inputs=operands.inputs,
        free=operands.free,
        moving_free=operands.moving_free,
        fp32=operands.fp32,
    )
    ports = target_costs.ports(op=op, engine=engine, memories=operands.memories)
    return Cost(engine, target.cycles_to_ns(engine, cycles), 0.0, ports, 0, operands)


_QUEUES = ("dma queues",)  # the DMA queues' key among the resources of lower_bound_ns
# Instructions that only carry semaphore waits or end the inference: alloc_semaphores' wait
# nops have no dependence edges, so counted with their engine they would set its earliest start
# and least tail to 0 (a few cycles of their own work are left out with them).
SYNC_ONLY = frozenset({"nop", "drain", "sem_reset"})


def _release_bound(heads: np.ndarray, tails: np.ndarray, work: np.ndarray) -> float:
    """The least time a resource needs for its jobs (each a head: the earliest it can start, a
    tail: the least that must follow it, and its work on the resource, run one at a time): for
    every t, the jobs that cannot start before t run after it one by one, and the one that ends
    last has at least the smallest of their tails behind it; likewise the jobs whose tails are at
    least t end t before the end at the latest, and the first of them starts no earlier than
    their smallest head. Taking every job (t = 0) is head + work + tail of the whole resource; a
    later t counts the work that only becomes ready late (the matmuls after a block's softmax)."""
    if not len(work):
        return 0.0
    best = 0.0
    for near, far in ((heads, tails), (tails, heads)):  # by head, and the mirror image by tail
        order = np.argsort(-near, kind="stable")
        after = np.cumsum(work[order])
        closest = np.minimum.accumulate(far[order])
        best = max(best, float(np.max(near[order] + after + closest)))
    return best


def dma_bandwidth_bytes_per_ns(target: Target) -> float:
    return min(target.hbm_bandwidth_gbps, target.dma_queues * target.dma_queue_bandwidth_gbps)


def lower_bound_ns(
    instructions: Iterable[bir_pb2.Instruction],
    deps: DepGraph | None,
    target: Target,
    table: CostTable | None = None,
    flow_only: bool = False,
    topological: bool = False,
    runs: dict[int, int] | None = None,
) -> dict[str, float]:
    """The lower bounds of any schedule and their maximum (key 'lower_bound_ns'). With `flow_only`
    the critical path follows only FLOW (true data) edges: after allocation the graph also holds
    WAR/WAW edges that address reuse made, which bind this allocation, not every schedule.
    `topological`: the instructions are in an order every edge of `deps` follows (a synchronized
    program's), so the graph need not be sorted again.

    An engine (or shared port) bound is head + work + tail, over the instructions that move data
    (not the nops, drains and reset that carry synchronization): no instruction on it can start before
    the earliest any of them can (the longest dependence path into it), all its work runs one
    instruction at a time, and whichever finishes last still has at least the shortest remaining
    path to the end of the program behind it; and the same over the instructions that cannot start
    before any given time, or must end a given time before the end (`_release_bound`). The DMA
    queues are one such resource, `dma_queues` of them: a transfer holds its queue for at least
    its fixed latency and its bytes at the queue's bandwidth, so the queues' work is the sum of
    that over every transfer, shared by all of them (a program of many small transfers pays the
    fixed latency of each).

    `runs` (a program that keeps loops): how many times each instruction runs; its work and
    bytes count that many times, while heads, tails and the critical path are those of one
    iteration (later iterations start no earlier), so the result is still a lower bound."""
    table = table or CostTable(target)
    # resource -> the positions (in `ids`) of its instructions, and their work there
    users: dict[object, list[int]] = defaultdict(list)
    shares: dict[object, list[float]] = defaultdict(list)
    work: dict[object, float] = defaultdict(float)
    latency: dict[int, float] = {}
    ids: list[int] = []
    moved = 0
    queue_count = max(1, target.dma_queues)
    for instr in instructions:
        cost = table(instr)
        node, engine_ns = instr.id, cost.engine_ns
        latency[node] = cost.latency_ns
        if instr.op in SYNC_ONLY:  # carries waits, moves no data: it bounds nothing
            continue
        times = runs.get(node, 1) if runs else 1
        position = len(ids)
        ids.append(node)
        for resource in (instr.engine, *cost.ports):
            work[resource] += engine_ns * times
            users[resource].append(position)
            shares[resource].append(engine_ns * times)
        if cost.transfer_ns:  # the queues' work, shared by all of them
            share = cost.transfer_ns * times / queue_count
            work[_QUEUES] += share
            users[_QUEUES].append(position)
            shares[_QUEUES].append(share)
        moved += cost.moved_bytes * times
    critical = 0.0
    head: dict[int, float] = {}
    tail: dict[int, float] = {}
    if deps is not None:
        if topological:
            order = [node for node in latency if node in deps]
        else:
            order = [node for node in deps.topological_order() if node in latency]
        # each node's predecessors, listed once for both walks
        if flow_only:
            preds = {node: deps.predecessors_of_kind(node, "FLOW") for node in order}
        else:
            preds = {node: list(deps.predecessors(node)) for node in order}
        for node in order:
            head[node] = max((head[p] + latency[p] for p in preds[node] if p in head), default=0.0)
        for node in reversed(order):  # tail: the longest path after `node` finishes
            after = latency[node] + tail.get(node, 0.0)
            for p in preds[node]:
                if p in latency:
                    tail[p] = max(tail.get(p, 0.0), after)
        critical = max((head[n] + latency[n] for n in order), default=0.0)
    critical = max(critical, max(latency.values(), default=0.0))

    heads = np.array([head.get(node, 0.0) for node in ids])
    tails = np.array([tail.get(node, 0.0) for node in ids])

    def bound(resource: object) -> float:
        at = np.array(users[resource], dtype=np.int64)
        return _release_bound(heads[at], tails[at], np.array(shares[resource]))

    busiest = max((bound(r) for r in work if isinstance(r, int)), default=0.0)
    port = max((bound(r) for r in work if isinstance(r, str)), default=0.0)
    queues = bound(_QUEUES) if users[_QUEUES] else 0.0
    dma = moved / dma_bandwidth_bytes_per_ns(target)
    return {
        "busiest_engine_ns": busiest,
        "busiest_port_ns": port,
        "critical_path_ns": critical,
        "dma_queues_ns": queues,
        "dma_bandwidth_ns": dma,
        "lower_bound_ns": max(busiest, port, critical, queues, dma),
    }
