"""HLO while loops kept as loops: the body lowered once, as a Penguin `Repeat` region.

Why: unrolled (control.py), a loop costs its trip count in nests, in BIR and in every pass after
them; a 2,000-step `lax.scan` was 12,000 nests and a 35 s compile. A body whose every trip lowers
to the same nests, but for where its HBM accesses fall, is lowered once instead: its nests form a
region that runs `trips` times (penguin.proto `Repeat`), and at trip t an access to a tensor
moves by a fixed number of elements per trip (`steps`: the scan's xs[t] and ys[t]).

How the trips are made the same:
  * the loop state is split into elements the body passes through unchanged (weights, xs: read
    in place), compile-time scalars (the counter: folded at every trip, as the unroller does, and
    required to be affine in the trip), and carried arrays, which get an HBM tensor each (a
    *carry*): filled from the initial value before the loop, read by every trip, and written
    again at the end of the trip from the trip's result (a result that reads some carry is first
    copied aside, so that no copy overwrites what a later one reads);
  * a dynamic-update-slice of a carry at a compile-time start that only the trip's result reads
    again (the scan's ys[t] = y) writes the carry in place rather than copying all of it.
Trip 0 is lowered for real; trips 1, the middle one and the last are lowered on trial and compared
with it, nest by nest with names set aside: the same nests and the same tensors, every view of
one base moved by the same multiple of the trip. A loop that fails any of this (a counter used
as data, a carry read after its in-place update, a clamp that bites at some trip) is unrolled
as before. `--loops unrolled` unrolls every loop. Otherwise (`auto` or `rolled`) a loop is kept
when, unrolled, its trips would be at least AUTO_ROLL_ABOVE backend instructions (lower_module's
`repeat_above`), counting the
whole copy of each in-place carry that every unrolled trip makes (a scan's ys: a 500-step RNN
unrolled moves its [500, 4, 32] outputs 500 times). A smaller loop unrolls, since a kept loop
pays at every trip for what unrolling removes: its carries go to HBM and back, and its trips do
not fuse (a 50-step elementwise fori_loop ran 9x slower kept).

A mixin of Lowering (lower.py), like control.py.
"""

from __future__ import annotations

from ncc.schemas import hlo_pb2, penguin_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.common.loops import REPEAT
from ncc.tools.common.penguin_budget import nest_backend_instructions, with_pieces
from ncc.tools.hlo2penguin.trip_fold import FoldedTrips, steps_evenly
from ncc.tools.hlo2penguin.values import Splat, Value
from ncc.tools.hlo2penguin.views import View

MIN_TRIPS = 4  # fewer trips unroll: the trial lowerings would cost as much as the trips


class _NotRepeatable(Exception):
    """The loop does not fit a region (the module docstring); it is unrolled instead."""


class RepeatOps:
    def _repeat_while(self, instr, body: hlo_pb2.HloComputationProto, state: Value,
                      folded: FoldedTrips) -> Value | None:
        """The loop's result, its body lowered once as a region; None (nothing emitted) when it
        does not fit one, or under --loops auto when its trips are too few to pay. `folded`: the
        trip count and the state's scalars at every trip (trip_fold.py). Every scalar the body
        computes must step evenly from trip to trip: one that does not (a `t == 5`) would make
        some trip lower differently from the trips compared."""
        trips = folded.count
        if self.loops == "unrolled" or trips < MIN_TRIPS or not isinstance(state, tuple) or not folded.evenly:
            return None
        kinds = _state_kinds(body, state, folded)
        if kinds is None:
            return None
        before = self._snapshot()
        carries = {j: self.builder.hbm_tensor(f"{instr.name}.carry{j}", value.dtype, value.shape,
                                              penguin_pb2.INTERNAL, instr.name)
                   for j, value in enumerate(state) if kinds[j] == "carried"}
        copy_cost = {}  # carry -> the instructions of copying it whole
        for j, name in carries.items():
            mark = len(self.builder.program.nests)
            self._copy_into(state[j], View.whole(name, state[j].dtype, state[j].shape), instr.name)
            copy_cost[name] = self._instructions(mark)
        start = self._snapshot()
        try:
            self._lower_trip(instr, body, state, folded, kinds, carries, 0)
            # unrolled, each trip would also copy whole every carry it updates in place
            in_place = sum(copy_cost[base] for base, _ in self.inplace_writes)
            unrolled = trips * (self._instructions(start[1]) + in_place)
            if unrolled < self.repeat_above:
                raise _NotRepeatable
            steps = self._trial_steps(instr, body, state, folded, kinds, carries, start, trips)
        except _NotRepeatable:
            self._restore(before)
            return None
        except CompileError as error:  # a loop inside whose trips follow this loop's counter (a
            # triangular fori_loop) folds only once this loop is unrolled: unroll it
            if error.code != "E207":
                raise
            self._restore(before)
            return None
        name = self.builder.unique(f"{instr.name}.repeat")
        for nest in self.builder.program.nests[start[1]:]:
            nest.attributes[REPEAT] = name
        repeat = self.builder.program.repeats.add(name=name, trips=trips, source=instr.name)
        for base, step in sorted(steps.items()):
            repeat.steps[base] = step
        return self._trip_state(state, folded, trips, kinds, carries)  # what the last trip left

    # ---- the state ----------------------------------------------------------------------------
    def _trip_state(self, state: tuple, folded: FoldedTrips, trip: int, kinds: list[str],
                    carries: dict[int, str]) -> tuple:
        """The state at the start of trip `trip` (at `folded.count`: what the last trip leaves)."""
        values = []
        for j, value in enumerate(state):
            if kinds[j] == "scalar":
                values.append(Splat(float(folded.scalar(j, trip)[0]), value.dtype, value.shape))
            elif kinds[j] == "carried":
                values.append(View.whole(carries[j], value.dtype, value.shape))
            else:
                values.append(value)
        return tuple(values)

    # ---- one trip -------------------------------------------------------------------------------
    def _lower_trip(self, instr, body, state: tuple, folded: FoldedTrips, kinds: list[str],
                    carries: dict[int, str], trip: int) -> None:
        """Emit trip `trip`'s nests: the body on the trip's state, then the carries written back."""
        self.inplace_carries, self.inplace_writes = set(carries.values()), []
        try:
            out = self._computation(body, [self._trip_state(state, folded, trip, kinds, carries)])
        finally:
            self.inplace_carries = set()
        if not isinstance(out, tuple) or len(out) != len(state):
            raise _NotRepeatable
        self._check_inplace(out, carries)
        carried = {j: out[j] for j in carries
                   if out[j] != View.whole(carries[j], state[j].dtype, state[j].shape)}
        aside = {}
        for j, value in carried.items():  # a result that reads a carry is copied aside first
            if isinstance(value, View) and value.base in carries.values():
                aside[j] = self._materialize(value, instr.name)
        for j, value in carried.items():
            target = View.whole(carries[j], state[j].dtype, state[j].shape)
            self._copy_into(aside.get(j, value), target, instr.name)

    def _check_inplace(self, out: tuple, carries: dict[int, str]) -> None:
        """An in-place update of a carry is right when its result is that carry's next value, no
        other result is that carry, and nothing after the update reads the carry."""
        program = self.builder.program
        tensors = {t.name: t for t in program.tensors}
        for base, after in self.inplace_writes:
            slots = [j for j, value in enumerate(out) if isinstance(value, View) and value.base == base]
            if [carries.get(j) for j in slots] != [base]:
                raise _NotRepeatable
            for nest in program.nests[after:]:
                for st in nest.statements:
                    for access in st.inputs:
                        if (tensors[access.tensor].view_of or access.tensor) == base:
                            raise _NotRepeatable

    def _instructions(self, first_nest: int) -> int:
        """The backend instructions of the nests from `first_nest` on, unrolled."""
        program = self.builder.program
        tensors = {t.name: t for t in program.tensors}
        counts = [nest_backend_instructions(nest, tensors) for nest in program.nests[first_nest:]]
        return with_pieces(sum(w for w, _ in counts), sum(e for _, e in counts))

    def _trial_steps(self, instr, body, state: tuple, folded: FoldedTrips, kinds: list[str],
                     carries: dict[int, str], start: tuple, trips: int) -> dict[str, int]:
        """Lower trips 1, the middle one and the last on trial, compare each with trip 0, and
        return each base's step per trip (the module docstring); raise _NotRepeatable if any differs."""
        program = self.builder.program
        first, offsets = _trip_form(program, start)
        steps: dict[str, int] = {}
        for trip in sorted({1, trips // 2, trips - 1}):
            mark = self._snapshot()
            self._lower_trip(instr, body, state, folded, kinds, carries, trip)
            form, moved = _trip_form(program, mark)
            self._restore(mark)
            if form != first or len(moved) != len(offsets):
                raise _NotRepeatable
            for (base, offset), (moved_base, moved_offset) in zip(offsets, moved, strict=True):
                delta = moved_offset - offset
                if moved_base != base or delta % trip:
                    raise _NotRepeatable
                if steps.setdefault(base, delta // trip) != delta // trip:
                    raise _NotRepeatable  # views of one base move by different steps
        if any(step and base.startswith("#") for base, step in steps.items()):
            raise _NotRepeatable  # a tensor of the trip itself moves: not one region
        return {base: step for base, step in steps.items() if step}

    # ---- trial lowering ---------------------------------------------------------------------------
    def _snapshot(self) -> tuple:
        """(tensors, nests, the builder's and the lowering's state) to go back to after a trial."""
        program = self.builder.program
        return len(program.tensors), len(program.nests), self.builder.snapshot(), set(self.produced), \
            dict(self.plans)

    def _restore(self, mark: tuple) -> None:
        _, _, builder, produced, plans = mark
        self.builder.restore(builder)
        self.produced, self.plans = set(produced), dict(plans)


def _state_kinds(body: hlo_pb2.HloComputationProto, state: tuple, folded: FoldedTrips) -> list[str] | None:
    """Per state element: "same" (the body passes it through), "scalar" (known at every trip,
    affine in the trip) or "carried"; None when the loop does not fit a region."""
    by_id = {i.id: i for i in body.instructions}
    root = by_id.get(body.root_id) or body.instructions[-1]
    parameter = next((i for i in body.instructions if i.opcode == "parameter"), None)
    if root.opcode != "tuple" or parameter is None or len(root.operand_ids) != len(state):
        return None
    kinds = []
    for j, value in enumerate(state):
        if isinstance(value, tuple):
            return None
        source = by_id[root.operand_ids[j]]
        if source.opcode == "get-tuple-element" and source.tuple_index == j \
                and list(source.operand_ids) == [parameter.id]:
            kinds.append("same")
            continue
        series = folded.series[j] if j < len(folded.series) else None
        if isinstance(value, Splat) and series is not None:
            if not steps_evenly(series):
                return None  # a scalar the trips do not step evenly: each trip would differ
            kinds.append("scalar")
            continue
        kinds.append("carried")
    return kinds


def _trip_form(program: penguin_pb2.Program, mark: tuple) -> tuple[list[bytes], list[tuple[str, int]]]:
    """The nests and tensors emitted since `mark`, with names set aside (a tensor of the trip is
    `#k` by order of declaration, a view is its base, shape and strides), and the (base, offset)
    of every view access in order: what two trips must share, and where they may differ."""
    tensors_from, nests_from = mark[0], mark[1]
    decls = {t.name: t for t in program.tensors}
    own: dict[str, str] = {}
    forms: list[bytes] = []
    for tensor in program.tensors[tensors_from:]:
        if tensor.view_of:
            continue
        own[tensor.name] = f"#{len(own)}"
        form = penguin_pb2.TensorDecl()
        form.CopyFrom(tensor)
        form.name, form.source = "", ""
        forms.append(form.SerializeToString(deterministic=True))
    offsets: list[tuple[str, int]] = []
    for nest in program.nests[nests_from:]:
        form_nest = penguin_pb2.LoopNest()
        form_nest.CopyFrom(nest)
        form_nest.name, form_nest.source = "", ""
        for st in form_nest.statements:
            st.name, st.source = "", ""
            for access in (*st.outputs, *st.inputs):
                decl = decls[access.tensor]
                if decl.view_of:
                    base = own.get(decl.view_of, decl.view_of)
                    offsets.append((base, decl.view_offset))
                    access.tensor = f"{base}|{decl.dtype}|{list(decl.shape)}|{list(decl.view_strides)}"
                else:
                    access.tensor = own.get(access.tensor, access.tensor)
        forms.append(form_nest.SerializeToString(deterministic=True))
    return forms, offsets
