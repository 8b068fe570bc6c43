"""Which operand of a dot goes on the PE's stationary side: the lhs rows as the lowering writes them,
or, swapped (`Lowering._swapped_dot`), the rhs columns, with the lhs rows moving. (A dot of
integers too wide for the PE is computed off it and keeps its form.)

A matmul streams its moving columns whatever rows its stationary tile holds, so m lhs rows that end
in a part tile (ViT's 197 tokens: 128 + 69) cost ⌈m / 128⌉ passes over the rhs's n columns per
contraction tile of 128, where as the moving side (m ≤ 512: one PSUM bank) they cost n / 128
passes over m columns: 0.77 of the columns for ViT's projections. The swapped product is stored
transposed (features across the partitions); the elementwise ops after it follow that layout
(`_stored_order`) and a dot reads it as it is stored, but any other reader (a residual add of a
row-major tensor, a norm, the module's result) takes it back through PE transposes (`forward`).

The rule, in PE cycles by the target's cost model (access and the 64-column minimum included):
swap when the swapped matmuls take at most SWAP_GAIN of the written ones and the product feeds
only dots; when it is the module's result (or an op of it is), only when the swapped matmuls and
the transposes back take at most SWAP_GAIN of them (a lone 197 × 768 × 768 product written to
the output gained 3 %, a 150 × 320 × 384 one lost 7 %, a bf16 257 × 512 × 768 one 15 %); and
for other readers when they take less than the written matmuls at all (ViT's attention output
projection, read by a residual add: its product round-trips through HBM in the written form,
whose row-wise norm cannot join the dot's 512-column tiles; swapped, the block ran 192.8 →
183.8 µs).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from ncc.schemas import common_pb2, hlo_pb2
from ncc.tools.target import load_target
from ncc.tools.target.costs import engine_cycles

PARTITIONS = 128   # rows of a stationary tile, contraction rows of a matmul
MOVING = 512       # columns of a moving tile (one PSUM bank of fp32)
SWAP_GAIN = 0.9    # the swapped form must take at most this share of the written one's PE cycles

DOTS, RESULT, OTHER = "dots", "result", "other"  # what reads a product (product_readers)


def swap_pays(m: int, k: int, n: int, fp32: bool, readers: Callable[[], str]) -> bool:
    """Whether a dot of m lhs rows by n rhs columns over k runs in fewer PE cycles swapped (the
    module docstring's rule); `readers()` is asked only when the shapes allow a swap at all."""
    if m <= PARTITIONS or m % PARTITIONS == 0 or m > MOVING or n % PARTITIONS:
        return False
    steps = -(-k // PARTITIONS)
    written = steps * -(-m // PARTITIONS) * _columns(n, fp32)
    swapped = steps * (n // PARTITIONS) * _columns(m, fp32)
    if swapped > SWAP_GAIN * written:
        return False
    kind = readers()
    if kind == DOTS:
        return True
    back = (n // PARTITIONS) * -(-m // PARTITIONS) * _pe(PARTITIONS, fp32)
    return swapped + back <= (SWAP_GAIN if kind == RESULT else 1.0) * written


def _columns(width: int, fp32: bool) -> float:
    """PE cycles of matmuls streaming `width` moving columns, in tiles of MOVING."""
    full, rest = divmod(width, MOVING)
    return full * _pe(MOVING, fp32) + (_pe(rest, fp32) if rest else 0.0)


def _pe(columns: int, fp32: bool) -> float:
    return engine_cycles(load_target(), op="matmul", engine=common_pb2.PE, inputs=2, free=columns,
                         moving_free=columns, fp32=fp32)


# Ops a swapped dot's transposed layout flows through to the dots that read it.
FOLLOWS_LAYOUT = frozenset({"add", "subtract", "multiply", "divide", "maximum", "minimum", "power",
                            "exponential", "log", "tanh", "erf", "logistic", "rsqrt", "sqrt", "abs",
                            "exponential-minus-one", "log-plus-one", "sine", "cosine", "sign", "compare",
                            "select", "clamp", "negate", "not", "is-finite", "convert", "copy", "reshape",
                            "transpose", "bitcast", "slice"})


class Readers:
    """A computation's instructions in program order and, for each, the instructions that read it:
    built once per computation, so that each candidate dot's walk (product_readers) costs what it
    reaches, not the whole computation."""

    def __init__(self, comp: hlo_pb2.HloComputationProto) -> None:
        self.root = comp.root_id or comp.instructions[-1].id
        self.position = {instr.id: k for k, instr in enumerate(comp.instructions)}
        self.users: dict[int, list[hlo_pb2.HloInstructionProto]] = {}
        for instr in comp.instructions:
            for operand in dict.fromkeys(instr.operand_ids):
                self.users.setdefault(operand, []).append(instr)


def product_readers(readers: Readers, instructions: dict[int, hlo_pb2.HloInstructionProto],
                    dot: hlo_pb2.HloInstructionProto) -> str:
    """DOTS when every reader of `dot`'s result, followed through FOLLOWS_LAYOUT ops of it and of
    broadcasts and constants (a bias, a GELU), is a dot; RESULT when the computation's root is
    the dot or one of those ops, or the first other reader is the root or a tuple (the module's
    results); else OTHER (the first reader, in program order, that mixes in another tensor)."""
    followed = {dot.id}
    root = readers.root
    pending: list[tuple[int, int]] = []  # (position, id) of the readers of what is followed

    def reached(node: int) -> None:
        for user in readers.users.get(node, ()):
            heapq.heappush(pending, (readers.position[user.id], user.id))

    reached(dot.id)
    seen: set[int] = set()
    while pending:
        _, node = heapq.heappop(pending)
        instr = instructions[node]
        if node in seen or instr.opcode == "dot":
            continue
        seen.add(node)
        operands = [instructions[i] for i in instr.operand_ids]
        if instr.opcode not in FOLLOWS_LAYOUT or not all(
                op.id in followed or op.opcode in ("broadcast", "constant") for op in operands):
            return RESULT if root in followed or node == root or instr.opcode == "tuple" else OTHER
        followed.add(node)
        reached(node)
    return RESULT if root in followed else DOTS
