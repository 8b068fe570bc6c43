"""Transitively reduce the dependence graph: drop every edge implied by a longer path.

The scheduler walks the graph once per edge and the critical path is unchanged by implied edges,
so fewer edges make scheduling cheaper without changing which orders are legal. Reachability is
kept as one bit set (a Python int) per node, built in reverse topological order; a node's
successors are visited in topological order, so an edge u->v is redundant exactly when v is
already reachable through a successor visited before it. Skipped (with a counter) when the
program attribute `too_many_spills` is set, as the real driver does for spill-heavy functions.
Edge attributes of the kept edges are preserved.
"""

from __future__ import annotations

import networkx as nx

from ncc.tools.walrus_driver.context import PassContext
from ncc.tools.walrus_driver.registry import register

NAME = "dep_reduction"


@register(NAME)
def run(ctx: PassContext) -> None:
    graph = ctx.require_deps()
    ctx.set_stat("edges_before", graph.number_of_edges())
    if ctx.program.attributes.get("too_many_spills", "") not in ("", "0", "false"):
        ctx.set_stat("skipped_too_many_spills", 1)
        ctx.set_stat("edges_removed", 0)
        return
    removed = reduce_in_place(graph)
    ctx.deps_reduced = True
    ctx.set_stat("edges_removed", removed)
    ctx.set_stat("edges_after", graph.number_of_edges())


def reduce_in_place(graph: nx.DiGraph) -> int:
    """Remove every transitively implied edge of a DAG; returns how many were removed."""
    order = list(nx.topological_sort(graph))
    index = {node: position for position, node in enumerate(order)}
    reach: dict[object, int] = {}
    redundant = []
    for node in reversed(order):
        seen = 0
        for succ in sorted(graph.successors(node), key=index.__getitem__):
            bit = 1 << index[succ]
            if seen & bit:
                redundant.append((node, succ))
            else:
                seen |= bit | reach[succ]
        reach[node] = seen
    graph.remove_edges_from(redundant)
    return len(redundant)
