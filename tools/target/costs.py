"""The cost model: how long an instruction occupies its engine, and which shared ports it holds.

One formula for everyone who needs a duration: the backend's scheduler estimates with it, the
simulator times with it, so "the schedule the compiler planned" and "the schedule that ran" differ
only by what the scheduler cannot know. Numbers come from the Target; N is the largest operand's
free elements per partition, access = onchip_access_cycles:

  matmul      max(N_moving, matmul_min_cycles) x fp32_matmul_factor (if an input is fp32) + access
  ACT         N x act_cycles_per_element + access
  DVE / POOL  max(1, #inputs) x N x {dve,pool}_cycles_per_element + access (+ pool_start_cycles on POOL)
              where #inputs counts the streamed inputs: one that is a single element per
              partition read across a wider output (stride 0: a per-partition scalar operand,
              NKI tensor_scalar's [P, 1] vector operand) streams nothing (`streamed_inputs`)
  nop         nop_cycles (sem_reset and drain too)
  dma         dma_issue_cycles on the trigger engine; the transfer then occupies its queue for
              Target.dma_ns(bytes) = dma_fixed_latency_ns + bytes / dma_queue_bandwidth_gbps

Per-element keys default to 1 cycle when the target omits them. Structural hazards (DESIGN.md):
DVE and POOL share the SBUF port, DVE and ACT the PSUM port; an instruction holds each port it
needs for its whole duration. The SBUF port is arbitrated when an instruction is dispatched (its
engine is free and it is next in the stream), before its semaphore waits are checked: it holds
the port while it waits (DISPATCH_CLAIMED_PORTS). A DVE or POOL instruction that waits, even
through other engines, for the other one's work still to come therefore deadlocks; a `drain`
(no operands, no port) carrying that wait just before it is the way out (sync_dve_pool).
"""

from __future__ import annotations

from collections.abc import Iterable

from ncc.schemas import common_pb2
from ncc.tools.target import INDIRECT_DMA_OPS, Target, is_dma

SBUF_PORT = "SBUF port (DVE/POOL)"
PSUM_PORT = "PSUM port (DVE/ACT)"
_PORT_USERS = {
    SBUF_PORT: (common_pb2.SBUF, frozenset({common_pb2.DVE, common_pb2.POOL})),
    PSUM_PORT: (common_pb2.PSUM, frozenset({common_pb2.DVE, common_pb2.ACT})),
}
# Ports claimed at dispatch rather than at start (see the module docstring).
DISPATCH_CLAIMED_PORTS = frozenset({SBUF_PORT})
_PER_ELEMENT_KEY = {
    common_pb2.DVE: "dve_cycles_per_element",
    common_pb2.POOL: "pool_cycles_per_element",
    common_pb2.ACT: "act_cycles_per_element",
    common_pb2.PE: "pe_cycles_per_element",
    common_pb2.SP: "sp_cycles_per_element",
}


# The tensor engine's ops: a matmul, and a transpose (the matmul of a tile, stationary, against an
# identity as wide as its partitions, moving): an fp32 operand takes `fp32_matmul_factor` passes.
PE_OPS = ("matmul", "transpose")


def engine_cycles(
    target: Target, *, op: str, engine: int, inputs: int, free: int, moving_free: int = 0, fp32: bool = False
) -> float:
    """Cycles `op` occupies `engine` (a dma: only its trigger's issue). `free`: the largest operand's
    free elements per partition; `moving_free` (a matmul's moving free size; a transpose's
    partitions) and `fp32` matter for PE_OPS only."""
    costs = target.costs
    if op in INDIRECT_DMA_OPS:
        # POOL reads the index tile (one s32 per partition) and writes one descriptor per partition,
        # the partitions side by side: its work does not grow with the table the rows come from
        return float(target.dma_issue_cycles) + float(costs.get("pool_start_cycles", 150)) + 1.0
    if is_dma(op):
        return float(target.dma_issue_cycles)
    if op in ("nop", "sem_reset", "drain"):
        return float(costs.get("nop_cycles", 4))
    access = float(costs.get("onchip_access_cycles", 60))
    if op in PE_OPS:
        factor = float(costs.get("fp32_matmul_factor", 4)) if fp32 else 1.0
        # (a transpose's moving operand is the identity: as wide as the tile has partitions)
        return max(moving_free, float(costs.get("matmul_min_cycles", 64))) * factor + access
    per_element = float(costs.get(_PER_ELEMENT_KEY.get(engine, ""), 1.0))
    if op == "activation" or engine == common_pb2.ACT:
        cycles = free * per_element
    else:
        cycles = max(1, inputs) * free * per_element
    if engine == common_pb2.POOL:
        cycles += float(costs.get("pool_start_cycles", 150))
    return cycles + access


def streamed_inputs(inputs: int, scalar_inputs: int, free: int) -> int:
    """How many of an instruction's `inputs` stream their elements, when `scalar_inputs` of them
    hold one distinct element per partition and the largest operand has `free` elements: in a
    wider operation those are per-partition scalar operands (the module docstring)."""
    return inputs - scalar_inputs if free > 1 else inputs


def ports(*, op: str, engine: int, memories: Iterable[int]) -> tuple[str, ...]:
    """The shared memory ports an instruction on `engine` touching `memories` holds (a dma: none)."""
    if is_dma(op):
        return ()
    touched = set(memories)
    return tuple(
        port for port, (memory, users) in _PORT_USERS.items() if engine in users and memory in touched
    )
