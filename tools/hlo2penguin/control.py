"""Control flow without control flow: while loops unrolled while their condition folds to a
constant, conditionals as one branch (a constant selector) or every branch and a select.

Before a loop is unrolled, its trip count is found by folding only its compile-time scalars (the
counter and what the condition reads) through condition and body (trip_fold.py: for all trips at
once where they are affine in the trip, else trip by trip), which costs microseconds where lowering
the body costs milliseconds a trip: a loop of more trips than the limit is refused at once, and the
instruction budget projects from the first trip over all of them.

A mixin of Lowering (lower.py): its methods call the rest of the lowering through `self`.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ncc.schemas import common_pb2, hlo_pb2, penguin_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.common.penguin_budget import MAX_INSTRUCTIONS, nest_backend_instructions, with_pieces
from ncc.tools.hlo.elementwise import BINARY_OPCODES, UNARY_OPCODES, apply
from ncc.tools.hlo.hlo_types import compute_dtype, is_tuple, xla_type
from ncc.tools.hlo.literals import literal_to_numpy
from ncc.tools.hlo2penguin.trip_fold import Folded, FoldedTrips, fold_loop, root_id
from ncc.tools.hlo2penguin.values import Splat, Value

# Ops a trip count can be folded through: elementwise ops on constants, and moves of a constant.
_FOLDABLE = UNARY_OPCODES | BINARY_OPCODES | {"compare", "select", "clamp", "convert", "copy"}
_SAME_VALUE = frozenset({"broadcast", "reshape", "bitcast", "transpose", "slice", "reverse"})

MAX_UNROLLED_ITERATIONS = 10_000  # a while loop is unrolled: 100 instructions a trip fill the budget (E302)
MAX_KEPT_TRIPS = 1_000_000  # a loop kept as a loop (repeat.py): its trip count is a number in the NEFF


class Budget:
    """Stops a lowering that repeats a body (an unrolled loop, a row-by-row scatter) as soon as what
    it emitted passes the instruction budget, or, when the number of rounds is known, as soon as the
    first round shows that all of them would (E302), rather than after building all of it. It counts
    backend instructions (each dma as the pieces split_dma cuts it into) on top of what the program
    already holds, as the budget check of the whole program does, so a program it lets through is
    not refused later, after all of it was built, for the same reason."""

    def __init__(self, program: penguin_pb2.Program, name: str, what: str, planned: int = 0) -> None:
        self.program, self.name, self.what, self.planned = program, name, what, planned
        self.counted, self.rounds = len(program.nests), 0
        self.tensors = {tensor.name: tensor for tensor in program.tensors}
        self.tensors_seen = len(program.tensors)
        # (instructions with each dma whole, extra pieces) before this body and in its rounds so far
        self.before = self._count(program.nests)
        self.whole = self.extra = 0

    def _count(self, nests: Iterable[penguin_pb2.LoopNest]) -> tuple[int, int]:
        counts = [nest_backend_instructions(nest, self.tensors) for nest in nests]
        return sum(whole for whole, _ in counts), sum(extra for _, extra in counts)

    def charge(self) -> None:
        nests, tensors = self.program.nests, self.program.tensors
        for k in range(self.tensors_seen, len(tensors)):  # only the declarations made since last time
            self.tensors[tensors[k].name] = tensors[k]
        self.tensors_seen = len(tensors)
        whole, extra = self._count(nests[k] for k in range(self.counted, len(nests)))
        self.whole, self.extra = self.whole + whole, self.extra + extra
        self.counted, self.rounds = len(nests), self.rounds + 1
        scale = self.planned / self.rounds if self.planned else 1.0
        expected = with_pieces(self.before[0] + int(max(1.0, scale) * self.whole),
                               self.before[1] + int(max(1.0, scale) * self.extra))
        if expected > MAX_INSTRUCTIONS:
            rounds = f"{self.rounds:,} of {self.planned or self.rounds:,}"
            so_far = with_pieces(self.whole, self.extra)
            before = with_pieces(*self.before)
            raise CompileError("E302", f"program too large: {self.what} '{self.name}' unrolls past the "
                                       f"budget of {MAX_INSTRUCTIONS:,} backend instructions ({so_far:,} "
                                       f"in its first {rounds} rounds, {before:,} before it)", self.name)


class ControlOps:
    def _while(self, instr, state: Value) -> Value:
        """Kept as a loop where repeat.py can (a region of nests that runs once per trip); else
        unrolled: the condition must fold to a constant each time round (a counter that starts from
        a constant and steps by constants, as fori_loop and scan emit); the body is lowered once per
        iteration with that iteration's state, so a dynamic-slice by the counter becomes a static slice."""
        body, condition = (self.computations[c] for c in instr.called_computation_ids)
        folded = self._fold_trips(body, condition, state)
        trips = folded.count if folded is not None else None
        if trips is not None and trips > MAX_KEPT_TRIPS:
            raise CompileError("E207", f"while loop '{instr.name}' runs more than {MAX_KEPT_TRIPS:,} "
                                       "iterations", instr.name)
        if folded is not None and not self.in_repeat and folded.series:
            self.in_repeat = True  # a loop inside a kept loop's body unrolls: regions do not nest
            try:
                kept = self._repeat_while(instr, body, state, folded)  # repeat.py
            finally:
                self.in_repeat = False
            if kept is not None:
                return kept
        if trips is not None and trips > MAX_UNROLLED_ITERATIONS:
            if trips == MAX_UNROLLED_ITERATIONS + 1:  # folded one trip at a time: only "past the limit"
                runs = f"more than {MAX_UNROLLED_ITERATIONS:,} iterations, the most a loop is unrolled"
            else:
                runs = f"{trips:,} iterations: more than {MAX_UNROLLED_ITERATIONS:,} unrolled"
            raise CompileError("E207", f"while loop '{instr.name}' runs {runs}, and it cannot stay a loop",
                               instr.name)
        budget = Budget(self.builder.program, instr.name, "while loop", planned=trips or 0)
        for _ in range(MAX_UNROLLED_ITERATIONS):
            verdict = self._computation(condition, [state])
            if not isinstance(verdict, Splat):
                raise CompileError("E207", f"while loop '{instr.name}' has a trip count not known at compile "
                                           "time: its condition depends on the module's inputs or on data "
                                           "computed from them", instr.name)
            if not verdict.value:
                return state
            state = self._computation(body, [state])
            budget.charge()
        raise CompileError("E207", f"while loop '{instr.name}' runs more than {MAX_UNROLLED_ITERATIONS} "
                                   "iterations", instr.name)

    def _fold_trips(self, body, condition, state: Value) -> FoldedTrips | None:
        """How many times the loop runs and its compile-time scalars at every trip, from those
        scalars alone (trip_fold.py); None when the condition needs more than they give (the
        unroller then decides, or refuses, as it goes). Past the limit: count limit + 1."""
        return fold_loop(self._fold_values, body, condition, constants_of(state),
                         MAX_KEPT_TRIPS, MAX_UNROLLED_ITERATIONS)

    def _fold_computation(self, comp: hlo_pb2.HloComputationProto, args: list[Folded]) -> Folded:
        return self._fold_values(comp, args)[root_id(comp)]

    @staticmethod
    def _fold_values(comp: hlo_pb2.HloComputationProto, args: list[Folded]) -> dict[int, Folded]:
        """Every instruction of `comp` folded (None where it is not a compile-time constant)."""
        values: dict[int, Folded] = {}
        for instr in comp.instructions:
            values[instr.id] = _fold_instruction(instr, [values[i] for i in instr.operand_ids], args)
        return values

    def _conditional(self, instr, ops: list[Value]) -> Value:
        """A constant selector lowers its branch only; a computed one lowers every branch (they have no
        side effects) and selects each result element by the selector, the last branch by default."""
        selector, branches = ops[0], [self.computations[c] for c in instr.called_computation_ids]
        if isinstance(selector, Splat):
            index = int(selector.value)
            if selector.dtype == common_pb2.PRED:
                index = 0 if selector.value else 1
            index = index if 0 <= index < len(branches) else len(branches) - 1
            return self._computation(branches[index], [ops[1 + index]])
        operands = zip(branches, ops[1:], strict=True)
        results = [self._computation(branch, [operand]) for branch, operand in operands]
        chosen = results[-1]
        for index in range(len(branches) - 2, -1, -1):
            if selector.dtype == common_pb2.PRED:
                taken: Value = selector
            else:
                taken = self._synthetic(instr, "compare", [selector, Splat(float(index), selector.dtype, ())],
                                        (), common_pb2.PRED, comparison_direction="EQ")
            chosen = self._select_tree(instr, taken, results[index], chosen)
        return chosen

    def _select_tree(self, instr, taken: Value, on_true: Value, on_false: Value) -> Value:
        if isinstance(on_true, tuple):
            pairs = zip(on_true, on_false, strict=True)
            return tuple(self._select_tree(instr, taken, a, b) for a, b in pairs)
        return self._synthetic(instr, "select", [taken, on_true, on_false], on_true.shape, on_true.dtype)


def constants_of(value: Value) -> Folded:
    """A lowering value as the trip counter sees it: a Splat's one value, tuples element by element."""
    if isinstance(value, tuple):
        return tuple(constants_of(v) for v in value)
    if isinstance(value, Splat):
        return np.asarray([value.value]).astype(compute_dtype(xla_type(value.dtype)))
    return None


def _fold_instruction(instr: hlo_pb2.HloInstructionProto, ops: list[Folded], args: list[Folded]) -> Folded:
    opcode = instr.opcode
    if opcode == "parameter":
        return args[instr.parameter_number] if instr.parameter_number < len(args) else None
    if opcode == "tuple":
        return tuple(ops)
    if opcode == "opt-barrier":
        return ops[0]
    if opcode == "get-tuple-element":
        return ops[0][instr.tuple_index] if isinstance(ops[0], tuple) and instr.tuple_index < len(ops[0]) \
            else None
    if is_tuple(instr.shape):
        return None
    if opcode == "constant":
        values = literal_to_numpy(instr.literal, instr.shape, instr.name).reshape(-1)
        if values.size == 0 or not np.all(values == values[0]):
            return None
        return values[:1].astype(compute_dtype(instr.shape.element_type))
    if opcode in _SAME_VALUE:
        return ops[0] if isinstance(ops[0], np.ndarray) else None
    if opcode in _FOLDABLE and ops and all(isinstance(op, np.ndarray) for op in ops):
        name = instr.comparison_direction if opcode == "compare" else opcode
        if opcode == "convert":
            name = "copy"
        return apply(name, ops, instr.shape.element_type)
    return None
