"""What a Penguin statement costs, by the target's cost model (tools/target/costs.py).

The Frontend's decisions that weigh time before the backend has run read it: the software
pipeliner's choice of the pipelined body's order (passes/pipelining.py) and how many iterations a
rolled loop's body holds (rolling.py, unroll and jam).
"""

from __future__ import annotations

import math

from ncc.schemas import common_pb2, penguin_pb2
from ncc.tools.common.dtypes import itemsize
from ncc.tools.hlo_opt.passes.broadcast_operands import broadcast_inputs
from ncc.tools.target import is_dma, load_target
from ncc.tools.target.costs import engine_cycles, streamed_inputs


def statement_ns(st: penguin_pb2.Statement, tensors: dict[str, penguin_pb2.TensorDecl]) -> float:
    """Nanoseconds one statement holds its engine, or a dma's transfer takes (at the DMA queues'
    combined bandwidth), for the elements its tensors hold (`clipped`)."""
    target = load_target()
    accesses = [*st.inputs, *st.outputs]
    if is_dma(st.op):
        moved = max((math.prod(clipped(a, tensors)) * itemsize(tensors[a.tensor].dtype) for a in accesses),
                    default=0)
        return moved / min(target.hbm_bandwidth_gbps, target.dma_queues * target.dma_queue_bandwidth_gbps)
    fp32 = any(tensors[a.tensor].dtype == common_pb2.F32 for a in st.inputs)
    moving = free_elements(clipped(st.inputs[1], tensors)) if len(st.inputs) > 1 else 0
    free = max((free_elements(clipped(a, tensors)) for a in accesses), default=1)
    inputs = streamed_inputs(len(st.inputs), len(broadcast_inputs(st)), free)
    cycles = engine_cycles(target, op=st.op, engine=st.engine, inputs=inputs, free=free,
                           moving_free=moving, fp32=fp32)
    return target.cycles_to_ns(st.engine, cycles)


def clipped(access: penguin_pb2.Access, tensors: dict[str, penguin_pb2.TensorDecl]) -> list[int]:
    """The access's extents, each at most its tensor's dimension: a tile larger than its tensor
    (60 rows in a 128-partition tile, 7 columns in one of 512) moves and computes what is there.
    (Priced whole, a convolution's 60 x 7 weight tile made its body's matmul 753 ns instead of
    114, and rolling jammed 2 iterations where the queues wanted 4.)"""
    shape = tensors[access.tensor].shape
    return [min(int(e), int(n)) for e, n in zip(access.extents, shape, strict=True)]


def free_elements(extents: list[int]) -> int:
    """Elements per partition of an on-chip box of these extents (the partitions are its
    second-to-last dimension)."""
    return math.prod(extents) // (extents[-2] if len(extents) > 1 and extents[-2] else 1)
