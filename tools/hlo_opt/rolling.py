"""Which axes of a Penguin nest stay loops in BIR, and over which of their iterations.

BirCodeGenLoop unrolls every axis unless told otherwise; this module decides which axes it may
keep rolled instead (`plan_rolling`), so that BIR holds a `loop` entry and one body for them and
a compile costs what the program's text costs, not its trip counts (docs/ir.md, Loops).

An axis can stay a loop over a *steady range* of its iterations [lo, hi) when every iteration in
the range lowers to the same instructions but for offsets that move by a fixed step:
  * every predicate of every statement has the same outcome at every iteration of the range, for
    every value of the nest's other axes (an `i == 0` initialization, a `k == K - 1` evacuation,
    a pipelined stage's guards: the iterations where the outcome changes are peeled, i.e. unrolled
    before or after the loop);
  * a matmul's accumulate flag (off at its accumulation axis's first step) is the same too;
  * no access is clipped at its tensor's edge (a partial last tile is peeled);
  * an iota's values, and an affine_select's predicate, do not depend on the axis (their scalars
    cannot vary per iteration);
  * each on-chip tensor is either *shared* by the iterations (no access moves with the axis: the
    same blocks every time, e.g. an accumulator, or weights loaded before the loop) or *private*
    to each iteration: every iteration writes its blocks before it reads them (`_fresh`) and no
    other nest touches the tensor; a tensor whose accesses move with the axis must be private,
    and they must move by a whole number of blocks per iteration, so that the blocks of
    different iterations are disjoint. A private tensor's blocks become one buffer per block of
    the body, which allocation may give several rotating copies (address rotation); a shared
    one keeps its blocks' buffers for the whole loop.
A tensor whose accesses move with the axis but that an iteration may read before writing (the
lhsT tiles of a dot, loaded at its first column tile and read again at every later one: the
reduction axis's loop of a later column tile reads what the first one's wrote) is an *indexed*
array instead, when no other nest touches it: its blocks along the dimension the axis moves
become one buffer, side by side in the free bytes, which every instance of the loop addresses
by the iteration (the operand's offset moves by a block per iteration, as an HBM offset does),
so that what one instance of the loop wrote stays where a later one reads it.
HBM offsets are always affine in the axis (a view's strides times the access's coefficients), so
they need nothing: the body instruction's offset moves by that step per iteration.

Rings (a software-pipelined axis, passes/pipelining.py). A tile that one stage writes and a later
stage reads was widened to hold R iterations along the partitions (R slabs of 128 rows) or a
leading dimension (R slabs of 1), and its accesses move by one slab per iteration, at offsets
that differ by their stages: a value written at iteration i is read at i + d, d < R. Such a tensor
is a *ring* when the axis is rolled: it keeps one buffer per slab for every block, shared by the
iterations, and the slab of iteration i is i mod U, where U, the iterations the loop's body holds
(unroll and jam), is at least R (`RollPlan.ring_depth`): each slab a body names is then the same
buffer at every iteration, what iteration i wrote stays until i + U > i + d reads it, and each
iteration of a body has a slab of its own. So the axis must be the innermost rolled one, and its
steady iterations must fill two bodies. A stage's guards (inequalities in the axis) hold over
the steady range, which must run every statement; outside it the iterations are peeled.

Unroll and jam (`body_copies`). An engine runs its stream in order, so a body that is one chain of
dependent statements alternating between engines (ACT, then DVE, then ACT ...) keeps each engine
waiting on the other, iteration after iteration; the unrolled program's scheduler interleaved
independent tiles instead. The innermost rolled loop's body therefore holds U consecutive
iterations, the smallest U (at most MAX_COPIES) for which the body's critical path fits in U
times the busiest engine's work of one iteration (with 10 % slack): backend scheduling then
interleaves the copies' chains. Likewise for the DMA queues: a dma instruction of a body has one
queue at every iteration, so a body of few transfers (a copy loop: one load, one store) keeps few
queues busy; U copies spread them over U times as many. A body with many independent points (a
matmul's tiles) needs no copies. The cost is U times the static instructions of that body.
When U reaches the whole extent of the innermost rolled axis (three kernel rows of an im2col
copy), that axis unrolls into the body of the loop around it instead, which is planned as the
innermost and holds the copies (ResNet stage 1: each 3x3 convolution's im2col copy 1,929 → 659
µs, its transfers on 10 queues instead of 6). A transfer's pieces are counted from the rows its
tensor has (56 in a 128-partition tile), as split_dma cuts them.

Nothing here is exact about the other axes: each is taken to range over its whole extent, so an
axis is kept rolled only where that holds for every value of the others (a conservative test: an
axis that fails it is unrolled, which is always correct).
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable
from dataclasses import dataclass, field

from ncc.schemas import common_pb2, penguin_pb2
from ncc.tools.common import affine
from ncc.tools.common.dtypes import itemsize
from ncc.tools.hlo_opt.estimate import clipped, statement_ns
from ncc.tools.target import dma_pieces, is_dma, load_target


@dataclass(frozen=True)
class RolledAxis:
    """One axis kept as a loop: the iterations [lo, hi) run as its trip count, the others peeled."""

    index: int  # position in the nest's axes
    name: str
    lo: int
    hi: int

    @property
    def trip(self) -> int:
        return self.hi - self.lo


MAX_COPIES = 8  # iterations one body may hold (unroll and jam)
INDEXED_MAX_BYTES = 32 * 1024  # per partition: an indexed array's blocks side by side, at most
INDEXED_NEST_BYTES = 64 * 1024  # per partition: a nest's indexed arrays at once, at most (a third of SBUF)


@dataclass
class RollPlan:
    """The axes of a nest kept rolled (outermost first), for each on-chip tensor that is
    private to some of their loops the names of those axes, and the
    iterations the innermost loop's body holds (`copies`, unroll and jam)."""

    axes: list[RolledAxis]
    private: dict[str, set[str]] = field(default_factory=dict)
    indexed: dict[str, set[int]] = field(default_factory=dict)  # tensor -> dimensions it is an array along
    rings: dict[str, dict[int, int]] = field(default_factory=dict)  # ring tensor -> dimension -> its slabs
    copies: int = 1

    @property
    def ring_depth(self) -> int:
        """The fewest iterations the innermost body may hold: the most slabs any ring was widened
        to (module docstring, rings)."""
        return max((slabs for dims in self.rings.values() for slabs in dims.values()), default=1)

    def rolled(self, axis: str) -> RolledAxis | None:
        return next((a for a in self.axes if a.name == axis), None)


def plan_rolling(
    nest: penguin_pb2.LoopNest,
    tensors: dict[str, penguin_pb2.TensorDecl],
    elsewhere: Container[str],
    min_trip: int,
    max_depth: int = 3,
) -> RollPlan | None:
    """The axes of `nest` to keep rolled: from the outermost, each axis of at least `min_trip`
    steady iterations that passes the tests of the module docstring, at most `max_depth` of them.
    `elsewhere`: the on-chip tensors some other nest touches (they cannot be private here).
    None when no axis qualifies. When the nest's indexed arrays would hold more than
    INDEXED_NEST_BYTES per partition at once (`_indexed_bytes`), it is planned again without
    them (their axes then unroll, as before indexed arrays)."""
    unindexed: frozenset[str] = frozenset()
    analyses: dict[tuple[str, frozenset[str]], _AxisOutcome] = {}  # each axis tested once per plan asked
    plan = _plan(nest, tensors, elsewhere, min_trip, max_depth, unindexed, analyses)
    if plan is not None and plan.indexed and _indexed_bytes(nest, tensors, plan) > INDEXED_NEST_BYTES:
        unindexed = frozenset(plan.indexed)
        plan = _plan(nest, tensors, elsewhere, min_trip, max_depth, unindexed, analyses)
    innermost = plan.axes[-1] if plan is not None else None
    if innermost is not None and len(plan.axes) > 1 and plan.copies >= innermost.trip \
            and innermost.trip == nest.axes[innermost.index].extent:
        # the innermost loop's copies are its whole extent, so it unrolls into the body of the loop
        # around it: plan that loop as the innermost, whose body then holds the copies it needs
        # (ResNet's im2col copy: three kernel rows a body kept six of the 16 queues busy)
        shallower = _plan(nest, tensors, elsewhere, min_trip, len(plan.axes) - 1, unindexed, analyses)
        if shallower is not None:
            plan = shallower
    return plan


def _indexed_bytes(nest: penguin_pb2.LoopNest, tensors: dict[str, penguin_pb2.TensorDecl],
                   plan: RollPlan) -> int:
    """Bytes per partition the plan's indexed arrays hold at once: per tensor, an array's bytes
    times the arrays that exist beside each other, one per block index an unrolled axis gives
    each other dimension (a rolled one rotates through them)."""
    rolled = {axis.name for axis in plan.axes}
    extents = {axis.name: int(axis.extent) for axis in nest.axes}
    total = 0
    for name, dims in plan.indexed.items():
        tensor = tensors[name]
        access = next(a for st in nest.statements for a in (*st.outputs, *st.inputs) if a.tensor == name)
        block = tensor.block_shape
        size = min(block[-1], tensor.shape[-1]) * itemsize(tensor.dtype)
        for dim, start in enumerate(access.starts):
            blocks = -(-tensor.shape[dim] // block[dim])
            if dim in dims:
                size *= blocks
            elif dim != len(block) - 2:  # partitions: one buffer holds them
                unrolled = math.prod(extents[t.var] for t in start.terms if t.coeff and t.var not in rolled)
                size *= min(blocks, unrolled)
        total += size
    return total


@dataclass(frozen=True)
class _AxisOutcome:
    """What _AxisAnalysis found for one axis: its steady range (None: not rollable), and the
    tensors private to its iterations and indexed along it."""

    steady: tuple[int, int] | None
    private: frozenset[str]
    indexed: dict[str, int]
    rings: dict[str, dict[int, int]]


def _plan(nest: penguin_pb2.LoopNest, tensors: dict[str, penguin_pb2.TensorDecl], elsewhere: Container[str],
          min_trip: int, max_depth: int, unindexed: frozenset[str],
          analyses: dict[tuple[str, frozenset[str]], _AxisOutcome]) -> RollPlan | None:
    extents = {axis.name: int(axis.extent) for axis in nest.axes}
    if any(e <= 0 for e in extents.values()):
        return None
    plan = RollPlan(axes=[])
    for index, axis in enumerate(nest.axes):
        if len(plan.axes) >= max_depth:
            break
        if extents[axis.name] < min_trip:
            continue
        outcome = analyses.get((axis.name, unindexed))
        if outcome is None:  # a nest of 25,000 statements takes 0.7 s an axis: asked again, not redone
            analysis = _AxisAnalysis(nest, tensors, extents, axis.name, unindexed)
            steady = analysis.steady_range(elsewhere)
            outcome = analyses[(axis.name, unindexed)] = _AxisOutcome(
                steady, frozenset(analysis.private), dict(analysis.indexed), analysis.rings)
        steady = outcome.steady
        if steady is None or steady[1] - steady[0] < min_trip:
            continue
        if outcome.rings and _ring_copies(RolledAxis(index, axis.name, *steady), outcome.rings, 1) is None:
            continue
        plan.axes.append(RolledAxis(index, axis.name, *steady))
        for tensor in outcome.private:
            plan.private.setdefault(tensor, set()).add(axis.name)
        for tensor, dim in outcome.indexed.items():
            plan.indexed.setdefault(tensor, set()).add(dim)
        if outcome.rings:  # a ring's slabs are static only in the innermost body, which holds the period
            plan.rings = {name: dict(dims) for name, dims in outcome.rings.items()}
            break
    if not plan.axes:
        return None
    plan.copies = body_copies(nest, tensors, plan.axes[-1])
    if plan.rings:
        plan.copies = _ring_copies(plan.axes[-1], plan.rings, plan.copies) or plan.copies
    return plan


def _ring_copies(axis: RolledAxis, rings: dict[str, dict[int, int]], copies: int) -> int | None:
    """The iterations a body of a loop with rings holds: at least the deepest ring's slabs, at
    most half the steady iterations (two bodies at least); None when those cross (the axis then
    unrolls)."""
    depth = max(slabs for dims in rings.values() for slabs in dims.values())
    if axis.trip < 2 * depth:
        return None
    return min(max(copies, depth), axis.trip // 2)


def body_copies(nest: penguin_pb2.LoopNest, tensors: dict[str, penguin_pb2.TensorDecl],
                innermost: RolledAxis) -> int:
    """How many consecutive iterations the innermost rolled loop's body holds (module docstring:
    unroll and jam): the smallest U at which U copies' work covers the body's critical path and
    its dmas keep the DMA queues busy. A statement that runs at one value of the loop's axis or
    of an axis outside it (a dot's evacuation at its last reduction step, the lhsT loads of its
    first column tile) is not in the body most instances of the loop run, and does not count;
    one that runs at one value of an axis inside counts once, not once per value."""
    target = load_target()
    points = math.prod(int(axis.extent) for axis in nest.axes[innermost.index + 1:])
    outer = {axis.name for axis in nest.axes[:innermost.index + 1]}
    statements = [st for st in nest.statements
                  if not any(_at_one_value(p, outer) for p in st.predicates)] or list(nest.statements)
    durations = [statement_ns(st, tensors) for st in statements]
    work: dict[object, float] = {}
    finish: list[float] = []
    written: dict[str, float] = {}  # tensor -> when the latest statement writing it finishes
    transfers = queue_ns = 0.0  # one iteration's dmas (split as split_dma cuts them) and their queue time
    inner = {axis.name: int(axis.extent) for axis in nest.axes[innermost.index + 1:]}
    for st, duration in zip(statements, durations, strict=True):
        engine = "dma" if is_dma(st.op) else st.engine
        # its points per iteration: an inner axis an equality pins contributes one value of its extent
        pinned = {t.var for p in st.predicates if _at_one_value(p, set(inner))
                  for t in p.expr.terms if t.coeff}
        runs = points // math.prod(inner[axis] for axis in pinned & inner.keys())
        work[engine] = work.get(engine, 0.0) + duration * runs
        start = max((written.get(a.tensor, 0.0) for a in st.inputs), default=0.0)
        finish.append(start + duration)
        for access in st.outputs:
            written[access.tensor] = finish[-1]
        if is_dma(st.op) and st.outputs:
            # a tile larger than its tensor (56 rows in a 128-partition tile) moves what is there
            moved = max(math.prod(clipped(a, tensors)) * itemsize(tensors[a.tensor].dtype)
                        for a in (*st.inputs, *st.outputs))
            extents = clipped(st.outputs[0], tensors)
            pieces = dma_pieces(int(extents[-2]) if len(extents) > 1 else 1, moved) \
                if _splits(st, tensors) else 1
            transfers += pieces * runs
            queue_ns += (pieces * target.dma_fixed_latency_ns
                         + moved / target.dma_queue_bandwidth_gbps) * runs
    path, busiest = max(finish, default=0.0), max(work.values(), default=0.0)
    computing = max((ns for engine, ns in work.items() if engine != "dma"), default=0.0)
    for copies in range(1, MAX_COPIES + 1):
        # each dma of the body keeps its queue at every iteration: U copies spread one
        # iteration's transfers over U times as many queues
        queues = min(target.dma_queues, transfers * copies) or 1
        bound = max(busiest, queue_ns / queues)
        chained = path <= 1.1 * copies * bound
        # the queues keep up when each is at most half as busy as the busiest engine, or all are
        # in use: the estimate leaves out what the queues share (HBM's bandwidth, descriptors)
        fed = queue_ns / queues <= max(0.5 * computing, queue_ns / target.dma_queues)
        if (chained and fed) or copies >= innermost.trip:
            return copies
    return MAX_COPIES


def _splits(st: penguin_pb2.Statement, tensors: dict[str, penguin_pb2.TensorDecl]) -> bool:
    """Whether walrus split_dma can cut a dma in pieces of partitions: its HBM side walks the
    tile's partitions (dim -2) in its outermost moving dimension. A transposed load (a dot's lhsT
    read through a view whose partitions are HBM's columns) moves whole, on one queue: counted as
    pieces, a convolution's body of 4 such loads held U = 2 iterations and kept 4 queues busy
    104 us each while 12 waited."""
    for access in (*st.inputs, *st.outputs):
        tensor = tensors[access.tensor]
        if tensor.memory != common_pb2.HBM:
            continue
        strides = list(tensor.view_strides) if tensor.view_of else affine.row_major_strides(tensor.shape)
        extents = clipped(access, tensors)
        moving = [(abs(strides[dim]), dim) for dim, extent in enumerate(extents) if extent > 1]
        if len(strides) >= 2 and moving and max(moving)[1] != len(strides) - 2:
            return False
    return True


def _at_one_value(predicate: penguin_pb2.Predicate, axes: set[str]) -> bool:
    """Whether the predicate holds at one value of one of `axes` only (an equality naming it)."""
    return predicate.relation == penguin_pb2.EQ and any(t.coeff and t.var in axes
                                                        for t in predicate.expr.terms)


class _NotRollable(Exception):
    """The axis fails one of the tests (it is then unrolled)."""


class _AxisAnalysis:
    """The tests of the module docstring for one axis `name` of the nest."""

    def __init__(self, nest: penguin_pb2.LoopNest, tensors: dict[str, penguin_pb2.TensorDecl],
                 extents: dict[str, int], name: str, unindexed: frozenset[str] = frozenset()) -> None:
        self.nest, self.tensors, self.extents, self.name = nest, tensors, extents, name
        self.unindexed = unindexed  # tensors that may not be indexed arrays
        self._index = next(k for k, axis in enumerate(nest.axes) if axis.name == name)
        self.cuts: set[int] = set()  # iterations where some outcome may change (a range may start there)
        self.lo, self.hi = 0, extents[name]  # the iterations every access stays unclipped in
        self.private: set[str] = set()
        self.indexed: dict[str, int] = {}  # tensor -> the dimension it is an indexed array along
        self.rings: dict[str, dict[int, int]] = {}  # ring tensor -> dimension -> slabs (module docstring)
        # each tensor's accesses in statement order, outputs before inputs (read once per axis:
        # a fused 12,500-op chain has as many tensors as statements)
        self.accesses: dict[str, list[tuple[penguin_pb2.Statement, penguin_pb2.Access]]] = {}
        for st in nest.statements:
            for access in (*st.outputs, *st.inputs):
                self.accesses.setdefault(access.tensor, []).append((st, access))

    def steady_range(self, elsewhere: Container[str]) -> tuple[int, int] | None:
        """The range of iterations with no cut inside, within [lo, hi), that runs the most
        statement instances (a range where no statement fires would be an empty loop); None if
        the axis is not rollable."""
        try:
            for statement in self.nest.statements:
                self._statement(statement)
            self._onchip_tensors(elsewhere)
        except _NotRollable:
            return None
        points = sorted({self.lo, self.hi, *(c for c in self.cuts if self.lo < c < self.hi)})
        ranges = list(zip(points, points[1:], strict=False))
        steady = max(ranges, key=lambda r: ((r[1] - r[0]) * self._firing(r[0]), r[1] - r[0], -r[0]),
                     default=None)
        if steady is not None and self._pipelined() and self._firing(steady[0]) < len(self.nest.statements):
            return None  # _fresh took the stage guards to hold: every stage must run in the loop
        return steady

    def _firing(self, value: int) -> int:
        """How many statements may run at iteration `value` (for some values of the other axes)."""
        return sum(all(self._may_hold(p, value) for p in st.predicates) for st in self.nest.statements)

    def _may_hold(self, predicate: penguin_pb2.Predicate, value: int) -> bool:
        c, g_lo, g_hi = self._split(predicate.expr)
        low, high = c * value + g_lo, c * value + g_hi
        return high >= 0 if predicate.relation == penguin_pb2.GE else low <= 0 <= high

    # ---- affine bounds ------------------------------------------------------------------------
    def _split(self, expr: penguin_pb2.AffineExpr) -> tuple[int, int, int]:
        """(coefficient of the axis, least and greatest value of the rest over the other axes)."""
        coeff = 0
        lo = hi = expr.constant
        for term in expr.terms:
            if term.var == self.name:
                coeff += term.coeff
                continue
            extent = self.extents.get(term.var)
            if extent is None:
                raise _NotRollable  # an unknown variable: bir_codegen reports it
            reach = term.coeff * (extent - 1)
            if reach < 0:
                lo += reach
            else:
                hi += reach
        return coeff, lo, hi

    def _statement(self, st: penguin_pb2.Statement) -> None:
        for predicate in st.predicates:
            self._predicate(predicate)
        if st.op == "matmul":
            axis = st.attributes.get("accumulate_axis", "")
            if axis == self.name:  # accumulates except at its group's first step
                shift = int(st.attributes.get("stage", "0")) if self._pipelined() else 0
                self.cuts.update((shift, shift + 1))
        for access in (*st.outputs, *st.inputs):
            self._access(access)
        if st.op == "iota" and "iota_dimension" in st.attributes and st.outputs:
            dims = [int(st.attributes["iota_dimension"])]
        elif st.op == "affine_select" and st.outputs:
            dims = [len(st.outputs[0].starts) - 2, len(st.outputs[0].starts) - 1]  # its rows and columns
        else:
            dims = []
        starts = st.outputs[0].starts if dims else []
        if any(0 <= dim < len(starts) and self._split(starts[dim])[0] for dim in dims):
            raise _NotRollable  # its values move with the axis: scalars cannot

    def _stage_guard(self, predicate: penguin_pb2.Predicate) -> bool:
        """Whether `predicate` is a software-pipelining stage guard on this axis (an inequality
        in the axis alone): it holds at every iteration of the steady range (steady_range)."""
        return (self._pipelined() and predicate.relation == penguin_pb2.GE
                and all(t.var == self.name for t in predicate.expr.terms if t.coeff))

    def _pipelined(self) -> bool:
        return any(a.name == self.name and "pipelined" in a.attributes for a in self.nest.axes)

    def _predicate(self, predicate: penguin_pb2.Predicate) -> None:
        c, g_lo, g_hi = self._split(predicate.expr)
        if c == 0:
            return
        if predicate.relation == penguin_pb2.GE:  # c*v + g >= 0 switches where v crosses -g / c
            if c > 0:
                first, last = -((g_hi) // c), -((g_lo) // c)  # ceil(-g / c) over g in [g_lo, g_hi]
            else:
                first, last = g_lo // -c + 1, g_hi // -c + 1  # floor(g / |c|) + 1
            self._cut_between(first, last)
        elif predicate.relation == penguin_pb2.EQ:  # true at v = -g / c only: each such v alone
            a, b = sorted((-g_lo / c, -g_hi / c))
            first, last = math.ceil(a), math.floor(b)
            self._cut_between(first, last + 1)
        else:
            raise _NotRollable

    def _cut_between(self, first: int, last: int) -> None:
        """Every iteration in [first, last] is a cut (clamped to the axis: far ones do not matter)."""
        first, last = max(first, 0), min(last, self.extents[self.name])
        if last - first > 4096:  # a range that long leaves no steady run worth a loop anyway
            raise _NotRollable
        self.cuts.update(range(first, last + 1))

    def _access(self, access: penguin_pb2.Access) -> None:
        tensor = self.tensors.get(access.tensor)
        if tensor is None or len(access.starts) != len(tensor.shape):
            raise _NotRollable  # malformed: bir_codegen reports it
        for start, extent, size in zip(access.starts, access.extents, tensor.shape, strict=True):
            c, h_lo, h_hi = self._split(start)
            if c == 0:
                continue
            # unclipped and non-empty for every value of the other axes: 0 <= start, start + extent <= size
            e, limit = int(extent), int(size)
            if c > 0:
                self.lo = max(self.lo, _ceil_div(-h_lo, c))
                self.hi = min(self.hi, (limit - e - h_hi) // c + 1)
            else:
                self.lo = max(self.lo, _ceil_div(h_hi + e - limit, -c))
                self.hi = min(self.hi, h_lo // -c + 1)
        if self.hi <= self.lo:
            raise _NotRollable

    def _onchip_tensors(self, elsewhere: Container[str]) -> None:
        """Each on-chip tensor of the nest is shared by the iterations or private to each."""
        moves: dict[str, list[tuple[int, ...]]] = {}  # tensor -> per access: block steps per dimension
        spans: dict[str, list[tuple[int, int]]] = {}  # tensor -> per moving dim: (least, greatest) block
        ring_moves: dict[str, set[tuple[int, ...]]] = {}  # tensor -> per access: slab steps per dimension
        for st in self.nest.statements:
            for access in (*st.outputs, *st.inputs):
                tensor = self.tensors[access.tensor]
                if tensor.memory == common_pb2.HBM:
                    continue
                steps, ranges, slab_steps = self._block_steps(tensor, access)
                moves.setdefault(tensor.name, []).append(steps)
                spans.setdefault(tensor.name, []).append(ranges)
                ring_moves.setdefault(tensor.name, set()).add(slab_steps)
        for name, per_access in moves.items():
            if len(set(per_access)) > 1 or len(ring_moves[name]) > 1:
                raise _NotRollable  # accesses move differently: blocks would alias across iterations
            steps = per_access[0]
            if any(ring_moves[name].pop()):
                if name in elsewhere or any(steps):
                    raise _NotRollable  # a ring hands values between this nest's stages only
                continue  # shared by the iterations: each slab keeps one buffer
            if not any(steps):  # the same blocks at every iteration: private if written afresh in each
                if name not in elsewhere and self._fresh(name):
                    self.private.add(name)
                continue
            if name in elsewhere:
                raise _NotRollable  # another nest reads or writes its blocks of every iteration
            if not self._fresh(name):  # an iteration may read what another point of the nest wrote
                dim = self._indexed_dim(name, steps)
                if dim is None:
                    raise _NotRollable
                self.indexed[name] = dim
            for dim, step in enumerate(steps):
                if not step:
                    continue
                least = min(r[dim][0] for r in spans[name])
                greatest = max(r[dim][1] for r in spans[name])
                if greatest - least >= abs(step):
                    raise _NotRollable  # one iteration's blocks reach into the next one's
            if name not in self.indexed:
                self.private.add(name)

    def _indexed_dim(self, name: str, steps: tuple[int, ...]) -> int | None:
        """The dimension along which tensor `name` may be an indexed array for this axis (module
        docstring), or None: an SBUF tensor whose accesses move along one dimension other than
        the last, not replicated there nor cut into slabs, whose blocks along that dimension,
        side by side, stay within INDEXED_MAX_BYTES per partition."""
        moving = [dim for dim, step in enumerate(steps) if step]
        tensor = self.tensors[name]
        block = list(tensor.block_shape)
        if tensor.memory != common_pb2.SBUF or name in self.unindexed:
            return None  # PSUM's 16 KiB per partition, in banks, holds no arrays
        if len(moving) != 1 or len(block) != len(tensor.shape) or len(block) < 2:
            return None
        dim = moving[0]
        if dim == len(block) - 1 or dim in tensor.replicated_dims:
            return None
        if math.prod(block[:-2]) > 1 or block[-2] > load_target().partitions:
            return None  # slabbed blocks (software pipelining's widened tiles) keep their names
        blocks = -(-int(tensor.shape[dim]) // int(block[dim]))
        row = min(int(block[-1]), int(tensor.shape[-1])) * itemsize(tensor.dtype)
        return dim if blocks * row <= INDEXED_MAX_BYTES else None

    def _fresh(self, name: str) -> bool:
        """Whether every iteration writes its blocks of tensor `name` before it reads them, so
        that nothing flows into an iteration from another point of the nest (another iteration,
        or the same iteration of the loop at other values of the axes around it). Every access
        must name the same box, so a block is touched at the points that share the values of the
        axes the box moves with and differ in the others inside this axis (`free`); the first
        statement to touch it must write it whole without reading it (a matmul: one that starts
        a new accumulation at its accumulation axis's first value, a free axis) and run for every
        block in every instance (its predicates read free axes only), at the first free point
        where any of them runs."""
        accesses = self.accesses[name]
        boxes = {(tuple(start.SerializeToString(deterministic=True) for start in access.starts),
                  tuple(access.extents)) for _, access in accesses}
        if len(boxes) > 1:
            return self._fresh_by_columns(name)
        moving = {term.var for start in accesses[0][1].starts for term in start.terms if term.coeff}
        free = [axis.name for axis in self.nest.axes[self._index + 1:] if axis.name not in moving]
        statements = list(dict.fromkeys(st.name for st, _ in accesses))
        by_name = {st.name: st for st, _ in accesses}
        first = by_name[statements[0]]
        if any(a.tensor == name for a in first.inputs) or not any(a.tensor == name for a in first.outputs):
            return False
        if first.op == "matmul" and "accumulate_axis" in first.attributes:
            if first.attributes["accumulate_axis"] not in free:
                return False
        if any(t.var not in free for p in first.predicates if not self._stage_guard(p)
               for t in p.expr.terms if t.coeff):
            return False  # it would not run for every block, or not in every instance of the loop
        starts = [self._first_point(by_name[st], free) for st in statements]
        return None not in starts and all(start >= starts[0] for start in starts[1:])

    def _fresh_by_columns(self, name: str) -> bool:
        """_fresh for a tile written a column slice at a time (epilogues' wide rows: a softmax over
        rows of 1,024 scores reads the row that two 512-column PSUM tiles were evacuated into).
        One statement, the first to touch the tile and not reading it, writes slice c of the row:
        last start W * c, extent W, for an axis c inside this one whose W * extent is the block's
        width; every other access reads either that slice (the same box) or the whole row (last
        start 0) at c's last value only, under the writer's predicates too. All boxes agree in
        the other dimensions, so each iteration writes its rows whole before reading them."""
        accesses = self.accesses[name]
        width = int(self.tensors[name].block_shape[-1])
        leading = {tuple(s.SerializeToString(deterministic=True) for s in access.starts[:-1])
                   for _, access in accesses}
        writer, slice_ = accesses[0]
        if len(leading) != 1 or not any(a.tensor == name for a in writer.outputs) \
                or any(a.tensor == name for a in writer.inputs):
            return False
        terms = [t for t in slice_.starts[-1].terms if t.coeff]
        if len(terms) != 1 or slice_.starts[-1].constant or terms[0].coeff != slice_.extents[-1]:
            return False
        column = terms[0].var
        count = self.extents.get(column, 0)
        position = next((k for k, axis in enumerate(self.nest.axes) if axis.name == column), -1)
        if position <= self._index or terms[0].coeff * count != width:
            return False
        if any(t.var == column and t.coeff for p in writer.predicates for t in p.expr.terms):
            return False
        predicates = {p.SerializeToString(deterministic=True) for p in writer.predicates}
        last = affine.equals(column, count - 1).SerializeToString(deterministic=True)
        for st, access in accesses[1:]:
            if st is writer or any(a.tensor == name for a in st.outputs):
                return False  # one writer, once
            if access.starts[-1] == slice_.starts[-1] and access.extents[-1] == slice_.extents[-1]:
                continue
            if access.starts[-1].terms or access.starts[-1].constant or access.extents[-1] != width:
                return False
            mine = {p.SerializeToString(deterministic=True) for p in st.predicates}
            if last not in mine or not predicates <= mine:
                return False
        return True

    def _first_point(self, st: penguin_pb2.Statement, free: list[str]) -> tuple[int, ...] | None:
        """The lexicographically first values of the `free` axes at which `st` runs (None when
        it never runs, or a predicate couples a free axis with another variable). Its
        predicates on other axes only say which blocks or which instances of the loop it
        touches at all."""
        lows = {axis: 0 for axis in free}
        highs = {axis: self.extents[axis] - 1 for axis in free}
        for predicate in st.predicates:
            terms = [t for t in predicate.expr.terms if t.coeff]
            if not any(t.var in lows for t in terms):
                continue
            if len(terms) != 1:
                return None
            var, c, k = terms[0].var, terms[0].coeff, predicate.expr.constant
            if predicate.relation == penguin_pb2.EQ:
                if k % c:
                    return None
                lows[var], highs[var] = max(lows[var], -k // c), min(highs[var], -k // c)
            elif c > 0:
                lows[var] = max(lows[var], _ceil_div(-k, c))
            else:
                highs[var] = min(highs[var], k // -c)
        if any(lows[axis] > highs[axis] for axis in free):
            return None
        return tuple(lows[axis] for axis in free)

    def _block_steps(self, tensor: penguin_pb2.TensorDecl, access: penguin_pb2.Access
                     ) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...], tuple[int, ...]]:
        """Per dimension: the blocks an access moves by per iteration, the least and greatest
        block its start reaches at the axis's iteration 0 (for the moving dimensions), and the
        elements it moves by within a ring's block (a pipelined axis: module docstring)."""
        block = list(tensor.block_shape) or [1] * len(tensor.shape)
        replicated = set(tensor.replicated_dims)
        steps, ranges, slab_steps = [], [], []
        for dim, start in enumerate(access.starts):
            c, h_lo, h_hi = self._split(start)
            if dim in replicated or c == 0:
                steps.append(0)
                ranges.append((0, 0))
                slab_steps.append(0)
                continue
            size = int(block[dim]) if dim < len(block) and block[dim] > 0 else 1
            if c % size:
                rows = len(block) - 2
                if not self._pipelined() or c < 0 or size % c or dim > rows \
                        or c != (load_target().partitions if dim == rows else 1):
                    raise _NotRollable  # the axis moves within a block: iterations share blocks
                # software pipelining widened the block to hold size / c iterations, one slab each
                self.rings.setdefault(tensor.name, {})[dim] = size // c
                steps.append(0)
                ranges.append((0, 0))
                slab_steps.append(c)
                continue
            steps.append(c // size)
            ranges.append((h_lo // size, h_hi // size))
            slab_steps.append(0)
        return tuple(steps), tuple(ranges), tuple(slab_steps)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def onchip_users(program: penguin_pb2.Program) -> dict[str, set[str]]:
    """Each on-chip tensor -> the nests that access it."""
    onchip = {t.name for t in program.tensors if t.memory != common_pb2.HBM}
    users: dict[str, set[str]] = {}
    for nest in program.nests:
        for st in nest.statements:
            for access in _accesses(st):
                if access.tensor in onchip:
                    users.setdefault(access.tensor, set()).add(nest.name)
    return users


class TouchedElsewhere(Container[str]):
    """The on-chip tensors some nest other than `nest` accesses (plan_rolling's `elsewhere`),
    answered from onchip_users per question: a set built per nest made planning quadratic in the
    program (a sorting network of 1,800 nests over 1,400 forwarded tiles: 4.3 s of a 10 s Frontend)."""

    def __init__(self, users: dict[str, set[str]], nest: str) -> None:
        self.users, self.nest = users, nest

    def __contains__(self, name: object) -> bool:
        users = self.users.get(name) if isinstance(name, str) else None
        return users is not None and users != {self.nest}


def _accesses(st: penguin_pb2.Statement) -> Iterable[penguin_pb2.Access]:
    yield from st.outputs
    yield from st.inputs
