"""Build the dependence graph: FLOW/ANTI/OUTPUT edges between instructions whose accesses overlap.

Walks program.instructions in order (the sequential reference) and, per memory class, keeps the
accesses that are still "active" for each region: SBUF/PSUM boxes are partition range x byte
range, per virtual buffer before allocation and in the one address space of the memory once every
buffer of that class has an address (then two buffers that share bytes conflict too). An HBM
access is a box of columns x rows of its tensor (birutil.hbm_box: exact for tiles, column blocks
and transposed tiles, so a column tile does not wait for every store of its producer), in the
row width that makes most of the tensor's accesses exact (birutil.hbm_widths). A read
gets a FLOW edge from every active overlapping write;
a write gets OUTPUT edges from active overlapping writes and ANTI edges from active overlapping
reads, and then retires what it covers of every access (an access it overlaps keeps only its parts
outside the write; later conflicts with a retired part are implied through the covering write),
which keeps the active lists short. Regions are cut into pages so
a lookup scans only the accesses near its bytes (or rows): linear in the program in practice.

The first walk of an instruction's operands (its footprints, kept in ctx.footprint_cache for
the next run) also reads what the cost model prices a compute instruction by, and seeds the
shared cost table with it (CostTable.seed), so the first pass to ask for costs need not walk
the operands again (assign_hwdge_engine spent seconds on that at 100k instructions).

An instruction attribute `order_after` (comma-separated instruction names) adds ORDERED edges:
an explicit ordering the frontend wants kept although no memory conflict implies it.
Edge attributes: kind (strongest of FLOW > OUTPUT > ANTI > ORDERED) and memory (SBUF/PSUM/HBM).
"""

from __future__ import annotations

from dataclasses import dataclass

from ncc.schemas import bir_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.walrus_driver import birutil
from ncc.tools.walrus_driver.context import ANTI, FLOW, ORDERED, OUTPUT, PassContext
from ncc.tools.walrus_driver.depgraph import KIND_CODE, KINDS, DepGraph, edge_code
from ncc.tools.walrus_driver.registry import register

NAME = "anti_dependency_analyzer"


@dataclass
class Options:
    sbuf_page_bytes: int = 4096  # region page size for SBUF lookups
    psum_page_bytes: int = 2048  # one PSUM bank
    hbm_page_rows: int = 16  # rows of an HBM tensor (its last dimension) per lookup page


def _page_size(options: Options, memory: int) -> int:
    if memory == birutil.SBUF:
        return max(1, options.sbuf_page_bytes)
    if memory == birutil.PSUM:
        return max(1, options.psum_page_bytes)
    return max(1, options.hbm_page_rows)


@register(NAME, Options)
def run(ctx: PassContext) -> None:
    options: Options = ctx.options or Options()
    program = ctx.program
    use_addresses = ctx.allocated and all(
        b.address >= 0 for b in program.buffers if b.memory in birutil.ONCHIP
    )
    analyze(ctx, use_addresses, options)


def analyze(ctx: PassContext, use_addresses: bool, options: Options | None = None) -> None:
    """Build ctx.deps for the current program: between buffers' final addresses (use_addresses)
    or between virtual buffers. allocation calls it too, after adding spill instructions."""
    options = options or Options()
    program = ctx.program
    buffers: dict[str, bir_pb2.Buffer] | None = None  # read only for footprints not cached yet
    if ctx.hbm_widths is None:  # one view per tensor for as long as footprints stay cached
        ctx.hbm_widths = birutil.hbm_widths(program)
    widths = ctx.hbm_widths
    address = {b.name: b.address for b in program.buffers} if use_addresses else {}
    cache = ctx.footprint_cache
    costs = ctx.costs()
    page_size = {memory: _page_size(options, memory) for memory in (birutil.SBUF, birutil.PSUM, birutil.HBM)}
    hbm = birutil.HBM
    # (memory, region, page) -> [reads, writes], each a list of (p0, p1, b0, b1, instruction id)
    pages: dict[tuple[int, str, int], tuple[list, list]] = {}
    graph = DepGraph()
    names: dict[str, int] = {}
    retired = 0
    by_kind = dict.fromkeys(KIND_CODE, 0)
    flow, output, anti = KIND_CODE[FLOW] * 4, KIND_CODE[OUTPUT] * 4, KIND_CODE[ANTI] * 4
    for instr in program.instructions:
        node = instr.id
        if node in graph:
            raise CompileError("E405", f"instruction id {node} is used twice ({instr.name})", instr.name)
        incoming: dict[int, int] = {}
        attributes = instr.attributes
        ordered_after = attributes.get("order_after", "") if attributes else ""
        if ordered_after:
            for other in filter(None, (n.strip() for n in ordered_after.split(","))):
                if other not in names:
                    raise CompileError(
                        "E405",
                        f"{instr.name}: order_after names {other!r}, which is not an earlier instruction",
                    )
                incoming[names[other]] = edge_code(ORDERED, 0)
        names[instr.name] = node

        boxes = cache.get(node)
        if boxes is None:  # boxes relative to their buffers, kept for the next run
            if buffers is None:
                buffers = birutil.buffer_map(program)
            boxes = cache[node] = birutil.footprints(instr, buffers, False, widths)
            if boxes.operands is not None:  # read in the same walk: the cost model need not
                costs.seed(instr, boxes.operands)
                boxes.operands = None
        # (p0, p1, b0, b1, write, memory, the active lists of the pages it touches) per box;
        # with addresses an on-chip box moves into its memory's one address space
        touched = []
        for memory, region, p0, p1, b0, b1, write in boxes:
            if use_addresses and memory != hbm:
                base = address[region]
                region, b0, b1 = "", b0 + base, b1 + base
            size = page_size[memory]
            lists = []
            for page in range(b0 // size, (b1 - 1) // size + 1):
                key = (memory, region, page)
                active = pages.get(key)
                if active is None:
                    active = pages[key] = ([], [])
                lists.append(active)
            touched.append((p0, p1, b0, b1, write, memory, lists))
        # Reads first (conflicts with earlier writes), then writes (earlier reads and writes).
        for p0, p1, b0, b1, write, memory, lists in touched:
            if write:
                checks = ((1, output + memory), (0, anti + memory))
            else:
                checks = ((1, flow + memory),)
            for which, code in checks:
                for active in lists:
                    for q0, q1, c0, c1, src in active[which]:
                        if q0 < p1 and p0 < q1 and c0 < b1 and b0 < c1 and src != node:
                            old = incoming.get(src)
                            if old is None or old >> 2 < code >> 2:
                                incoming[src] = code
        for p0, p1, b0, b1, write, _, lists in touched:
            entry = (p0, p1, b0, b1, node)
            if not write:
                for active in lists:
                    active[0].append(entry)
                continue
            for active in lists:  # a write retires what it covers of every access
                for entries in active:
                    for q0, q1, c0, c1, _ in entries:
                        if q0 < p1 and p0 < q1 and c0 < b1 and b0 < c1:
                            kept = _uncovered(entries, p0, p1, b0, b1)
                            retired += len(entries) - len(kept)
                            entries[:] = kept
                            break
                active[1].append(entry)
        graph.set_predecessors(node, incoming)
        for code in incoming.values():
            by_kind[KINDS[code >> 2]] += 1

    ctx.deps = graph
    ctx.deps_rebuild = None
    ctx.deps_valid = True
    ctx.deps_valid_for_addresses = use_addresses
    ctx.deps_reduced = False
    ctx.set_stat("nodes", graph.number_of_nodes())
    ctx.set_stat("edges", graph.number_of_edges())
    for kind in (FLOW, ANTI, OUTPUT, ORDERED):
        ctx.set_stat(f"edges_{kind.lower()}", by_kind[kind])
    ctx.set_stat("address_mode", 1 if use_addresses else 0)
    ctx.set_stat("retired_entries", retired)


def _uncovered(entries: list, p0: int, p1: int, b0: int, b1: int) -> list:
    """`entries` less the box [p0, p1) x [b0, b1): an entry the box covers goes, one it overlaps
    keeps the parts outside it (up to four boxes), the rest stay. Later conflicts with a removed
    part also conflict with the covering write, which is ordered after the entry, so their edges
    are implied; keeping partly overwritten accesses whole made every later access near them get
    an edge from each (an MLP at D = 8192 had 46 edges per instruction after allocation)."""
    kept = []
    for entry in entries:
        q0, q1, c0, c1, src = entry
        if q0 >= p1 or p0 >= q1 or c0 >= b1 or b0 >= c1:
            kept.append(entry)
            continue
        if q0 < p0:
            kept.append((q0, p0, c0, c1, src))
        if p1 < q1:
            kept.append((p1, q1, c0, c1, src))
        lo, hi = max(q0, p0), min(q1, p1)
        if c0 < b0:
            kept.append((lo, hi, c0, b0, src))
        if b1 < c1:
            kept.append((lo, hi, b1, c1, src))
    return kept
