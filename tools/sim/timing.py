"""The simulator's timing: how long each instruction occupies its engine, queue and ports (ns).

The formulas are the target's cost model (tools/target/costs.py), the same the backend's scheduler
estimates with; this module applies them to decoded instructions and converts cycles with each
engine's clock. A dma occupies its trigger engine for the issue and its queue for the transfer.
"""

from __future__ import annotations

from ncc.schemas import common_pb2
from ncc.tools.sim.instruction import Op
from ncc.tools.target import Target, costs


class CostModel:
    """Instruction durations in ns for one target."""

    def __init__(self, target: Target) -> None:
        self.target = target

    def engine_ns(self, op: Op) -> float:
        """How long `op` occupies its engine (a dma: only the trigger's issue time)."""
        return self.target.cycles_to_ns(op.engine, self.engine_cycles(op))

    def engine_cycles(self, op: Op) -> float:
        operands = [*op.inputs, *op.outputs]
        moving_free = 0
        if op.op == "matmul":
            moving_free = op.inputs[1].size // max(op.inputs[1].partitions, 1)
        elif op.op == "transpose":  # the identity it streams is as wide as the tile has partitions
            moving_free = op.inputs[0].partitions
        free = max((a.size // max(a.partitions, 1) for a in operands), default=0)
        scalars = sum(not any(c > 1 and s for c, s in zip(a.counts, a.byte_strides, strict=True))
                      for a in op.inputs)  # one element per partition: a per-partition scalar operand
        return costs.engine_cycles(
            self.target,
            op=op.op,
            engine=op.engine,
            inputs=costs.streamed_inputs(len(op.inputs), scalars, free),
            free=free,
            moving_free=moving_free,
            fp32=op.op in costs.PE_OPS and any(a.dtype == common_pb2.F32 for a in op.inputs),
        )

    def transfer_ns(self, op: Op) -> float:
        """How long a dma's data occupies its queue."""
        return self.target.dma_ns(op.moved_bytes) if op.is_dma else 0.0

    def hbm_ns(self, op: Op) -> float:
        """How long a dma's bytes occupy the core's aggregate HBM bandwidth (hbm_bandwidth_gbps,
        410 GB/s on trn1: less than 16 queues x 27 GB/s), if it reads or writes HBM."""
        touches_hbm = any(a.memory == common_pb2.HBM for a in (*op.inputs, *op.outputs))
        if not op.is_dma or not touches_hbm:
            return 0.0
        return op.moved_bytes / self.target.hbm_bandwidth_gbps

    @staticmethod
    def ports(op: Op) -> tuple[str, ...]:
        """The shared memory ports `op` holds while it runs."""
        return costs.ports(op=op.op, engine=op.engine, memories={a.memory for a in (*op.inputs, *op.outputs)})

    @staticmethod
    def dispatch_ports(op: Op) -> tuple[str, ...]:
        """Of `op.ports`, those claimed when it is dispatched rather than when it starts."""
        return tuple(port for port in op.ports if port in costs.DISPATCH_CLAIMED_PORTS)
