"""Does a BIR program hold an opcode pattern such as `divide(exponential)`? (fault injection)

The pattern names HLO opcodes, as a bug report would: `divide` holds when some instruction
computes a divide; `divide(exponential)` when one of its operands was computed by an exponential.
BIR keeps no HLO graph, so "computed by" follows the data: an operand's producers are the
instructions that write the tensor or buffer it reads, seen through pure moves (dmas and copies,
which is what views, layout ops and stores to HBM become), up to the computing instruction.
A tensor written by several instructions has all of them as producers (an over-approximation
no model of the suite trips over). Used by `NCC_FAULT_INJECT=walrus_driver:KIND@op=PATTERN`
(ncc.tools.common.faults) to plant a crash only in the modules a test chose.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from ncc.schemas import bir_pb2
from ncc.tools.common.faults import OpPattern

# HLO opcode -> the BIR func that computes it, where the names differ (docs/ir.md).
_FUNC_OF_OPCODE = {
    "exponential": "exp",
    "exponential-minus-one": "expm1",
    "log-plus-one": "log1p",
    "sine": "sin",
    "cosine": "cos",
    "round-nearest-even": "round_even",
    "round-nearest-afz": "round_afz",
}
_OP_OF_OPCODE = {"dot": "matmul"}
_FUNC_OPS = frozenset({"activation", "tensor_tensor", "tensor_scalar", "tensor_reduce"})
_MOVES = frozenset({"dma", "tensor_copy", "dma_gather", "dma_scatter"})
_MAX_DEPTH = 64  # moves followed back from one operand (a chain of views and stores is short)


def _computes(instr: bir_pb2.Instruction, opcode: str) -> bool:
    """True if `instr` computes HLO `opcode` (a BIR func name is accepted as well)."""
    if instr.op in _FUNC_OPS:
        func = _FUNC_OF_OPCODE.get(opcode, opcode.replace("-", "_"))
        if instr.func == func:
            return True
    return instr.op == _OP_OF_OPCODE.get(opcode, opcode) and instr.op not in _MOVES


def _key(access: bir_pb2.AccessPattern) -> tuple[int, str]:
    return access.memory, access.tensor


class DataFlow:
    """Who writes each tensor and buffer of a program, and which computing instructions an
    instruction's operands come from."""

    def __init__(self, instructions: Iterable[bir_pb2.Instruction]) -> None:
        self.instructions = list(instructions)
        self.writers: dict[tuple[int, str], list[bir_pb2.Instruction]] = defaultdict(list)
        for instr in self.instructions:
            for access in instr.outputs:
                self.writers[_key(access)].append(instr)

    def producers(self, instr: bir_pb2.Instruction) -> list[bir_pb2.Instruction]:
        """The computing instructions whose results reach `instr`'s inputs through moves only."""
        found: dict[int, bir_pb2.Instruction] = {}
        seen: set[tuple[int, str]] = set()
        pending = [(_key(access), 0) for access in instr.inputs]
        while pending:
            key, depth = pending.pop()
            if key in seen or depth > _MAX_DEPTH:
                continue
            seen.add(key)
            for writer in self.writers.get(key, ()):
                if writer.op in _MOVES:
                    pending.extend((_key(access), depth + 1) for access in writer.inputs)
                elif writer is not instr:
                    found[id(writer)] = writer
        return list(found.values())


def holds(program: bir_pb2.Program, pattern: OpPattern) -> bool:
    """True if `program` holds `pattern` (see the module docstring)."""
    consumers = [instr for instr in program.instructions if _computes(instr, pattern.consumer)]
    if not pattern.producer or not consumers:
        return bool(consumers)
    flow = DataFlow(program.instructions)
    return any(
        _computes(producer, pattern.producer) for instr in consumers for producer in flow.producers(instr)
    )
