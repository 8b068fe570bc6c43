"""XLA element types and shapes as ncc sees them: names, numpy and ncc dtypes, shape helpers.

One table of truth for the HLO text parser, the verifier, the golden evaluator and the lowering,
so that "which XLA types does ncc take" and "how is each held in numpy" are answered once.
"""

from __future__ import annotations

import numpy as np

from ncc.schemas import common_pb2, hlo_pb2
from ncc.tools.common.errors import CompileError

T = hlo_pb2.PrimitiveType

# HLO text spelling of every PrimitiveType the schema can hold.
TYPE_NAMES: dict[int, str] = {
    T.PRED: "pred", T.S8: "s8", T.S16: "s16", T.S32: "s32", T.S64: "s64",
    T.U8: "u8", T.U16: "u16", T.U32: "u32", T.U64: "u64",
    T.F16: "f16", T.F32: "f32", T.F64: "f64", T.BF16: "bf16",
    T.C64: "c64", T.C128: "c128", T.F8E5M2: "f8e5m2", T.F8E4M3FN: "f8e4m3fn",
    T.TOKEN: "token", T.OPAQUE_TYPE: "opaque", T.TUPLE: "tuple",
}
TYPES_BY_NAME: dict[str, int] = {name: kind for kind, name in TYPE_NAMES.items() if kind != T.TUPLE}

# Element types ncc compiles and evaluates. Everything else is refused with E206.
SUPPORTED_ELEMENT_TYPES = frozenset({T.PRED, T.S8, T.S16, T.S32, T.S64, T.U8, T.U16, T.U32, T.U64, T.F16,
                                     T.BF16, T.F32})
FLOAT_TYPES = frozenset({T.F16, T.BF16, T.F32})
SIGNED_TYPES = frozenset({T.S8, T.S16, T.S32, T.S64})
UNSIGNED_TYPES = frozenset({T.U8, T.U16, T.U32, T.U64})

# How the evaluator holds each type: floats as float32 (bf16/f16 values rounded to their type),
# integers in their own width (so arithmetic wraps like XLA's), pred as bool.
_COMPUTE = {
    T.PRED: np.dtype(bool), T.S8: np.dtype(np.int8), T.S16: np.dtype(np.int16),
    T.S32: np.dtype(np.int32), T.S64: np.dtype(np.int64), T.U8: np.dtype(np.uint8),
    T.U16: np.dtype(np.uint16), T.U32: np.dtype(np.uint32), T.U64: np.dtype(np.uint64),
    T.F16: np.dtype(np.float32), T.BF16: np.dtype(np.float32), T.F32: np.dtype(np.float32),
}

_NCC = {
    T.F32: common_pb2.F32, T.BF16: common_pb2.BF16, T.F16: common_pb2.F16, T.PRED: common_pb2.PRED,
    T.S8: common_pb2.S8, T.S16: common_pb2.S16, T.S32: common_pb2.S32, T.S64: common_pb2.S64,
    T.U8: common_pb2.U8, T.U16: common_pb2.U16, T.U32: common_pb2.U32, T.U64: common_pb2.U64,
}


_XLA = {ncc: xla for xla, ncc in _NCC.items()}


def xla_type(dtype: int) -> int:
    """The XLA element type whose values an ncc DType holds."""
    return _XLA[dtype]


def type_name(kind: int) -> str:
    """The HLO text name of an element type (`f32`), or `type<N>` for a value the enum lacks."""
    return TYPE_NAMES.get(kind, f"type<{kind}>")


def ncc_dtype(xla_type: int) -> int:
    """The ncc DType that holds values of an XLA element type."""
    try:
        return _NCC[xla_type]
    except KeyError:
        raise CompileError("E206", f"element type {type_name(xla_type)} has no ncc dtype") from None


def compute_dtype(xla_type: int) -> np.dtype:
    """The numpy dtype the evaluator computes and returns values of `xla_type` in."""
    try:
        return _COMPUTE[xla_type]
    except KeyError:
        raise CompileError("E206", f"element type {type_name(xla_type)} is not supported") from None


def is_float(xla_type: int) -> bool:
    return xla_type in FLOAT_TYPES


def is_tuple(shape: hlo_pb2.ShapeProto) -> bool:
    return shape.element_type == T.TUPLE


def dims(shape: hlo_pb2.ShapeProto) -> tuple[int, ...]:
    return tuple(shape.dimensions)


def element_count(shape: hlo_pb2.ShapeProto) -> int:
    count = 1
    for size in shape.dimensions:
        count *= size
    return count


def shape_str(shape: hlo_pb2.ShapeProto) -> str:
    """A shape as HLO text writes it, without layout: `f32[2,3]`, `(f32[2], s32[])`."""
    if is_tuple(shape):
        return "(" + ", ".join(shape_str(sub) for sub in shape.tuple_shapes) + ")"
    return f"{type_name(shape.element_type)}[{','.join(str(d) for d in shape.dimensions)}]"


def same_shape(a: hlo_pb2.ShapeProto, b: hlo_pb2.ShapeProto) -> bool:
    """Equal element types and dimensions (recursively for tuples); layouts are ignored."""
    if a.element_type != b.element_type:
        return False
    if is_tuple(a):
        return len(a.tuple_shapes) == len(b.tuple_shapes) and all(
            same_shape(x, y) for x, y in zip(a.tuple_shapes, b.tuple_shapes, strict=True)
        )
    return list(a.dimensions) == list(b.dimensions)


def leaf_shapes(shape: hlo_pb2.ShapeProto) -> list[hlo_pb2.ShapeProto]:
    """The array shapes of a (possibly nested) tuple shape in depth-first order."""
    if not is_tuple(shape):
        return [shape]
    return [leaf for sub in shape.tuple_shapes for leaf in leaf_shapes(sub)]


def entry_computation(module: hlo_pb2.HloModuleProto) -> hlo_pb2.HloComputationProto | None:
    """The entry computation: by entry_computation_name if set, else by entry_computation_id."""
    if module.entry_computation_name:
        for comp in module.computations:
            if comp.name == module.entry_computation_name:
                return comp
        return None
    for comp in module.computations:
        if comp.id == module.entry_computation_id:
            return comp
    return None


def root_of(comp: hlo_pb2.HloComputationProto,
            default: hlo_pb2.HloInstructionProto | None = None) -> hlo_pb2.HloInstructionProto | None:
    """A computation's root instruction; `default` when its root_id names none of its instructions
    (a module the verifier has not seen: hlo_verify refuses it, E204)."""
    return next((instr for instr in comp.instructions if instr.id == comp.root_id), default)


def parameters(comp: hlo_pb2.HloComputationProto) -> list[hlo_pb2.HloInstructionProto]:
    """A computation's parameter instructions ordered by parameter number."""
    params = [instr for instr in comp.instructions if instr.opcode == "parameter"]
    return sorted(params, key=lambda instr: instr.parameter_number)
