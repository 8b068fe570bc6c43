"""The simulator's cost model: how long each instruction occupies its engine, queue and ports (ns).

All numbers come from the Target (tools/target/<name>.json), converted with each engine's clock:

  matmul      max(N, matmul_min_cycles) × (fp32_matmul_factor if an input is fp32) + access
              (N = moving free size)
  activation  N × act_cycles_per_element + access                        (N = free size)
  DVE / POOL  max(1, #inputs) × N × {dve,pool}_cycles_per_element + access  (+ pool_start_cycles on POOL)
  ACT copy    N × act_cycles_per_element + access
  nop         nop_cycles
  dma         the trigger engine spends dma_issue_cycles; the transfer occupies its queue for
              Target.dma_ns(bytes) = dma_fixed_latency_ns + bytes / dma_queue_bandwidth_gbps

where access = onchip_access_cycles (once per instruction that touches SBUF/PSUM) and the free
size N is the largest operand's elements per partition. Keys this module adds beyond the bundled
description are read with a default of 1 cycle per element.

Structural hazards (DESIGN.md): DVE and POOL share the SBUF port; DVE and ACT share the PSUM
port. An instruction holds each shared port it needs for its whole duration, so a DVE and a POOL
instruction that both touch SBUF do not overlap.
"""

from __future__ import annotations

from ncc.schemas import common_pb2
from ncc.tools.sim.instruction import Op
from ncc.tools.target import Target

SBUF_PORT = "SBUF port (DVE/POOL)"
PSUM_PORT = "PSUM port (DVE/ACT)"

_PORT_USERS = {
    SBUF_PORT: (common_pb2.SBUF, frozenset({common_pb2.DVE, common_pb2.POOL})),
    PSUM_PORT: (common_pb2.PSUM, frozenset({common_pb2.DVE, common_pb2.ACT})),
}

_PER_ELEMENT_KEY = {
    common_pb2.DVE: "dve_cycles_per_element",
    common_pb2.POOL: "pool_cycles_per_element",
    common_pb2.ACT: "act_cycles_per_element",
    common_pb2.PE: "pe_cycles_per_element",
    common_pb2.SP: "sp_cycles_per_element",
}


class CostModel:
    """Instruction durations in ns for one target."""

    def __init__(self, target: Target) -> None:
        self.target = target
        costs = target.costs
        self.access_cycles = float(costs.get("onchip_access_cycles", 60))
        self.matmul_min_cycles = float(costs.get("matmul_min_cycles", 64))
        self.fp32_matmul_factor = float(costs.get("fp32_matmul_factor", 4))
        self.pool_start_cycles = float(costs.get("pool_start_cycles", 150))
        self.nop_cycles = float(costs.get("nop_cycles", 4))
        self.per_element = {engine: float(costs.get(key, 1.0)) for engine, key in _PER_ELEMENT_KEY.items()}

    def engine_ns(self, op: Op) -> float:
        """How long `op` occupies its engine (a dma: only the trigger's issue time)."""
        if op.is_dma:
            return self.target.cycles_to_ns(op.engine, self.target.dma_issue_cycles)
        return self.target.cycles_to_ns(op.engine, self.engine_cycles(op))

    def engine_cycles(self, op: Op) -> float:
        if op.op == "nop":
            return self.nop_cycles
        operands = [*op.inputs, *op.outputs]
        free = max((a.size // max(a.partitions, 1) for a in operands), default=0)
        if op.op == "matmul":
            stationary, moving = op.inputs
            n = moving.size // max(moving.partitions, 1)
            factor = self.fp32_matmul_factor if common_pb2.F32 in (stationary.dtype, moving.dtype) else 1.0
            return max(n, self.matmul_min_cycles) * factor + self.access_cycles
        per_element = self.per_element.get(op.engine, 1.0)
        if op.op in ("activation",) or op.engine == common_pb2.ACT:
            cycles = free * per_element
        else:
            cycles = max(1, len(op.inputs)) * free * per_element
        if op.engine == common_pb2.POOL:
            cycles += self.pool_start_cycles
        return cycles + self.access_cycles

    def transfer_ns(self, op: Op) -> float:
        """How long a dma's data occupies its queue."""
        return self.target.dma_ns(op.inputs[0].nbytes) if op.is_dma else 0.0

    @staticmethod
    def ports(op: Op) -> tuple[str, ...]:
        """The shared memory ports `op` holds while it runs."""
        if op.is_dma:
            return ()
        memories = {a.memory for a in (*op.inputs, *op.outputs)}
        return tuple(
            port
            for port, (memory, engines) in _PORT_USERS.items()
            if op.engine in engines and memory in memories
        )
