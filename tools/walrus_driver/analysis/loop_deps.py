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

The walks: one per block (the top level and each loop body), over the instructions of the
block and of the loops inside it in static order, each with its operands' boxes swept over the
loops inside the block; pairs within one inner loop are left to that loop's own walk, and an
instruction of an inner loop retires nothing (its box over all iterations is not one write).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from ncc.schemas import bir_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.walrus_driver.analysis import birutil
from ncc.tools.walrus_driver.analysis.depgraph import KIND_CODE, DepGraph, edge_code
from ncc.tools.walrus_driver.analysis.loopnest import ROOT, Loop, LoopNest

_FLOW, _OUTPUT, _ANTI = KIND_CODE["FLOW"] * 4, KIND_CODE["OUTPUT"] * 4, KIND_CODE["ANTI"] * 4
_WIDE = 1 << 62  # a row width that puts a whole HBM tensor in one row


@dataclass(frozen=True)
class Carried:
    """dst at iteration r of `loop` follows src at iteration r - distance (src's inner loops at
    their last iteration)."""

    src: int
    dst: int
    loop: int
    distance: int
    code: int


class _Box(NamedTuple):
    """One operand's bytes: region (virtual buffer, "" for an allocated memory, or an HBM tensor),
    partitions [p0, p1), bytes or (HBM) columns [c0, c1) and rows [b0, b1); a rotating buffer's
    operand also carries its buffer (`rotor`) and its box within one copy (s0, s1), and its
    [b0, b1) then spans every copy."""

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


class _Operand(NamedTuple):
    """What the walks need of one operand: its box at iteration 0 of every loop and how it moves."""

    ap: bir_pb2.AccessPattern
    write: bool
    steps: tuple[int, ...]  # HBM: element step per enclosing loop (outermost first); () on chip


class LoopDeps:
    """Builds ctx.deps and ctx.carried for a program with loops (see the module docstring)."""

    def __init__(self, program: bir_pb2.Program, nest: LoopNest, use_addresses: bool,
                 widths: dict[str, int]) -> None:
        self.program = program
        self.use_addresses = use_addresses
        self.widths = widths
        self.nest = nest
        self.buffers = birutil.buffer_map(program)
        self.instructions = list(program.instructions)
        self.operands = {i.id: list(self._operands(i)) for i in self.instructions}
        self.carried: list[Carried] = []

    # ---- operands and boxes -----------------------------------------------------------------
    def _operands(self, instr: bir_pb2.Instruction) -> Iterator[_Operand]:
        accumulating = instr.accumulate and instr.op == "matmul"
        for write, operands in ((False, instr.inputs), (True, instr.outputs)):
            for ap in operands:
                steps = tuple(v.step for v in ap.loop) if ap.memory == birutil.HBM else ()
                yield _Operand(ap, write, steps)
                if write and accumulating:
                    yield _Operand(ap, False, steps)

    def boxes(self, instr: bir_pb2.Instruction, level: int) -> list[tuple[int, _Box]]:
        """(operand index, box) of each operand that touches something: its box at iteration 0
        of the instruction's outermost `level` loops, swept over the iterations of the loops
        inside them."""
        chain = self.nest.chain_of(instr.id)
        swept = [self.nest.loops[loop].trip for loop in chain[level:]]
        result = []
        for index, operand in enumerate(self.operands[instr.id]):
            box = self._box(operand, level, swept, instr.name)
            if box is not None:
                result.append((index, box))
        return result

    def _box(self, operand: _Operand, level: int, swept: list[int], where: str) -> _Box | None:
        ap, write = operand.ap, operand.write
        if ap.memory == birutil.HBM:
            width = self.widths.get(ap.tensor, 0) or _WIDE
            steps = operand.steps[level:] if operand.steps else ()
            return self._hbm_box(ap, width, steps, swept, write)
        if ap.memory not in birutil.ONCHIP:
            raise CompileError("E405", f"{where}: operand {ap.tensor!r} has no memory class", where)
        span = birutil.operand_box(ap, self.buffers, False, where)
        if span is None:
            return None
        _, p0, p1, b0, b1 = span
        if not self.use_addresses:
            return _Box(ap.memory, ap.tensor, p0, p1, 0, 1, b0, b1, write, "", 0, 0)
        buffer = self.buffers[ap.tensor]
        base = buffer.address
        if buffer.slots > 1:
            span_bytes = (buffer.slots - 1) * buffer.bytes_per_partition
            return _Box(ap.memory, "", p0, p1, 0, 1, base + b0, base + b1 + span_bytes, write, ap.tensor, b0, b1)
        return _Box(ap.memory, "", p0, p1, 0, 1, base + b0, base + b1, write, "", 0, 0)

    @staticmethod
    def _hbm_box(ap: bir_pb2.AccessPattern, width: int, steps: tuple[int, ...], swept: list[int],
                 write: bool) -> _Box | None:
        box = birutil.hbm_box(ap, width)
        if box is None:
            return None
        c0, c1, r0, r1 = box
        low = high = 0
        for step, trip in zip(steps, swept, strict=False):
            reach = step * (trip - 1)
            if reach < 0:
                low += reach
            else:
                high += reach
        if low or high:
            if all(step % width == 0 for step in steps):
                r0, r1 = r0 + low // width, r1 + high // width
            else:
                span = birutil.element_span(ap) or (0, 0)
                c0, c1 = 0, width
                r0 = (ap.offset + span[0] + low) // width
                r1 = (ap.offset + span[1] + high) // width + 1
        return _Box(birutil.HBM, ap.tensor, 0, 1, c0, c1, r0, r1, write, "", 0, 0)

    # ---- the DAG ----------------------------------------------------------------------------
    def graph(self) -> DepGraph:
        graph = DepGraph()
        for instr in self.instructions:
            graph.add_node(instr.id)
        self._ordered(graph)
        self._walk(graph, ROOT, self.instructions, 0)
        for loop_id in self.nest.loops:
            members = self._members(loop_id)
            self._walk(graph, loop_id, members, self.nest.loops[loop_id].depth)
            self._carry(loop_id, members)
        return graph

    def _members(self, loop_id: int) -> list[bir_pb2.Instruction]:
        return [i for i in self.instructions if loop_id in self.nest.chain_of(i.id)]

    def _ordered(self, graph: DepGraph) -> None:
        names: dict[str, int] = {}
        for instr in self.instructions:
            ordered = instr.attributes.get("order_after", "") if instr.attributes else ""
            for other in filter(None, (n.strip() for n in ordered.split(","))):
                if other not in names:
                    raise CompileError(
                        "E405", f"{instr.name}: order_after names {other!r}, which is not an earlier instruction"
                    )
                graph.merge_predecessors(instr.id, {names[other]: edge_code("ORDERED", 0)})
            names[instr.name] = instr.id

    def _walk(self, graph: DepGraph, block: int, members: list[bir_pb2.Instruction], level: int) -> None:
        """Conflicts at one iteration of `block` among its members (docstring: the walks)."""
        pages: dict[tuple, list[list[tuple]]] = {}
        for instr in members:
            chain = self.nest.chain_of(instr.id)
            inner = chain[level] if len(chain) > level else None  # the child loop of block holding it
            incoming: dict[int, int] = {}
            boxes = [box for _, box in self.boxes(instr, level)]
            for box in boxes:
                for key in _pages(box):
                    entries = pages.get(key)
                    if entries is None:
                        continue
                    checks = ((1, _OUTPUT), (0, _ANTI)) if box.write else ((1, _FLOW),)
                    for which, kind in checks:
                        for other, other_inner, obox in entries[which]:
                            if other == instr.id or (inner is not None and other_inner == inner):
                                continue
                            if _meet(box, obox):
                                code = kind + box.memory
                                if incoming.get(other, -1) < code:
                                    incoming[other] = code
            for box in boxes:
                for key in _pages(box):
                    entries = pages.setdefault(key, [[], []])
                    if box.write and inner is None:  # a write of this block retires what it covers
                        for which in (0, 1):
                            entries[which][:] = [e for e in entries[which] if not _covers(box, e[2])]
                    entries[1 if box.write else 0].append((instr.id, inner, box))
            if incoming:
                graph.merge_strongest(instr.id, incoming)

    # ---- carried ----------------------------------------------------------------------------
    def _carry(self, loop_id: int, members: list[bir_pb2.Instruction]) -> None:
        """The dependences loop `loop_id` carries between its members (docstring: carried)."""
        loop = self.nest.loops[loop_id]
        level = loop.depth  # boxes at iteration 0 of the loop, swept over the loops inside it
        whole = loop.depth - 1  # ... and swept over this loop too: every iteration
        pages: dict[tuple, list[_Entry]] = {}
        for instr in members:
            exact = dict(self.boxes(instr, level))
            for index, hull in self.boxes(instr, whole):
                entry = _Entry(instr.id, index, hull, exact[index])
                for key in _pages(hull):
                    pages.setdefault(key, []).append(entry)
        best: dict[tuple[int, int], tuple[int, int]] = {}  # (src, dst) -> (distance, code)
        for entries in pages.values():
            if not any(e.hull.write for e in entries):
                continue
            for a in entries:
                for b in entries:
                    # b at iteration r - d, a at r: src b, dst a (one instruction is one thread, in order)
                    if a.node == b.node or not (a.hull.write or b.hull.write) or not _meet(a.hull, b.hull):
                        continue
                    distance = self._distance(loop, a, b)
                    if distance is None:
                        continue
                    kind = _OUTPUT if a.hull.write and b.hull.write else (_FLOW if b.hull.write else _ANTI)
                    code = kind + a.hull.memory
                    key = (b.node, a.node)
                    old = best.get(key)
                    if old is None or distance < old[0] or (distance == old[0] and code > old[1]):
                        best[key] = (distance, code)
        for (src, dst), (distance, code) in best.items():
            self.carried.append(Carried(src, dst, loop_id, distance, code))

    def _distance(self, loop: Loop, a: _Entry, b: _Entry) -> int | None:
        """The least d >= 1 at which a's operand (iteration r) meets b's (iteration r - d); None
        when they never meet at different iterations of the loop."""
        if loop.trip < 2:
            return None
        if a.box.memory == birutil.HBM:
            return self._hbm_distance(loop, a, b)
        return self._onchip_distance(loop.id, a.box, b.box)

    def _hbm_distance(self, loop: Loop, a: _Entry, b: _Entry) -> int | None:
        operand_a, operand_b = self.operands[a.node][a.operand], self.operands[b.node][b.operand]
        step_a, step_b = _step(operand_a, loop.depth), _step(operand_b, loop.depth)
        box_a, box_b = a.box, b.box
        if step_a != step_b:
            return 1
        if step_a == 0:
            return 1 if _meet(box_a, box_b) else None
        width = self.widths.get(box_a.region, 0) or _WIDE
        if step_a % width == 0:  # rows move by step / width per iteration
            if box_a.c0 >= box_b.c1 or box_b.c0 >= box_a.c1:
                return None
            return _least_shift(box_a.b0, box_a.b1, box_b.b0, box_b.b1, step_a // width, loop.trip)
        span_a, span_b = _elements(operand_a.ap), _elements(operand_b.ap)
        return _least_shift(span_a[0], span_a[1], span_b[0], span_b[1], step_a, loop.trip)

    def _onchip_distance(self, loop_id: int, box_a: _Box, box_b: _Box) -> int | None:
        if not self.use_addresses:
            if box_a.region != box_b.region or not _meet(box_a, box_b):
                return None
            buffer = self.buffers[box_a.region]
            if buffer.HasField("private_to") and loop_id in self._chain_to(buffer.private_to):
                return None  # fresh at every iteration of this loop
            return 1
        if not _meet(box_a, box_b):
            return None
        if box_a.rotor and box_a.rotor == box_b.rotor:
            buffer = self.buffers[box_a.rotor]
            if buffer.private_to == loop_id:  # copy r mod N: the same copy again N iterations on
                return max(1, buffer.slots)  # (_meet compared the boxes within one copy)
        return 1

    def _chain_to(self, loop_id: int) -> tuple[int, ...]:
        return self.nest.chain(loop_id) if loop_id in self.nest.loops else ()


class _Entry(NamedTuple):
    """An operand of a loop's member in the carried search: its box over every iteration of the
    loop (`hull`) and at the loop's iteration 0 (`box`)."""

    node: int
    operand: int
    hull: _Box
    box: _Box


def _step(operand: _Operand, depth: int) -> int:
    """An HBM operand's element step per iteration of its enclosing loop at `depth` (1-based)."""
    return operand.steps[depth - 1] if len(operand.steps) >= depth else 0


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


def _pages(box: _Box) -> list[tuple[int, str, int]]:
    """The lookup pages a box falls in: (memory, region, page) keys."""
    size = _PAGE.get(box.memory, 4096)
    return [(box.memory, box.region, page) for page in range(box.b0 // size, (box.b1 - 1) // size + 1)]


def _meet(a: _Box, b: _Box) -> bool:
    if not (a.p0 < b.p1 and b.p0 < a.p1 and a.c0 < b.c1 and b.c0 < a.c1 and a.b0 < b.b1 and b.b0 < a.b1):
        return False
    if a.rotor and a.rotor == b.rotor:  # one rotating buffer at one iteration: the same copy
        return a.s0 < b.s1 and b.s0 < a.s1
    return True


def _covers(a: _Box, b: _Box) -> bool:
    """Whether write a covers every byte b touches (at one iteration)."""
    if a.rotor or b.rotor:
        if not (a.rotor and a.rotor == b.rotor):
            return False
        return a.p0 <= b.p0 and b.p1 <= a.p1 and a.s0 <= b.s0 and b.s1 <= a.s1
    return (a.p0 <= b.p0 and b.p1 <= a.p1 and a.c0 <= b.c0 and b.c1 <= a.c1 and a.b0 <= b.b0
            and b.b1 <= a.b1)

