"""Element types: ncc DType <-> numpy, bf16 conversion and Tensor proto <-> numpy arrays.

numpy has no bfloat16, so bf16 data is kept as raw uint16 words on the wire and in device
memory, and widened to float32 for arithmetic (round-to-nearest-even when narrowing).
"""

from __future__ import annotations

import numpy as np

from ncc.schemas import common_pb2

DType = common_pb2.DType

# Storage dtype of each DType (bf16 is stored as its raw 16-bit pattern).
_STORAGE = {
    common_pb2.F32: np.dtype("<f4"),
    common_pb2.BF16: np.dtype("<u2"),
    common_pb2.F16: np.dtype("<f2"),
    common_pb2.S32: np.dtype("<i4"),
    common_pb2.U32: np.dtype("<u4"),
    common_pb2.U8: np.dtype("u1"),
    common_pb2.S8: np.dtype("i1"),
    common_pb2.PRED: np.dtype("u1"),
    common_pb2.S16: np.dtype("<i2"),
    common_pb2.U16: np.dtype("<u2"),
    common_pb2.S64: np.dtype("<i8"),
    common_pb2.U64: np.dtype("<u8"),
}

_NAMES = {
    common_pb2.F32: "f32",
    common_pb2.BF16: "bf16",
    common_pb2.F16: "f16",
    common_pb2.S32: "s32",
    common_pb2.U32: "u32",
    common_pb2.U8: "u8",
    common_pb2.S8: "s8",
    common_pb2.PRED: "pred",
    common_pb2.S16: "s16",
    common_pb2.U16: "u16",
    common_pb2.S64: "s64",
    common_pb2.U64: "u64",
}
_BY_NAME = {name: dtype for dtype, name in _NAMES.items()}


def itemsize(dtype: int) -> int:
    return _STORAGE[dtype].itemsize


def storage_dtype(dtype: int) -> np.dtype:
    return _STORAGE[dtype]


def name(dtype: int) -> str:
    return _NAMES.get(dtype, f"dtype{dtype}")


def from_name(text: str) -> int:
    return _BY_NAME[text]


def is_signed(dtype: int) -> bool:
    """Signed integer (or float) types: their values can be negative."""
    return dtype in (common_pb2.S8, common_pb2.S16, common_pb2.S32, common_pb2.S64) or is_float(dtype)


def is_float(dtype: int) -> bool:
    return dtype in (common_pb2.F32, common_pb2.BF16, common_pb2.F16)


def bf16_to_f32(words: np.ndarray) -> np.ndarray:
    return (words.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(values: np.ndarray) -> np.ndarray:
    """Round float32 to bf16 (nearest even), returned as uint16 words. (In place on one temporary,
    and a NaN looked for by the sum, NaN when one is, before the exact test: the simulator rounds
    every bf16 result it stores.)"""
    values = np.asarray(values, dtype=np.float32, order="C")
    bits = values.view(np.uint32)
    rounded = bits >> np.uint32(16)
    rounded &= np.uint32(1)
    rounded += bits
    rounded += np.uint32(0x7FFF)  # bits + 0x7FFF + lsb, modulo 2^32 as before
    rounded >>= np.uint32(16)
    words = rounded.astype(np.uint16)
    if np.isnan(values.sum()):  # also when inf - inf: the test below decides
        nan = np.isnan(values)
        if nan.any():
            words = np.where(nan, np.uint16(0x7FC0), words)
    return words


def to_compute(storage: np.ndarray, dtype: int) -> np.ndarray:
    """Widen stored values to the type arithmetic runs in: float32 for floats, uint64 for u64
    (whose values int64 cannot hold), int64 for the other integers."""
    if dtype == common_pb2.BF16:
        return bf16_to_f32(storage)
    if is_float(dtype):
        return storage.astype(np.float32)
    return storage.astype(compute_integer(dtype))


def compute_integer(dtype: int) -> type:
    """The numpy integer type arithmetic on `dtype` runs in."""
    return np.uint64 if dtype == common_pb2.U64 else np.int64


def from_compute(values: np.ndarray, dtype: int) -> np.ndarray:
    """Narrow computed values to the storage type of `dtype`."""
    if dtype == common_pb2.BF16:
        return f32_to_bf16(np.asarray(values, dtype=np.float32))
    if dtype == common_pb2.PRED:
        return (np.asarray(values) != 0).astype(np.uint8)
    if is_float(dtype):
        return np.asarray(values).astype(_STORAGE[dtype])
    values = np.asarray(values)
    if values.dtype.kind == "f":
        return float_to_int(values, _STORAGE[dtype])
    return values.astype(_STORAGE[dtype])  # integers keep their low bits (two's complement)


def float_to_int(values: np.ndarray, integer: np.dtype) -> np.ndarray:
    """XLA's float → integer convert: truncate toward zero and saturate at the type's range (±inf
    too); NaN is 0."""
    info = np.iinfo(integer)
    truncated = np.nan_to_num(np.trunc(np.asarray(values, dtype=np.float64)), nan=0.0)
    # float64 may round the type's max up past it (2**63 − 1, 2**64 − 1): clip just below, then set
    clipped = np.clip(truncated, float(info.min), np.nextafter(float(info.max) + 1, 0.0))
    return np.where(truncated >= float(info.max), info.max, clipped.astype(integer)).astype(integer)


def tensor_to_numpy(tensor: common_pb2.Tensor) -> np.ndarray:
    """Decode a Tensor proto into its storage array (bf16 stays as uint16 words)."""
    storage = _STORAGE[tensor.dtype]
    count = int(np.prod(tensor.shape, dtype=np.int64)) if tensor.shape else 1
    if len(tensor.data) != count * storage.itemsize:
        raise ValueError(
            f"tensor {tensor.name!r} holds {len(tensor.data)} bytes, expected {count * storage.itemsize}"
        )
    return np.frombuffer(tensor.data, dtype=storage).reshape(tuple(tensor.shape)).copy()


def numpy_to_tensor(name_: str, array: np.ndarray, dtype: int) -> common_pb2.Tensor:
    """Encode a storage array (already of `dtype`'s storage type) as a Tensor proto."""
    storage = np.asarray(array, dtype=_STORAGE[dtype], order="C")
    return common_pb2.Tensor(name=name_, dtype=dtype, shape=list(storage.shape), data=storage.tobytes())


def user_array_to_storage(array: np.ndarray, dtype: int) -> np.ndarray:
    """Convert an array a user gave (e.g. float32 from an .npz, bf16 widened) to `dtype`'s storage.
    A bf16 array saved as its 16-bit words (numpy writes ml_dtypes' bfloat16 to an .npz as raw
    2-byte records) is taken bit for bit."""
    array = np.asarray(array)
    if dtype == common_pb2.BF16 and array.dtype.itemsize == 2 and (array.dtype.kind == "V"
                                                                   or array.dtype.name == "bfloat16"):
        return np.ascontiguousarray(array).view(np.uint16)
    return from_compute(array, dtype) if dtype != common_pb2.PRED else (array != 0).astype(np.uint8)


def lossy_integer_input(array: np.ndarray, dtype: int) -> str:
    """Why an array given for an integer `dtype` does not survive the conversion (fractions, NaN
    or infinities, values out of the type's range), or "": XLA's rules then truncate, saturate and
    wrap, which is rarely what the caller meant. Floats to floats narrow as any compiler does."""
    array = np.asarray(array)
    if is_float(dtype) or dtype == common_pb2.PRED or array.dtype.kind not in "biuf" or array.size == 0:
        return ""
    info = np.iinfo(_STORAGE[dtype])
    if array.dtype.kind == "f":
        if not np.isfinite(array).all():
            return "NaN or infinite values"
        if (np.trunc(array) != array).any():
            return "fractional values"
    low, high = array.min(), array.max()
    if low < info.min or high > info.max:
        return f"values out of {name(dtype)}'s range [{info.min}, {info.max}] ({low} .. {high})"
    return ""


def storage_to_user_array(storage: np.ndarray, dtype: int) -> np.ndarray:
    """The array a user sees: bf16 widened to float32, PRED as bool, others as stored."""
    if dtype == common_pb2.BF16:
        return bf16_to_f32(storage)
    if dtype == common_pb2.PRED:
        return storage.astype(bool)
    return storage
