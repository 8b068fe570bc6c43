"""Element functions whose exact semantics numpy does not give directly, defined once.

The golden evaluator (XLA's semantics), the frontend's constant folding and the simulator (the
device's ALU functions, which the frontend maps HLO ops onto one to one) must agree bit for bit,
so each such function lives here. Integer functions take and return int64 arrays holding values
of an integer type `bits` wide (signed or not); the caller narrows the result to that type, which
wraps as XLA's integer arithmetic does. Float functions work on float32 arrays.
"""

from __future__ import annotations

import numpy as np


def wrap(values: np.ndarray, bits: int, signed: bool) -> np.ndarray:
    """int64 `values` reduced modulo 2**bits into the type's range (two's complement when signed)."""
    values = np.asarray(values, dtype=np.int64)
    if bits >= 64:
        return values
    mask = (1 << bits) - 1
    low = values & mask
    if signed:
        return np.where(low >> (bits - 1) != 0, low - (1 << bits), low)
    return low


def int_divide(a: np.ndarray, b: np.ndarray, bits: int, signed: bool) -> np.ndarray:
    """XLA integer division: truncates toward zero; x / 0 is -1 (all ones); MIN / -1 is MIN."""
    safe = np.where(b == 0, 1, b)
    quotient = np.abs(a) // np.abs(safe)
    quotient = np.where((a < 0) != (safe < 0), -quotient, quotient)
    return wrap(np.where(b == 0, -1, quotient), bits, signed)


def int_remainder(a: np.ndarray, b: np.ndarray, bits: int, signed: bool) -> np.ndarray:
    """XLA integer remainder: the sign of the dividend; x % 0 is x; MIN % -1 is 0."""
    safe = np.where(b == 0, 1, b)
    rest = np.abs(a) % np.abs(safe)
    rest = np.where(a < 0, -rest, rest)
    return wrap(np.where(b == 0, a, rest), bits, signed)


def int_power(a: np.ndarray, b: np.ndarray, bits: int, signed: bool) -> np.ndarray:
    """XLA integer power by squaring, wrapping; a negative exponent gives 0 (1 for base 1, ±1 for -1)."""
    a, b = np.broadcast_arrays(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64))
    result = np.ones(a.shape, dtype=np.int64)
    base, exponent = a.copy(), np.where(b < 0, 0, b)
    with np.errstate(over="ignore"):
        while np.any(exponent):
            odd = (exponent & 1) == 1
            result = wrap(np.where(odd, result * base, result), bits, signed)
            base = wrap(base * base, bits, signed)
            exponent = exponent >> 1
    negative = np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 == 0, 1, -1), 0))
    return wrap(np.where(b < 0, negative, result), bits, signed)


def shift_left(a: np.ndarray, b: np.ndarray, bits: int, signed: bool) -> np.ndarray:
    """a << b in `bits` bits; a shift by `bits` or more (or negative) gives 0."""
    out_of_range = (b < 0) | (b >= bits)
    shifted = np.left_shift(a, np.where(out_of_range, 0, b))
    return wrap(np.where(out_of_range, 0, shifted), bits, signed)


def shift_right_logical(a: np.ndarray, b: np.ndarray, bits: int, signed: bool) -> np.ndarray:
    """a >> b filling with zeros (the bits read as unsigned); out-of-range shifts give 0."""
    unsigned = wrap(a, bits, False) if bits < 64 else a.astype(np.uint64)
    out_of_range = (b < 0) | (b >= bits)
    shifted = np.right_shift(unsigned, np.where(out_of_range, 0, b).astype(unsigned.dtype))
    return wrap(np.where(out_of_range, 0, shifted).astype(np.int64), bits, signed)


def shift_right_arithmetic(a: np.ndarray, b: np.ndarray, bits: int, signed: bool) -> np.ndarray:
    """a >> b filling with the sign bit (the bits read as signed); shifts past the width fill fully."""
    as_signed = wrap(a, bits, True)
    amount = np.where((b < 0) | (b >= bits), bits - 1, b)
    return wrap(np.right_shift(as_signed, amount), bits, signed)


def round_half_away(x: np.ndarray) -> np.ndarray:
    """Round to nearest, ties away from zero (XLA round-nearest-afz), without the x + 0.5 error."""
    truncated = np.trunc(x)
    tie = np.abs(x - truncated) == np.float32(0.5)
    return np.where(tie, truncated + np.sign(x), np.rint(x)).astype(x.dtype, copy=False)


INTEGER_BINARY = {
    "divide": int_divide,
    "remainder": int_remainder,
    "power": int_power,
    "shift_left": shift_left,
    "shift_right_logical": shift_right_logical,
    "shift_right_arithmetic": shift_right_arithmetic,
}
