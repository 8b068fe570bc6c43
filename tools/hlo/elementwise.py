"""What each elementwise HLO op computes, in numpy, with XLA's semantics.

Values are held as the evaluator holds them (`round_to`): floats as float32 (bf16/f16 values
rounded to their type after every op), integers in their own width, pred as bool. `apply(opcode,
operands, kind)` is the one definition the golden evaluator runs and the frontend folds constants
with, so a constant-folded op and an evaluated one cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ncc.tools.common import numerics
from ncc.tools.common.dtypes import bf16_to_f32, f32_to_bf16
from ncc.tools.hlo.hlo_types import FLOAT_TYPES, SIGNED_TYPES, T, compute_dtype

FLOAT_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "exponential": np.exp,
    "exponential-minus-one": np.expm1,
    "log": np.log,
    "log-plus-one": np.log1p,
    "tanh": np.tanh,
    "erf": numerics.erf,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: np.reciprocal(np.sqrt(x)),
    "cbrt": np.cbrt,
    "logistic": lambda x: np.reciprocal(np.float32(1) + np.exp(-x)),
    "sine": np.sin,
    "cosine": np.cos,
    "tan": np.tan,
    "floor": np.floor,
    "ceil": np.ceil,
    "round-nearest-even": np.rint,
    "round-nearest-afz": numerics.round_half_away,
}
# Unary ops on any numeric type (not pred); `not` takes integers and pred.
NUMERIC_UNARY = frozenset({"negate", "abs", "sign"})
BITWISE_UNARY = frozenset({"not"})
INTEGER_UNARY = frozenset({"popcnt", "count-leading-zeros"})  # on the bits, integers only

ARITHMETIC_BINARY = frozenset({"add", "subtract", "multiply", "divide", "maximum", "minimum", "power",
                               "remainder"})
FLOAT_BINARY = frozenset({"atan2"})
BITWISE_BINARY = frozenset({"and", "or", "xor"})  # integers and pred
SHIFTS = frozenset({"shift-left", "shift-right-logical", "shift-right-arithmetic"})  # integers only

UNARY_OPCODES = frozenset(FLOAT_UNARY) | NUMERIC_UNARY | BITWISE_UNARY | INTEGER_UNARY
BINARY_OPCODES = ARITHMETIC_BINARY | FLOAT_BINARY | BITWISE_BINARY | SHIFTS

_NUMPY_BINARY: dict[str, Callable] = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "maximum": np.maximum,
    "minimum": np.minimum, "atan2": np.arctan2, "and": np.bitwise_and, "or": np.bitwise_or,
    "xor": np.bitwise_xor,
}
_FLOAT_ONLY_BINARY: dict[str, Callable] = {"divide": np.divide, "power": numerics.float_power,
                                                     "remainder": np.fmod}


def round_to(values: np.ndarray, kind: int) -> np.ndarray:
    """Values in the evaluator's representation of element type `kind` (bf16/f16 rounded, ints wrapped)."""
    if kind == T.F32:
        return np.asarray(values, dtype=np.float32)
    if kind == T.BF16:
        return bf16_to_f32(f32_to_bf16(np.asarray(values, dtype=np.float32)))
    if kind == T.F16:
        return np.asarray(values, dtype=np.float32).astype(np.float16).astype(np.float32)
    if kind == T.PRED:
        return np.asarray(values).astype(bool)
    return np.asarray(values).astype(compute_dtype(kind))


def integer_bits(kind: int) -> tuple[int, bool]:
    """(width in bits, signed) of an integer element type."""
    return compute_dtype(kind).itemsize * 8, kind in SIGNED_TYPES


def apply(opcode: str, operands: list[np.ndarray], kind: int) -> np.ndarray:
    """The result of elementwise `opcode` on `operands` (same shapes), as element type `kind`.

    For `compare`, pass the direction as the opcode (EQ, NE, LT, LE, GT, GE) and kind PRED.
    """
    with np.errstate(all="ignore"):
        return round_to(_apply(opcode, [np.asarray(x) for x in operands], kind), kind)


def _apply(opcode: str, ops: list[np.ndarray], kind: int) -> np.ndarray:
    if opcode in _COMPARE:
        return _COMPARE[opcode](ops[0], ops[1])
    if opcode == "copy":
        return ops[0]
    if opcode == "is-finite":
        return np.isfinite(ops[0])
    if opcode == "clamp":
        low, x, high = ops
        return np.minimum(np.maximum(x, low), high)
    if opcode == "select":
        return np.where(ops[0], ops[1], ops[2])
    if opcode in FLOAT_UNARY:
        return FLOAT_UNARY[opcode](ops[0])
    if opcode == "negate":
        return np.negative(ops[0])
    if opcode == "abs":
        return np.abs(ops[0])
    if opcode == "sign":
        return numerics.sign(ops[0])
    if opcode == "not":
        return np.logical_not(ops[0]) if kind == T.PRED else np.invert(ops[0])
    if opcode in INTEGER_UNARY:
        return _bit_count(opcode, ops[0])
    if kind in FLOAT_TYPES and opcode in _FLOAT_ONLY_BINARY:
        return _FLOAT_ONLY_BINARY[opcode](ops[0], ops[1])
    numeric = opcode.replace("-", "_")
    if numeric in numerics.INTEGER_BINARY:
        bits, signed = integer_bits(kind)
        a, b = (x.astype(np.int64) for x in ops)
        return numerics.INTEGER_BINARY[numeric](a, b, bits, signed)
    return _NUMPY_BINARY[opcode](ops[0], ops[1])


def _bit_count(opcode: str, values: np.ndarray) -> np.ndarray:
    """popcnt (set bits) or count-leading-zeros of integers, read as their unsigned bit pattern."""
    width = values.dtype.itemsize * 8
    bits = values.view(np.dtype(f"u{values.dtype.itemsize}"))
    if opcode == "count-leading-zeros":  # smear the top set bit downward; the zeros above it remain
        shift = 1
        while shift < width:
            bits = bits | (bits >> shift)
            shift *= 2
        return width - np.bitwise_count(bits).astype(np.int64)
    return np.bitwise_count(bits)


_COMPARE: dict[str, Callable] = {
    "EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal, "GT": np.greater,
    "GE": np.greater_equal,
}
