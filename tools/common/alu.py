"""What the device's ALU functions compute, defined once: ACT's function table and the binary
functions of DVE and POOL (tensor_tensor, tensor_scalar).

The simulator executes BIR with them (tools/sim/semantics.py), and hlo_opt's act_functions
evaluates chains of Penguin statements with them to find the ACT function a chain computes, so
both read the same definitions. ACT functions take and return float32 arrays; `binary` computes
in the domain its caller chose.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ncc.tools.common import dtypes, numerics

# An activation's attribute naming its per-partition operands after inputs[0] (NKI's activation
# takes its scale and its bias as [P, 1] vectors): a scale is multiplied in before the scalar
# bias, a bias added after it. Absent, inputs[1] (if any) is a bias.
ACT_OPERAND = "act_operand"
ACT_OPERAND_ROLES: dict[str, tuple[str, ...]] = {"bias": ("bias",), "scale": ("scale",),
                                                 "scale_bias": ("scale", "bias")}


def act_operand_problem(role: str, inputs: int) -> str:
    """Why an activation with attribute act_operand = `role` and `inputs` inputs is malformed
    ('' when it is not): the role must be known and name as many operands as follow inputs[0]
    (a bias may be absent)."""
    names = ACT_OPERAND_ROLES.get(role)
    if names is None or inputs - 1 > len(names) or (role != "bias" and inputs - 1 != len(names)):
        return f"act_operand {role!r} does not name its {inputs - 1} operand(s) after input 0"
    return ""

# ACT's (scale, bias) that pass func's input through unchanged: a bias of -0, since x + (-0) is x
# for every x, -0 included, while x + (+0) makes -0 +0 (rsqrt(-0) is -inf, rsqrt(+0) +inf).
IDENTITY_SCALE_BIAS = (1.0, -0.0)

ACT_FUNCTIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "identity": lambda x: x,
    "exp": np.exp,
    "tanh": np.tanh,
    "erf": numerics.erf,
    "logistic": lambda x: np.float32(1) / (np.float32(1) + np.exp(-x)),
    "log": np.log,
    "rsqrt": lambda x: np.float32(1) / np.sqrt(x),
    "sqrt": np.sqrt,
    "relu": lambda x: np.maximum(x, np.float32(0)),
    "square": lambda x: x * x,
    "abs": np.abs,
    "sign": numerics.sign,
    "expm1": np.expm1,
    "log1p": np.log1p,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "cbrt": np.cbrt,
    "floor": np.floor,
    "ceil": np.ceil,
    "round_even": np.rint,
    "round_afz": numerics.round_half_away,
    "gelu_apprx_tanh": numerics.gelu_apprx_tanh,
    "gelu": numerics.gelu,
}


BINARY_FUNCS = frozenset(
    {
        "add",
        "subtract",
        "multiply",
        "divide",
        "maximum",
        "minimum",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "and",
        "or",
        "xor",
        "power",
        "remainder",
        "atan2",
        "shift_left",
        "shift_right_logical",
        "shift_right_arithmetic",
    }
)


_ARITHMETIC = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "maximum": np.maximum,
               "minimum": np.minimum}
_FLOAT_ONLY = {"divide": np.divide, "power": numerics.float_power, "remainder": np.fmod,
               "atan2": np.arctan2}
_BITWISE = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}
_COMPARE = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
            "ge": np.greater_equal}


FLOAT_FUNCS = frozenset(_ARITHMETIC) | frozenset(_FLOAT_ONLY) | frozenset(_COMPARE)  # `binary` on float32


def binary(func: str, a: np.ndarray, b: np.ndarray, kind: type, out_dtype: int) -> np.ndarray:
    """A tensor_tensor/tensor_scalar function computed in `kind` (float32, uint64 or int64: the
    simulator's `_domain`) on values of the output's type (an integer's width decides how shifts
    and wrap-around behave)."""
    floating = kind is np.float32
    if func in _ARITHMETIC:
        return _ARITHMETIC[func](a, b)
    if floating and func in _FLOAT_ONLY:
        return _FLOAT_ONLY[func](a, b)
    if func in numerics.INTEGER_BINARY:
        bits = dtypes.itemsize(out_dtype) * 8
        return numerics.INTEGER_BINARY[func](a, b, bits, dtypes.is_signed(out_dtype))
    if func in _BITWISE:
        if floating:
            return _BITWISE[func](a != 0, b != 0).astype(kind)
        return _BITWISE[func](a, b)
    return _COMPARE[func](a, b).astype(kind)
