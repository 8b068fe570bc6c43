"""The first-principles bound of an HLO module on a target: the time no compiler can beat.

Two floors, from the module alone (not from anything ncc made of it):

  PE      every dot's and convolution's FLOPs at the tensor engine's peak for its operands' dtype:
          partitions² multiply-adds per PE cycle for bf16 (128 × 128 × 2 × 2.8 GHz = 91.75 TFLOP/s
          on trn1), fp32_matmul_factor (4) times slower for anything wider (costs.py's matmul)
  HBM     the minimum bytes: each entry parameter read once and each output written once, at the
          core's HBM bandwidth (410 GB/s on trn1)

The bound is the larger of the two. `call` and `fusion` computations count once per call; a
module with a `while` loop is not bounded here (its trip count is not in the HLO): None.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ncc.schemas import common_pb2, hlo_pb2
from ncc.tools.common.dtypes import itemsize
from ncc.tools.hlo.hlo_types import entry_computation, ncc_dtype
from ncc.tools.target import Target

T = hlo_pb2.PrimitiveType
_FAST_PE = frozenset({T.BF16, T.F16, T.S8, T.U8})  # one PE pass; anything wider takes fp32's


@dataclass(frozen=True)
class Bound:
    """A module's floors: FLOPs on PE (by whether they run at the fast rate), bytes in HBM, and time."""

    fast_flops: int  # bf16 (and narrower) dot/convolution FLOPs
    fp32_flops: int  # the rest
    min_hbm_bytes: int
    pe_ns: float
    hbm_ns: float

    @property
    def ns(self) -> float:
        return max(self.pe_ns, self.hbm_ns)

    @property
    def bound_by(self) -> str:
        return "PE" if self.pe_ns >= self.hbm_ns else "HBM"


def shape_bytes(shape: hlo_pb2.ShapeProto) -> int:
    """Bytes of an array shape, or of a tuple's leaves."""
    if shape.element_type == T.TUPLE:
        return sum(shape_bytes(leaf) for leaf in shape.tuple_shapes)
    return math.prod(shape.dimensions) * itemsize(ncc_dtype(shape.element_type))


def _flops(instr: hlo_pb2.HloInstructionProto, operand: dict[int, hlo_pb2.HloInstructionProto]) -> int:
    """2 × multiply-adds of a dot or a convolution."""
    outputs = math.prod(instr.shape.dimensions)
    lhs, rhs = (operand[i].shape for i in instr.operand_ids[:2])
    if instr.opcode == "dot":
        numbers = instr.dot_dimension_numbers
        contracted = math.prod(lhs.dimensions[d] for d in numbers.lhs_contracting_dimensions)
        return 2 * outputs * contracted
    numbers = instr.convolution_dimension_numbers  # type: ignore[assignment]
    window = math.prod(rhs.dimensions[d] for d in numbers.kernel_spatial_dimensions)
    return 2 * outputs * window * rhs.dimensions[numbers.kernel_input_feature_dimension]


def first_principles(module: hlo_pb2.HloModuleProto, target: Target) -> Bound | None:
    """The module's floors on `target`; None when it has a while loop."""
    computations = {c.id: c for c in module.computations}
    fast = wide = 0

    def visit(computation: hlo_pb2.HloComputationProto) -> bool:
        nonlocal fast, wide
        by_id = {i.id: i for i in computation.instructions}
        for instr in computation.instructions:
            if instr.opcode == "while":
                return False
            if instr.opcode in ("call", "fusion"):
                if not all(visit(computations[c]) for c in instr.called_computation_ids):
                    return False
            elif instr.opcode in ("dot", "convolution"):
                dtypes = {by_id[i].shape.element_type for i in instr.operand_ids[:2]}
                if dtypes <= _FAST_PE:
                    fast += _flops(instr, by_id)
                else:
                    wide += _flops(instr, by_id)
        return True

    entry = entry_computation(module)
    if not visit(entry):
        return None
    parameters = sum(shape_bytes(i.shape) for i in entry.instructions if i.opcode == "parameter")
    root = next(i for i in entry.instructions if i.id == entry.root_id)
    minimum = parameters + shape_bytes(root.shape)
    fast_peak = 2 * target.partitions**2 * target.clock_ghz[common_pb2.PE]  # FLOP per ns
    factor = float(target.costs.get("fp32_matmul_factor", 4))
    pe_ns = fast / fast_peak + wide * factor / fast_peak
    return Bound(fast, wide, minimum, pe_ns, minimum / target.hbm_bandwidth_gbps)
