"""Decode an HLO LiteralProto (a constant's value) into a numpy array of its logical values.

bf16 and f16 arrive as little-endian bytes; bf16 is returned widened to float32. Integers come
back as int64, except u64 as uint64 (int64 cannot hold its upper half).
"""

from __future__ import annotations

import numpy as np

from ncc.schemas import hlo_pb2
from ncc.tools.common.dtypes import bf16_to_f32
from ncc.tools.common.errors import CompileError

_T = hlo_pb2.PrimitiveType

# Integer literal fields: repeated varints, or little-endian bytes for the narrow types.
_REPEATED_INTEGERS = {_T.S32: ("s32s", np.int64), _T.S64: ("s64s", np.int64),
                      _T.U32: ("u32s", np.int64), _T.U64: ("u64s", np.uint64)}
_BYTES_INTEGERS = {_T.S8: ("s8s", "i1"), _T.U8: ("u8s", "u1"), _T.S16: ("s16s", "<i2"),
                   _T.U16: ("u16s", "<u2")}


def literal_to_numpy(literal: hlo_pb2.LiteralProto, shape: hlo_pb2.ShapeProto, where: str) -> np.ndarray:
    dims = tuple(shape.dimensions)
    count = int(np.prod(dims, dtype=np.int64)) if dims else 1
    kind = shape.element_type
    if kind == _T.F32:
        values = np.asarray(literal.f32s, dtype=np.float32)
    elif kind == _T.F64:
        values = np.asarray(literal.f64s, dtype=np.float64).astype(np.float32)
    elif kind == _T.BF16:
        values = bf16_to_f32(np.frombuffer(literal.bf16s, dtype="<u2"))
    elif kind == _T.F16:
        values = np.frombuffer(literal.f16s, dtype="<f2").astype(np.float32)
    elif kind == _T.PRED:
        values = np.asarray(literal.preds, dtype=bool)
    elif kind in _REPEATED_INTEGERS:
        field, storage = _REPEATED_INTEGERS[kind]
        values = np.asarray(getattr(literal, field), dtype=storage)
    elif kind in _BYTES_INTEGERS:
        field, storage = _BYTES_INTEGERS[kind]
        values = np.frombuffer(getattr(literal, field), dtype=storage).astype(np.int64)
    else:
        raise CompileError("E206", f"constant of element type {_T.Name(kind)} is not supported", where)
    if values.size != count:
        raise CompileError("E203", f"constant holds {values.size} values but its shape needs {count}", where)
    return values.reshape(dims)
