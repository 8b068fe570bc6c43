"""Build the dependence graph: FLOW/ANTI/OUTPUT edges between instructions whose accesses overlap.

Walks program.instructions in order (the sequential reference) and, per memory class, keeps the
accesses that are still "active" for each region: SBUF/PSUM boxes are partition range x byte
range, per virtual buffer before allocation and in the one address space of the memory once every
buffer of that class has an address (then two buffers that share bytes conflict too). HBM boxes
are element-range hulls per tensor. A read gets a FLOW edge from every active overlapping write;
a write gets OUTPUT edges from active overlapping writes and ANTI edges from active overlapping
reads, and then retires every access it covers (later conflicts with a retired access are implied
through the covering write), which keeps the active lists short. Regions are cut into pages so
a lookup scans only the accesses near its bytes: linear in practice for programs of thousands
of instructions.

An instruction attribute `order_after` (comma-separated instruction names) adds ORDERED edges:
an explicit ordering the frontend wants kept although no memory conflict implies it.
Edge attributes: kind (strongest of FLOW > OUTPUT > ANTI > ORDERED) and memory (SBUF/PSUM/HBM).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import networkx as nx

from ncc.tools.common.errors import CompileError
from ncc.tools.walrus_driver import birutil
from ncc.tools.walrus_driver.birutil import Footprint
from ncc.tools.walrus_driver.context import ANTI, FLOW, KIND_RANK, ORDERED, OUTPUT, PassContext
from ncc.tools.walrus_driver.registry import register

NAME = "anti_dependency_analyzer"


@dataclass
class Options:
    sbuf_page_bytes: int = 4096  # region page size for SBUF lookups
    psum_page_bytes: int = 2048  # one PSUM bank
    hbm_page_elements: int = 16384


@dataclass
class _Active:
    reads: list[tuple[Footprint, int]]
    writes: list[tuple[Footprint, int]]


def _page_size(options: Options, memory: int) -> int:
    if memory == birutil.SBUF:
        return max(1, options.sbuf_page_bytes)
    if memory == birutil.PSUM:
        return max(1, options.psum_page_bytes)
    return max(1, options.hbm_page_elements)


@register(NAME, Options)
def run(ctx: PassContext) -> None:
    options: Options = ctx.options or Options()
    program = ctx.program
    buffers = birutil.buffer_map(program)
    use_addresses = ctx.allocated and all(
        b.address >= 0 for b in program.buffers if b.memory in birutil.ONCHIP
    )
    pages: dict[tuple[int, str, int], _Active] = defaultdict(lambda: _Active([], []))
    edges: dict[tuple[int, int], tuple[str, int]] = {}

    def add_edge(src: int, dst: int, kind: str, memory: int) -> None:
        if src == dst:
            return
        old = edges.get((src, dst))
        if old is None or KIND_RANK[kind] > KIND_RANK[old[0]]:
            edges[(src, dst)] = (kind, memory)

    graph = nx.DiGraph()
    names: dict[str, int] = {}
    for instr in program.instructions:
        if instr.id in graph:
            raise CompileError("E405", f"instruction id {instr.id} is used twice ({instr.name})", instr.name)
        graph.add_node(instr.id)
        names[instr.name] = instr.id
        ordered_after = instr.attributes.get("order_after", "")
        for other in filter(None, (n.strip() for n in ordered_after.split(","))):
            if other not in names:
                raise CompileError(
                    "E405", f"{instr.name}: order_after names {other!r}, which is not an earlier instruction"
                )
            add_edge(names[other], instr.id, ORDERED, 0)

        boxes = birutil.footprints(instr, buffers, use_addresses)
        for box in boxes:  # reads first: conflicts with earlier writes
            if box.write:
                continue
            for key in _keys(box, options):
                for other, src in pages[key].writes:
                    if other.overlaps(box):
                        add_edge(src, instr.id, FLOW, box.memory)
        for box in boxes:  # then writes: conflicts with earlier reads and writes
            if not box.write:
                continue
            for key in _keys(box, options):
                active = pages[key]
                for other, src in active.writes:
                    if other.overlaps(box):
                        add_edge(src, instr.id, OUTPUT, box.memory)
                for other, src in active.reads:
                    if other.overlaps(box):
                        add_edge(src, instr.id, ANTI, box.memory)
        for box in boxes:
            for key in _keys(box, options):
                active = pages[key]
                if box.write:
                    before = len(active.reads) + len(active.writes)
                    active.reads = [(b, i) for b, i in active.reads if not box.covers(b)]
                    active.writes = [(b, i) for b, i in active.writes if not box.covers(b)]
                    ctx.count("retired_entries", before - len(active.reads) - len(active.writes))
                    active.writes.append((box, instr.id))
                else:
                    active.reads.append((box, instr.id))

    by_kind: dict[str, int] = defaultdict(int)
    for (src, dst), (kind, memory) in edges.items():
        graph.add_edge(src, dst, kind=kind, memory=birutil.memory_name(memory) if memory else "")
        by_kind[kind] += 1
    ctx.deps = graph
    ctx.deps_valid = True
    ctx.deps_valid_for_addresses = use_addresses
    ctx.deps_reduced = False
    ctx.set_stat("nodes", graph.number_of_nodes())
    ctx.set_stat("edges", graph.number_of_edges())
    for kind in (FLOW, ANTI, OUTPUT, ORDERED):
        ctx.set_stat(f"edges_{kind.lower()}", by_kind[kind])
    ctx.set_stat("address_mode", 1 if use_addresses else 0)


def _keys(box: Footprint, options: Options) -> list[tuple[int, str, int]]:
    size = _page_size(options, box.memory)
    return [(box.memory, box.region, page) for page in range(box.b0 // size, (box.b1 - 1) // size + 1)]
