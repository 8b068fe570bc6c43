"""Instruction selection for ACT: an elementwise chain that computes one of the ACT engine's built-in
functions becomes one activation of that function.

The one chain today is the tanh approximation of gelu, as JAX's `jax.nn.gelu(approximate=True)`
and the models built on it write it: nine statements, seven of them on DVE,

    x² = x·x;  x³ = x²·x;  q = x³·0.044715;  s = x + q;  m = s·√(2/π);
    t = tanh(m);  u = t + 1;  h = u·0.5;  y = x·h

which is `gelu_apprx_tanh`, one function of ACT's table (NKI: `nl.gelu_apprx_tanh`). gelu
[256, 1024] was DVE-bound at 3.4 times its bound: DVE ran the seven statements of every tile, ACT
only the tanh. The simulator computes the function as exactly those nine float32 operations, in
that order (`numerics.gelu_apprx_tanh`, whose constants this pass requires), so a program gives
the same bits with or without this pass (a product or a sum matched with its operands swapped is
the same in IEEE arithmetic).

A chain matches when, within one nest, each link is the only statement that writes its result,
every statement of the chain accesses the same tile under the same predicates, x is not written
between the chain's first statement and its last, the constants equal the function's in float32,
and every tensor involved is float32 (a bf16 chain rounds after every step; the function does
not). The last statement becomes the activation; the others are left for `dce`, which drops
those nothing else reads, so this pass runs before it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ncc.schemas import common_pb2, penguin_pb2
from ncc.tools.common.numerics import GELU_CUBE_COEFF, GELU_SCALE

GELU_TANH = "gelu_apprx_tanh"


@dataclass
class ActFunctionStats:
    gelu_apprx_tanh: int = 0


def select_act_functions(program: penguin_pb2.Program) -> ActFunctionStats:
    stats = ActFunctionStats()
    f32 = {t.name for t in program.tensors if t.dtype == common_pb2.F32}
    for nest in program.nests:
        chains = _Nest(nest, f32)
        for index, statement in enumerate(nest.statements):
            x = chains.gelu_input(index)
            if x is None:
                continue
            x_access = penguin_pb2.Access()
            x_access.CopyFrom(statement.inputs[0] if statement.inputs[0].tensor == x else statement.inputs[1])
            statement.op, statement.engine, statement.func = "activation", common_pb2.ACT, GELU_TANH
            del statement.inputs[:]
            statement.inputs.append(x_access)
            del statement.scalars[:]
            statement.scalars.extend([1.0, 0.0])  # scale, bias
            stats.gelu_apprx_tanh += 1
    return stats


class _Nest:
    """One nest's statements, who writes each tensor, and the chain links between them."""

    def __init__(self, nest: penguin_pb2.LoopNest, f32: set[str]) -> None:
        self.statements = nest.statements
        self.f32 = f32
        self.writers: dict[str, list[int]] = {}
        for index, statement in enumerate(nest.statements):
            for access in statement.outputs:
                self.writers.setdefault(access.tensor, []).append(index)

    def gelu_input(self, last: int) -> str | None:
        """x when statement `last` is the end of a gelu chain y = x·h (unchanged so far), else None."""
        end = self.statements[last]
        if not self._is(end, "tensor_tensor", "multiply") or len(end.outputs) != 1 or len(end.inputs) != 2:
            return None
        if not all(_same_tile(a, end.outputs[0]) for a in end.inputs):
            return None
        for x, h in _both_orders(end):
            chain = [last]
            u = self._operand(h, "tensor_scalar", "multiply", 0.5, chain, end)
            t = self._operand(u, "tensor_scalar", "add", 1.0, chain, end)
            m = self._tanh_of(t, chain, end)
            s = self._operand(m, "tensor_scalar", "multiply", GELU_SCALE, chain, end)
            q = _other_than(x, self._link(s, "tensor_tensor", "add", chain, end))
            cube = self._operand(q, "tensor_scalar", "multiply", GELU_CUBE_COEFF, chain, end)
            square = _other_than(x, self._link(cube, "tensor_tensor", "multiply", chain, end))
            if square is None or self._link(square, "tensor_tensor", "multiply", chain, end) != (x, x):
                continue
            if self._x_unchanged(x, min(chain), last) and x in self.f32 and end.outputs[0].tensor in self.f32:
                return x
        return None

    def _is(self, statement: penguin_pb2.Statement, op: str, func: str) -> bool:
        return statement.op == op and statement.func == func

    def _writer(
        self, tensor: str | None, chain: list[int], end: penguin_pb2.Statement
    ) -> penguin_pb2.Statement | None:
        """The one statement of the nest that writes `tensor`, before the chain's earliest so far, if it
        accesses end's tile under end's predicates and writes a float32 tensor."""
        if tensor is None or tensor not in self.f32:
            return None
        writers = self.writers.get(tensor, [])
        if len(writers) != 1 or writers[0] >= min(chain):
            return None
        statement = self.statements[writers[0]]
        if list(statement.predicates) != list(end.predicates):
            return None
        if not all(_same_tile(a, end.outputs[0]) for a in (*statement.inputs, *statement.outputs)):
            return None
        chain.append(writers[0])
        return statement

    def _operand(
        self,
        tensor: str | None,
        op: str,
        func: str,
        scalar: float,
        chain: list[int],
        end: penguin_pb2.Statement,
    ) -> str | None:
        """The input of the tensor_scalar `op` by `scalar` (in float32) that writes `tensor`."""
        statement = self._writer(tensor, chain, end)
        if statement is None or not self._is(statement, op, func) or len(statement.inputs) != 1:
            return None
        if len(statement.scalars) != 1 or np.float32(statement.scalars[0]) != np.float32(scalar):
            return None
        return statement.inputs[0].tensor

    def _tanh_of(self, tensor: str | None, chain: list[int], end: penguin_pb2.Statement) -> str | None:
        statement = self._writer(tensor, chain, end)
        if statement is None or not self._is(statement, "activation", "tanh") or len(statement.inputs) != 1:
            return None
        if [np.float32(s) for s in statement.scalars] not in ([], [1.0], [1.0, 0.0]):  # scale 1, bias 0
            return None
        return statement.inputs[0].tensor

    def _link(
        self, tensor: str | None, op: str, func: str, chain: list[int], end: penguin_pb2.Statement
    ) -> tuple[str, str] | None:
        """The two inputs of the binary `op` that writes `tensor`."""
        statement = self._writer(tensor, chain, end)
        if statement is None or not self._is(statement, op, func) or len(statement.inputs) != 2:
            return None
        return statement.inputs[0].tensor, statement.inputs[1].tensor

    def _x_unchanged(self, x: str, first: int, last: int) -> bool:
        return all(not first <= index <= last for index in self.writers.get(x, []))


def _both_orders(statement: penguin_pb2.Statement) -> list[tuple[str, str]]:
    a, b = statement.inputs[0].tensor, statement.inputs[1].tensor
    return [(a, b), (b, a)] if a != b else [(a, b)]


def _other_than(x: str, operands: tuple[str, str] | None) -> str | None:
    """Of a binary statement's two operands, the one that is not x (None if neither is x)."""
    if operands is None or x not in operands:
        return None
    return operands[1] if operands[0] == x else operands[0]


def _same_tile(a: penguin_pb2.Access, b: penguin_pb2.Access) -> bool:
    return list(a.starts) == list(b.starts) and list(a.extents) == list(b.extents)
