"""Device memory for the simulator: HBM tensors, SBUF and PSUM, and resolved access patterns.

Every byte the program can touch lives in a numpy uint8 array: one flat array per HBM tensor,
and one [partitions x bytes-per-partition] array each for SBUF and PSUM (buffers that the
allocation pass has not placed yet get a private array of their own, so BIR can be simulated
before allocation). `DeviceMemory.resolve` turns an `AccessPattern` into an `Access`: a numpy
view of the operand's logical shape (storage dtype, aliasing device memory) plus the facts the
race checker needs (region, partition range, byte hull, exact byte intervals). Bounds are
checked once, when the operand is resolved, and an out-of-bounds operand is a CompileError E601
naming the instruction. Malformed operands (unknown tensor, wrong memory) are E603.

An operand inside a loop changes only its offset from iteration to iteration: its Access says at
which offsets the same pattern stays in bounds (`offset_range`), and `at(offset)` gives the
Access at another offset without resolving the pattern again (the simulator decodes a loop body
once and checks every iteration's offsets against that range up front).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.common import dtypes
from ncc.tools.common.errors import CompileError
from ncc.tools.target import Target

ONCHIP_NAMES = {common_pb2.SBUF: "SBUF", common_pb2.PSUM: "PSUM"}
# dtypes whose stored form is not their computed values' cast (dtypes.from_compute rounds or maps)
_CONVERTED_ON_STORE = frozenset({common_pb2.BF16, common_pb2.PRED})
MEMORY_NAMES = {common_pb2.HBM: "HBM", **ONCHIP_NAMES}


def known_dtype(dtype: int) -> bool:
    """Is `dtype` a DType with a storage type (not DTYPE_INVALID or an unknown value)?"""
    try:
        dtypes.storage_dtype(dtype)
    except KeyError:
        return False
    return True


def shape_text(dtype: int, shape: Iterable[int]) -> str:
    return f"{dtypes.name(dtype)}[{','.join(str(d) for d in shape)}]"


@dataclass(eq=False)
class Access:
    """One resolved operand of one instruction.

    `view` has the operand's logical shape (`[partition_count, counts...]` on chip, `[counts...]`
    in HBM) and `dtype`'s storage type, and aliases device memory: reading copies out of it,
    writing stores into it. Race checking sees the operand as partitions `[part_lo, part_hi)` ×
    bytes `[byte_lo, byte_hi)` of `region` (bytes within a partition on chip, within the tensor
    in HBM); `intervals()` refines the byte hull to the exact bytes touched.
    """

    view: np.ndarray
    dtype: int
    memory: int
    region: str
    region_label: str
    part_lo: int
    part_hi: int
    byte_lo: int
    byte_hi: int
    base: int
    counts: tuple[int, ...]
    byte_strides: tuple[int, ...]
    offset: int = 0  # the access pattern's offset (HBM: elements, on chip: bytes)
    offset_unit: int = 1  # bytes per unit of `offset`
    offset_range: tuple[int, int] = (0, 0)  # the offsets at which the pattern is in bounds
    storage: np.ndarray | None = field(default=None, repr=False)  # what `view` aliases (None: empty)
    storage_offset: int = 0  # where `view` starts in `storage`, in bytes
    footprint: object = field(default=None, repr=False)  # the race detector's record of this geometry
    _intervals: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)
    size: int = field(init=False)  # elements: the view's, read on every execution and check
    empty: bool = field(init=False)

    def __post_init__(self) -> None:
        self.size = int(self.view.size)
        self.empty = self.size == 0

    @property
    def shape(self) -> tuple[int, ...]:
        return self.view.shape


    @property
    def partitions(self) -> int:
        """Partition count on chip (1 for HBM)."""
        return self.part_hi - self.part_lo if self.memory != common_pb2.HBM else 1

    @property
    def nbytes(self) -> int:
        return self.size * dtypes.itemsize(self.dtype)

    def read(self) -> np.ndarray:
        """A copy of the operand's stored values (storage dtype, logical shape)."""
        return np.array(self.view, copy=True)

    def read_compute(self) -> np.ndarray:
        """The operand's values widened for arithmetic (float32 for floats, int64 for integers), in
        a new array (widening copies, so nothing is copied before it)."""
        return dtypes.to_compute(self.view, self.dtype)

    def values(self) -> np.ndarray:
        """The operand's values as `read_compute` has them, but without a copy when they are stored
        as computed (f32): the result may alias device memory, so it is only read."""
        if self.dtype == common_pb2.F32:
            return self.view
        return dtypes.to_compute(self.view, self.dtype)

    def write_storage(self, values: np.ndarray) -> None:
        if self.size:
            self.view[...] = np.asarray(values, dtype=self.view.dtype).reshape(self.view.shape)

    def write_compute(self, values: np.ndarray) -> None:
        """Narrow computed values to this operand's dtype (bf16 rounds to nearest even) and store them."""
        if not self.size:
            return
        values = np.asarray(values)
        if values.dtype == self.view.dtype and self.dtype not in _CONVERTED_ON_STORE:
            self.view[...] = values.reshape(self.view.shape)  # already the stored type (f32 into f32)
        else:
            self.write_storage(dtypes.from_compute(values, self.dtype).reshape(self.view.shape))

    def at(self, offset: int) -> Access:
        """The same operand with its access pattern's offset at `offset` (a loop instance's), which
        the caller has checked against `offset_range`: nothing is resolved or checked again."""
        delta = (offset - self.offset) * self.offset_unit
        moved = Access.__new__(Access)
        moved.__dict__.update(self.__dict__)
        moved.offset = offset
        moved.byte_lo, moved.byte_hi = self.byte_lo + delta, self.byte_hi + delta
        moved.base = self.base + delta
        moved.footprint = moved._intervals = None
        if self.storage is not None:
            moved.storage_offset = self.storage_offset + delta
            view = self.view
            moved.view = np.ndarray(
                view.shape, view.dtype, buffer=self.storage, offset=moved.storage_offset, strides=view.strides
            )
        return moved

    def intervals(self) -> tuple[np.ndarray, np.ndarray]:
        """Sorted disjoint byte intervals [starts, ends) touched in each partition (or in the tensor)."""
        if self._intervals is None:
            self._intervals = _byte_intervals(
                self.base, self.counts, self.byte_strides, dtypes.itemsize(self.dtype)
            )
        return self._intervals

    def overlaps(self, other: Access) -> bool:
        """Exact test: do the two operands share a byte of the same region (and partition)?"""
        if self.region != other.region or self.empty or other.empty:
            return False
        if self.part_lo >= other.part_hi or other.part_lo >= self.part_hi:
            return False
        if self.byte_lo >= other.byte_hi or other.byte_lo >= self.byte_hi:
            return False
        a_starts, a_ends = self.intervals()
        b_starts, b_ends = other.intervals()
        first_after = np.searchsorted(b_ends, a_starts, side="right")
        valid = first_after < len(b_starts)
        return bool(np.any(b_starts[first_after[valid]] < a_ends[valid]))

    def describe_overlap(self, other: Access) -> str:
        """Human text for where two overlapping operands meet (inclusive ranges, hull intersection)."""
        lo, hi = max(self.byte_lo, other.byte_lo), min(self.byte_hi, other.byte_hi) - 1
        if self.memory == common_pb2.HBM:
            return f"{self.region_label} bytes {lo}-{hi}"
        p_lo, p_hi = max(self.part_lo, other.part_lo), min(self.part_hi, other.part_hi) - 1
        return f"{self.region_label} partitions {p_lo}-{p_hi} bytes {lo}-{hi}"


def _byte_intervals(
    base: int, counts: tuple[int, ...], strides: tuple[int, ...], itemsize: int
) -> tuple[np.ndarray, np.ndarray]:
    """Exact bytes walked by `counts`/`strides` from `base`, merged into sorted disjoint intervals."""
    dims = sorted((abs(s), c, s) for c, s in zip(counts, strides, strict=True) if c > 1 and s != 0)
    lo = base + sum(min(0, (c - 1) * s) for _, c, s in dims)
    expected = itemsize
    dense = True
    for magnitude, count, _ in dims:
        if magnitude != expected:
            dense = False
            break
        expected *= count
    if dense:
        return np.array([lo], dtype=np.int64), np.array([lo + expected], dtype=np.int64)
    offsets = np.array([base], dtype=np.int64)
    for _, count, stride in dims:
        offsets = (offsets[:, None] + np.arange(count, dtype=np.int64)[None, :] * stride).ravel()
    starts = np.unique(offsets)
    breaks = np.flatnonzero(starts[1:] > starts[:-1] + itemsize) + 1
    group_starts = np.concatenate(([0], breaks))
    group_ends = np.concatenate((breaks, [len(starts)])) - 1
    return starts[group_starts], starts[group_ends] + itemsize


class DeviceMemory:
    """All device memory of one simulated execution, and the resolver of access patterns."""

    def __init__(
        self, target: Target, hbm: Iterable[bir_pb2.HbmTensor], buffers: Iterable[bir_pb2.Buffer]
    ) -> None:
        self.target = target
        self.onchip = {
            common_pb2.SBUF: np.zeros((target.partitions, target.sbuf_bytes_per_partition), dtype=np.uint8),
            common_pb2.PSUM: np.zeros((target.partitions, target.psum_bytes_per_partition), dtype=np.uint8),
        }
        self.tensors: dict[str, bir_pb2.HbmTensor] = {}
        self.hbm: dict[str, np.ndarray] = {}
        for tensor in hbm:
            self._add_tensor(tensor)
        self.buffers: dict[str, bir_pb2.Buffer] = {}
        self.private: dict[str, np.ndarray] = {}
        for buffer in buffers:
            self._add_buffer(buffer)

    def _add_tensor(self, tensor: bir_pb2.HbmTensor) -> None:
        if tensor.name in self.tensors:
            raise CompileError("E603", f"HBM tensor {tensor.name!r} is declared twice", tensor.name)
        if not known_dtype(tensor.dtype):
            raise CompileError("E603", f"HBM tensor {tensor.name!r} has no valid dtype", tensor.name)
        if any(d < 0 for d in tensor.shape):
            raise CompileError("E603", f"HBM tensor {tensor.name!r} has a negative dimension", tensor.name)
        nbytes = int(np.prod(tensor.shape, dtype=np.int64)) * dtypes.itemsize(tensor.dtype)
        data = np.zeros(nbytes, dtype=np.uint8)
        if tensor.role == bir_pb2.CONSTANT:
            if len(tensor.data) != nbytes:
                raise CompileError(
                    "E603",
                    f"constant {tensor.name!r} ({shape_text(tensor.dtype, tensor.shape)}) holds "
                    f"{len(tensor.data)} bytes of data, expected {nbytes}",
                    tensor.name,
                )
            data[:] = np.frombuffer(tensor.data, dtype=np.uint8)
        self.tensors[tensor.name] = tensor
        self.hbm[tensor.name] = data

    def _add_buffer(self, buffer: bir_pb2.Buffer) -> None:
        if buffer.name in self.buffers:
            raise CompileError("E603", f"buffer {buffer.name!r} is declared twice", buffer.name)
        if buffer.memory not in ONCHIP_NAMES:
            raise CompileError("E603", f"buffer {buffer.name!r} is not in SBUF or PSUM", buffer.name)
        space = self.onchip[buffer.memory].shape
        if buffer.partitions > space[0]:
            raise CompileError(
                "E601",
                f"buffer {buffer.name!r} spans {buffer.partitions} partitions (the target has {space[0]})",
                buffer.name,
            )
        if buffer.address >= 0:
            if buffer.address + buffer.bytes_per_partition > space[1]:
                raise CompileError(
                    "E601",
                    f"buffer {buffer.name!r} at address {buffer.address} + "
                    f"{buffer.bytes_per_partition} bytes exceeds the {space[1]} bytes of a "
                    f"{ONCHIP_NAMES[buffer.memory]} partition",
                    buffer.name,
                )
        else:
            if buffer.bytes_per_partition <= 0:
                raise CompileError(
                    "E603", f"buffer {buffer.name!r} is neither allocated nor sized", buffer.name
                )
            self.private[buffer.name] = np.zeros((space[0], buffer.bytes_per_partition), dtype=np.uint8)
        self.buffers[buffer.name] = buffer

    # ---- host side: inputs and outputs ---------------------------------------------------------

    def store_tensor(self, name: str, storage: np.ndarray) -> None:
        """Fill HBM tensor `name` from a storage array of its dtype and shape."""
        tensor = self.tensors[name]
        flat = np.ascontiguousarray(storage, dtype=dtypes.storage_dtype(tensor.dtype)).reshape(-1)
        self.hbm[name][:] = flat.view(np.uint8)

    def load_tensor(self, name: str) -> np.ndarray:
        """A copy of HBM tensor `name` as a storage array of its shape."""
        tensor = self.tensors[name]
        return self.hbm[name].view(dtypes.storage_dtype(tensor.dtype)).reshape(tuple(tensor.shape)).copy()

    # ---- device side: access patterns -----------------------------------------------------------

    def resolve(self, ap: bir_pb2.AccessPattern, what: str) -> Access:
        """Resolve one operand; `what` names it in errors (e.g. "instruction 'add3' input 1")."""
        if not known_dtype(ap.dtype):
            raise CompileError("E603", f"{what} has no valid dtype", what)
        counts = tuple(int(d.count) for d in ap.dims)
        if any(c < 0 for c in counts):
            raise CompileError("E603", f"{what} has a negative dim count", what)
        if ap.memory == common_pb2.HBM:
            return self._resolve_hbm(ap, counts, what)
        if ap.memory in ONCHIP_NAMES:
            return self._resolve_onchip(ap, counts, what)
        raise CompileError("E603", f"{what} names no memory (HBM, SBUF or PSUM)", what)

    def _resolve_hbm(self, ap: bir_pb2.AccessPattern, counts: tuple[int, ...], what: str) -> Access:
        tensor = self.tensors.get(ap.tensor)
        if tensor is None:
            raise CompileError("E603", f"{what} names unknown HBM tensor {ap.tensor!r}", what)
        if ap.dtype != tensor.dtype:
            raise CompileError(
                "E603",
                f"{what} reads HBM tensor {ap.tensor!r} as {dtypes.name(ap.dtype)} but it is "
                f"{dtypes.name(tensor.dtype)}",
                what,
            )
        itemsize = dtypes.itemsize(ap.dtype)
        data = self.hbm[ap.tensor]
        numel = len(data) // itemsize
        strides = tuple(int(d.stride) for d in ap.dims)
        empty = any(c == 0 for c in counts)
        below = sum(min(0, (c - 1) * s) for c, s in zip(counts, strides, strict=True))
        above = sum(max(0, (c - 1) * s) for c, s in zip(counts, strides, strict=True)) + 1
        lo, hi = ap.offset + below, ap.offset + above
        offset_range = (-below, numel - above)  # lo >= 0 and hi <= numel
        if not empty and not offset_range[0] <= ap.offset <= offset_range[1]:
            raise CompileError(
                "E601",
                f"{what} reaches elements {lo}..{hi - 1} of HBM tensor {ap.tensor!r} "
                f"({shape_text(tensor.dtype, tensor.shape)}, {numel} elements)",
                what,
            )
        byte_strides = tuple(s * itemsize for s in strides)
        storage = dtypes.storage_dtype(ap.dtype)
        if empty:
            view = np.zeros(counts, dtype=storage)
        else:
            view = np.ndarray(
                counts, dtype=storage, buffer=data, offset=ap.offset * itemsize, strides=byte_strides
            )
        return Access(
            view=view,
            dtype=ap.dtype,
            memory=common_pb2.HBM,
            region=f"HBM:{ap.tensor}",
            region_label=f"HBM tensor {ap.tensor}",
            part_lo=0,
            part_hi=1,
            byte_lo=lo * itemsize,
            byte_hi=hi * itemsize,
            base=ap.offset * itemsize,
            counts=counts,
            byte_strides=byte_strides,
            offset=int(ap.offset),
            offset_unit=itemsize,
            offset_range=offset_range,
            storage=None if empty else data,
            storage_offset=ap.offset * itemsize,
        )

    def _resolve_onchip(self, ap: bir_pb2.AccessPattern, counts: tuple[int, ...], what: str) -> Access:
        memory_name = ONCHIP_NAMES[ap.memory]
        buffer = self.buffers.get(ap.tensor)
        if buffer is None:
            raise CompileError("E603", f"{what} names unknown {memory_name} buffer {ap.tensor!r}", what)
        if buffer.memory != ap.memory:
            raise CompileError(
                "E603",
                f"{what} accesses buffer {ap.tensor!r} as {memory_name} but it is in "
                f"{ONCHIP_NAMES[buffer.memory]}",
                what,
            )
        allocated = buffer.address >= 0
        storage_array = self.onchip[ap.memory] if allocated else self.private[buffer.name]
        partitions_total, row_bytes = storage_array.shape
        buffer_partitions = buffer.partitions or partitions_total
        p_lo, p_count = int(ap.partition_start), int(ap.partition_count)
        if p_count < 0 or p_lo < 0 or p_lo + p_count > buffer_partitions:
            raise CompileError(
                "E601",
                f"{what} uses partitions {p_lo}..{p_lo + p_count - 1} of buffer {ap.tensor!r}, "
                f"which has {buffer_partitions}",
                what,
            )
        itemsize = dtypes.itemsize(ap.dtype)
        strides = tuple(int(d.stride) * itemsize for d in ap.dims)
        base_address = buffer.address if allocated else 0
        start = base_address + int(ap.offset)
        below = sum(min(0, (c - 1) * s) for c, s in zip(counts, strides, strict=True))
        above = sum(max(0, (c - 1) * s) for c, s in zip(counts, strides, strict=True)) + itemsize
        lo, hi = start + below, start + above
        limit_lo = base_address
        limit_hi = base_address + buffer.bytes_per_partition if buffer.bytes_per_partition > 0 else row_bytes
        # lo >= limit_lo and hi <= min(limit_hi, row_bytes)
        offset_range = (limit_lo - base_address - below, min(limit_hi, row_bytes) - base_address - above)
        empty = p_count == 0 or any(c == 0 for c in counts)
        if not empty and not offset_range[0] <= ap.offset <= offset_range[1]:
            raise CompileError(
                "E601",
                f"{what} reaches bytes {lo - base_address}..{hi - base_address - 1} of buffer {ap.tensor!r} "
                f"({memory_name}, {buffer.bytes_per_partition} bytes per partition)",
                what,
            )
        shape = (p_count, *counts)
        storage = dtypes.storage_dtype(ap.dtype)
        if empty:
            view = np.zeros(shape, dtype=storage)
        else:
            view = np.ndarray(
                shape,
                dtype=storage,
                buffer=storage_array,
                offset=p_lo * row_bytes + start,
                strides=(row_bytes, *strides),
            )
        region = memory_name if allocated else f"{memory_name}:{buffer.name}"
        label = memory_name if allocated else f"{memory_name} buffer {buffer.name} (unallocated)"
        return Access(
            view=view,
            dtype=ap.dtype,
            memory=ap.memory,
            region=region,
            region_label=label,
            part_lo=p_lo,
            part_hi=p_lo + p_count,
            byte_lo=lo,
            byte_hi=hi,
            base=start,
            counts=counts,
            byte_strides=strides,
            offset=int(ap.offset),
            offset_range=offset_range,
            storage=None if empty else storage_array,
            storage_offset=p_lo * row_bytes + start,
        )
