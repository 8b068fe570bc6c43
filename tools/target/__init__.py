"""The machine description: engines, memories, sizes and the cost model (one JSON file per target).

Passes and the simulator ask this module for numbers instead of hard-coding them. A target is
`trn1` (bundled) or a path to a JSON file of the same form.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from ncc.schemas import bir_pb2, common_pb2

ENGINES = {
    "PE": common_pb2.PE,
    "ACT": common_pb2.ACT,
    "POOL": common_pb2.POOL,
    "DVE": common_pb2.DVE,
    "SP": common_pb2.SP,
}
ENGINE_NAMES = {value: key for key, value in ENGINES.items()}


# Ops that move data on a DMA queue. `dma` has its descriptors written at compile time (hardware
# DGE, triggered on SP/ACT/DVE); `dma_gather` (rows of an HBM table into partitions, row p chosen
# by index p of an SBUF tile) and `dma_scatter` (partitions into rows chosen the same way) have
# descriptors that depend on data known only at run time, so POOL's software DGE writes them and
# triggers them (SWDGE).
DMA_OPS = frozenset({"dma", "dma_gather", "dma_scatter"})
INDIRECT_DMA_OPS = frozenset({"dma_gather", "dma_scatter"})


def is_dma(op: str) -> bool:
    return op in DMA_OPS


# How the backend cuts a large tile DMA (walrus split_dma): into at most DMA_SPLIT_MAX_PARTS pieces
# over partition ranges, each moving at least DMA_SPLIT_MIN_BYTES, until the program has
# DMA_SPLIT_MAX_EXTRA pieces more than it had dmas (later dmas stay whole: split_dma's docstring
# says why). The instruction budget (tools/common/penguin_budget) counts with the same rule, so it
# sees the program the backend holds.
DMA_SPLIT_MAX_PARTS = 8
DMA_SPLIT_MIN_BYTES = 32768
DMA_SPLIT_MAX_EXTRA = 16384
DMA_SPLIT_FREE_EXTRA = 256  # pieces outside loops cut even where the queues have no slack for them


def dma_pieces(partitions: int, total_bytes: int, max_parts: int = DMA_SPLIT_MAX_PARTS,
               min_bytes: int = DMA_SPLIT_MIN_BYTES) -> int:
    """How many dmas split_dma makes of one moving `total_bytes` over `partitions` partitions."""
    return max(1, min(max_parts, partitions, total_bytes // max(1, min_bytes)))


# A semaphore wait's threshold is a 64-bit count; the engines' wait instruction encodes it as two
# 32-bit words (walrus lower_sync writes them, the simulator executes a lowered wait from them).
WAIT_WORD_BITS = 32
WAIT_VALUE_LIMIT = 1 << (2 * WAIT_WORD_BITS)  # thresholds are 0 <= value < this


def wait_words(value: int) -> tuple[int, int]:
    """(low word, high word) of a wait threshold 0 <= value < WAIT_VALUE_LIMIT."""
    return value & ((1 << WAIT_WORD_BITS) - 1), value >> WAIT_WORD_BITS


def encoded_wait_value(wait: bir_pb2.SemaphoreWait) -> int | None:
    """The threshold a lowered wait's words encode; None for a wait that carries no words."""
    if not wait.HasField("value_lo"):
        return None
    return wait.value_lo | (wait.value_hi << WAIT_WORD_BITS)


@dataclass(frozen=True)
class Target:
    name: str
    partitions: int
    sbuf_bytes_per_partition: int
    sbuf_reserved_bytes_per_partition: int
    psum_bytes_per_partition: int
    psum_banks: int
    psum_bank_bytes: int
    hbm_bandwidth_gbps: float
    hbm_bytes: int
    dma_queues: int
    dma_queue_bandwidth_gbps: float
    dma_fixed_latency_ns: float
    dma_issue_cycles: int
    num_semaphores: int
    max_waits_per_instruction: int
    max_updates_per_instruction: int
    matmul_max_stationary_free: int
    matmul_max_moving_free: int
    clock_ghz: dict[int, float]
    costs: dict[str, float]

    @property
    def sbuf_usable_bytes(self) -> int:
        return self.sbuf_bytes_per_partition - self.sbuf_reserved_bytes_per_partition

    def cycles_to_ns(self, engine: int, cycles: float) -> float:
        return cycles / self.clock_ghz[engine]

    def dma_ns(self, nbytes: int) -> float:
        """Time one DMA queue needs to move `nbytes` (fixed latency + bytes / queue bandwidth)."""
        return self.dma_fixed_latency_ns + nbytes / self.dma_queue_bandwidth_gbps


@lru_cache(maxsize=8)
def load_target(name: str = "trn1") -> Target:
    path = Path(name) if name.endswith(".json") else Path(__file__).with_name(f"{name}.json")
    raw = json.loads(path.read_text())
    return Target(
        name=raw["name"],
        partitions=raw["partitions"],
        sbuf_bytes_per_partition=raw["sbuf_bytes_per_partition"],
        sbuf_reserved_bytes_per_partition=raw["sbuf_reserved_bytes_per_partition"],
        psum_bytes_per_partition=raw["psum_bytes_per_partition"],
        psum_banks=raw["psum_banks"],
        psum_bank_bytes=raw["psum_bank_bytes"],
        hbm_bandwidth_gbps=raw["hbm_bandwidth_gbps"],
        hbm_bytes=raw["hbm_bytes"],
        dma_queues=raw["dma_queues"],
        dma_queue_bandwidth_gbps=raw["dma_queue_bandwidth_gbps"],
        dma_fixed_latency_ns=raw["dma_fixed_latency_ns"],
        dma_issue_cycles=raw["dma_issue_cycles"],
        num_semaphores=raw["num_semaphores"],
        max_waits_per_instruction=raw["max_waits_per_instruction"],
        max_updates_per_instruction=raw["max_updates_per_instruction"],
        matmul_max_stationary_free=raw["matmul_max_stationary_free"],
        matmul_max_moving_free=raw["matmul_max_moving_free"],
        clock_ghz={ENGINES[key]: value["clock_ghz"] for key, value in raw["engines"].items()},
        costs=dict(raw["costs"]),
    )


# The default target's partitions: the most an on-chip tile spans (the frontend's tiling, trn1: 128).
PARTITIONS = load_target().partitions
