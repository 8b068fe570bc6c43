"""Element functions whose exact semantics numpy does not give directly, defined once.

The golden evaluator (XLA's semantics), the frontend's constant folding and the simulator (the
device's ALU functions, which the frontend maps HLO ops onto one to one) must agree bit for bit,
so each such function lives here. Integer functions take and return int64 arrays holding values
of an integer type `bits` wide (signed or not); the caller narrows the result to that type, which
wraps as XLA's integer arithmetic does. A u64 value is held as its bit pattern in int64 (uint64
arrays are accepted and read so), and the functions whose answer depends on signedness read
those bits as unsigned. Float functions work on float32 arrays.
"""

from __future__ import annotations

import math

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


def _bits(values: np.ndarray) -> np.ndarray:
    """Integer values as int64 bit patterns (a uint64 array wraps into the same 64 bits)."""
    return np.asarray(values).astype(np.int64, copy=False)


def _unsigned64(bits: int, signed: bool) -> bool:
    return bits >= 64 and not signed


def int_divide(a: np.ndarray, b: np.ndarray, bits: int, signed: bool) -> np.ndarray:
    """XLA integer division: truncates toward zero; x / 0 is -1 (all ones); MIN / -1 is MIN."""
    a, b = _bits(a), _bits(b)
    if _unsigned64(bits, signed):
        ua, ub = a.view(np.uint64), b.view(np.uint64)
        return np.where(ub == 0, np.iinfo(np.uint64).max, ua // np.where(ub == 0, 1, ub)).view(np.int64)
    safe = np.where(b == 0, 1, b)
    quotient = np.abs(a) // np.abs(safe)
    quotient = np.where((a < 0) != (safe < 0), -quotient, quotient)
    return wrap(np.where(b == 0, -1, quotient), bits, signed)


def int_remainder(a: np.ndarray, b: np.ndarray, bits: int, signed: bool) -> np.ndarray:
    """XLA integer remainder: the sign of the dividend; x % 0 is x; MIN % -1 is 0."""
    a, b = _bits(a), _bits(b)
    if _unsigned64(bits, signed):
        ua, ub = a.view(np.uint64), b.view(np.uint64)
        return np.where(ub == 0, ua, ua % np.where(ub == 0, 1, ub)).view(np.int64)
    safe = np.where(b == 0, 1, b)
    rest = np.abs(a) % np.abs(safe)
    rest = np.where(a < 0, -rest, rest)
    return wrap(np.where(b == 0, a, rest), bits, signed)


def float_power(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IEEE/C pow, as XLA computes `power` on floats. numpy's power takes an exponent of 0.5 as a
    square root, which differs at two bases: pow(-inf, 0.5) is +inf (numpy: nan) and pow(-0, 0.5)
    is +0 (numpy: -0)."""
    result = np.power(a, b)
    half = b == 0.5
    if np.any(half):
        a, half = np.broadcast_arrays(a, half)
        fixed = np.where(half & (a == -np.inf), np.inf, np.where(half & (a == 0), 0.0, result))
        result = fixed.astype(result.dtype)
    return result


def int_power(a: np.ndarray, b: np.ndarray, bits: int, signed: bool) -> np.ndarray:
    """XLA integer power by squaring, wrapping; a negative exponent gives 0 (1 for base 1, ±1 for -1)."""
    a, b = np.broadcast_arrays(_bits(a), _bits(b))
    result = np.ones(a.shape, dtype=np.int64)
    if not signed:  # an unsigned exponent is never negative (a u64 one may use the top bit)
        base, exponent = a.copy(), b.view(np.uint64).copy()
        with np.errstate(over="ignore"):
            while np.any(exponent):
                result = wrap(np.where(exponent & 1 == 1, result * base, result), bits, signed)
                base = wrap(base * base, bits, signed)
                exponent = exponent >> np.uint64(1)
        return result
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
    a, b = _bits(a), _bits(b)
    out_of_range = (b < 0) | (b >= bits)
    shifted = np.left_shift(a, np.where(out_of_range, 0, b))
    return wrap(np.where(out_of_range, 0, shifted), bits, signed)


def shift_right_logical(a: np.ndarray, b: np.ndarray, bits: int, signed: bool) -> np.ndarray:
    """a >> b filling with zeros (the bits read as unsigned); out-of-range shifts give 0."""
    a, b = _bits(a), _bits(b)
    unsigned = wrap(a, bits, False) if bits < 64 else a.view(np.uint64)
    out_of_range = (b < 0) | (b >= bits)
    shifted = np.right_shift(unsigned, np.where(out_of_range, 0, b).astype(unsigned.dtype))
    return wrap(np.where(out_of_range, 0, shifted).astype(np.int64), bits, signed)


def shift_right_arithmetic(a: np.ndarray, b: np.ndarray, bits: int, signed: bool) -> np.ndarray:
    """a >> b filling with the sign bit (the bits read as signed); shifts past the width fill fully."""
    a, b = _bits(a), _bits(b)
    as_signed = wrap(a, bits, True)
    amount = np.where((b < 0) | (b >= bits), bits - 1, b)
    return wrap(np.right_shift(as_signed, amount), bits, signed)


def sign(x: np.ndarray) -> np.ndarray:
    """XLA's sign: -1, +1, or x itself at ±0 and NaN (numpy's sign makes -0 +0)."""
    return np.where(x == 0, x, np.sign(x))


def round_half_away(x: np.ndarray) -> np.ndarray:
    """Round to nearest, ties away from zero (XLA round-nearest-afz), without the x + 0.5 error."""
    truncated = np.trunc(x)
    tie = np.abs(x - truncated) == np.float32(0.5)
    return np.where(tie, truncated + np.sign(x), np.rint(x)).astype(x.dtype, copy=False)


def total_order_of_bits(bits: np.ndarray | int, width: int) -> np.ndarray:
    """IEEE 754 totalOrder keys (-NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN) of floats given
    as their `width`-bit patterns read as signed integers: every bit but the sign flipped in
    negatives. What a `compare` of type TOTALORDER orders by (JAX's sorts, top-k)."""
    bits = np.asarray(bits).astype(np.int64)
    return np.where(bits < 0, bits ^ ((1 << (width - 1)) - 1), bits)


def total_order_key(values: np.ndarray) -> np.ndarray:
    """total_order_of_bits of a float16/32/64 array."""
    values = np.asarray(values)
    kind = {2: np.int16, 4: np.int32, 8: np.int64}[values.dtype.itemsize]
    return total_order_of_bits(values.view(kind), 8 * values.dtype.itemsize)  # (same itemsize: any strides)


INTEGER_BINARY = {
    "divide": int_divide,
    "remainder": int_remainder,
    "power": int_power,
    "shift_left": shift_left,
    "shift_right_logical": shift_right_logical,
    "shift_right_arithmetic": shift_right_arithmetic,
}


# gelu's tanh approximation (ACT's `gelu_apprx_tanh`, NKI `nl.gelu_apprx_tanh`): its constants in
# float32, which hlo_opt's act_functions also requires of a chain it replaces by the function.
GELU_CUBE_COEFF = np.float32(0.044715)
GELU_SCALE = np.float32(np.sqrt(2.0 / np.pi))


def gelu_apprx_tanh(x: np.ndarray) -> np.ndarray:
    """x·(tanh(√(2/π)·(x + 0.044715·x³)) + 1)·0.5 as the nine float32 operations of the chain
    jax.nn.gelu(approximate=True) writes, in its order: the same bits as that chain."""
    cube = (x * x) * x
    inner = (x + cube * GELU_CUBE_COEFF) * GELU_SCALE
    return x * ((np.tanh(inner) + np.float32(1)) * np.float32(0.5))


_ERF = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    """The error function (ACT's `erf`, NKI `nl.erf`; HLO `erf`, which jax.nn.gelu(approximate=False),
    jax.scipy.special.erf and PyTorch's default GELU emit): computed in float64 and rounded to
    float32, so within half an ulp of the true value (numpy has no erf of its own)."""
    values = np.asarray(x, dtype=np.float64)
    return np.asarray(_ERF(values), dtype=np.float32).reshape(values.shape)  # a 0-d input gives a float


_ERFC = np.frompyfunc(math.erfc, 1, 1)


def gelu(x: np.ndarray) -> np.ndarray:
    """gelu in its exact (erf) form, x·Φ(x) = ½·x·erfc(−x/√2) (ACT's `gelu`, NKI `nl.gelu`): computed
    in float64 and rounded to float32. jax.nn.gelu(approximate=False) and PyTorch's default GELU
    write it; XLA expands their erfc into a rational approximation of some 60 float32 operations,
    which act_functions recognizes by evaluating it (within 53 ulp of this above 1e-20)."""
    values = np.asarray(x, dtype=np.float64)
    with np.errstate(invalid="ignore"):  # -inf · erfc(inf) = -inf · 0: the limit is -0
        result = 0.5 * values * np.asarray(_ERFC(-values * math.sqrt(0.5)), dtype=np.float64)
    return np.where(values == -np.inf, -0.0, result).astype(np.float32)
