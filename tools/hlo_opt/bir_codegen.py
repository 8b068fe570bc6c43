"""BirCodeGenLoop: unroll Penguin loop nests into a flat BIR instruction list.

Every iteration point of a nest runs the statements whose predicates hold; each becomes one BIR
instruction whose operands are concrete access patterns:
  * HBM boxes resolve through their view to the base tensor: offset + per-dim [stride, count];
  * on-chip boxes name the buffer of the block they fall in (one virtual buffer per tensor block,
    so tiles of different iterations are independent and the allocator decides what shares space;
    a block that software pipelining widened along the partitions or a leading dimension is a ring
    of slabs, one virtual buffer per slab; widened along the free dimension, one buffer holds the
    iterations side by side);
  * extents are clipped at the tensor's logical shape (partial tiles);
  * a block written again in full (every byte of its buffer, by an instruction that does not also
    read it) starts a new virtual buffer, `name#n`, and the readers after it name that one: a tile
    loaded afresh at every step of an outer loop (a weight tile reloaded for each row block) is
    then n short-lived buffers rather than one that lives from the first load to the last read,
    which the scheduler and the allocator would have to keep on chip all along.
The list is in program order, which is a valid order; the backend reorders, allocates and syncs.

Loops that stay loops (`loops` = "rolled"): the axes rolling.plan_rolling keeps rolled are not
unrolled; each becomes a `loop` entry of the global order whose body is the rest of the nest at
the axis's first steady iteration, with the iterations outside its steady range peeled (unrolled
before and after it). Body instructions name their loop (`in_loop`); an HBM operand's offset
moves by its step per iteration (`AccessPattern.loop`); an on-chip tensor private to each
iteration becomes buffers marked `private_to` the loop (allocation may rotate them over several
copies); a shared one keeps one buffer for every iteration and is never renamed inside the loop
(its value may carry from one iteration to the next). A software-pipelined tile's slabs form a
ring (rolling.py, Rings): one buffer per slab for every block of the tensor, iteration i naming
slab i mod the iterations the body holds. A pipelined nest that unrolled would emit at most
PIPELINED_UNROLL_MAX instructions unrolls its pipelined axis: small, its unrolled stages run
faster. docs/ir.md, Loops in the global order.

The instruction budget (tools/common/penguin_budget.py) is checked before anything unrolls.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

from ncc.schemas import bir_pb2, common_pb2, penguin_pb2
from ncc.tools.common import affine
from ncc.tools.common.dtypes import itemsize
from ncc.tools.common.errors import CompileError
from ncc.tools.common.loops import BARRIER, CARRIED, LOOP_OP, REPEAT
from ncc.tools.common.penguin_budget import (
    AUTO_ROLL_ABOVE,
    MAX_INSTRUCTIONS,
    backend_instruction_count,
    check_budget,
    nest_backend_instructions,
    with_pieces,
)
from ncc.tools.hlo_opt import rolling
from ncc.tools.hlo_opt.passes.broadcast_operands import broadcast_inputs
from ncc.tools.target import PARTITIONS, is_dma

LOOP_MODES = ("auto", "rolled", "unrolled")

_ROLE = {
    penguin_pb2.INPUT: bir_pb2.INPUT,
    penguin_pb2.OUTPUT: bir_pb2.OUTPUT,
    penguin_pb2.CONSTANT: bir_pb2.CONSTANT,
    penguin_pb2.INTERNAL: bir_pb2.INTERNAL,
}


@dataclass
class _OpenLoop:
    """A loop being emitted: its axis, its entry in the BIR list, where its body starts."""

    axis: str
    entry: bir_pb2.Instruction
    start: int
    copies: int  # consecutive iterations of the axis each loop iteration runs (unroll and jam)
    first: int  # the axis's value at the loop's first iteration


# --loops auto: a nest keeps only its outermost loop when it then emits at most AUTO_NEST_STATIC
# instructions and the program AUTO_SHALLOW_TOTAL (_unroll_inner_loops)
AUTO_NEST_STATIC = 16_000
AUTO_SHALLOW_TOTAL = 60_000
# A software-pipelined loop stays a loop (its widened tiles rings of slabs, rolling.py) only in a
# nest that unrolled would emit more than this; below it the unrolled stages run faster (the
# pipelining fixtures of bench/run_fusion.py: 38.96 against 44.59 µs, 8.57 against 10.74)
PIPELINED_UNROLL_MAX = 4_096
# A nest that unrolled emits at most this many instructions (every dma whole) unrolls under every
# --loops mode while the program stays within AUTO_SHALLOW_TOTAL (_unroll_small_nests)
SMALL_NEST = 128
# ... and a nest of transfers alone (no compute statement) of at most SMALL_COPY_FACTOR times that
SMALL_COPY_FACTOR = 4
AUTO_REDUCTION_BYTES = 64 * 1024  # ... and a dot's reduction loop unrolled puts at most this in one body
BARRIER_BODY = 1_000  # a Repeat region's loop of this many instructions or more is a barrier loop
BARRIER_TRIP = 10_000  # ... or whose trip executes this many (its inner loops' iterations counted)


class BirCodeGenLoop:
    def __init__(self, program: penguin_pb2.Program, target: str = "trn1", loops: str = "unrolled",
                 jam: int = 0, small_nest: int = SMALL_NEST) -> None:
        if loops not in LOOP_MODES:
            raise CompileError("E301", f"loop mode {loops!r} is not one of {', '.join(LOOP_MODES)}")
        self.loops = loops
        self.jam = jam
        self.small_nest = small_nest  # the largest nest that unrolls under every mode (0: none)
        self.open_loops: list[_OpenLoop] = []  # outermost first
        self.region: penguin_pb2.Repeat | None = None  # the Repeat region being emitted
        self.roll: rolling.RollPlan | None = None  # of the nest being emitted
        self.plans: dict[int, rolling.RollPlan | None] = {}  # nest index -> its loops (rolled modes)
        self.private_axes: dict[str, set[str]] = {}  # its private tensor -> the rolled axes it is private to
        self.indexed_dims: dict[str, set[int]] = {}  # indexed array -> the dimensions its blocks merge
        self.onchip_users: dict[str, set[str]] = {}
        self.penguin = program
        self.tensors = {t.name: t for t in program.tensors}
        self.bir = bir_pb2.Program(name=program.name, target=target)
        self.buffers: dict[str, bir_pb2.Buffer] = {}
        self.current: dict[str, str] = {}  # block buffer -> the version its next reader reads
        self.versions: dict[str, int] = {}  # block buffer -> how many times it was written in full
        self.layouts: dict[str, _BlockLayout] = {}  # on-chip tensor -> how its blocks are named

    def run(self) -> bir_pb2.Program:
        rolled = self.loops == "rolled" or (self.loops == "auto" and (  # a Repeat region is a loop
            bool(self.penguin.repeats) or backend_instruction_count(self.penguin)[0] >= AUTO_ROLL_ABOVE))
        if rolled:
            self.onchip_users = rolling.onchip_users(self.penguin)
            self.plans = {k: self._plan_nest(nest) for k, nest in enumerate(self.penguin.nests)}
            self._unroll_small_nests()
            if self.loops == "auto":
                self._unroll_inner_loops()
            self._check_static_budget()
        else:
            check_budget(self.penguin)
        for tensor in self.penguin.tensors:
            if tensor.memory == common_pb2.HBM and not tensor.view_of:
                self.bir.hbm.add(name=tensor.name, dtype=tensor.dtype, shape=tensor.shape,
                                 role=_ROLE[tensor.role],
                                 index=tensor.index, data=tensor.data)
        repeats = {repeat.name: repeat for repeat in self.penguin.repeats}
        emitted: set[str] = set()  # the regions whose loop is closed
        for k, nest in enumerate(self.penguin.nests):
            name = nest.attributes.get(REPEAT, "")
            region = repeats.get(name)
            if name and (region is None or name in emitted):
                problem = "not declared" if region is None else "not one run of nests"
                raise CompileError("E301", f"nest '{nest.name}' names repeat region '{name}', "
                                   f"which is {problem}", nest.name)
            if region is not self.region:
                if self.region is not None:
                    self._close_region()
                    emitted.add(self.region.name)
                self.region = region
                if region is not None:
                    self._open_region(region)
            self._nest(nest, self.plans.get(k))
        if self.region is not None:
            self._close_region()
        return self.bir

    def _close_region(self) -> None:
        """Close a Repeat region's loop; a large one is synchronized as a barrier between trips
        (tools/common/loops.py, CARRIED): its dependences pair by pair cost time and waits that
        grow with the square of the body (1.5M and 118k for a 4,842-instruction decoder layer),
        and its trips overlap little anyway. Large: BARRIER_BODY instructions written, or
        BARRIER_TRIP executed a trip (a rolled attention layer: 623 written, 37k executed, whose
        pairs were 120k carried edges, a second of the analyzer's time)."""
        start = self.open_loops[0].start
        entry = self.open_loops[0].entry
        self._close_loop()
        if entry.body_length >= BARRIER_BODY or self._executed(start, entry.body_length) >= BARRIER_TRIP:
            entry.attributes[CARRIED] = BARRIER

    def _executed(self, start: int, length: int) -> int:
        """The instructions one iteration of the loop whose body is bir.instructions[start:start
        + length] executes: each counted once per iteration of the loops inside that hold it."""
        executed, open_ends = 0, []  # (end of an inner loop's body, its iterations times the outer's)
        for index in range(start, start + length):
            while open_ends and index >= open_ends[-1][0]:
                open_ends.pop()
            times = open_ends[-1][1] if open_ends else 1
            instr = self.bir.instructions[index]
            if instr.op == LOOP_OP:
                open_ends.append((index + 1 + instr.body_length, times * max(instr.trip_count, 1)))
            else:
                executed += times
        return executed

    def _open_region(self, region: penguin_pb2.Repeat) -> None:
        """The loop of a Repeat region (a while loop kept as a loop): its nests are the body."""
        if region.trips < 1:
            raise CompileError("E301", f"repeat region '{region.name}' runs {region.trips} times",
                               region.name)
        entry = self._add_instruction(name=f"{region.name}/loop", op=LOOP_OP, source=region.source)
        entry.trip_count = region.trips
        self.open_loops.append(_OpenLoop(_region_axis(region), entry, len(self.bir.instructions), 1, 0))

    def _check_static_budget(self) -> None:
        """E302 when the rolled program is still over the instruction budget: each nest counts
        its unrolled backend instructions times the share of its points that are emitted (the
        peeled ones, and a body's copies for its loop)."""
        tensors = self.tensors
        whole = extra = 0
        largest, largest_count = None, 0
        for k, nest in enumerate(self.penguin.nests):
            nest_whole, nest_extra = nest_backend_instructions(nest, tensors)
            share = _emitted_share(nest, self.plans.get(k))
            nest_whole, nest_extra = math.ceil(nest_whole * share), math.ceil(nest_extra * share)
            whole, extra = whole + nest_whole, extra + nest_extra
            if nest_whole + nest_extra > largest_count:
                largest, largest_count = nest, nest_whole + nest_extra
        total = with_pieces(whole, extra)
        if total > MAX_INSTRUCTIONS:
            where = (largest.source or largest.name) if largest is not None else self.penguin.name
            raise CompileError("E302", f"program too large: {total:,} backend instructions with its loops "
                                       f"kept rolled (limit {MAX_INSTRUCTIONS:,}); the largest nest, from "
                                       f"HLO instruction '{where}', still emits {largest_count:,}", where)

    def _nest(self, nest: penguin_pb2.LoopNest, plan: rolling.RollPlan | None) -> None:
        names = [axis.name for axis in nest.axes]
        if any(axis.extent == 0 for axis in nest.axes):
            return  # an empty iteration space (a zero-element tensor): never build its other axes' ranges
        # Each statement's predicates and accesses are read once per nest, not once per point:
        # unrolling is the frontend's inner loop (100k instructions for a fused 25,000-op chain).
        predicates = [self._compiled(affine.predicate_function, st.predicates, names, st)
                      for st in nest.statements]
        plans: dict[int, _StatementPlan] = {}
        self.roll = plan
        self.private_axes = dict(plan.private) if plan is not None else {}
        self.indexed_dims.update(plan.indexed if plan is not None else {})
        if self.roll is None:
            for point in itertools.product(*(range(axis.extent) for axis in nest.axes)):
                self._point(nest, names, predicates, plans, point, {})
            return
        self._axes(nest, names, predicates, plans, [])
        self.roll = None

    def _plan_nest(self, nest: penguin_pb2.LoopNest, max_depth: int = 3) -> rolling.RollPlan | None:
        """The axes of `nest` that stay loops (rolling.plan_rolling), or None to unroll it."""
        if any(axis.extent == 0 for axis in nest.axes):
            return None
        elsewhere = rolling.TouchedElsewhere(self.onchip_users, nest.name)
        plan = rolling.plan_rolling(nest, self.tensors, elsewhere, min_trip=2, max_depth=max_depth)
        if plan is not None and plan.rings and \
                nest_backend_instructions(nest, self.tensors)[0] <= PIPELINED_UNROLL_MAX:
            # a small pipelined loop runs faster unrolled (the module docstring): plan without it
            shallower = len(plan.axes) - 1
            return self._plan_nest(nest, shallower) if shallower else None
        return plan

    def _unroll_small_nests(self) -> None:
        """A nest that unrolled emits at most `small_nest` instructions unrolls, smallest first, while
        the program stays within AUTO_SHALLOW_TOTAL. Why: its loops save the compile little, and
        walrus schedules a body as one iteration, so a loop of a few iterations overlaps them only
        as far as the engines' in-order streams and two rotating copies let it, where unrolled
        every tile overlaps freely (forced --loops rolled, the bundled models' small loops ran up
        to 1.38x their unrolled time: depthwise_train's and cnn's im2col copies, gelu's 2 x 2 tiles,
        decoder_step's four heads). A nest of transfers alone unrolls up to SMALL_COPY_FACTOR
        times that: it is bound by its queues, and a rolled body's transfers keep one queue each at
        every iteration, where unrolled each takes a free one (a 3 x 3 convolution's im2col copies
        of 136 transfers, forced rolled, ran 87.7 µs against 65.8 unrolled). The program cap keeps
        a program of many small nests (a sorting network) as rolled as before."""
        nests = self.penguin.nests
        sizes = {k: nest_backend_instructions(nest, self.tensors)[0] for k, nest in enumerate(nests)}
        shares = {k: _emitted_share(nests[k], plan) if plan is not None else 1.0
                  for k, plan in self.plans.items()}
        total = sum(sizes[k] * shares[k] for k in sizes)

        def limit(nest: penguin_pb2.LoopNest) -> int:
            copies_only = all(is_dma(st.op) for st in nest.statements)
            return self.small_nest * (SMALL_COPY_FACTOR if copies_only else 1)

        small = sorted((k for k, plan in self.plans.items()
                        if plan is not None and sizes[k] <= limit(nests[k])), key=sizes.__getitem__)
        for k in small:
            grown = sizes[k] * (1.0 - shares[k])
            if total + grown > AUTO_SHALLOW_TOTAL:
                break
            self.plans[k] = None
            total += grown

    def _unroll_inner_loops(self) -> None:
        """--loops auto: where a nest keeps loops inside loops, keep only its outermost loop and
        unroll the others into its body, when that nest then emits at most AUTO_NEST_STATIC
        instructions and the whole program at most AUTO_SHALLOW_TOTAL. Why: walrus schedules a
        loop's body as one iteration and overlaps iterations only as far as the in-order engine
        streams let it, so a body that holds several independent tiles (heads, row tiles)
        interleaves their chains where a loop over them runs them one after another; the LLaMA
        prefill's attention, a loop over KV heads around a loop over the heads that share each,
        ran 19.2 ms and with the inner loops unrolled 18.5 (GPT-2 24.9 -> 21.0 ms), for up to
        twice the static instructions. The program cap keeps a program whose loops are
        what let it compile at all (a 32-layer decoder) as rolled as before; a dot's reduction
        loop stays a loop where its operand tiles would crowd SBUF (`_reduction_bytes`)."""
        chosen: dict[int, rolling.RollPlan] = {}
        total = 0.0
        for k, nest in enumerate(self.penguin.nests):
            plan = self.plans.get(k)
            size = nest_backend_instructions(nest, self.tensors)[0]
            if plan is not None and len(plan.axes) > 1 and \
                    _reduction_bytes(nest, self.tensors, plan.axes[1:]) <= AUTO_REDUCTION_BYTES:
                outer = self._plan_nest(nest, max_depth=1)
                if outer is not None and size * _emitted_share(nest, outer) <= AUTO_NEST_STATIC:
                    chosen[k] = plan = outer
            total += size * (_emitted_share(nest, plan) if plan is not None else 1)
        if total <= AUTO_SHALLOW_TOTAL:
            self.plans.update(chosen)

    def _axes(self, nest: penguin_pb2.LoopNest, names: list[str], predicates: list, plans: dict,
              values: list[int]) -> None:
        """Emit the nest's points from axis len(values) on: an axis kept rolled as a loop over its
        steady iterations (the body at the first of them) between its peeled ones."""
        depth = len(values)
        if depth == len(names):
            symbolic = {loop.axis: loop.first for loop in self.open_loops}
            self._point(nest, names, predicates, plans, tuple(values), symbolic)
            return
        axis = nest.axes[depth]
        assert self.roll is not None
        rolled = self.roll.rolled(axis.name)
        if rolled is None:
            for v in range(axis.extent):
                self._axes(nest, names, predicates, plans, [*values, v])
            return
        copies = self._copies(rolled)
        trip = rolled.trip // copies
        looped = rolled.lo + trip * copies  # the iterations from here on are peeled after the loop
        for v in range(rolled.lo):
            self._axes(nest, names, predicates, plans, [*values, v])
        if trip >= 2:
            self._open_loop(nest, axis.name, trip, copies, rolled.lo)
            for v in range(rolled.lo, rolled.lo + copies):
                self._axes(nest, names, predicates, plans, [*values, v])
            self._close_loop()
        else:
            looped = rolled.lo
        for v in range(looped, axis.extent):
            self._axes(nest, names, predicates, plans, [*values, v])

    def _copies(self, rolled: rolling.RolledAxis) -> int:
        """How many consecutive iterations one body holds (unroll and jam, rolling.body_copies):
        the plan's for the innermost rolled axis (`self.jam` when set), 1 for the others."""
        assert self.roll is not None
        if rolled is not self.roll.axes[-1]:
            return 1
        copies = self.jam or self.roll.copies
        if self.roll.rings and (copies < self.roll.ring_depth or rolled.trip < 2 * copies):
            copies = self.roll.copies  # each iteration a ring holds needs its own slab (rolling.py)
        return copies if rolled.trip >= copies else 1

    def _open_loop(self, nest: penguin_pb2.LoopNest, axis: str, trip: int, copies: int, first: int) -> None:
        entry = self._add_instruction(name=f"{nest.name}/loop.{axis}", op=LOOP_OP, source=nest.source)
        entry.trip_count = trip
        self.open_loops.append(_OpenLoop(axis, entry, len(self.bir.instructions), copies, first))

    def _close_loop(self) -> None:
        loop = self.open_loops.pop()
        loop.entry.body_length = len(self.bir.instructions) - loop.start
        if loop.entry.body_length == 0:  # every statement of the body was clipped away
            del self.bir.instructions[-1]

    def _add_instruction(self, **fields) -> bir_pb2.Instruction:
        """A new instruction at the end of the list, inside the innermost open loop."""
        instr = self.bir.instructions.add(id=len(self.bir.instructions), **fields)
        if self.open_loops:
            instr.in_loop = self.open_loops[-1].entry.id
        return instr

    def _point(self, nest: penguin_pb2.LoopNest, names: list[str], predicates: list, plans: dict,
               point: tuple, symbolic: dict[str, int]) -> None:
        """The instructions of one iteration point (a body's, at its loops' first steady iteration;
        `symbolic`: each rolled axis and its value there)."""
        env = dict(zip(names, point, strict=True))
        label = ",".join(_label(n, v, symbolic) for n, v in env.items())
        resolved: dict[tuple, tuple[bir_pb2.AccessPattern, list[int]] | None] = {}  # this point's
        for k, statement in enumerate(nest.statements):
            if predicates[k](point):
                plan = plans.get(k)
                if plan is None:
                    plan = plans[k] = self._statement_plan(nest, statement, names)
                self._statement(nest, statement, plan, env, point, label, resolved)

    def _statement_plan(self, nest: penguin_pb2.LoopNest, st: penguin_pb2.Statement,
                        names: list[str]) -> _StatementPlan:
        axis = st.attributes.get("accumulate_axis", "") if st.op == "matmul" else ""
        return _StatementPlan(
            outputs=[self._plan(a, st, names) for a in st.outputs],
            inputs=[self._plan(a, st, names) for a in st.inputs],
            accumulate_axis=axis,
            accumulate_shift=self._shift(nest, st, axis) if axis else 0,
            attributes=[(key, value) for key, value in st.attributes.items()
                        if key not in ("accumulate_axis", "iota_dimension", "broadcast")],
            broadcast=broadcast_inputs(st),
        )

    def _statement(self, nest: penguin_pb2.LoopNest, st: penguin_pb2.Statement, plan: _StatementPlan,
                   env: dict[str, int], point: tuple, label: str, resolved: dict) -> None:
        outputs = [self._resolve(a, point, resolved) for a in plan.outputs]
        inputs = [self._resolve(a, point, resolved) for a in plan.inputs]
        if any(ap is None for ap in outputs + inputs):
            return  # an empty box: the clipped tile has no elements
        instr = self._add_instruction(
            name=f"{nest.name}/{st.name}[{label}]",
            op=st.op,
            engine=st.engine,
            func=st.func,
            source=st.source,
        )
        instr.outputs.extend(ap for ap, _ in outputs)
        instr.inputs.extend(ap for ap, _ in inputs)
        if self.open_loops:
            self._loop_steps(instr.outputs, plan.outputs)
            self._loop_steps(instr.inputs, plan.inputs)
        instr.scalars.extend(st.scalars)
        if st.op == "matmul":
            axis = plan.accumulate_axis
            instr.accumulate = bool(axis) and env[axis] - plan.accumulate_shift != 0
        self._version(instr)
        for key, value in plan.attributes:
            instr.attributes[key] = value
        for position in plan.broadcast:  # a [P, 1] tile read across the output's free dim
            source, free = instr.inputs[position], instr.outputs[0].dims[-1].count
            del source.dims[:]
            source.dims.add(stride=0, count=free)
        if st.op == "iota":
            self._iota_scalars(instr, st, outputs[0][1])
        if st.op == "affine_select":
            self._affine_select_scalars(instr, st, outputs[0][1])
        if st.op == "dma" and _partition_broadcast(instr):
            self._broadcast_on_chip(instr)
        if st.op == "dma" and _hbm_to_hbm(instr) and len(instr.outputs[0].dims) > 2:
            _merge_copy_dims(instr)

    def _loop_steps(self, operands, plans: list[_AccessPlan]) -> None:
        """An HBM operand inside loops moves by its step per iteration of each, and so does an
        indexed array's (a block per iteration); other on-chip ones do not: a private buffer's
        copies rotate, which allocation decides, and a shared one stays."""
        for ap, plan in zip(operands, plans, strict=True):
            if not plan.steps:
                continue
            steps = [plan.step(loop.axis) * loop.copies for loop in self.open_loops]
            if any(steps):
                ap.loop.extend(bir_pb2.LoopVariation(step=step) for step in steps)

    def _broadcast_on_chip(self, load: bir_pb2.Instruction) -> None:
        """A load whose HBM rows repeat across the partitions (a [N] vector broadcast to a [P, N]
        tile) reads the row from HBM once, into one partition, and a second dma copies that
        partition to all P on chip: HBM moves N elements instead of P x N."""
        out, src = load.outputs[0], load.inputs[0]
        row = f"{out.tensor}.row{load.id}"
        free = math.prod(d.count for d in out.dims)
        buffer = self.bir.buffers.add(name=row, memory=out.memory, partitions=1,
                                      bytes_per_partition=free * itemsize(out.dtype), address=-1)
        if self.open_loops:  # loaded afresh at every iteration
            buffer.private_to = self.open_loops[-1].entry.id
        spread = self.bir.instructions.add()
        spread.CopyFrom(load)
        spread.id = len(self.bir.instructions) - 1
        spread.name = load.name + ".broadcast"
        del spread.inputs[:]
        spread.inputs.add(memory=out.memory, tensor=row, dtype=out.dtype, partition_count=1,
                          dims=[bir_pb2.Dim(stride=0, count=out.partition_count), *out.dims])
        del src.dims[0]
        del load.outputs[:]
        load.outputs.add(memory=out.memory, tensor=row, dtype=out.dtype, partition_count=1, dims=out.dims)

    def _merged_strides(self, tensor: penguin_pb2.TensorDecl) -> dict[int, int]:
        """An indexed array's merged dimensions -> the bytes per partition between consecutive
        blocks along each: a block's row (its free extent, the tensor's when narrower) for the
        innermost, times the blocks of the ones inside it for the others."""
        block = tensor.block_shape
        stride = min(block[-1], tensor.shape[-1]) * itemsize(tensor.dtype)
        strides = {}
        for dim in sorted(self.indexed_dims[tensor.name], reverse=True):
            strides[dim] = stride
            stride *= -(-tensor.shape[dim] // block[dim])
        return strides

    def _private_loop(self, tensor: str) -> int | None:
        """The innermost open loop each of whose iterations has its own blocks of `tensor`."""
        axes = self.private_axes.get(tensor)
        if axes:
            for loop in reversed(self.open_loops):
                if loop.axis in axes:
                    return loop.entry.id
        return None

    def _version(self, instr: bir_pb2.Instruction) -> None:
        """Name the buffer versions `instr` reads and writes (the module docstring's last point)."""
        for ap in instr.inputs:
            if ap.memory != common_pb2.HBM:
                ap.tensor = self.current.get(ap.tensor, ap.tensor)
        reads = {ap.tensor for ap in instr.inputs}
        for ap in instr.outputs:
            if ap.memory == common_pb2.HBM:
                continue
            block = ap.tensor
            name = self.current.get(block, block)
            written = self.versions.get(block)
            if written is None:
                self.versions[block] = 0  # the first write keeps the block's own name
            elif (name not in reads and not instr.accumulate and self._covers(ap, self.buffers[block])
                  and not self._shared_in_loop(self.buffers[block])):
                self.versions[block] = written + 1
                name = self.current[block] = f"{block}#{written + 1}"
                self.bir.buffers.add().CopyFrom(self.buffers[block])
                self.bir.buffers[-1].name = name
            ap.tensor = name

    def _shared_in_loop(self, buffer: bir_pb2.Buffer) -> bool:
        """Inside a loop, a buffer every iteration shares keeps its one name: what an iteration
        writes in full may still be read by the next one before it is written again. A buffer
        private to a Repeat region's trips is shared by the loops of a nest inside it."""
        if not self.open_loops:
            return False
        if self.region is not None and buffer.private_to == self.open_loops[0].entry.id:
            return len(self.open_loops) > 1
        return not buffer.HasField("private_to")

    @staticmethod
    def _covers(ap: bir_pb2.AccessPattern, buffer: bir_pb2.Buffer) -> bool:
        """Whether `ap` is every byte of `buffer`."""
        return (ap.partition_start == 0 and ap.partition_count == buffer.partitions and ap.offset == 0
                and len(ap.dims) == 1 and ap.dims[0].stride == 1
                and ap.dims[0].count * itemsize(ap.dtype) == buffer.bytes_per_partition)

    @staticmethod
    def _shift(nest: penguin_pb2.LoopNest, st: penguin_pb2.Statement, axis: str) -> int:
        """How far a pipelined statement's iteration lags its loop counter on `axis` (its stage)."""
        if any(a.name == axis and "pipelined" in a.attributes for a in nest.axes):
            return int(st.attributes.get("stage", "0"))
        return 0

    def _iota_scalars(self, instr: bir_pb2.Instruction, st: penguin_pb2.Statement, starts: list[int]) -> None:
        """Iota over the logical tensor: value = index along `iota_dimension`, offset by the tile start."""
        base = st.scalars[0] if st.scalars else 0.0
        if "iota_dimension" not in st.attributes:
            del instr.scalars[:]
            instr.scalars.extend([base, 0.0, 0.0])
            return
        dim, rank = int(st.attributes["iota_dimension"]), len(starts)
        scalars = [base + starts[dim], 0.0, 0.0]
        if dim == rank - 2:
            scalars[1] = 1.0
        elif dim == rank - 1:
            scalars[2] = 1.0
        del instr.scalars[:]
        instr.scalars.extend(scalars)

    @staticmethod
    def _affine_select_scalars(instr: bir_pb2.Instruction, st: penguin_pb2.Statement,
                               starts: list[int]) -> None:
        """An affine_select's predicate over the tile (docs/ir.md): the statement's [fill, const, row,
        column] over the tensor's last two dimensions becomes [fill, offset, partition step, column
        step] over the tile, offset by where the tile starts."""
        fill, const, row, column = st.scalars[:4]
        del instr.scalars[:]
        instr.scalars.extend([fill, const + row * starts[-2] + column * starts[-1], row, column])

    def _plan(self, access: penguin_pb2.Access, st: penguin_pb2.Statement, axes: list[str]) -> _AccessPlan:
        tensor = self.tensors.get(access.tensor)
        if tensor is None:
            raise CompileError("E301", f"statement uses undeclared tensor '{access.tensor}'", st.name)
        shape = tuple(tensor.shape)
        if len(access.starts) != len(shape) or len(access.extents) != len(shape):
            raise CompileError("E301", f"access rank does not match tensor '{tensor.name}'", st.name)
        starts = self._compiled(affine.point_function, access.starts, axes, st)
        steps: dict[str, int] = {}
        if tensor.memory == common_pb2.HBM and self.roll is not None:
            strides = tensor.view_strides if tensor.view_of else affine.row_major_strides(tensor.shape)
            for start, stride in zip(access.starts, strides, strict=True):
                for term in start.terms:
                    steps[term.var] = steps.get(term.var, 0) + term.coeff * stride
        elif tensor.name in self.indexed_dims and self.roll is not None:  # bytes per iteration
            block = tensor.block_shape
            for dim, stride in self._merged_strides(tensor).items():
                for term in access.starts[dim].terms:
                    if term.coeff % block[dim] == 0:
                        steps[term.var] = steps.get(term.var, 0) + term.coeff // block[dim] * stride
        if self.region is not None and tensor.memory == common_pb2.HBM:  # moves from trip to trip
            step = self.region.steps.get(tensor.view_of or tensor.name, 0)
            if step:
                steps[_region_axis(self.region)] = step
        return _AccessPlan(tensor, shape, starts, tuple(access.extents), steps)

    @staticmethod
    def _compiled(make, exprs, axes: list[str], st: penguin_pb2.Statement):
        """`make`(exprs, axes); a variable that is not one of the nest's axes, or an unknown
        predicate relation, is an E301."""
        try:
            return make(exprs, axes)
        except KeyError as err:
            raise CompileError("E301", f"statement uses {err.args[0]!r}, which is not an axis of its nest",
                               st.name) from None
        except ValueError as err:
            raise CompileError("E301", str(err), st.name) from None

    def _resolve(self, plan: _AccessPlan, point: tuple, resolved: dict):
        starts = plan.starts(point)
        key = (plan.tensor.name, *starts, *plan.extents)
        if key in resolved:  # the same box at the same point (a tile one statement writes, the next reads)
            return resolved[key]
        extents = [min(e, size - s) for s, e, size in zip(starts, plan.extents, plan.shape, strict=True)]
        if any(e <= 0 for e in extents):
            result = None
        elif plan.tensor.memory == common_pb2.HBM:
            result = self._hbm(plan.tensor, starts, extents), starts
        else:
            result = self._onchip(plan.tensor, starts, extents), starts
        resolved[key] = result
        return result

    def _hbm(self, tensor: penguin_pb2.TensorDecl, starts: list[int],
             extents: list[int]) -> bir_pb2.AccessPattern:
        if tensor.view_of:
            base, offset, strides = tensor.view_of, tensor.view_offset, list(tensor.view_strides)
        else:
            base, offset, strides = tensor.name, 0, list(affine.row_major_strides(tensor.shape))
        offset += sum(s * st for s, st in zip(starts, strides, strict=True))
        rank = len(extents)
        dims = [bir_pb2.Dim(stride=strides[d], count=extents[d])
                for d in range(rank) if d >= rank - 2 or extents[d] != 1]
        return bir_pb2.AccessPattern(memory=common_pb2.HBM, tensor=base, dtype=tensor.dtype, offset=offset,
                                     dims=dims)

    def _onchip(self, tensor: penguin_pb2.TensorDecl, starts: list[int],
                extents: list[int]) -> bir_pb2.AccessPattern:
        layout = self.layouts.get(tensor.name)
        if layout is None:
            layout = self.layouts[tensor.name] = _BlockLayout.of(tensor)
        block, rows = layout.block, layout.rows
        if layout.replicated:  # every block along these holds the same data: one buffer
            starts = [0 if d in layout.replicated else s for d, s in enumerate(starts)]
        if len(block) != len(starts) or any(e > 1 for e in extents[:-2]):
            raise CompileError("E301", f"access does not fit the block of on-chip tensor '{tensor.name}'",
                               tensor.name)
        inner = [s % b for s, b in zip(starts, block, strict=True)]
        if inner[-2] % rows + extents[-2] > rows and block[-2] > rows:
            raise CompileError("E301", f"access straddles two slabs of on-chip tensor '{tensor.name}'",
                               tensor.name)
        index = [str(s // b) for s, b in zip(starts, block, strict=True)]
        rings = self.roll.rings.get(tensor.name, ()) if self.roll is not None else ()
        if rings:  # one ring of slabs for every block, a slab per iteration the body holds
            slabs = self._copies(self.roll.axes[-1])
            inner = list(inner)
            for dim in rings:
                slab = rows if dim == len(block) - 2 else 1  # a slab: 128 rows, or 1 of a leading dim
                index[dim] = "~"
                inner[dim] = starts[dim] // slab % slabs * slab
        merged = self._merged_strides(tensor) if tensor.name in self.indexed_dims else {}
        base = 0  # an indexed array's block: its place in the buffer of the blocks merged
        for dim, stride in merged.items():
            base += starts[dim] // block[dim] * stride
            index[dim] = "*"
        name = f"{tensor.name}[{','.join(index)}]"
        if layout.slabbed:
            name += "/" + ".".join([str(at) for at in [*inner[:-2], inner[-2] // rows]])
        size = layout.itemsize
        if name not in self.buffers:
            # Sized to what the block can hold of the tensor: a block at the tensor's edge (or of a
            # tensor narrower than a block) holds only the elements that exist, not a full block.
            first = starts[-1] - inner[-1]
            held = min(block[-1], layout.last_extent - first) * size
            if merged:  # every block along the merged dimensions, side by side
                outer = min(merged)  # the outermost has the largest stride
                held = merged[outer] * -(-tensor.shape[outer] // block[outer])
            buffer = self.buffers[name] = self.bir.buffers.add(
                name=name, memory=tensor.memory, partitions=rows, bytes_per_partition=held, address=-1,
            )
            loop = self._private_loop(tensor.name)
            if loop is None and self.region is not None:
                # a Repeat region's trips hand values on through HBM only: every on-chip buffer
                # of its nests is written afresh at each trip
                loop = self.open_loops[0].entry.id
            if loop is not None:
                buffer.private_to = loop
        return bir_pb2.AccessPattern(
            memory=tensor.memory,
            tensor=name,
            dtype=tensor.dtype,
            offset=base + inner[-1] * size,
            partition_start=inner[-2] % rows,
            partition_count=extents[-2],
            dims=[bir_pb2.Dim(stride=1, count=extents[-1])],
        )


@dataclass(frozen=True)
class _BlockLayout:
    """How an on-chip tensor's blocks become virtual buffers, read once per tensor. A virtual
    buffer is one slab of a block: at most 128 partitions by the block's free extent. A block has
    one slab unless it spans several leading positions or more than 128 rows (a block widened by
    software pipelining to hold several iterations, one slab each: `slabbed`)."""
    block: tuple[int, ...]
    rows: int
    slabbed: bool
    replicated: frozenset[int]
    itemsize: int
    last_extent: int  # the tensor's last dimension

    @classmethod
    def of(cls, tensor: penguin_pb2.TensorDecl) -> _BlockLayout:
        """E301 for a block of fewer than two dimensions (partitions by free elements)."""
        block = tuple(tensor.block_shape)
        if len(block) < 2:
            raise CompileError("E301", f"on-chip tensor '{tensor.name}' has a block of {len(block)} "
                               "dimensions; it needs partitions and free elements", tensor.name)
        rows = min(block[-2], PARTITIONS)
        slabbed = math.prod(block[:-2]) > 1 or block[-2] > rows
        return cls(block, rows, slabbed, frozenset(tensor.replicated_dims), itemsize(tensor.dtype),
                   tensor.shape[-1])


def _reduction_bytes(nest: penguin_pb2.LoopNest, tensors: dict[str, penguin_pb2.TensorDecl],
                     axes: list[rolling.RolledAxis]) -> int:
    """Bytes per partition of the operand tiles that a dot's reduction loop among `axes` would
    hold in one body if it were unrolled there: every K step's stationary and moving tiles at once
    (the training step's 60 moving tiles of 2 KiB did not fit SBUF beside the rest)."""
    trips = {axis.name: axis.trip for axis in axes}
    total = 0
    for st in nest.statements:
        trip = trips.get(st.attributes.get("accumulate_axis", "")) if st.op == "matmul" else None
        if trip:
            for access in st.inputs:
                tensor = tensors[access.tensor]
                total += trip * tensor.block_shape[-1] * itemsize(tensor.dtype)
    return total


def _emitted_share(nest: penguin_pb2.LoopNest, plan: rolling.RollPlan | None) -> float:
    """The share of a nest's points that are emitted when `plan` keeps its loops: per rolled
    axis, its peeled iterations and the iterations one body holds, out of all."""
    share = 1.0
    if plan is None:
        return share
    extents = {axis.name: int(axis.extent) for axis in nest.axes}
    for rolled in plan.axes:
        copies = plan.copies if rolled is plan.axes[-1] else 1
        trip = rolled.trip // copies if rolled.trip >= copies else 0
        emitted = extents[rolled.name] - (trip - 1) * copies if trip >= 2 else extents[rolled.name]
        share *= emitted / max(1, extents[rolled.name])
    return share


def _region_axis(region: penguin_pb2.Repeat) -> str:
    """The name a Repeat region's loop goes by among the open loops (no nest axis has a colon)."""
    return f"repeat:{region.name}"


def _label(axis: str, value: int, symbolic: dict[str, int]) -> str:
    """An axis's part of an instruction name: `i3` at a point, `i*` in a loop body (`i*+1` for
    the second iteration a jammed body holds)."""
    first = symbolic.get(axis)
    if first is None:
        return f"{axis}{value}"
    return f"{axis}*" if value == first else f"{axis}*+{value - first}"


def _hbm_to_hbm(dma: bir_pb2.Instruction) -> bool:
    return (len(dma.inputs) == 1 and len(dma.outputs) == 1 and dma.inputs[0].memory == common_pb2.HBM
            and dma.outputs[0].memory == common_pb2.HBM)


def _merge_copy_dims(dma: bir_pb2.Instruction) -> None:
    """An HBM-to-HBM dma of several dimensions (a direct copy whose loops joined its box) walks both
    sides in the destination's order (largest stride first: the same permutation on both, so the
    same element pairs), then each side merges neighbours that are contiguous (stride of the outer
    = stride x count of the inner). A dma pairs its sides' elements in order, whatever their dims."""
    src, dst = dma.inputs[0], dma.outputs[0]
    if [d.count for d in src.dims] != [d.count for d in dst.dims]:
        return
    order = sorted(range(len(dst.dims)), key=lambda d: -abs(dst.dims[d].stride))
    for side in (src, dst):
        dims = [(side.dims[d].stride, side.dims[d].count) for d in order]
        merged = [dims[0]]
        for stride, count in dims[1:]:
            outer_stride, outer_count = merged[-1]
            if outer_stride == stride * count:
                merged[-1] = (stride, outer_count * count)
            else:
                merged.append((stride, count))
        del side.dims[:]
        side.dims.extend(bir_pb2.Dim(stride=stride, count=count) for stride, count in merged)


def _partition_broadcast(load: bir_pb2.Instruction) -> bool:
    """An HBM -> on-chip dma whose HBM side repeats one row for every partition (stride 0; also
    for a one-row partial tile, so that the instruction budget counts every such load alike)."""
    src, out = load.inputs[0], load.outputs[0]
    return (src.memory == common_pb2.HBM and out.memory != common_pb2.HBM and len(src.dims) > 1
            and src.dims[0].stride == 0 and src.dims[0].count == out.partition_count)


@dataclass(frozen=True)
class _StatementPlan:
    """A statement read once per nest: its accesses' plans and what its instructions copy."""
    outputs: list[_AccessPlan]
    inputs: list[_AccessPlan]
    accumulate_axis: str  # a matmul's: it accumulates except at this axis's first step
    accumulate_shift: int  # the statement's pipeline stage along that axis
    attributes: list[tuple[str, str]]  # the statement attributes every instruction carries
    broadcast: list[int]  # positions of the [P, 1] input tiles read across the output's free dimension


@dataclass(frozen=True)
class _AccessPlan:
    """An access read once per nest: its tensor, and its starts compiled to one function of the point."""
    tensor: penguin_pb2.TensorDecl
    shape: tuple[int, ...]
    starts: Callable[[tuple], list[int]]
    extents: tuple[int, ...]
    steps: dict[str, int]  # the offset's step per iteration of each axis it moves with: HBM
    # elements, or an indexed array's bytes

    def step(self, axis: str) -> int:
        return self.steps.get(axis, 0)


def lower_to_bir(program: penguin_pb2.Program, target: str = "trn1", loops: str = "unrolled",
                 small_nest: int = SMALL_NEST) -> bir_pb2.Program:
    """Lower `program` to BIR, unrolled or with loops kept rolled (`loops`: LOOP_MODES), a nest of
    at most `small_nest` instructions unrolled in every mode; E302 if it exceeds the instruction
    budget, E301 if it is malformed."""
    return BirCodeGenLoop(program, target, loops, small_nest=small_nest).run()
