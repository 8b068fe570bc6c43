"""Broadcast operands: a [P, 1] tile that an on-chip broadcast spreads across a row only for one
DVE or POOL operation becomes that operation's per-partition scalar operand instead.

Fusion turns the load of a broadcast column (a softmax's row max and row sum, a norm's mean and
scale, read back from HBM across each row) into an ACT `tensor_copy` that spreads the [P, 1] tile
over the row tile (attribute `broadcast`), which a DVE `tensor_tensor` then reads. DVE and POOL
read a per-partition scalar operand directly (NKI's tensor_scalar takes a [P, 1] vector as its
operand), so when every reader of the spread tile in the nest is such an operation on the same
box, and nothing writes the [P, 1] tile between the spread and the reader, the reader takes the
[P, 1] box itself, marked in its `broadcast` attribute (the positions of its inputs read across
the free dimension: BIR gives them stride 0), and the spread is left for `dce`. ACT loses the
spread (BERT's softmax: 39 of its 77 µs of ACT), and DVE streams one operand instead of two
(the cost model counts a per-partition scalar operand as no stream, target/costs.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ncc.schemas import common_pb2, penguin_pb2
from ncc.tools.hlo_opt.passes import nests_naming, same_box, writers_and_readers

BROADCAST = "broadcast"  # statement attribute: comma-separated positions of inputs read across the free dim
READERS = frozenset({"tensor_tensor"})  # what takes a vector operand (NKI tensor_scalar's)


@dataclass
class BroadcastOperandStats:
    operands_folded: int = 0


def broadcast_inputs(st: penguin_pb2.Statement) -> list[int]:
    """The positions of st's inputs that are [P, 1] tiles read across the free dimension."""
    text = st.attributes.get(BROADCAST, "")
    return [int(p) for p in text.split(",")] if text else []


def fold_broadcast_operands(program: penguin_pb2.Program) -> BroadcastOperandStats:
    """Let DVE/POOL operations read the [P, 1] tiles that were spread for them only, in place."""
    stats = BroadcastOperandStats()
    nests_of = nests_naming(program)
    for index, nest in enumerate(program.nests):
        statements = nest.statements
        writers, readers = writers_and_readers(nest)
        for k, spread in enumerate(statements):
            if spread.op != "tensor_copy" or broadcast_inputs(spread) != [0] or len(spread.outputs) != 1:
                continue
            tile, column = spread.outputs[0], spread.inputs[0]
            if writers[tile.tensor] != [k] or nests_of[tile.tensor] != {index}:
                continue
            users = readers[tile.tensor]
            if not users or not all(_takes(statements[j], tile, spread, writers, k, j) for j in users):
                continue
            for j in users:
                user = statements[j]
                positions = broadcast_inputs(user)
                for position, access in enumerate(user.inputs):
                    if access.tensor == tile.tensor:
                        access.CopyFrom(column)
                        positions.append(position)
                        stats.operands_folded += 1
                user.attributes[BROADCAST] = ",".join(map(str, sorted(positions)))
    return stats


def _takes(user: penguin_pb2.Statement, tile: penguin_pb2.Access, spread: penguin_pb2.Statement,
           writers: dict[str, list[int]], k: int, j: int) -> bool:
    """Whether statement j (`user`) can read the spread's [P, 1] input where it reads the spread
    `tile`: a DVE/POOL operation that reads the tile's box under the spread's predicates, writes a
    box as wide, and does not find that input rewritten since the spread (statement k)."""
    if user.op not in READERS or user.engine not in (common_pb2.DVE, common_pb2.POOL) or j <= k:
        return False
    if list(user.predicates) != list(spread.predicates) or len(user.outputs) != 1:
        return False
    if not all(same_box(a, tile) for a in user.inputs if a.tensor == tile.tensor):
        return False
    if list(user.outputs[0].extents) != list(tile.extents):
        return False
    return not any(k < w < j for w in writers[spread.inputs[0].tensor])
