"""Instruction costs in ns, from the target's cost model (docs/ir.md, DESIGN.md "The target machine").

The scheduler uses them to estimate start times and the critical path; the lower bound of a
schedule is max(busiest engine's work, busiest shared port, critical path, bytes moved / DMA
bandwidth). The formulas are the target's cost model (tools/target/costs.py), shared with the simulator.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.target import Target, is_dma
from ncc.tools.target import costs as target_costs
from ncc.tools.walrus_driver import birutil
from ncc.tools.walrus_driver.depgraph import DepGraph


@dataclass(frozen=True, slots=True)
class Cost:
    """One instruction's costs, computed once: engine time, queue time, ports, bytes moved."""

    engine: int
    engine_ns: float
    transfer_ns: float
    ports: tuple[str, ...]
    moved_bytes: int

    @property
    def latency_ns(self) -> float:
        return self.engine_ns + self.transfer_ns


class CostTable:
    """Memoized costs by instruction id. An entry is recomputed when the instruction's engine
    changed (a dma's trigger engine sets its issue time); nothing else a pass changes after the
    first lookup moves a cost."""

    def __init__(self, target: Target):
        self.target = target
        self._costs: dict[int, Cost] = {}

    def __call__(self, instr: bir_pb2.Instruction) -> Cost:
        engine = instr.engine
        cost = self._costs.get(instr.id)
        if cost is None or cost.engine != engine:
            target = self.target
            if is_dma(instr.op):  # most instructions: the issue on the trigger, the bytes on a queue
                moved = birutil.transfer_bytes(instr)
                issue = target.cycles_to_ns(engine, float(target.dma_issue_cycles))
                cost = Cost(engine, issue, target.dma_ns(moved), (), moved)
            else:
                cost = _compute_cost(instr, target)
            self._costs[instr.id] = cost
        return cost

    def adopt(self, other: CostTable, ids: Iterable[int]) -> None:
        """Take `other`'s costs of `ids`: instructions rewritten into the form `other` priced."""
        for instr_id in ids:
            self._costs[instr_id] = other._costs[instr_id]


def _compute_cost(instr: bir_pb2.Instruction, target: Target) -> Cost:
    """engine_ns and ports of a compute instruction, its operands read once (the first lookup of
    every instruction lands here: a 100k-instruction program spent seconds re-walking them)."""
    free = 0
    memories = set()
    fp32 = False
    inputs = instr.inputs
    for position, ap in enumerate((*inputs, *instr.outputs)):
        elements = 1
        for dim in ap.dims:
            elements *= dim.count
        free = max(free, elements)
        memories.add(ap.memory)
        fp32 = fp32 or (position < len(inputs) and ap.dtype == common_pb2.F32)  # inputs decide
    op, engine = instr.op, instr.engine
    moving = inputs[1] if op == "matmul" and len(inputs) > 1 else None
    cycles = target_costs.engine_cycles(
        target,
        op=op,
        engine=engine,
        inputs=len(inputs),
        free=free,
        moving_free=birutil.free_elements(moving) if moving is not None else 1,
        fp32=fp32,
    )
    ports = target_costs.ports(op=op, engine=engine, memories=memories)
    return Cost(engine, target.cycles_to_ns(engine, cycles), 0.0, ports, 0)


def dma_bandwidth_bytes_per_ns(target: Target) -> float:
    return min(target.hbm_bandwidth_gbps, target.dma_queues * target.dma_queue_bandwidth_gbps)


def lower_bound_ns(
    instructions: Iterable[bir_pb2.Instruction],
    deps: DepGraph | None,
    target: Target,
    table: CostTable | None = None,
    flow_only: bool = False,
) -> dict[str, float]:
    """The lower bounds of any schedule and their maximum (key 'lower_bound_ns'). With `flow_only`
    the critical path follows only FLOW (true data) edges: after allocation the graph also holds
    WAR/WAW edges that address reuse made, which bind this allocation, not every schedule.

    An engine (or shared port) bound is head + work + tail: no instruction on it can start before
    the earliest any of them can (the longest dependence path into it), all its work runs one
    instruction at a time, and whichever finishes last still has at least the shortest remaining
    path to the end of the program behind it."""
    table = table or CostTable(target)
    users: dict[object, list[int]] = defaultdict(list)  # engine or port -> instruction ids
    work: dict[object, float] = defaultdict(float)
    latency: dict[int, float] = {}
    moved = 0
    for instr in instructions:
        cost = table(instr)
        for resource in (instr.engine, *cost.ports):
            work[resource] += cost.engine_ns
            users[resource].append(instr.id)
        latency[instr.id] = cost.latency_ns
        moved += cost.moved_bytes
    critical = 0.0
    head: dict[int, float] = {}
    tail: dict[int, float] = {}
    if deps is not None:
        order = [node for node in deps.topological_order() if node in latency]

        def preds(node: int) -> Iterable[int]:
            return deps.predecessors_of_kind(node, "FLOW") if flow_only else deps.predecessors(node)

        for node in order:
            head[node] = max((head[p] + latency[p] for p in preds(node) if p in head), default=0.0)
        for node in reversed(order):  # tail: the longest path after `node` finishes
            for p in preds(node):
                if p in latency:
                    tail[p] = max(tail.get(p, 0.0), latency[node] + tail.get(node, 0.0))
        critical = max((head[n] + latency[n] for n in order), default=0.0)
    critical = max(critical, max(latency.values(), default=0.0))

    def bound(resource: object) -> float:
        ids = users[resource]
        return min(head.get(i, 0.0) for i in ids) + work[resource] + min(tail.get(i, 0.0) for i in ids)

    busiest = max((bound(r) for r in work if not isinstance(r, str)), default=0.0)
    port = max((bound(r) for r in work if isinstance(r, str)), default=0.0)
    dma = moved / dma_bandwidth_bytes_per_ns(target)
    return {
        "busiest_engine_ns": busiest,
        "busiest_port_ns": port,
        "critical_path_ns": critical,
        "dma_bandwidth_ns": dma,
        "lower_bound_ns": max(busiest, port, critical, dma),
    }
