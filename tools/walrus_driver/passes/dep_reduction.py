"""Transitively reduce the dependence graph: drop edges implied by a longer path.

The scheduler walks the graph once per edge and the critical path is unchanged by implied edges,
so fewer edges make scheduling cheaper without changing which orders are legal. Nodes are taken
in a topological order; each node keeps the set of its ancestors among the `window` nodes before
it (a bit set, a Python int, relative to the window's start), built from its predecessors' sets.
An edge u -> v is redundant exactly when u is an ancestor of another predecessor of v. Ancestors
further back than the window are not tracked, so an edge whose implying path leaves the window is
kept: that costs an edge, never correctness, and keeps time and memory linear in the program
(window bits per node) where exact reduction needs a bit per node pair. With `window` at least the
number of instructions the reduction is exact.

Skipped (with a counter) when the program attribute `too_many_spills` is set, as the real driver
does for spill-heavy functions. Edge attributes of the kept edges are preserved.
"""

from __future__ import annotations

from dataclasses import dataclass

from ncc.tools.walrus_driver.analysis.depgraph import DepGraph
from ncc.tools.walrus_driver.context import PassContext
from ncc.tools.walrus_driver.registry import register

NAME = "dep_reduction"


@dataclass
class Options:
    window: int = 2048  # ancestors tracked per node, in topological positions


@register(NAME, Options)
def run(ctx: PassContext) -> None:
    options: Options = ctx.options or Options()
    graph = ctx.require_deps()
    ctx.set_stat("edges_before", graph.number_of_edges())
    if ctx.program.attributes.get("too_many_spills", "") not in ("", "0", "false"):
        ctx.set_stat("skipped_too_many_spills", 1)
        ctx.set_stat("edges_removed", 0)
        return
    removed = reduce_in_place(graph, max(1, options.window))
    ctx.deps_reduced = True
    ctx.set_stat("edges_removed", removed)
    ctx.set_stat("edges_after", graph.number_of_edges())


def reduce_in_place(graph: DepGraph, window: int | None = None) -> int:
    """Remove the transitively implied edges whose implying path stays within `window` topological
    positions (all of them when `window` is None); returns how many were removed."""
    order = graph.topological_order()
    if window is None:
        window = len(order) + 1
    index = {node: position for position, node in enumerate(order)}
    # ancestors[v] = (base, bits): bit k set <=> the node at position base + k is an ancestor of v.
    ancestors: dict[int, tuple[int, int]] = {}
    remaining_uses = {node: graph.out_degree(node) for node in order}
    redundant = []
    for node in order:
        position = index[node]
        base = max(0, position - window)
        preds = sorted(graph.predecessors(node), key=index.__getitem__, reverse=True)
        reach = 0
        for pred in preds:  # latest first: a later predecessor can imply an earlier one
            pred_position = index[pred]
            if pred_position < base:
                break
            bit = 1 << (pred_position - base)
            if reach & bit:
                redundant.append((pred, node))
                continue
            pred_base, pred_bits = ancestors[pred]
            shift = pred_base - base
            reach |= bit | (pred_bits << shift if shift >= 0 else pred_bits >> -shift)
        ancestors[node] = (base, reach)
        for pred in preds:  # a node's set is dropped once its last successor has read it
            remaining_uses[pred] -= 1
            if remaining_uses[pred] == 0:
                del ancestors[pred]
        if remaining_uses[node] == 0:
            del ancestors[node]
    graph.remove_edges_from(redundant)
    return len(redundant)
