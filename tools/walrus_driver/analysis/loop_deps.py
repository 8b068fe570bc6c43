"""Dependences of a program whose global order keeps loops (analysis/loopnest.py): a DAG over the
static order, and the dependences loops carry from one iteration to a later one.

The DAG (ctx.deps) orders pairs within one iteration: two instructions of one loop body conflict
when they touch common bytes at the same iteration of every loop enclosing both; an instruction
before (after) a loop conflicts with a body instruction when it touches bytes the body touches at
any iteration. Every edge goes forward in the static order, so the passes that schedule,
allocate and synchronize straight-line code read a body as one iteration of it.

Carried dependences (ctx.carried) are the pairs a loop L orders across its iterations: the
instance of `dst` at iteration r of L must follow the instance of `src` at iteration r - d,
d >= 1 (`distance`), `src` at its last iteration of every loop inside L. Found per loop from how
an operand moves from one iteration to the next:
  * HBM: its offset moves by the step its `loop` variation gives; two operands with one step s
    meet at distance d when one's box shifted by d * s meets the other's; operands whose steps
    differ (or whose boxes wrap rows) are taken to meet at distance 1 whenever their boxes over
    all iterations meet;
  * SBUF/PSUM, each virtual buffer (before allocation): a buffer private to L or to a loop
    inside it is fresh at every iteration of L and never carries; any other meets at distance 1;
  * with addresses (after allocation), a buffer that rotates over N copies at L's iterations
    (`slots`, `private_to` = L) meets its own accesses at distance N; everything else, address
    reuse across buffers included, at distance 1 where the bytes meet at all.
A distance that is too short is safe (a later wait for an earlier instance of the same thread
completes in order), so every approximation here is toward a shorter distance.

Aligned dependences (`_align`): a loop whose every conflict with an earlier loop of the same
block is in HBM, one step a time in both (a nest reading, row block by row block, what the nest
before it wrote), follows that loop iteration by iteration instead of waiting for all of it:
its iteration r needs the earlier loop's iterations up to scale * r + delta only (scale the
ratio of their steps), so the DAG's edges between them become such dependences (Carried with
`src_loop`), and the two loops overlap at run time as the unrolled program's nests did.

The walks: one per block (the top level and each loop body), over the instructions of the
block and of the loops inside it in static order, each with its operands' boxes swept over the
loops inside the block; pairs within one inner loop are left to that loop's own walk, and an
instruction of an inner loop retires nothing (its box over all iterations is not one write).
The blocks never read each other's findings, so with `fork` the loops' walks and carried
searches run in a forked child (tools/common/forked.py) while this process walks the top level
(most of the work: 1.0 of 1.8 s in the 9-layer attention's run after allocation), and their
edges then join the graph in the order one process adds them: the graph is the same either way.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from itertools import repeat
from typing import NamedTuple

from ncc.schemas import bir_pb2
from ncc.tools.common import forked
from ncc.tools.common.errors import CompileError
from ncc.tools.walrus_driver.analysis import birutil, syncmodel
from ncc.tools.walrus_driver.analysis.depgraph import KIND_CODE, DepGraph, edge_code
from ncc.tools.walrus_driver.analysis.loopnest import ROOT, Loop, LoopNest

_FLOW, _OUTPUT, _ANTI = KIND_CODE["FLOW"] * 4, KIND_CODE["OUTPUT"] * 4, KIND_CODE["ANTI"] * 4
_WIDE = 1 << 62  # a row width that puts a whole HBM tensor in one row


@dataclass(frozen=True)
class Carried:
    """dst at iteration r of `loop` follows src at iteration r - distance of the same loop, or
    (an aligned dependence) at iteration scale * r - distance of `src_loop`, a loop before
    `loop` in their common block; src's inner loops at their last iteration."""

    src: int
    dst: int
    loop: int
    distance: int
    code: int
    src_loop: int | None = None
    scale: int = 1


class _Box(NamedTuple):
    """One operand's bytes: region (virtual buffer, "" for an allocated memory, or an HBM tensor),
    partitions [p0, p1), bytes or (HBM) columns [c0, c1) and rows [b0, b1); a rotating buffer's
    operand also carries its rotation group (`rotor`: LoopDeps._rotor) and its box within one
    copy (s0, s1), and its [b0, b1) then spans every copy."""

    memory: int
    region: str
    p0: int
    p1: int
    c0: int
    c1: int
    b0: int
    b1: int
    write: bool
    rotor: str
    s0: int
    s1: int
    buffer: str = ""  # on chip: the virtual buffer


class _Operand(NamedTuple):
    """What the walks need of one operand: its box at iteration 0 of every loop and how it moves."""

    ap: bir_pb2.AccessPattern
    write: bool
    steps: tuple[int, ...]  # per enclosing loop (outermost first): HBM elements, on chip bytes (an
    # indexed array's); () when it does not move


class _Merges:
    """What a walk of a block done apart adds to the graph: DepGraph.merge_strongest's calls, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, dict[int, int]]] = []

    def merge_strongest(self, node: int, preds: dict[int, int]) -> None:
        self.calls.append((node, preds))


# A loop's findings: its walk's merges into the graph and the dependences it carries.
LoopFindings = list[tuple[list[tuple[int, dict[int, int]]], list[Carried]]]


class LoopDeps:
    """Builds ctx.deps and ctx.carried for a program with loops (see the module docstring);
    with `fork`, the loops' walks run in a forked child."""

    def __init__(self, program: bir_pb2.Program, nest: LoopNest, use_addresses: bool,
                 widths: dict[str, int], fork: bool = False) -> None:
        self.program = program
        self.use_addresses = use_addresses
        self.fork = fork
        self.forked = False  # whether the loops' walks came from a child (for the pass's counters)
        self.widths = widths
        self.nest = nest
        self.buffers = birutil.buffer_map(program)
        self.instructions = list(program.instructions)
        self._position = {instr.id: index for index, instr in enumerate(self.instructions)}
        self.operands = {i.id: list(self._operands(i)) for i in self.instructions}
        self.carried: list[Carried] = []
        self.aligned = 0  # pairs of loops whose dependence runs iteration by iteration
        self._boxes: dict[tuple[int, int], list[tuple[int, _Box]]] = {}  # (instruction, level) -> boxes
        self.rotors: dict[str, tuple[int, int, int]] = {}  # rotation group -> (its loop, copies, copy size)
        self._bases: dict[int, tuple | None] = {}  # id(operand) -> _base
        self._rotor_names: dict[tuple[int, int, int, int, int], str] = {}
        # loop -> its operands indexed for _aligned_pairs (a loop is the first of several pairs)
        self._first_index: dict[int, tuple[dict[tuple, dict[int, list[_Box]]], dict[str, list[tuple]]]] = {}
        self.page_rows = {t.name: max(_PAGE[birutil.HBM], -(-math.prod(t.shape) // (widths.get(t.name) or 1)
                                                           // _MAX_PAGES)) for t in program.hbm}

    # ---- operands and boxes -----------------------------------------------------------------
    def _operands(self, instr: bir_pb2.Instruction) -> Iterator[_Operand]:
        accumulating = instr.accumulate and instr.op == "matmul"
        for write, operands in ((False, instr.inputs), (True, instr.outputs)):
            for ap in operands:
                yield _Operand(ap, write, tuple(v.step for v in ap.loop))
                if write and accumulating:
                    yield _Operand(ap, False, tuple(v.step for v in ap.loop))

    def boxes(self, instr: bir_pb2.Instruction, level: int) -> list[tuple[int, _Box]]:
        """(operand index, box) of each operand that touches something: its box at iteration 0
        of the instruction's outermost `level` loops, swept over the iterations of the loops
        inside them."""
        key = (instr.id, level)
        result = self._boxes.get(key)
        if result is None:
            chain = self.nest.chain_of(instr.id)
            swept = [self.nest.loops[loop].trip for loop in chain[level:]]
            result = self._boxes[key] = []
            for index, operand in enumerate(self.operands[instr.id]):
                box = self._box(operand, level, swept, instr.name)
                if box is not None:
                    result.append((index, box))
        return result

    def _base(self, operand: _Operand, where: str) -> tuple | None:
        """What an operand's box at every level starts from, worked out once (an instruction's
        boxes are asked for at its every level, up to 4): an HBM operand's box in its tensor's
        row width (birutil.hbm_box), an on-chip one's span in its buffer (birutil.operand_box)."""
        key = id(operand)  # the operands live in self.operands as long as this analysis
        if key in self._bases:
            return self._bases[key]
        ap = operand.ap
        if ap.memory == birutil.HBM:
            base = birutil.hbm_box(ap, self.widths.get(ap.tensor, 0) or _WIDE)
        elif ap.memory not in birutil.ONCHIP:
            raise CompileError("E405", f"{where}: operand {ap.tensor!r} has no memory class", where)
        else:
            base = birutil.operand_box(ap, self.buffers, False, where)
        self._bases[key] = base
        return base

    def _box(self, operand: _Operand, level: int, swept: list[int], where: str) -> _Box | None:
        ap, write = operand.ap, operand.write
        span = self._base(operand, where)
        if ap.memory == birutil.HBM:
            width = self.widths.get(ap.tensor, 0) or _WIDE
            steps = operand.steps[level:] if operand.steps else ()
            return self._hbm_box(ap, span, width, steps, swept, write)
        if span is None:
            return None
        _, p0, p1, b0, b1 = span
        if operand.steps:  # an indexed array's block moves over the loops inside
            low, high = _reach(operand.steps[level:], swept)
            b0, b1 = b0 + low, b1 + high
        if not self.use_addresses:
            return _Box(ap.memory, ap.tensor, p0, p1, 0, 1, b0, b1, write, "", 0, 0, ap.tensor)
        buffer = self.buffers[ap.tensor]
        base = buffer.address
        if buffer.slots > 1:
            span_bytes = (buffer.slots - 1) * buffer.bytes_per_partition
            rotor = self._rotor(buffer)
            return _Box(ap.memory, "", p0, p1, 0, 1, base + b0, base + b1 + span_bytes, write, rotor, b0, b1,
                        ap.tensor)
        return _Box(ap.memory, "", p0, p1, 0, 1, base + b0, base + b1, write, "", 0, 0, ap.tensor)

    @staticmethod
    def _hbm_box(ap: bir_pb2.AccessPattern, box: tuple[int, int, int, int] | None, width: int,
                 steps: tuple[int, ...], swept: list[int], write: bool) -> _Box | None:
        """An HBM operand's box (`box`: birutil.hbm_box's, at iteration 0) swept over `steps`."""
        if box is None:
            return None
        c0, c1, r0, r1 = box
        low, high = _reach(steps, swept)
        if low or high:
            if all(step % width == 0 for step in steps):
                r0, r1 = r0 + low // width, r1 + high // width
            else:
                span = birutil.element_span(ap) or (0, 0)
                c0, c1 = 0, width
                r0 = (ap.offset + span[0] + low) // width
                r1 = (ap.offset + span[1] + high) // width + 1
        return _Box(birutil.HBM, ap.tensor, 0, 1, c0, c1, r0, r1, write, "", 0, 0)

    def _pages(self, box: _Box) -> tuple[tuple[int, str], range]:
        """The lookup pages a box falls in: its region's key (memory, region) and the range of
        its pages there, which the walks' tables (region key -> page -> entries) are indexed by;
        an HBM tensor's pages are 16 rows or a 64th of its rows, whichever is more (a box over
        every iteration of a loop can span a whole tensor). A range, not a list of keys: the
        walks ask again for every box at every level and in every loop that holds it (half a
        million times at 12k instructions), and a loop's hull spans up to 65 pages."""
        if box.memory == birutil.HBM:
            size = self.page_rows.get(box.region, _PAGE[birutil.HBM])
        else:
            size = _PAGE.get(box.memory, 4096)
        return (box.memory, box.region), range(box.b0 // size, (box.b1 - 1) // size + 1)

    def _rotor(self, buffer: bir_pb2.Buffer) -> str:
        """The rotation group of a rotating buffer: the buffers at one address with one copy size,
        as many copies and one loop rotating them take the same copy at every iteration, so
        their operands compare within one copy (`s0`, `s1`)."""
        key = (buffer.memory, buffer.address, buffer.bytes_per_partition, buffer.slots, buffer.private_to)
        name = self._rotor_names.get(key)
        if name is None:  # named once per group, not once per operand
            name = self._rotor_names[key] = "@".join(str(k) for k in key)
            self.rotors.setdefault(name, (buffer.private_to, buffer.slots, buffer.bytes_per_partition))
        return name

    # ---- the DAG ----------------------------------------------------------------------------
    def graph(self) -> DepGraph:
        graph = DepGraph()
        for instr in self.instructions:
            graph.add_node(instr.id)
        self._ordered(graph)
        members: dict[int, list[bir_pb2.Instruction]] = {loop_id: [] for loop_id in self.nest.loops}
        for instr in self.instructions:
            for loop_id in self.nest.chain_of(instr.id):
                members[loop_id].append(instr)
        if self.fork:  # the loops in a child (or here, after the top level, if the child fails)
            loops = forked.Forked(partial(self._loops, members, None))
            try:
                self._walk(graph, ROOT, self.instructions, 0)
            except BaseException:
                loops.cancel()
                raise
            findings = loops.result()
            self.forked = loops.ran_in_child
        else:
            self._walk(graph, ROOT, self.instructions, 0)
            findings = self._loops(members, graph)
        for merges, carried in findings:  # the edges a child found join in the order one process adds them
            for node, incoming in merges:
                graph.merge_strongest(node, incoming)
            self.carried += carried
        self._align(graph, members)
        return graph

    def _loops(self, members: dict[int, list[bir_pb2.Instruction]], graph: DepGraph | None) -> LoopFindings:
        """Each loop's walk and carried dependences, in the nest's order of loops: its edges added
        to `graph`, or (None: in a forked child) recorded for the parent to add."""
        found: LoopFindings = []
        for loop_id, body in members.items():
            merges = _Merges() if graph is None else graph
            carried: list[Carried] = []
            self._walk(merges, loop_id, body, self.nest.loops[loop_id].depth)
            if self.nest.loops[loop_id].barrier:
                self._carry_barrier(loop_id, body, carried)
            else:
                self._carry(loop_id, body, carried)
            found.append((merges.calls if isinstance(merges, _Merges) else [], carried))
        return found

    # ---- loops one after the other -------------------------------------------------------------
    def _align(self, graph: DepGraph, members: dict[int, list[bir_pb2.Instruction]]) -> None:
        """Let a loop's iterations follow an earlier sibling loop's iteration by iteration where
        that is all they depend on (the module docstring: aligned dependences)."""
        candidates: set[tuple[int, int]] = set()
        owner = self.nest.owner_map().get
        owners: set[tuple[int, int]] = set()  # (src's loop, dst's loop) of every edge, in edge order
        for src in graph.nodes:  # per node in Python, per edge in C: 365k edges at the 9-layer attention
            successors = graph.successors(src)
            mine = repeat(owner(src, ROOT), len(successors))
            owners.update(zip(mine, map(owner, successors, repeat(ROOT)), strict=True))
        for owner_src, owner_dst in owners:
            pair = self._siblings(owner_src, owner_dst)
            if pair is not None:
                candidates.add(pair)
        for first, second in sorted(candidates, key=lambda pair: self._position[members[pair[1]][0].id]):
            pairs = self._aligned_pairs(first, second, members)
            if not pairs:
                continue
            sources = {instr.id for instr in members[first]}
            graph.remove_edges_from([(src, instr.id) for instr in members[second]
                                     for src in list(graph.predecessors(instr.id)) if src in sources])
            for src, dst, scale, delta, code in pairs:
                self.carried.append(Carried(src, dst, second, -delta, code, first, scale))
            self.aligned += 1

    def _siblings(self, src: int, dst: int) -> tuple[int, int] | None:
        """The two sibling loops (children of one block) holding loops `src` and `dst`."""
        chain_src, chain_dst = self.nest.chain(src), self.nest.chain(dst)
        shared = 0
        while shared < min(len(chain_src), len(chain_dst)) and chain_src[shared] == chain_dst[shared]:
            shared += 1
        if shared >= len(chain_src) or shared >= len(chain_dst):
            return None
        return chain_src[shared], chain_dst[shared]

    def _aligned_pairs(self, first: int, second: int, members: dict[int, list[bir_pb2.Instruction]]
                       ) -> list[tuple[int, int, int, int, int]]:
        """(src, dst, scale, delta, code) for every conflict between loops `first` and `second`,
        when each is HBM whose step per iteration of `second` is `scale` times its step per
        iteration of `first`, so that iteration r of `second` needs iterations up to
        scale * r + delta of `first`, within its iterations; [] when some conflict is not so
        (on chip, steps that do not divide) and `second` must wait for the whole of `first`."""
        level = self.nest.loops[first].depth - 1  # boxes over every iteration of both loops
        exact = self.nest.loops[first].depth  # ... and at their iteration 0
        onchip_first, hbm_first = self._indexed_first(first, members)
        for instr in members[second]:  # any on-chip conflict: the whole first loop first
            for _, box in self.boxes(instr, level):
                if box.memory == birutil.HBM:
                    continue
                region, span = self._pages(box)
                there = onchip_first.get(region, {})
                if any(_meet(box, other) for page in span for other in there.get(page, ())):
                    return []
        pairs = []
        for instr in members[second]:
            at_zero = dict(self.boxes(instr, exact))
            for index, box in self.boxes(instr, level):
                if box.memory != birutil.HBM:
                    continue
                for src, src_index, hull, zero in hbm_first.get(box.region, ()):
                    if not (box.write or hull.write) or not _meet(box, hull):
                        continue
                    found = self._delta(src, src_index, zero, instr.id, index, at_zero[index], first, second)
                    if found is None:
                        return []
                    kind = _OUTPUT if box.write and hull.write else (_FLOW if hull.write else _ANTI)
                    pairs.append((src, instr.id, *found, kind + birutil.HBM))
        return pairs

    def _indexed_first(self, first: int, members: dict[int, list[bir_pb2.Instruction]]
                       ) -> tuple[dict[tuple, dict[int, list[_Box]]], dict[str, list[tuple]]]:
        """Loop `first`'s operands as _aligned_pairs looks them up: its on-chip boxes over every
        iteration by page, and its HBM ones by tensor with each one's box at iteration 0 (source,
        operand index, hull, box). Built once per loop: a loop that many later siblings follow
        (a layer's input, read by every nest of the layer) was indexed once per pair (0.5 s of
        the 9-layer attention's second analysis)."""
        found = self._first_index.get(first)
        if found is not None:
            return found
        level = self.nest.loops[first].depth - 1
        exact = self.nest.loops[first].depth
        onchip: dict[tuple, dict[int, list[_Box]]] = {}  # region -> page -> the loop's on-chip boxes there
        hbm: dict[str, list[tuple[int, int, _Box, _Box]]] = {}
        for instr in members[first]:
            at_zero = None
            for index, box in self.boxes(instr, level):
                if box.memory != birutil.HBM:
                    region, span = self._pages(box)
                    there = onchip.setdefault(region, {})
                    for page in span:
                        there.setdefault(page, []).append(box)
                else:
                    at_zero = at_zero if at_zero is not None else dict(self.boxes(instr, exact))
                    hbm.setdefault(box.region, []).append((instr.id, index, box, at_zero[index]))
        found = self._first_index[first] = (onchip, hbm)
        return found

    def _delta(self, src: int, src_index: int, src_box: _Box, dst: int, dst_index: int, dst_box: _Box,
               first: int, second: int) -> tuple[int, int] | None:
        """(scale, delta): the HBM operand of `dst` at iteration j of `second` meets the one of
        `src` at iteration i of `first` only for i <= scale * j + delta, and scale * j + delta
        stays within `first`'s iterations; None when the steps are not whole rows, or the
        second's not a multiple of the first's."""
        depth = self.nest.loops[first].depth
        step, later = _step(self.operands[src][src_index], depth), _step(self.operands[dst][dst_index], depth)
        width = self.widths.get(src_box.region, 0) or _WIDE
        if step <= 0 or later <= 0 or step % width or later % step:
            return None
        rows, scale = step // width, later // step
        # src at i meets dst at j iff i * rows - j * scale * rows lies in (dst.b0 - src.b1,
        # dst.b1 - src.b0): i - scale * j < (dst.b1 - src.b0) / rows
        delta = -(-(dst_box.b1 - src_box.b0) // rows) - 1
        if scale * (self.nest.loops[second].trip - 1) + delta > self.nest.loops[first].trip - 1:
            return None  # a late iteration would wait for one the first loop never runs
        return scale, delta

    def _ordered(self, graph: DepGraph) -> None:
        names: dict[str, int] = {}
        for instr in self.instructions:
            ordered = instr.attributes.get("order_after", "") if instr.attributes else ""
            for other in filter(None, (n.strip() for n in ordered.split(","))):
                if other not in names:
                    raise CompileError(
                        "E405",
                        f"{instr.name}: order_after names {other!r}, which is not an earlier instruction",
                    )
                graph.merge_predecessors(instr.id, {names[other]: edge_code("ORDERED", 0)})
            names[instr.name] = instr.id

    def _walk(self, graph: DepGraph | _Merges, block: int, members: list[bir_pb2.Instruction],
              level: int) -> None:
        """Conflicts at one iteration of `block` among its members (docstring: the walks).

        An instruction of an inner loop stands, for what follows the loop, for the latest
        instruction of that loop on its thread, whose last iteration completes after every earlier
        one's: what follows a loop gets an edge per thread of it, not one per instruction (and a
        box is kept once per thread). Its on-chip writes retire what came before the loop where
        the loop writes a whole buffer (every copy of a rotating one, in turn) over its
        iterations; never the loop's own accesses, whose order is the loop's own walk's to say."""
        pages: dict[tuple, dict[int, list[list[tuple]]]] = {}  # region -> page -> [reads, writes]
        latest: dict[tuple, int] = {}  # (inner loop, thread) -> its latest instruction
        whole = self._whole_buffers(members, level)  # (inner loop, buffer) -> the box it writes whole
        seen: set[tuple] = set()  # the (group, box) of inner loops in the pages (in all of the box's)
        # An inner loop's boxes join the pages when the walk leaves the loop, so that its own
        # instructions look only at what came before it (and each sees all of that).
        pending: list[tuple[tuple, _Box]] = []  # (group, box) of the inner loop being walked
        current: int | None = None

        def leave_loop() -> None:
            footprints = {box.buffer: whole[(current, box.buffer)] for _, box in pending
                          if box.write and (current, box.buffer) in whole}
            for footprint in footprints.values():  # what the loop writes whole retires what it covers
                region, span = self._pages(footprint)
                there = pages.get(region, {})
                for page in span:
                    entries = there.get(page)
                    if entries is not None:
                        for kind in (0, 1):
                            entries[kind][:] = _retire(entries[kind], footprint)
            hulls: dict[tuple, _Box] = {}  # an inner loop's HBM accesses: one hull per thread and tensor
            exact: list[tuple[tuple, _Box]] = []
            for group, box in pending:
                if box.memory == birutil.HBM:
                    key = (group, box.region, box.write)
                    old = hulls.get(key)
                    hulls[key] = box if old is None else _hull(old, box)
                else:
                    exact.append((group, box))
            exact += [(key[0], box) for key, box in hulls.items()]
            for group, box in exact:
                known = len(seen)
                seen.add((group, box))  # hashed once: a box is 13 fields
                if len(seen) == known:
                    continue
                # the group's latest instruction is final once the walk leaves its loop (a body
                # is one run of the order), so the entry names it rather than the group
                entry = _walk_entry(latest[group], box)
                region, span = self._pages(box)
                there = pages.setdefault(region, {})
                for page in span:
                    there.setdefault(page, [[], []])[1 if box.write else 0].append(entry)
            pending.clear()

        for instr in members:
            chain = self.nest.chain_of(instr.id)
            inner = chain[level] if len(chain) > level else None  # the child loop of block holding it
            if inner != current:
                if current is not None:
                    leave_loop()
                current = inner
            incoming: dict[int, int] = {}
            incoming_get = incoming.get
            boxes = [box for _, box in self.boxes(instr, level)]
            for box in boxes:
                checks = ((1, _OUTPUT), (0, _ANTI)) if box.write else ((1, _FLOW),)
                p0, p1, c0, c1, b0, b1, rotor = box.p0, box.p1, box.c0, box.c1, box.b0, box.b1, box.rotor
                region, span = self._pages(box)
                there = pages.get(region)
                if there is None:
                    continue
                for page in span:  # a loop's HBM hull spans up to 65 pages
                    entries = there.get(page)
                    if entries is None:
                        continue
                    for which, kind in checks:
                        code = kind + box.memory
                        for other, q0, q1, d0, d1, e0, e1, orotor, obox in entries[which]:
                            # this is the analysis's inner loop: most entries name a node already
                            # found at this code (an inner loop's thread has many boxes), so
                            # that is asked first; then _meet, inlined on the entry's fields
                            if incoming_get(other, -1) >= code:
                                continue
                            if not (q0 < p1 and p0 < q1 and d0 < c1 and c0 < d1 and e0 < b1 and b0 < e1):
                                continue
                            if rotor and rotor == orotor and not _meet(box, obox):
                                continue
                            incoming[other] = code
            if inner is not None:
                group = (inner, syncmodel.access_thread(instr))
                latest[group] = instr.id
                pending.extend((group, box) for box in boxes)
            else:
                for box in boxes:
                    entry = _walk_entry(instr.id, box)
                    region, span = self._pages(box)
                    there = pages.setdefault(region, {})
                    for page in span:
                        entries = there.setdefault(page, [[], []])
                        if box.write:  # a write of this block retires what it covers
                            for kind in (0, 1):
                                entries[kind][:] = _retire(entries[kind], box)
                        entries[1 if box.write else 0].append(entry)
            if incoming:
                graph.merge_strongest(instr.id, incoming)

    def _whole_buffers(self, members: list[bir_pb2.Instruction], level: int) -> dict[tuple, _Box]:
        """(inner loop, on-chip buffer) -> the buffer's whole box (every copy), for the buffers an
        inner loop's writes cover whole between them (a tile written in pieces of partitions, as
        split_dma cuts it), every copy of a rotating one over the iterations of a loop inside."""
        writes: dict[tuple, list[_Box]] = {}
        for instr in members:
            chain = self.nest.chain_of(instr.id)
            if len(chain) <= level:
                continue
            operands = self.operands[instr.id]
            for index, box in self.boxes(instr, level):
                if box.write and box.memory != birutil.HBM and not any(operands[index].steps[level:]):
                    # (a box that moves over the loops inside is a hull, not a write)
                    writes.setdefault((chain[level], box.buffer), []).append(box)
        found: dict[tuple, _Box] = {}
        for (inner, name), boxes in writes.items():
            if boxes[0].rotor and not self._rotates_whole(boxes[0].rotor, inner):
                continue
            buffer = self.buffers[name]
            size = buffer.bytes_per_partition
            relative = [b._replace(b0=b.s0, b1=b.s1) if b.rotor else b for b in boxes]
            base = 0 if not self.use_addresses or boxes[0].rotor else buffer.address
            target = boxes[0]._replace(p0=0, p1=buffer.partitions, b0=base, b1=base + size, rotor="")
            if not _union_covers(relative, target):
                continue
            copies = max(1, buffer.slots) if self.use_addresses else 1
            start = buffer.address if self.use_addresses else 0
            found[(inner, name)] = target._replace(b0=start, b1=start + copies * size)
        return found

    def _rotates_whole(self, rotor: str, inner: int) -> bool:
        """Whether a rotating buffer's copies all get written over the iterations of loop `inner`:
        the loop it rotates at is `inner` or inside it and runs at least once per copy."""
        loop_id, slots, _ = self.rotors[rotor]
        if loop_id not in self.nest.loops:
            return False
        return inner in self.nest.chain(loop_id) and self.nest.loops[loop_id].trip >= slots

    # ---- carried ----------------------------------------------------------------------------
    def _carry_barrier(self, loop_id: int, members: list[bir_pb2.Instruction], out: list[Carried]) -> None:
        """A barrier loop's carried dependences (a Repeat region's: a whole layer a trip, whose
        pairwise ones ran to 1.5M edges and 118k waits): the first instruction of every thread of
        the body follows the last of every other thread at the iteration before. That orders
        every pair of iterations (a thread runs its instructions in order, and a wait for a
        later instance of a thread is one for all its earlier ones), at the cost of their overlap."""
        if self.nest.loops[loop_id].trip < 2:
            return
        first: dict[object, int] = {}
        last: dict[object, int] = {}
        for instr in members:
            thread = syncmodel.access_thread(instr)
            first.setdefault(thread, instr.id)
            last[thread] = instr.id
        for producer, src in last.items():
            for consumer, dst in first.items():
                if producer != consumer:
                    out.append(Carried(src, dst, loop_id, 1, _FLOW + birutil.HBM))

    def _carry(self, loop_id: int, members: list[bir_pb2.Instruction], out: list[Carried]) -> None:
        """The dependences loop `loop_id` carries between its members (docstring: carried), onto `out`."""
        loop = self.nest.loops[loop_id]
        if loop.trip < 2:
            return
        level = loop.depth  # boxes at iteration 0 of the loop, swept over the loops inside it
        onchip: list[_Entry] = []
        hbm: list[_Entry] = []
        for instr in members:
            chain = self.nest.chain_of(instr.id)
            child = chain[level] if len(chain) > level else None  # the loop inside this one holding it
            for index, box in self.boxes(instr, level):
                entry = _Entry(instr.id, index, _step(self.operands[instr.id][index], level), box, child)
                (hbm if box.memory == birutil.HBM else onchip).append(entry)
        for distance in sorted(self._onchip_distances(loop, onchip)):
            self._carry_onchip(loop, onchip, distance, out)
        self._carry_hbm(loop, hbm, out)

    def _onchip_distances(self, loop: Loop, entries: list[_Entry]) -> set[int]:
        """The distances at which on-chip operands of the loop can meet again: 1, and the copies of
        each buffer that rotates at this loop's iterations."""
        found = {1}
        for entry in entries:
            rotor = entry.box.rotor
            if rotor and self._rotor_loop(rotor) == loop.id:
                found.add(self._rotor_slots(rotor))
        return found

    def _carry_onchip(self, loop: Loop, entries: list[_Entry], distance: int, out: list[Carried]) -> None:
        """The on-chip dependences of iteration r on iteration r - distance: the loop body walked
        twice, as the earlier iteration and then the later one, with the analyzer's retiring of
        covered accesses (an access the earlier iteration overwrote itself, or the later one
        before, is ordered through that write), so only the accesses that stay exposed across the
        iteration boundary give an edge. A pair meets at this distance when it meets in one buffer
        (or copy of a rotating one) `distance` iterations apart (`_meets_at`)."""
        pages: dict[tuple, dict[int, list[list[tuple[bool, _Entry]]]]] = {}  # region -> page -> lists
        found: dict[tuple[int, int], int] = {}
        for later in (False, True):
            for entry in entries:
                box = entry.box
                # Past distance 1 only two operands of one group that rotates at this loop over
                # `distance` copies, neither moving, meet (_meets_at): only those join the lists,
                # and the others only retire what they cover. The lists hold the same meeting
                # entries in the same order, without the rest (half the pairs tried in the
                # 9-layer attention's second analysis).
                meets = distance == 1 or (entry.step == 0 and bool(box.rotor)
                                          and self._rotor_loop(box.rotor) == loop.id
                                          and self._rotor_slots(box.rotor) == distance)
                region, span = self._pages(box)
                there = pages.setdefault(region, {})
                if later and meets:
                    checks = ((1, _OUTPUT), (0, _ANTI)) if box.write else ((1, _FLOW),)
                    for page in span:
                        lists = there.get(page)
                        if lists is None:
                            continue
                        for which, kind in checks:
                            for from_later, other in lists[which]:
                                if from_later or other.node == entry.node:
                                    continue
                                if self._meets_at(loop, other, entry, distance):
                                    pair = (other.node, entry.node)
                                    if found.get(pair, -1) < kind + box.memory:
                                        found[pair] = kind + box.memory
                moves = entry.step != 0
                for page in span:
                    lists = there.setdefault(page, [[], []])
                    if box.write and entry.child is None and not moves:  # a body write retires what it covers
                        # (a copy of a rotating buffer covers the earlier iteration's accesses of
                        # that buffer only when the two iterations take the same copy)
                        same_copy = not box.rotor or distance % self._rotor_slots(box.rotor) == 0
                        for which in (0, 1):
                            lists[which][:] = [e for e in lists[which] if not (
                                (e[0] == later or same_copy) and _covers(box, e[1].box))]
                    if meets:
                        lists[1 if box.write else 0].append((later, entry))
        for (src, dst), code in found.items():
            out.append(Carried(src, dst, loop.id, distance, code))

    def _meets_at(self, loop: Loop, earlier: _Entry, later: _Entry, distance: int) -> bool:
        """Whether on-chip operands `earlier` (iteration r - distance) and `later` (iteration r)
        touch common bytes. Pairs within one inner loop are that loop's to order: its own carried
        dependences cover this loop's iterations too, since every buffer they meet in is the same
        at each iteration or rotates over copies that divide the inner loop's trip (allocation),
        which then follow on across this loop's iterations, and a wait of the inner loop for "d
        iterations back" computes, at its first iterations, a threshold no less than that of the
        instance it needs in this loop's previous iteration (loop_sync)."""
        a, b = earlier.box, later.box
        if earlier.child is not None and earlier.child == later.child:
            return False
        step_a, step_b = earlier.step, later.step
        if step_a or step_b:  # an indexed array's operand moves with this loop
            return distance == 1 and self._moving_meet(loop, earlier, later, step_a, step_b)
        if not self.use_addresses:  # virtual buffers: only one that every iteration shares carries
            if distance != 1 or a.region != b.region or not _meet(a, b):
                return False
            buffer = self.buffers[a.region]
            return not (buffer.HasField("private_to") and loop.id in self._chain_to(buffer.private_to))
        same_rotor = a.rotor and a.rotor == b.rotor
        rotating_here = same_rotor and self._rotor_loop(a.rotor) == loop.id
        if rotating_here:  # copy r mod N: the same copy again N iterations later, and only then
            return distance == self._rotor_slots(a.rotor) and _meet(a, b)
        return distance == 1 and _meet(a, b)

    def _moving_meet(self, loop: Loop, earlier: _Entry, later: _Entry, step_a: int, step_b: int) -> bool:
        """Whether on-chip operands of which one moves with `loop` meet at any distance (reported
        at distance 1, which is safe): with one step, where the earlier's box moved by the step
        d >= 1 times meets the later's; else where their boxes over all the loop's iterations do."""
        a, b = earlier.box, later.box
        if not self.use_addresses and a.region != b.region:
            return False
        if step_a == step_b:
            if not (a.p0 < b.p1 and b.p0 < a.p1):
                return False
            # b at iteration r, a at r - d: b moved back by d steps meets a
            return _least_shift(b.b0, b.b1, a.b0, a.b1, step_a, loop.trip) is not None
        hulls = [dict(self.boxes(self._instruction(entry.node), loop.depth - 1))[entry.operand]
                 for entry in (earlier, later)]
        return _meet(hulls[0]._replace(rotor=""), hulls[1]._replace(rotor=""))

    def _instruction(self, node: int) -> bir_pb2.Instruction:
        return self.instructions[self._position[node]]

    def _rotor_loop(self, rotor: str) -> int:
        return self.rotors[rotor][0]

    def _rotor_slots(self, rotor: str) -> int:
        return self.rotors[rotor][1]

    def _carry_hbm(self, loop: Loop, entries: list[_Entry], out: list[Carried]) -> None:
        """HBM dependences the loop carries: per tensor that the body writes, every pair with a
        write at its least distance: 1 when the two move by different steps, 1 when neither moves
        and they meet, else the least d >= 1 at which one moved d steps meets the other (in rows
        when the step is whole rows, else in elements). Each operand's motion is worked out once
        (`_hbm_motion`), not once per pair: the pairs are quadratic in a tensor's operands."""
        by_tensor: dict[str, list[_Entry]] = {}
        for entry in entries:
            by_tensor.setdefault(entry.box.region, []).append(entry)
        best: dict[tuple[int, int], tuple[int, int]] = {}  # (src, dst) -> (distance, code)
        trip = loop.trip
        for tensor, group in by_tensor.items():
            writes = [e for e in group if e.box.write]
            if not writes:
                continue
            width = self.widths.get(tensor, 0) or _WIDE
            motion = {id(e): self._hbm_motion(e, width) for e in group}
            for a in group:
                step_a, rows_a, a0, a1 = motion[id(a)]
                box_a = a.box
                for b in writes if not box_a.write else group:
                    # b at iteration r - d, a at r: src b, dst a (one instruction is one thread, in order)
                    box_b = b.box
                    if a.node == b.node or not (box_a.write or box_b.write):
                        continue
                    step_b, _, b0, b1 = motion[id(b)]
                    if step_a != step_b:
                        distance: int | None = 1
                    elif step_a == 0:
                        distance = 1 if _meet(box_a, box_b) else None
                    elif rows_a and (box_a.c0 >= box_b.c1 or box_b.c0 >= box_a.c1):
                        distance = None
                    else:
                        distance = _least_shift(a0, a1, b0, b1, rows_a or step_a, trip)
                    if distance is None:
                        continue
                    kind = _OUTPUT if box_a.write and box_b.write else (_FLOW if box_b.write else _ANTI)
                    key = (b.node, a.node)
                    old = best.get(key)
                    if old is None or distance < old[0] or (distance == old[0] and kind > old[1]):
                        best[key] = (distance, kind + birutil.HBM)
        for (src, dst), (distance, code) in best.items():
            out.append(Carried(src, dst, loop.id, distance, code))

    def _hbm_motion(self, entry: _Entry, width: int) -> tuple[int, int, int, int]:
        """(step, rows, lo, hi) of an HBM operand in the searched loop: its step in elements per
        iteration; when that is whole rows of `width`, the rows it moves (else 0) and the rows
        [lo, hi) of its box, else the elements [lo, hi) it reaches at iteration 0."""
        step = entry.step
        if step == 0:
            return 0, 0, 0, 0
        if step % width == 0:
            return step, step // width, entry.box.b0, entry.box.b1
        return (step, 0, *_elements(self.operands[entry.node][entry.operand].ap))

    def _chain_to(self, loop_id: int) -> tuple[int, ...]:
        return self.nest.chain(loop_id) if loop_id in self.nest.loops else ()


class _Entry(NamedTuple):
    """An operand of a loop's member in the carried search: its step per iteration of the loop
    (_step, worked out once: the searches ask for it per pair) and its box at the loop's
    iteration 0."""

    node: int
    operand: int
    step: int
    box: _Box
    child: int | None  # the loop inside the searched one that holds the instruction (None: none)


def _step(operand: _Operand, depth: int) -> int:
    """An operand's step per iteration of its enclosing loop at `depth` (1-based)."""
    return operand.steps[depth - 1] if len(operand.steps) >= depth else 0


def _reach(steps: tuple[int, ...], trips: list[int]) -> tuple[int, int]:
    """How far below and above its first position an offset moving by `steps` reaches over
    loops of `trips` iterations."""
    low = high = 0
    for step, trip in zip(steps, trips, strict=False):
        reach = step * (trip - 1)
        if reach < 0:
            low += reach
        else:
            high += reach
    return low, high


def _elements(ap: bir_pb2.AccessPattern) -> tuple[int, int]:
    """[first, last + 1) element an HBM operand reaches at iteration 0."""
    span = birutil.element_span(ap) or (0, 0)
    return ap.offset + span[0], ap.offset + span[1] + 1


def _least_shift(a0: int, a1: int, b0: int, b1: int, step: int, trip: int) -> int | None:
    """The least d in 1 .. trip - 1 with [a0 + d step, a1 + d step) meeting [b0, b1); None if none."""
    # a0 + d s < b1 and b0 < a1 + d s  ->  d s in (b0 - a1, b1 - a0)
    lo, hi = b0 - a1, b1 - a0  # open interval for d * step
    if step > 0:
        first = lo // step + 1
        last = -(-hi // step) - 1
    else:
        up = -step
        first = -hi // up + 1
        last = -(lo // up) - 1
    first = max(first, 1)
    last = min(last, trip - 1)
    return first if first <= last else None


_PAGE = {birutil.SBUF: 4096, birutil.PSUM: 2048, birutil.HBM: 16}
_MAX_PAGES = 64  # an HBM tensor is cut in at most this many pages (of rows)




def _meet(a: _Box, b: _Box) -> bool:
    if not (a.p0 < b.p1 and b.p0 < a.p1 and a.c0 < b.c1 and b.c0 < a.c1 and a.b0 < b.b1 and b.b0 < a.b1):
        return False
    if a.rotor and a.rotor == b.rotor:  # one rotating buffer at one iteration: the same copy
        return a.s0 < b.s1 and b.s0 < a.s1
    return True


def _hull(a: _Box, b: _Box) -> _Box:
    """The least box holding both (of one memory and region)."""
    return a._replace(p0=min(a.p0, b.p0), p1=max(a.p1, b.p1), c0=min(a.c0, b.c0), c1=max(a.c1, b.c1),
                      b0=min(a.b0, b.b0), b1=max(a.b1, b.b1))


def _walk_entry(node: int, box: _Box) -> tuple:
    """What a walk's page lists hold of an access: (node, p0, p1, c0, c1, b0, b1, rotor, box),
    the fields its inner loop compares unpacked in one step rather than read one by one."""
    return (node, box.p0, box.p1, box.c0, box.c1, box.b0, box.b1, box.rotor, box)


def _retire(entries: list[tuple], write: _Box) -> list[tuple]:
    """A walk's entries (_walk_entry) less what `write` covers: an entry it covers goes,
    one it overlaps keeps the parts outside it (as the analyzer's _uncovered does), so that stale
    accesses do not pile up where buffers of other sizes came and went; later conflicts with a
    removed part are ordered through the write."""
    kept = []
    w0, w1, v0, v1, u0, u1 = write.p0, write.p1, write.c0, write.c1, write.b0, write.b1
    for entry in entries:
        _, q0, q1, d0, d1, e0, e1, rotor, box = entry
        if not (q0 < w1 and w0 < q1 and d0 < v1 and v0 < d1 and e0 < u1 and u0 < e1):  # _meet's boxes
            kept.append(entry)
        elif not _meet(write, box) or (write.rotor and write.rotor != rotor):
            kept.append(entry)
        elif not _covers(write, box):
            if write.rotor or box.rotor:
                kept.append(entry)  # copies of a rotating buffer: no parts to keep apart
            else:
                kept.extend(_walk_entry(entry[0], part) for part in _outside(box, write))
    return kept


_SPANS = tuple((_Box._fields.index(low), _Box._fields.index(high))
               for low, high in (("p0", "p1"), ("c0", "c1"), ("b0", "b1")))


def _outside(box: _Box, write: _Box) -> list[_Box]:
    """The parts of `box` outside `write` (they meet): up to two per dimension. Built by field
    position: `_replace` by keyword took 19 us a call, 4x this, and the 4-layer 7B decoder's two
    analyses make 85k calls."""
    parts = []
    rest = list(box)
    for low, high in _SPANS:
        lo, hi, cut_lo, cut_hi = rest[low], rest[high], write[low], write[high]
        if lo < cut_lo:
            part = rest.copy()
            part[high] = cut_lo
            parts.append(_Box._make(part))
        if cut_hi < hi:
            part = rest.copy()
            part[low] = cut_hi
            parts.append(_Box._make(part))
        rest[low], rest[high] = max(lo, cut_lo), min(hi, cut_hi)
    return parts


def _union_covers(writes: list[_Box], b: _Box) -> bool:
    """Whether the writes together cover every byte of b: those that span b's bytes cover its
    partitions between them (a tile written in pieces of partitions, as split_dma cuts one)."""
    spans = sorted((w.p0, w.p1) for w in writes
                   if w.c0 <= b.c0 and b.c1 <= w.c1 and w.b0 <= b.b0 and b.b1 <= w.b1)
    reached = b.p0
    for p0, p1 in spans:
        if p0 > reached:
            break
        reached = max(reached, p1)
    return reached >= b.p1


def _covers(a: _Box, b: _Box) -> bool:
    """Whether write a covers every byte b touches (at one iteration): a write of one copy of a
    rotating buffer covers only accesses of that copy; any other write its box, which then holds
    every copy of a rotating b."""
    if a.rotor:
        if a.rotor != b.rotor:
            return False
        return a.p0 <= b.p0 and b.p1 <= a.p1 and a.s0 <= b.s0 and b.s1 <= a.s1
    return (a.p0 <= b.p0 and b.p1 <= a.p1 and a.c0 <= b.c0 and b.c1 <= a.c1 and a.b0 <= b.b0
            and b.b1 <= a.b1)

