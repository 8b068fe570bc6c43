"""Control flow without control flow: while loops unrolled while their condition folds to a
constant, conditionals as one branch (a constant selector) or every branch and a select.

A mixin of Lowering (lower.py): its methods call the rest of the lowering through `self`.
"""

from __future__ import annotations

from ncc.schemas import common_pb2, penguin_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.common.penguin_budget import MAX_INSTRUCTIONS, nest_instructions
from ncc.tools.hlo2penguin.values import Splat, Value

MAX_UNROLLED_ITERATIONS = 10_000  # a while loop is unrolled: 100 instructions a trip fill the budget (E302)


class Budget:
    """Stops a lowering that repeats a body (an unrolled loop, a row-by-row scatter) as soon as what
    it emitted passes the instruction budget, or, when the number of rounds is known, as soon as the
    first round shows that all of them would (E302), rather than after building all of it."""

    def __init__(self, program: penguin_pb2.Program, name: str, what: str, planned: int = 0) -> None:
        self.program, self.name, self.what, self.planned = program, name, what, planned
        self.counted, self.total, self.rounds = len(program.nests), 0, 0

    def charge(self) -> None:
        nests = self.program.nests
        self.total += sum(nest_instructions(nests[k]) for k in range(self.counted, len(nests)))
        self.counted, self.rounds = len(nests), self.rounds + 1
        expected = self.total * self.planned // self.rounds if self.planned else self.total
        if max(self.total, expected) > MAX_INSTRUCTIONS:
            rounds = f"{self.rounds:,} of {self.planned or self.rounds:,}"
            raise CompileError("E302", f"program too large: {self.what} '{self.name}' unrolls past the "
                                       f"budget of {MAX_INSTRUCTIONS:,} instructions ({self.total:,} in its "
                                       f"first {rounds} rounds)", self.name)


class ControlOps:
    def _while(self, instr, state: Value) -> Value:
        """Unroll: the condition must fold to a constant each time round (a counter that starts from
        a constant and steps by constants, as fori_loop and scan emit); the body is lowered once per
        iteration with that iteration's state, so a dynamic-slice by the counter becomes a static slice."""
        body, condition = (self.computations[c] for c in instr.called_computation_ids)
        budget = Budget(self.builder.program, instr.name, "while loop")
        for _ in range(MAX_UNROLLED_ITERATIONS):
            verdict = self._computation(condition, [state])
            if not isinstance(verdict, Splat):
                raise CompileError("E207", f"while loop '{instr.name}' has a trip count not known at compile "
                                           "time: its condition depends on computed data", instr.name)
            if not verdict.value:
                return state
            state = self._computation(body, [state])
            budget.charge()
        raise CompileError("E207", f"while loop '{instr.name}' runs more than {MAX_UNROLLED_ITERATIONS} "
                                   "iterations", instr.name)

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
