"""Hand-building BIR programs for simulator and packager tests.

`ProgramBuilder` declares HBM tensors and on-chip buffers (addresses assigned linearly unless
given) and appends instructions in one global order; `build()` gives the BIR Program (streams
empty, so consumers group by engine). AP helpers cover the common 2-D shapes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.common import dtypes

F32, BF16, S32, PRED = common_pb2.F32, common_pb2.BF16, common_pb2.S32, common_pb2.PRED
SBUF, PSUM, HBM = common_pb2.SBUF, common_pb2.PSUM, common_pb2.HBM
PE, ACT, POOL, DVE, SP = common_pb2.PE, common_pb2.ACT, common_pb2.POOL, common_pb2.DVE, common_pb2.SP


def hbm_2d(
    tensor: str, rows: int, cols: int, dtype: int = F32, row0: int = 0, row_stride: int | None = None
) -> bir_pb2.AccessPattern:
    """Rows [row0, row0+rows) × all `cols` columns of a row-major HBM matrix."""
    stride = cols if row_stride is None else row_stride
    return bir_pb2.AccessPattern(
        memory=HBM,
        tensor=tensor,
        dtype=dtype,
        offset=row0 * stride,
        dims=[bir_pb2.Dim(stride=stride, count=rows), bir_pb2.Dim(stride=1, count=cols)],
    )


def onchip(
    buffer: str,
    partitions: int,
    cols: int,
    dtype: int = F32,
    memory: int = SBUF,
    offset: int = 0,
    partition_start: int = 0,
    stride: int = 1,
) -> bir_pb2.AccessPattern:
    """Partitions [start, start+partitions) × `cols` elements from byte `offset` of `buffer`."""
    return bir_pb2.AccessPattern(
        memory=memory,
        tensor=buffer,
        dtype=dtype,
        offset=offset,
        partition_start=partition_start,
        partition_count=partitions,
        dims=[bir_pb2.Dim(stride=stride, count=cols)],
    )


def wait(semaphore: int, value: int) -> bir_pb2.SemaphoreWait:
    return bir_pb2.SemaphoreWait(semaphore=semaphore, value=value)


def update(semaphore: int, increment: int = 1) -> bir_pb2.SemaphoreUpdate:
    return bir_pb2.SemaphoreUpdate(semaphore=semaphore, increment=increment)


class ProgramBuilder:
    """Accumulates a BIR Program."""

    def __init__(self, name: str = "test", num_semaphores: int = 8) -> None:
        self.program = bir_pb2.Program(name=name, target="trn1", num_semaphores=num_semaphores)
        self._next_address = {SBUF: 0, PSUM: 0}
        self._next_id = 0

    def hbm(
        self,
        name: str,
        shape: Sequence[int],
        dtype: int = F32,
        role: int = bir_pb2.INPUT,
        index: int = 0,
        data: np.ndarray | None = None,
    ) -> str:
        tensor = self.program.hbm.add(name=name, dtype=dtype, shape=list(shape), role=role, index=index)
        if data is not None:
            tensor.data = np.ascontiguousarray(dtypes.user_array_to_storage(data, dtype)).tobytes()
        return name

    def buffer(
        self,
        name: str,
        bytes_per_partition: int,
        memory: int = SBUF,
        partitions: int = 128,
        address: int | None = None,
    ) -> str:
        if address is None:
            address = self._next_address[memory]
            self._next_address[memory] = address + bytes_per_partition
        self.program.buffers.add(
            name=name,
            memory=memory,
            partitions=partitions,
            bytes_per_partition=bytes_per_partition,
            address=address,
        )
        return name

    def add(
        self,
        op: str,
        engine: int,
        outputs: Sequence[bir_pb2.AccessPattern] = (),
        inputs: Sequence[bir_pb2.AccessPattern] = (),
        *,
        name: str | None = None,
        func: str = "",
        scalars: Sequence[float] = (),
        accumulate: bool = False,
        queue: int = 0,
        waits: Sequence[bir_pb2.SemaphoreWait] = (),
        updates: Sequence[bir_pb2.SemaphoreUpdate] = (),
        attributes: dict[str, str] | None = None,
    ) -> bir_pb2.Instruction:
        self._next_id += 1
        instruction = self.program.instructions.add(
            id=self._next_id,
            name=name or f"{op}{self._next_id}",
            op=op,
            engine=engine,
            dma_queue=queue,
            func=func,
            scalars=list(scalars),
            accumulate=accumulate,
        )
        instruction.outputs.extend(outputs)
        instruction.inputs.extend(inputs)
        instruction.waits.extend(waits)
        instruction.updates.extend(updates)
        instruction.attributes.update(attributes or {})
        return instruction

    def build(self) -> bir_pb2.Program:
        program = bir_pb2.Program()
        program.CopyFrom(self.program)
        return program


def find(program: bir_pb2.Program, name: str) -> bir_pb2.Instruction:
    """The instruction called `name` (to edit a built program)."""
    for instruction in program.instructions:
        if instruction.name == name:
            return instruction
    raise KeyError(name)
