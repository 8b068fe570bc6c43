"""Algebraic identities: an elementwise op of x and its identity element is x, with no nest.

JAX's softmax takes the row maximum as max(reduce_max(x), -inf) (the `initial` of jnp.max).
Lowered as written, that maximum is a nest of its own, over the reduced shape, so it stands
between the reduction and the subtraction that would otherwise fuse (the transformer block
round-tripped HBM three times more for it). The lowering returns the operand itself for such
an op, as it does for a copy, and folds ops of constants (`Lowering._fold`).

Only identities that hold bit for bit for every x, NaN, signed zeros and infinities included:
    x * 1, 1 * x, x / 1, x + (-0.0), (-0.0) + x, x - (+0.0),
    max(x, -inf), max(-inf, x), min(x, +inf), min(+inf, x)            (floating point)
    x + 0, 0 + x, x - 0, x * 1, 1 * x, x / 1, x | 0, 0 | x, x ^ 0, 0 ^ x   (integers)
Not x + 0.0 for floats: -0.0 + 0.0 is +0.0. The operand must already have the result's type
and shape (a convert or a broadcast is not an identity).
"""

from __future__ import annotations

import math

from ncc.schemas import common_pb2
from ncc.tools.common.dtypes import is_float
from ncc.tools.hlo2penguin.values import Splat, Value

# opcode -> (identity as the right operand, may it be the left one too); a float identity of
# zero is signed (-0.0 for add, +0.0 for subtract)
_FLOAT = {
    "multiply": (1.0, True),
    "divide": (1.0, False),
    "add": (-0.0, True),
    "subtract": (0.0, False),
    "maximum": (-math.inf, True),
    "minimum": (math.inf, True),
}
_INTEGER = {
    "add": (0, True),
    "subtract": (0, False),
    "multiply": (1, True),
    "divide": (1, False),
    "or": (0, True),
    "xor": (0, True),
}


def identity_operand(opcode: str, ops: list[Value], dtype: int) -> Value | None:
    """The operand an elementwise op returns unchanged (the other one is its identity element,
    a compile-time constant), or None."""
    if len(ops) != 2 or dtype == common_pb2.PRED:
        return None
    floating = is_float(dtype)
    rule = (_FLOAT if floating else _INTEGER).get(opcode)
    if rule is None:
        return None
    identity, either_side = rule
    left, right = ops
    candidates = [(left, right)] + ([(right, left)] if either_side else [])
    for operand, other in candidates:
        if isinstance(operand, Splat) or not isinstance(other, Splat):
            continue
        if operand.dtype != dtype or other.dtype != dtype:
            continue
        if _same(other.value, identity, floating):
            return operand
    return None


def _same(value: float, identity: float, floating: bool) -> bool:
    if not floating:
        return value == identity
    if math.isnan(value) or value != identity:
        return False
    return identity != 0 or math.copysign(1.0, value) == math.copysign(1.0, identity)
