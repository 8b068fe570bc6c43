"""DepGraph: the dependence graph of a BIR program, compact enough for millions of instructions.

Nodes are instruction ids, kept in insertion order (the analyzer inserts them in program order,
so iteration order is a topological order until a pass reorders the program). Each edge carries
one small int: its kind (FLOW > OUTPUT > ANTI > ORDERED, the strongest conflict of the pair) and
the memory class it conflicts in. Adjacency is a dict of dicts (successor -> code) per direction,
the same shape networkx uses but without a per-edge attribute dict, which is most of networkx's
memory and time at this scale.

The read API is the subset of networkx's DiGraph that the passes use (nodes, edges(data=...),
predecessors, successors, in_degree, number_of_edges, ...); `to_networkx()` gives a real
DiGraph for tests that want networkx's algorithms.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from ncc.tools.walrus_driver.analysis import birutil

if TYPE_CHECKING:
    import networkx as nx

# Kinds by strength: the code of an edge is rank * 4 + memory (memory enum 0..3).
KINDS = ("ORDERED", "ANTI", "OUTPUT", "FLOW")
KIND_CODE = {kind: rank for rank, kind in enumerate(KINDS)}


def edge_code(kind: str, memory: int) -> int:
    return KIND_CODE[kind] * 4 + memory


def edge_data(code: int) -> dict[str, str]:
    memory = code & 3
    return {"kind": KINDS[code >> 2], "memory": birutil.memory_name(memory) if memory else ""}


class _EdgeView:
    """`graph.edges` iterates (src, dst) pairs; `graph.edges(data=True | "kind" | "memory")` adds data."""

    def __init__(self, graph: DepGraph):
        self._graph = graph

    def __iter__(self) -> Iterator[tuple[int, int]]:
        for src, succs in self._graph._succ.items():
            for dst in succs:
                yield src, dst

    def __len__(self) -> int:
        return self._graph.number_of_edges()

    def __call__(self, data: bool | str = False) -> Iterator[tuple]:
        for src, succs in self._graph._succ.items():
            for dst, code in succs.items():
                if data is False:
                    yield src, dst
                elif data is True:
                    yield src, dst, edge_data(code)
                else:
                    yield src, dst, edge_data(code).get(data)


class DepGraph:
    """A DAG over instruction ids with one coded attribute per edge."""

    def __init__(self) -> None:
        self._succ: dict[int, dict[int, int]] = {}
        self._pred: dict[int, dict[int, int]] = {}
        self._edges = 0

    # ---- building ---------------------------------------------------------------------------
    def add_node(self, node: int) -> None:
        if node not in self._succ:
            self._succ[node] = {}
            self._pred[node] = {}

    def set_predecessors(self, node: int, preds: dict[int, int]) -> None:
        """Give a node with no incoming edges yet its predecessors at once ({pred: code})."""
        succ = self._succ
        if node not in succ:  # the analyzer's case: a new node, one call per instruction
            succ[node] = {}
            self._pred[node] = dict(preds)
            self._edges += len(preds)
            for pred, code in preds.items():
                succ[pred][node] = code
            return
        incoming = self._pred[node]
        for pred, code in preds.items():
            if pred not in incoming:
                self._edges += 1
            incoming[pred] = code
            succ[pred][node] = code

    def merge_predecessors(self, node: int, preds: dict[int, int]) -> None:
        """Add edges into an existing `node` ({pred: code}); a pair it already has keeps the
        stronger kind, its own on a tie."""
        incoming, succ = self._pred[node], self._succ
        for pred, code in preds.items():
            old = incoming.get(pred)
            if old is None:
                self._edges += 1
            elif old >> 2 >= code >> 2:
                continue
            incoming[pred] = code
            succ[pred][node] = code

    def merge_strongest(self, node: int, preds: dict[int, int]) -> None:
        """Add edges into an existing `node` ({pred: code}); a pair it already has keeps the
        higher code: the stronger kind, and of one kind the higher memory (as the analyzer's
        on-chip walk does, so that a walk split in two gives the edges of one)."""
        incoming, succ = self._pred[node], self._succ
        if not incoming:  # the node's first edges (most calls of a walk): what the loop below does
            incoming.update(preds)
            self._edges += len(preds)
            for pred, code in preds.items():
                succ[pred][node] = code
            return
        for pred, code in preds.items():
            old = incoming.get(pred)
            if old is None:
                self._edges += 1
            elif old >= code:
                continue
            incoming[pred] = code
            succ[pred][node] = code

    def add_edge(self, src: int, dst: int, kind: str = "ORDERED", memory: int = 0) -> None:
        self.add_node(src)
        self.add_node(dst)
        code = edge_code(kind, memory)
        old = self._succ[src].get(dst)
        if old is None:
            self._edges += 1
        elif old >> 2 >= code >> 2:
            return
        self._succ[src][dst] = code
        self._pred[dst][src] = code

    def remove_edges_from(self, edges: Iterable[tuple[int, int]]) -> None:
        for src, dst in edges:
            if self._succ[src].pop(dst, None) is not None:
                del self._pred[dst][src]
                self._edges -= 1

    def copy(self) -> DepGraph:
        other = DepGraph()
        other._succ = {node: dict(succs) for node, succs in self._succ.items()}
        other._pred = {node: dict(preds) for node, preds in self._pred.items()}
        other._edges = self._edges
        return other

    # ---- reading ----------------------------------------------------------------------------
    @property
    def nodes(self) -> Iterable[int]:
        return self._succ.keys()

    @property
    def edges(self) -> _EdgeView:
        return _EdgeView(self)

    def __contains__(self, node: object) -> bool:
        return node in self._succ

    def __len__(self) -> int:
        return len(self._succ)

    def number_of_nodes(self) -> int:
        return len(self._succ)

    def number_of_edges(self) -> int:
        return self._edges

    def successors(self, node: int) -> Iterable[int]:
        return self._succ[node].keys()

    def predecessors(self, node: int) -> Iterable[int]:
        return self._pred[node].keys()

    def pred_codes(self, node: int) -> dict[int, int]:
        """{predecessor: edge code} of `node` (read-only)."""
        return self._pred[node]

    def predecessors_of_kind(self, node: int, kind: str) -> list[int]:
        rank = KIND_CODE[kind]
        return [pred for pred, code in self._pred[node].items() if code >> 2 == rank]

    def in_degree(self, node: int) -> int:
        return len(self._pred[node])

    def out_degree(self, node: int) -> int:
        return len(self._succ[node])

    def kind_counts(self) -> dict[str, int]:
        """{kind: number of edges of that kind}, every kind present."""
        counts = [0] * len(KINDS)
        for preds in self._pred.values():
            for code in preds.values():
                counts[code >> 2] += 1
        return dict(zip(KINDS, counts, strict=True))

    def edge_attributes(self, src: int, dst: int) -> dict[str, str]:
        return edge_data(self._succ[src][dst])

    def topological_order(self) -> list[int]:
        """A topological order (Kahn's algorithm, first-in first-out from the insertion order)."""
        successors = self._succ
        indegree = {node: len(preds) for node, preds in self._pred.items()}
        order = [node for node, degree in indegree.items() if degree == 0]
        for node in order:  # the list is the FIFO queue: iteration reaches what is appended
            for succ in successors[node]:
                degree = indegree[succ] - 1
                indegree[succ] = degree
                if degree == 0:
                    order.append(succ)
        if len(order) != len(successors):
            raise ValueError("the dependence graph has a cycle")
        return order

    def to_networkx(self) -> nx.DiGraph:
        import networkx as nx  # only tests ask for it: importing networkx costs a tool 0.16 s

        graph = nx.DiGraph()
        graph.add_nodes_from(self._succ)
        graph.add_edges_from((src, dst, data) for src, dst, data in self.edges(data=True))
        return graph
