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
The memories never conflict with one another, so SBUF/PSUM and HBM are two walks: from 20k
instructions the HBM one runs in a forked child (option `fork`), and the run after allocation
takes the first run's HBM edges (see analyze()). Pages never conflict with one another either
(each keeps and retires its own accesses), so with `fork` the on-chip walk is split too: once
every footprint is cached, a child walks half of the pages while this process walks the rest.

The first walk of an instruction's operands (its footprints, kept in ctx.footprint_cache for
the next run) also reads what the cost model prices a compute instruction by, and seeds the
shared cost table with it (CostTable.seed), so the first pass to ask for costs need not walk
the operands again (assign_hwdge_engine spent seconds on that at 100k instructions).

An instruction attribute `order_after` (comma-separated instruction names) adds ORDERED edges:
an explicit ordering the frontend wants kept although no memory conflict implies it.
Edge attributes: kind (strongest of FLOW > OUTPUT > ANTI > ORDERED) and memory (SBUF/PSUM/HBM).
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from ncc.schemas import bir_pb2
from ncc.tools.common import forked
from ncc.tools.common.errors import CompileError
from ncc.tools.walrus_driver.analysis import birutil, loop_deps
from ncc.tools.walrus_driver.analysis.depgraph import KIND_CODE, DepGraph, edge_code
from ncc.tools.walrus_driver.context import ANTI, FLOW, ORDERED, OUTPUT, PassContext
from ncc.tools.walrus_driver.registry import register

NAME = "anti_dependency_analyzer"
# A static program with loops costs more per instruction (boxes swept over loops, carried
# searches): a fork pays from fewer instructions (docs/performance.md, session 24: 10 % of the
# analyzer at 5,360 static instructions, 33 % at 14,130)
LOOP_FORK_MIN_INSTRUCTIONS = 5_000


@dataclass
class Options:
    sbuf_page_bytes: int = 4096  # region page size for SBUF lookups
    psum_page_bytes: int = 2048  # one PSUM bank
    hbm_page_rows: int = 16  # rows of an HBM tensor (its last dimension) per lookup page
    # yes | no | auto (= from forked.MIN_INSTRUCTIONS up, in a program with loops from
    # LOOP_FORK_MIN_INSTRUCTIONS): the HBM walk runs in a forked child while this process walks
    # SBUF and PSUM; in a program with loops, the loops' walks while this process walks the top level
    fork: str = "auto"


def _page_size(options: Options, memory: int) -> int:
    if memory == birutil.SBUF:
        return max(1, options.sbuf_page_bytes)
    if memory == birutil.PSUM:
        return max(1, options.psum_page_bytes)
    return max(1, options.hbm_page_rows)


@register(NAME, Options)
def run(ctx: PassContext) -> None:
    options: Options = ctx.options or Options()
    if options.fork not in ("yes", "no", "auto"):
        raise CompileError("E400", f"{NAME}: option fork={options.fork!r} is not yes, no or auto")
    program = ctx.program
    use_addresses = ctx.allocated and all(
        b.address >= 0 for b in program.buffers if b.memory in birutil.ONCHIP
    )
    analyze(ctx, use_addresses, options)


# What a walk done apart (the HBM one, or a forked half of the on-chip one) hands back:
# (instruction id, {earlier instruction id: edge code}) for every instruction with a conflict
# there, in program order; and the count of retired entries.
WalkEdges = tuple[list[tuple[int, dict[int, int]]], int]


def analyze(ctx: PassContext, use_addresses: bool, options: Options | None = None) -> None:
    """Build ctx.deps for the current program: between buffers' final addresses (use_addresses)
    or between virtual buffers. allocation calls it too, after adding spill instructions.

    Two walks: SBUF and PSUM here, HBM in a forked child from 20k instructions (the memories
    never conflict with each other, so the walks are independent; a pair that conflicts in both
    keeps the stronger kind, the on-chip memory on a tie). HBM edges do not depend on addresses
    and, for the same instructions, not on the order either (a reorder that respects the
    dependences keeps every conflicting pair in its order, and the edges of a region follow
    from the order of its own accesses), so the run after allocation takes the first run's
    (ctx.hbm_edges, dropped whenever instructions change)."""
    options = options or Options()
    program = ctx.program
    if ctx.hbm_widths is None:  # one view per tensor for as long as footprints stay cached
        ctx.hbm_widths = birutil.hbm_widths(program)
    if ctx.loop_entries:
        many = len(program.instructions) >= LOOP_FORK_MIN_INSTRUCTIONS
        _analyze_loops(ctx, use_addresses, options.fork == "yes" or (options.fork == "auto" and many))
        return
    hbm_edges = ctx.hbm_edges
    hbm_walk = None
    many = len(program.instructions) >= forked.MIN_INSTRUCTIONS
    fork = options.fork == "yes" or (options.fork == "auto" and many)
    if hbm_edges is None:
        page_rows = _page_size(options, birutil.HBM)
        hbm_walk = forked.Forked(
            functools.partial(_walk_hbm, program, ctx.hbm_widths, page_rows), parallel=fork
        )
    try:
        graph, onchip_retired = _walk_onchip(ctx, use_addresses, options, fork)
    except BaseException:
        if hbm_walk is not None:
            hbm_walk.cancel()
        raise
    if hbm_walk is not None:
        hbm_edges = ctx.hbm_edges = hbm_walk.result()
    edges, hbm_retired = hbm_edges
    for node, incoming in edges:
        graph.merge_predecessors(node, incoming)

    _install(ctx, graph, use_addresses)
    ctx.set_stat("retired_entries", onchip_retired + hbm_retired)
    ctx.set_stat("hbm_edges_reused", int(hbm_walk is None))
    ctx.set_stat("forked", int(fork))


def _analyze_loops(ctx: PassContext, use_addresses: bool, fork: bool) -> None:
    """A program that keeps loops: the DAG of one iteration and the carried dependences
    (analysis/loop_deps.py); with `fork`, the loops' walks run in a forked child while this
    process walks the top level."""
    analysis = loop_deps.LoopDeps(ctx.program, ctx.loops(), use_addresses, ctx.hbm_widths or {}, fork)
    _install(ctx, analysis.graph(), use_addresses)
    ctx.carried = analysis.carried
    ctx.set_stat("edges_carried", len(analysis.carried))
    ctx.set_stat("loops", len(analysis.nest.loops))
    ctx.set_stat("loops_aligned", analysis.aligned)
    ctx.set_stat("forked", int(analysis.forked))


def _install(ctx: PassContext, graph: DepGraph, use_addresses: bool) -> None:
    """Make `graph` the context's valid dependence graph, with its counters."""
    ctx.deps = graph
    ctx.deps_rebuild = None
    ctx.deps_valid = True
    ctx.deps_valid_for_addresses = use_addresses
    ctx.deps_reduced = False
    ctx.set_stat("nodes", graph.number_of_nodes())
    ctx.set_stat("edges", graph.number_of_edges())
    by_kind = graph.kind_counts()
    for kind in (FLOW, ANTI, OUTPUT, ORDERED):
        ctx.set_stat(f"edges_{kind.lower()}", by_kind[kind])
    ctx.set_stat("address_mode", 1 if use_addresses else 0)


def _walk_onchip(ctx: PassContext, use_addresses: bool, options: Options, fork: bool) -> tuple[DepGraph, int]:
    """Every instruction a node, its ORDERED edges and its SBUF/PSUM conflicts; the footprints
    it computes stay in ctx.footprint_cache (HBM boxes included) for the next run and the passes
    after it. With `fork`, half of the lookup pages (_Active.half) are walked in a forked child
    while this process walks the other half: a conflict lies in a page both accesses touch, and
    each page's accesses are kept and retired on their own, so the two halves find exactly the
    edges one walk does. Returns the graph and the count of retired entries."""
    program = ctx.program
    ordered = _nodes_and_footprints(ctx)
    cache = ctx.footprint_cache
    address = {b.name: b.address for b in program.buffers} if use_addresses else None
    page_size = {memory: _page_size(options, memory) for memory in birutil.ONCHIP}
    other = None
    if fork:  # forked once every footprint is in the cache, so the child need compute none
        other = forked.Forked(functools.partial(_onchip_edges, program, cache, address, page_size, 1))
    graph = DepGraph()
    active = _Active(page_size, 0 if fork else None)
    try:
        for node, incoming in _onchip_conflicts(program, cache, address, active):
            for src, code in ordered.get(node, {}).items():  # the weakest kind: any conflict wins
                incoming.setdefault(src, code)
            graph.set_predecessors(node, incoming)
    except BaseException:
        if other is not None:
            other.cancel()
        raise
    if other is not None:
        edges, other_retired = other.result()
        for node, incoming in edges:
            graph.merge_strongest(node, incoming)
        return graph, active.retired + other_retired
    return graph, active.retired


def _nodes_and_footprints(ctx: PassContext) -> dict[int, dict[int, int]]:
    """Check the instructions' ids and `order_after` names, and fill ctx.footprint_cache with every
    instruction's boxes (relative to their buffers), seeding the cost table from the same walk.
    Returns the ORDERED edges of the instructions that have some ({node: {earlier node: code}})."""
    program = ctx.program
    buffers: dict[str, bir_pb2.Buffer] | None = None  # read only for footprints not cached yet
    widths = ctx.hbm_widths
    cache = ctx.footprint_cache
    costs = ctx.costs()
    ordered: dict[int, dict[int, int]] = {}
    names: dict[str, int] = {}
    seen: set[int] = set()
    for instr in program.instructions:
        node = instr.id
        if node in seen:
            raise CompileError("E405", f"instruction id {node} is used twice ({instr.name})", instr.name)
        seen.add(node)
        attributes = instr.attributes
        ordered_after = attributes.get("order_after", "") if attributes else ""
        if ordered_after:
            incoming = ordered[node] = {}
            for other in filter(None, (n.strip() for n in ordered_after.split(","))):
                if other not in names:
                    raise CompileError(
                        "E405",
                        f"{instr.name}: order_after names {other!r}, which is not an earlier instruction",
                    )
                incoming[names[other]] = edge_code(ORDERED, 0)
        names[instr.name] = node
        if node not in cache:
            if buffers is None:
                buffers = birutil.buffer_map(program)
            boxes = cache[node] = birutil.footprints(instr, buffers, False, widths)
            if boxes.operands is not None:  # read in the same walk: the cost model need not
                costs.seed(instr, boxes.operands)
                boxes.operands = None
    return ordered


def _onchip_edges(
    program: bir_pb2.Program, cache: dict, address: dict[str, int] | None, page_size: dict[int, int],
    half: int,
) -> WalkEdges:
    """The forked child's half of the on-chip walk: the instructions with a conflict in the pages
    of `half`, each with its {earlier id: code}, and the count of retired entries."""
    active = _Active(page_size, half)
    walk = _onchip_conflicts(program, cache, address, active)
    edges = [(node, incoming) for node, incoming in walk if incoming]
    return edges, active.retired


def _onchip_conflicts(
    program: bir_pb2.Program, cache: dict, address: dict[str, int] | None, active: _Active
) -> Iterator[tuple[int, dict[int, int]]]:
    """(id, {earlier id: code}) for every instruction in program order: its SBUF/PSUM conflicts
    in the pages `active` keeps, from the cached footprints, in the virtual buffers or
    (`address`: each buffer's) in the memories' one address space each."""
    hbm = birutil.HBM
    for instr in program.instructions:
        node = instr.id
        boxes = cache[node]
        incoming: dict[int, int] = {}
        if address is None:
            active.access(node, [box for box in boxes if box[0] != hbm], incoming)
        else:  # with addresses an on-chip box moves into its memory's one address space
            onchip = []
            for memory, region, p0, p1, b0, b1, write in boxes:
                if memory != hbm:
                    base = address[region]
                    onchip.append((memory, "", p0, p1, b0 + base, b1 + base, write))
            active.access(node, onchip, incoming)
        yield node, incoming


def _walk_hbm(program: bir_pb2.Program, widths: dict[str, int], page_rows: int) -> WalkEdges:
    """The HBM conflicts of every instruction, from its HBM operands alone (so that a forked child
    can walk them beside _walk_onchip, which computes the footprints)."""
    active = _Active({birutil.HBM: page_rows})
    edges: list[tuple[int, dict[int, int]]] = []
    hbm = birutil.HBM
    for instr in program.instructions:
        boxes = []
        for write, operands in ((False, instr.inputs), (True, instr.outputs)):
            for ap in operands:
                if ap.memory == hbm:
                    box = birutil.hbm_box(ap, widths.get(ap.tensor, 0) or (1 << 62))
                    if box is not None:
                        boxes.append((hbm, ap.tensor, *box, write))
        if boxes:
            node = instr.id
            incoming: dict[int, int] = {}
            active.access(node, boxes, incoming)
            if incoming:
                edges.append((node, incoming))
    return edges, active.retired


class _Active:
    """The accesses of one walk that later ones can conflict with, per (memory, region, page):
    for each page a list of reads and a list of writes, each entry (p0, p1, b0, b1, instruction id).

    `half` (0 or 1) keeps only the pages of that half of every memory: stripes of _STRIPE_BYTES
    alternate between the halves, starting from a half a region's name picks (so the virtual
    buffers are spread too); None keeps every page."""

    __slots__ = ("pages", "page_size", "retired", "half", "_stripe", "_region_half")

    def __init__(self, page_size: dict[int, int], half: int | None = None) -> None:
        self.pages: dict[tuple[int, str, int], tuple[list, list]] = {}
        self.page_size = page_size
        self.retired = 0
        self.half = half
        self._stripe = {memory: max(1, _STRIPE_BYTES.get(memory, size) // size)
                        for memory, size in page_size.items()}
        self._region_half: dict[str, int] = {}

    def access(self, node: int, boxes: list, incoming: dict[int, int]) -> None:
        """Record in `incoming` ({earlier instruction: code}) the strongest conflict of every active
        access with the instruction's `boxes` ((memory, region, p0, p1, b0, b1, write) each), reads
        checked before writes; then make the boxes active, each write retiring what it covers.
        Of two conflicts of one kind the higher memory code is kept, so that the edge does not
        depend on which page (or half) found it first."""
        pages, page_size, half = self.pages, self.page_size, self.half
        touched = []
        for memory, region, p0, p1, b0, b1, write in boxes:
            size = page_size[memory]
            lists = []
            if half is None:
                first = 0
                stripe = 1 << 62
            else:
                first = self._region_half.get(region)
                if first is None:
                    first = self._region_half[region] = zlib.crc32(region.encode()) & 1
                first ^= half
                stripe = self._stripe[memory]
            for page in range(b0 // size, (b1 - 1) // size + 1):
                if (first + page // stripe) & 1:  # a page of the other half
                    continue
                key = (memory, region, page)
                entries = pages.get(key)
                if entries is None:
                    entries = pages[key] = ([], [])
                lists.append(entries)
            if lists:
                touched.append((p0, p1, b0, b1, write, memory, lists))
        for p0, p1, b0, b1, write, memory, lists in touched:
            checks = ((1, _OUTPUT + memory), (0, _ANTI + memory)) if write else ((1, _FLOW + memory),)
            for which, code in checks:
                for entries in lists:
                    for q0, q1, c0, c1, src in entries[which]:
                        if q0 < p1 and p0 < q1 and c0 < b1 and b0 < c1 and src != node:
                            old = incoming.get(src)
                            if old is None or old < code:
                                incoming[src] = code
        for p0, p1, b0, b1, write, _, lists in touched:
            entry = (p0, p1, b0, b1, node)
            if not write:
                for entries in lists:
                    entries[0].append(entry)
                continue
            for entries in lists:  # a write retires what it covers of every access
                for accesses in entries:
                    for q0, q1, c0, c1, _ in accesses:
                        if q0 < p1 and p0 < q1 and c0 < b1 and b0 < c1:
                            kept = _uncovered(accesses, p0, p1, b0, b1)
                            self.retired += len(accesses) - len(kept)
                            accesses[:] = kept
                            break
                entries[1].append(entry)


# The lookup pages of a forked walk's halves alternate in stripes of this many bytes (SBUF: 6
# stripes of its 192 KiB a partition; PSUM: 2 of its 16 KiB), wide enough that a tile seldom
# straddles two (one that does is looked up in both halves, each with its own pages).
_STRIPE_BYTES = {birutil.SBUF: 32 * 1024, birutil.PSUM: 8 * 1024}

_FLOW, _OUTPUT, _ANTI = KIND_CODE[FLOW] * 4, KIND_CODE[OUTPUT] * 4, KIND_CODE[ANTI] * 4


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
