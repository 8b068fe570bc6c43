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

A load can hold such a column too: a batch norm over channel-major tiles (ResNet: x − mean, then
· scale, · gamma, + beta, each a [C] vector broadcast along the positions) loads each vector
through an HBM view whose free dimension has stride 0, into a full [P, 2048] tile that the
`tensor_tensor` then streams. When every reader of that tile is such an operation on the same
box, the load brings the [P, 1] column alone and the readers take it as their per-partition
operand: the same values, the HBM traffic of one element per partition instead of a row, and one
DVE stream instead of two (`invariant_loads` then keeps the column once per row block). A column
an earlier nest computed narrows too (the LLaMA prefill's RMSNorm rstd, which streamed as a full
[128, 2048] tile: the prefill 18,486.4 -> 18,238.1 us, the training step 34,986.0 -> 34,222.9;
the decode step +0.1 %, the prefill's cut +0.2 %).
Session 11 had kept those as rows: narrowed then, the prefill went 26.3 -> 30.4 ms with the same
engine work, its second dependence analysis aligning another pair of loops; the loops have
changed since (docs/performance.md, session 20).

A constant fill (an `iota` with no step: a `where(mask, x, -1e9)`'s -1e9, the frontend's
materialized splat) read only by such operations, `select` included, is narrowed the same way:
one element per partition, read across the row. GPT-2's causal-mask select streamed three
[128, 1024] operands on POOL per score tile, one of them all -1e9.
"""

from __future__ import annotations

from dataclasses import dataclass

from ncc.schemas import common_pb2, penguin_pb2
from ncc.tools.hlo_opt.passes import fills_one_value, nests_naming, same_box, writers_and_readers

BROADCAST = "broadcast"  # statement attribute: comma-separated positions of inputs read across the free dim
READERS = frozenset({"tensor_tensor", "select"})  # what takes a vector operand (NKI tensor_scalar's)


@dataclass
class BroadcastOperandStats:
    operands_folded: int = 0
    loads_narrowed: int = 0  # loads of a stride-0 row that now bring their [P, 1] column
    fills_narrowed: int = 0  # constant fills that now write their [P, 1] column


def broadcast_inputs(st: penguin_pb2.Statement) -> list[int]:
    """The positions of st's inputs that are [P, 1] tiles read across the free dimension."""
    text = st.attributes.get(BROADCAST, "")
    return [int(p) for p in text.split(",")] if text else []


def fold_broadcast_operands(program: penguin_pb2.Program) -> BroadcastOperandStats:
    """Let DVE/POOL operations read the [P, 1] tiles that were spread for them only, in place."""
    stats = BroadcastOperandStats()
    nests_of = nests_naming(program)
    tensors = {t.name: t for t in program.tensors}
    for index, nest in enumerate(program.nests):
        statements = nest.statements
        writers, readers = writers_and_readers(nest)
        for k, load in enumerate(statements):
            if _loads_a_column(load, tensors) and writers[load.outputs[0].tensor] == [k] \
                    and nests_of[load.outputs[0].tensor] == {index}:
                stats.loads_narrowed += _narrow(program, tensors, load, k, statements, writers, readers)
            elif _fills_a_constant(load, tensors) and writers[load.outputs[0].tensor] == [k] \
                    and nests_of[load.outputs[0].tensor] == {index}:
                stats.fills_narrowed += _narrow(program, tensors, load, k, statements, writers, readers)
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


def _loads_a_column(load: penguin_pb2.Statement, tensors: dict[str, penguin_pb2.TensorDecl]) -> bool:
    """Whether `load` is a plain dma of an HBM view of a module input or constant that repeats one
    element along the free dimension (stride 0) into more than one column of an SBUF tile."""
    if load.op != "dma" or load.predicates or len(load.inputs) != 1 or len(load.outputs) != 1:
        return False
    source, tile = tensors[load.inputs[0].tensor], tensors[load.outputs[0].tensor]
    if not source.view_of:
        return False
    return (source.memory == common_pb2.HBM and tile.memory == common_pb2.SBUF
            and source.view_strides[-1] == 0 and load.inputs[0].extents[-1] > 1
            and load.outputs[0].extents[-1] == load.inputs[0].extents[-1])


def _fills_a_constant(fill: penguin_pb2.Statement, tensors: dict[str, penguin_pb2.TensorDecl]) -> bool:
    """Whether `fill` writes one value into more than one column of an SBUF tile."""
    return (fills_one_value(fill) and tensors[fill.outputs[0].tensor].memory == common_pb2.SBUF
            and fill.outputs[0].extents[-1] > 1)


def _narrow(program: penguin_pb2.Program, tensors: dict[str, penguin_pb2.TensorDecl],
            load: penguin_pb2.Statement, k: int, statements, writers: dict[str, list[int]],
            readers: dict[str, list[int]]) -> int:
    """Make `load` (statement k: a load or a constant fill) bring the [P, 1] column of its tile and
    its readers take that column as their per-partition operand, when every reader can
    (`_takes`); 1 if it did."""
    tile = load.outputs[0]
    users = readers[tile.tensor]
    if not users or not all(_takes(statements[j], tile, load, writers, k, j) for j in users):
        return 0
    decl = tensors[tile.tensor]
    column = program.tensors.add()
    column.CopyFrom(decl)
    column.name = f"{decl.name}.column"
    column.shape[-1] = 1
    column.block_shape[-1] = 1
    tensors[column.name] = column
    for access in (load.outputs[0], *load.inputs):
        access.starts[-1].Clear()
        access.extents[-1] = 1
    load.outputs[0].tensor = column.name
    for j in users:
        user = statements[j]
        positions = broadcast_inputs(user)
        for position, access in enumerate(user.inputs):
            if access.tensor == decl.name:
                access.CopyFrom(load.outputs[0])
                positions.append(position)
        user.attributes[BROADCAST] = ",".join(map(str, sorted(positions)))
    return 1


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
    return not any(k < w < j for a in spread.inputs for w in writers[a.tensor])  # a fill reads nothing
