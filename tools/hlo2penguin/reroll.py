"""Repeated blocks of straight-line HLO rolled back into a while loop, before lowering (loop
rerolling).

Why: a framework that traces a Python loop writes its body once per iteration. A stack of layers
that share their weights (the scale family's 9 attention layers, an ALBERT-style encoder), a
chain that repeats its ops, or any loop PyTorch/XLA traces reaches ncc as R copies of the same
instructions, and every job after the first lowered, optimized, scheduled and packed all R of
them. Rolled back into a `while` here, the body becomes one Repeat region
(repeat.py) and the backend sees it once: compile time follows the program's size, not R.

What is found, in the entry computation (instructions in the order written, operands first): R >=
MIN_BLOCKS consecutive runs of p instructions, each the run before it shifted by p positions: at
each offset the same opcode, shape and attributes, and each operand either

  * the instruction p positions later than the run before's operand (*shifted*): inside the block,
    or a member of the block before it (a value *carried* from block to block, which the first
    block reads from the instructions written just before the runs: the carry's initial value); or
  * the same instruction in every block (*invariant*), written before the runs: a weight, or a
    constant, which the body computes itself (a constant kept a constant lowers to an immediate).

A value no later than the block after its own may read it, and after the runs only the last block's
carried values may be read (a run whose last block is read otherwise is shortened by one). The
period found is the one that covers most instructions; among its phases, the one that carries
fewest values. Blocks are grouped `per_trip` to a trip, so that a trip holds enough work that its
carries' round trip through HBM (repeat.py) is a small part of it; the blocks left over stay
straight-line code after the loop. Nothing is rolled unless the runs hold at least MIN_WORK tiles of
work: a small repetition unrolls anyway, and rolled and unrolled again would only reorder it. The
search is bounded (SEARCH_STEPS): a module that looks periodic everywhere and rolls nowhere costs
a fraction of a second.

The evaluator runs the module as written, so `--verify` compares the rolled program against it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ncc.schemas import hlo_pb2
from ncc.tools.hlo.hlo_types import T, dims, entry_computation
from ncc.tools.hlo.shape_inference import array_shape
from ncc.tools.hlo2penguin.hlo_cse import alike_computations, computed_key

Instr = hlo_pb2.HloInstructionProto
Shape = hlo_pb2.ShapeProto

MIN_BLOCKS = 4          # fewer blocks are not rolled (repeat.py keeps no loop of fewer trips)
MAX_PERIOD = 4_096      # the longest block looked for, in HLO instructions
MAX_REGIONS = 8         # rolled per module; each search is over the whole entry computation
# the search's steps (an instruction compared with the one a period later, or checked as a
# block's) before it settles for the best found so far: a running product multiplied by a new
# parameter at each of 8,000 steps otherwise took 22 s to find nothing; the 12,500-op chain
# needs 12,641
SEARCH_STEPS = 250_000
ELEMENT_COMPARES = 200_000_000  # the periods tried times the instructions they compare
TILE_ELEMENTS = 128 * 512
MIN_WORK = 4_096        # tiles of work (one op on 128 x 512 elements) the runs must hold
# tiles of work a trip must hold per tile it carries: each carried tile goes to HBM and back and is
# copied once a trip (about 2.5 us, against 0.4 us for an elementwise op on it). At 128 the
# 12,500-op chain runs 1.026x its unrolled time and the 9-layer attention 1.001x its layers
# unrolled in the HLO. Blocks that reduce but hold no dot paid more a trip, why not examined:
# 200 blocks of a row normalization, rolled 26 to a trip, ran 1.29x unrolled; at 1,024 they are
# not rolled. (The chain at 1,024, 342 blocks a trip, ran 1.004x but compiled in 8.3 s, not 3.6.)
WORK_PER_CARRIED_TILE = 128
REDUCING_WORK_PER_CARRIED_TILE = 1_024
_PE_OPS = frozenset({"dot", "convolution"})
_REDUCING_OPS = frozenset({"reduce", "reduce-window"})
# opcodes that never roll: their value is not a function of their operands (a new random number
# each time), they have effects, or they are control flow of their own
_NEVER = frozenset({
    "parameter", "rng", "rng-get-and-update-state", "custom-call", "infeed", "outfeed", "send",
    "send-done", "recv", "recv-done", "after-all", "add-dependency", "while", "conditional",
    "all-reduce", "all-gather", "all-to-all", "collective-permute", "reduce-scatter", "partition-id",
    "replica-id", "optimization-barrier",
})
# opcodes that cost no tile of work of their own (views and plumbing)
_FREE = frozenset({"constant", "iota", "broadcast", "reshape", "transpose", "slice", "reverse", "bitcast",
                   "tuple", "get-tuple-element"})


@dataclass(frozen=True)
class Region:
    """`blocks` runs of `period` instructions from position `start` of the entry computation."""

    start: int
    period: int
    blocks: int
    carried: tuple[int, ...]    # offsets in the block of the members the next block reads
    initial: tuple[int, ...]    # positions of their values before the first block
    invariants: tuple[int, ...]  # positions (before start) of what every block reads the same

    @property
    def end(self) -> int:
        return self.start + self.period * self.blocks


def reroll_repeats(module: hlo_pb2.HloModuleProto) -> hlo_pb2.HloModuleProto:
    """`module` itself when its entry computation holds no repeated blocks worth rolling, else a
    copy with each such run of blocks rolled into a while loop."""
    rolled = module
    for _ in range(MAX_REGIONS):
        entry = entry_computation(rolled)
        if entry is None:
            break
        region = find_region(entry, alike_computations(rolled))
        if region is None:
            break
        if rolled is module:
            rolled = hlo_pb2.HloModuleProto()
            rolled.CopyFrom(module)
        _Rewriter(rolled, entry_computation(rolled), region).run()
    return rolled


# ---- finding the blocks ---------------------------------------------------------------------------
class _Search:
    def __init__(self, comp: hlo_pb2.HloComputationProto, alike: dict[int, int]) -> None:
        self.instrs = list(comp.instructions)
        self.position = {instr.id: i for i, instr in enumerate(self.instrs)}
        self.operands = [[self.position.get(o, -1) for o in instr.operand_ids] for instr in self.instrs]
        self.users: list[list[int]] = [[] for _ in self.instrs]
        for i, ops in enumerate(self.operands):
            for o in ops:
                if o >= 0:
                    self.users[o].append(i)
        root = self.position.get(comp.root_id, len(self.instrs) - 1)
        # the last position reading each instruction (past the end for the root)
        self.last_read = np.array([max(users, default=i) for i, users in enumerate(self.users)],
                                  dtype=np.int64)
        self.last_read[root] = len(self.instrs)
        keys: dict[bytes, int] = {}
        kinds = []
        for i, instr in enumerate(self.instrs):
            if instr.opcode in _NEVER or instr.control_predecessor_ids or -1 in self.operands[i]:
                kinds.append(-1 - i)  # matches nothing
            else:
                kinds.append(keys.setdefault(computed_key(instr, [], alike), len(keys)))
        self.kinds = np.array(kinds, dtype=np.int64)
        # per instruction, how far back its nearest operand is: a carried value is read at most
        # two blocks' length after it is written
        self.nearest = np.array([min((i - o for o in ops if o >= 0), default=len(self.instrs))
                                 for i, ops in enumerate(self.operands)], dtype=np.int64)
        self.steps_left = SEARCH_STEPS
        self.tiles = np.array([_tiles(instr.shape) for instr in self.instrs], dtype=np.int64)
        self.work = np.array([self._work(i) for i in range(len(self.instrs))], dtype=np.int64)

    def _work(self, i: int) -> int:
        """Tiles of work of instruction i: one per result tile, a dot's once per 128 rows of its
        contraction (a PE pass each; fp32 passes at a quarter of the rate: docs/target.md);
        layout ops and constants none."""
        instr = self.instrs[i]
        if instr.opcode in _FREE:
            return 0
        if instr.opcode == "dot" and self.operands[i][0] >= 0:
            sizes = dims(self.instrs[self.operands[i][0]].shape)
            depth = math.prod(sizes[d] for d in instr.dot_dimension_numbers.lhs_contracting_dimensions)
            rate = 4 if self.instrs[self.operands[i][0]].shape.element_type == T.F32 else 1
            return int(self.tiles[i]) * -(-depth // 128) * rate
        return int(self.tiles[i])

    def _spend(self, steps: int) -> None:
        self.steps_left -= steps
        if self.steps_left < 0:
            raise _SearchSpent

    def shifted_alike(self, i: int, period: int) -> bool:
        """Instruction i + period is instruction i shifted: each operand shifted or the same."""
        pairs = zip(self.operands[i], self.operands[i + period], strict=True)
        return all(b in (a, a + period) for a, b in pairs)

    def runs(self, period: int) -> list[tuple[int, int]]:
        """[a, b): maximal runs where every i has the opcode, shape and attributes of i + period,
        long enough for MIN_BLOCKS blocks."""
        same = self.kinds[:-period] == self.kinds[period:]
        least = (MIN_BLOCKS - 1) * period
        edges = np.flatnonzero(np.diff(np.concatenate(([0], same.astype(np.int8), [0]))))
        return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)
                if b - a >= least and bool((self.nearest[a:b] < 2 * period).any())]

    def shifted_runs(self, period: int, a: int, b: int) -> list[tuple[int, int]]:
        """The parts of run [a, b) where every i also has i + period shifted alike, long enough
        for MIN_BLOCKS blocks."""
        found, least, start = [], (MIN_BLOCKS - 1) * period, None
        self._spend(b - a)
        for i in range(a, b + 1):
            if i < b and self.shifted_alike(i, period):
                start = i if start is None else start
            elif start is not None:
                if i - start >= least:
                    found.append((start, i))
                start = None
        return found

    def region(self, period: int, start: int, blocks: int) -> Region | None:
        """The region of `blocks` blocks from `start`, whose blocks after the first are known to be
        their predecessors shifted; None where the first block is not the second one's likeness
        (the same instructions, each operand shifted, the same, or read from before the blocks as
        the initial value of what the second block reads from the first), or a value is read
        where it may not be (module docstring)."""
        if start < 0 or blocks < MIN_BLOCKS:
            return None
        end = start + period * blocks
        self._spend(period)
        initial: dict[int, int] = {}  # offset of a carried member -> position of its initial value
        invariants = set()
        for i in range(start, start + period):
            if self.kinds[i] != self.kinds[i + period]:
                return None
            for a, b in zip(self.operands[i], self.operands[i + period], strict=True):
                if b == a + period and a >= start:
                    continue  # inside the block
                if b == a and a < start:
                    invariants.add(a)
                elif a < start <= b < start + period and initial.setdefault(b - start, a) == a \
                        and self.instrs[a].shape == self.instrs[b].shape:
                    continue
                else:
                    return None
        if not initial or set(initial.values()) & invariants:
            return None
        read_after = np.flatnonzero(self.last_read[start:end] >= end)  # offsets from start
        if len(read_after) and (read_after[0] < (blocks - 1) * period
                                or not set((read_after % period).tolist()) <= initial.keys()):
            return None  # only the last block's carried values may be read after the blocks
        carried = tuple(sorted(initial))
        return Region(start, period, blocks, carried, tuple(initial[j] for j in carried),
                      tuple(sorted(invariants)))

    def best_in_run(self, period: int, a: int, b: int) -> Region | None:
        """The region of run [a, b) (blocks a..b + period, and the one before them if it is the
        first) that covers most, then carries least, over the run's phases."""
        best: Region | None = None
        for phase in range(a, min(a + period, b)):
            most = (b - phase) // period + 1
            # the block before the run (its first: it reads its carries from elsewhere), then a
            # last block read after the run left out
            tries = ((phase - period, most + 1), (phase - period, most), (phase, most), (phase, most - 1))
            region = next((r for s, n in tries if (r := self.region(period, s, n)) is not None), None)
            if region is not None and (best is None or _better(region, best)):
                best = region
        return best


def find_region(comp: hlo_pb2.HloComputationProto, alike: dict[int, int]) -> Region | None:
    """The repeated blocks of `comp` that cover the most instructions and hold at least MIN_WORK
    tiles of work, grouped per trip (module docstring); None when there are none."""
    search = _Search(comp, alike)
    n = len(search.instrs)
    best: Region | None = None
    covered: list[tuple[int, int, int]] = []  # (period, start, end) of regions found
    try:
        for period in range(1, min(n // MIN_BLOCKS, MAX_PERIOD, ELEMENT_COMPARES // max(n, 1)) + 1):
            best = _best_of_period(search, period, covered, best)
    except _SearchSpent:
        pass  # the best found so far
    return best


def _best_of_period(search: _Search, period: int, covered: list[tuple[int, int, int]],
                    best: Region | None) -> Region | None:
    """`best`, or a region of `period` blocks that beats it (find_region)."""
    for a, b in search.runs(period):
        if any(period % p == 0 and min(e, b + period) - max(s, a) >= 0.9 * (b + period - a)
               for p, s, e in covered):
            continue  # a multiple of a period already found over (most of) the same run
        for c, d in search.shifted_runs(period, a, b):
            region = search.best_in_run(period, c, d)
            if region is None:
                continue
            covered.append((period, region.start, region.end))
            if int(search.work[region.start:region.end].sum()) < MIN_WORK:
                continue
            grouped = _grouped(search, region)
            if grouped is not None and (best is None or _better(grouped, best)):
                best = grouped
    return best


class _SearchSpent(Exception):
    """The search used its SEARCH_STEPS."""


def _better(a: Region, b: Region) -> bool:
    """More instructions covered, then fewer carries, then shorter blocks."""
    def rank(r: Region) -> tuple[int, int, int]:
        return r.period * r.blocks, -len(r.carried), -r.period
    return rank(a) > rank(b)


def _grouped(search: _Search, region: Region) -> Region | None:
    """`region` with its blocks grouped so that a trip holds WORK_PER_CARRIED_TILE tiles of work
    per tile it carries (REDUCING_WORK_PER_CARRIED_TILE where the blocks reduce and hold no dot
    or convolution), with MIN_BLOCKS trips still; the blocks left over are left out of it.
    None when no grouping does: the HBM round trips of the carries would cost more than rolling
    saves (unrolled, consecutive blocks fuse and keep their values on chip)."""
    block = range(region.start, region.start + region.period)
    block_work = max(1, int(search.work[block.start:block.stop].sum()))
    carried_tiles = sum(int(search.tiles[region.start + j]) for j in region.carried)
    opcodes = {search.instrs[i].opcode for i in block}
    reducing = bool(opcodes & _REDUCING_OPS) and not opcodes & _PE_OPS
    ratio = REDUCING_WORK_PER_CARRIED_TILE if reducing else WORK_PER_CARRIED_TILE
    per_trip = max(1, -(-ratio * carried_tiles // block_work))
    if region.blocks // per_trip < MIN_BLOCKS:
        return None
    if per_trip == 1:
        return region
    return search.region(region.period * per_trip, region.start, region.blocks // per_trip)


def _tiles(shape: Shape) -> int:
    return -(-_elements(shape) // TILE_ELEMENTS)


def _elements(shape: Shape) -> int:
    if shape.element_type == T.TUPLE:
        return sum(_elements(s) for s in shape.tuple_shapes)
    return math.prod(shape.dimensions)


# ---- rolling them ----------------------------------------------------------------------------------
def _tuple_shape(shapes: list[Shape]) -> Shape:
    return Shape(element_type=T.TUPLE, tuple_shapes=shapes)


class _Rewriter:
    """Replaces the region's instructions in the entry computation by the state's tuple, a while
    loop over a new body and condition, and the loop's carried results."""

    def __init__(self, module: hlo_pb2.HloModuleProto, entry: hlo_pb2.HloComputationProto,
                 region: Region) -> None:
        self.module, self.entry, self.region = module, entry, region
        self.next_id = 1 + max(i.id for c in module.computations for i in c.instructions)
        self.next_computation = 1 + max(c.id for c in module.computations)
        self.names = {i.name for c in module.computations for i in c.instructions}

    def _unique(self, name: str) -> str:
        unique, k = name, 1
        while unique in self.names:
            unique, k = f"{name}.{k}", k + 1
        self.names.add(unique)
        return unique

    def _new(self, name: str, opcode: str, shape: Shape, operands: list[Instr], **fields) -> Instr:
        instr = Instr(name=self._unique(name), opcode=opcode, shape=shape, id=self.next_id,
                      operand_ids=[o.id for o in operands], **fields)
        self.next_id += 1
        return instr

    def run(self) -> None:
        region, instrs = self.region, list(self.entry.instructions)
        block = instrs[region.start:region.start + region.period]
        first = block[0].name
        fixed = _fixed(instrs[:region.start])
        passed = [instrs[v] for v in region.invariants if instrs[v].id not in fixed]
        carried = [block[j] for j in region.carried]
        counter_shape = array_shape(T.S32, [])
        state = _tuple_shape([counter_shape] + [c.shape for c in carried] + [p.shape for p in passed])
        body = self._body(instrs, fixed, passed, carried, state)
        condition = self._condition(first, state)
        zero = self._new(f"{first}.trip0", "constant", counter_shape, [],
                         literal=hlo_pb2.LiteralProto(shape=counter_shape, s32s=[0]))
        inits = [instrs[v] for v in region.initial]
        init = self._new(f"{first}.state", "tuple", state, [zero, *inits, *passed])
        loop = self._new(f"rolled.{first}", "while", state, [init],
                         called_computation_ids=[body.id, condition.id])
        loop.metadata.op_name = f"{region.blocks} trips of {region.period} instructions from {first}, rolled"
        results = {}
        outs = []
        for k, member in enumerate(carried):
            out = self._new(f"{member.name}.last", "get-tuple-element", member.shape, [loop],
                            tuple_index=k + 1)
            last = instrs[region.end - region.period + region.carried[k]]
            results[last.id] = out.id
            outs.append(out)
        after = instrs[region.end:]
        for instr in after:
            if any(o in results for o in instr.operand_ids):
                ids = [results.get(o, o) for o in instr.operand_ids]
                del instr.operand_ids[:]
                instr.operand_ids.extend(ids)
        self.entry.root_id = results.get(self.entry.root_id, self.entry.root_id)
        written = _without_dead_constants(instrs[:region.start] + [zero, init, loop] + outs + after, fixed,
                                          self.entry.root_id)
        del self.entry.instructions[:]
        self.entry.instructions.extend(written)
        position = list(self.module.computations).index(self.entry)
        self.module.computations.insert(position, body)
        self.module.computations.insert(position, condition)

    def _body(self, instrs: list[Instr], fixed: set[int], passed: list[Instr], carried: list[Instr],
              state: Shape) -> hlo_pb2.HloComputationProto:
        """The first block's instructions on the state (counter, carries, invariants passed
        through) and the constants it reads, returning the next state."""
        region = self.region
        prefix = f"{instrs[region.start].name}.body"
        param = self._new(f"{prefix}.state", "parameter", state, [], parameter_number=0)
        out = [param]
        clone: dict[int, Instr] = {}
        counter = self._new(f"{prefix}.trip", "get-tuple-element", state.tuple_shapes[0], [param],
                            tuple_index=0)
        one = self._new(f"{prefix}.one", "constant", counter.shape, [],
                        literal=hlo_pb2.LiteralProto(shape=counter.shape, s32s=[1]))
        next_trip = self._new(f"{prefix}.next_trip", "add", counter.shape, [counter, one])
        out += [counter, one, next_trip]
        for k, v in enumerate(region.initial):  # the previous block's members, as the state holds them
            source = instrs[v]
            clone[source.id] = self._new(f"{source.name}.carried", "get-tuple-element", source.shape, [param],
                                         tuple_index=1 + k)
            out.append(clone[source.id])
        for k, instr in enumerate(passed):
            clone[instr.id] = self._new(f"{instr.name}.same", "get-tuple-element", instr.shape, [param],
                                        tuple_index=1 + len(carried) + k)
            out.append(clone[instr.id])
        needed = {instrs[v].id for v in region.invariants if instrs[v].id in fixed}
        for instr in _closure(instrs[:region.start], needed):
            out.append(self._copy(instr, clone))
        for instr in instrs[region.start:region.start + region.period]:
            out.append(self._copy(instr, clone))
        members = [next_trip] + [clone[c.id] for c in carried] + [clone[p.id] for p in passed]
        root = self._new(f"{prefix}.next", "tuple", state, members)
        out.append(root)
        return hlo_pb2.HloComputationProto(
            name=prefix, id=self._computation_id(), root_id=root.id, instructions=out,
            program_shape=hlo_pb2.ProgramShapeProto(parameters=[state], result=state))

    def _condition(self, first: str, state: Shape) -> hlo_pb2.HloComputationProto:
        """`trip < blocks` on the state's counter."""
        prefix = f"{first}.condition"
        param = self._new(f"{prefix}.state", "parameter", state, [], parameter_number=0)
        counter = self._new(f"{prefix}.trip", "get-tuple-element", state.tuple_shapes[0], [param],
                            tuple_index=0)
        trips = self._new(f"{prefix}.trips", "constant", counter.shape, [],
                          literal=hlo_pb2.LiteralProto(shape=counter.shape, s32s=[self.region.blocks]))
        more = self._new(f"{prefix}.more", "compare", array_shape(T.PRED, []), [counter, trips],
                         comparison_direction="LT")
        return hlo_pb2.HloComputationProto(
            name=prefix, id=self._computation_id(), root_id=more.id,
            instructions=[param, counter, trips, more],
            program_shape=hlo_pb2.ProgramShapeProto(parameters=[state], result=more.shape))

    def _copy(self, instr: Instr, clone: dict[int, Instr]) -> Instr:
        copied = Instr()
        copied.CopyFrom(instr)
        copied.id, copied.name = self.next_id, self._unique(f"{instr.name}.rolled")
        self.next_id += 1
        del copied.operand_ids[:]
        copied.operand_ids.extend(clone[o].id for o in instr.operand_ids)
        clone[instr.id] = copied
        return copied

    def _computation_id(self) -> int:
        self.next_computation += 1
        return self.next_computation - 1


def _fixed(instrs: list[Instr]) -> set[int]:
    """Ids of the instructions that depend on no parameter (constants, iotas and what is computed
    from them alone; no random numbers): the body computes them itself."""
    fixed: set[int] = set()
    for instr in instrs:
        if instr.opcode not in _NEVER and instr.opcode != "rng-bit-generator" and \
                all(o in fixed for o in instr.operand_ids):
            fixed.add(instr.id)
    return fixed


def _without_dead_constants(instrs: list[Instr], fixed: set[int], root: int) -> list[Instr]:
    """`instrs` without the constants (ids in `fixed`) that only the rolled blocks read: the body
    computes its own."""
    read = {root}
    for instr in reversed(instrs):
        if instr.id not in fixed or instr.id in read:
            read.update(instr.operand_ids)
    return [i for i in instrs if i.id not in fixed or i.id in read]


def _closure(instrs: list[Instr], needed: set[int]) -> list[Instr]:
    """The instructions of `instrs` that `needed` are computed from (themselves included), in order."""
    by_id = {i.id: i for i in instrs}
    wanted, stack = set(), list(needed)
    while stack:
        i = stack.pop()
        if i in wanted:
            continue
        wanted.add(i)
        stack.extend(by_id[i].operand_ids)
    return [i for i in instrs if i.id in wanted]
