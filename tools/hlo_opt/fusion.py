"""Loop fusion: a consumer nest that reads, tile for tile, what the nest before it just stored joins
that nest and reads the producer's SBUF tile instead of HBM.

The lowering gives every HLO op its own nest that loads its operands from HBM and stores its result
back, so an elementwise chain round-trips every intermediate through HBM. Two adjacent nests fuse
when they iterate the same space and the consumer loads a tensor the producer stores with the same
box at the same iteration, where that box is a different tile at every iteration (so the stored
value is final when it is stored). The fused nest runs the producer's statements, then the
consumer's with that load gone and its tile renamed to the producer's. The producer's store stays;
dead-store elimination (dce.py) removes it when no one else reads the tensor. Nothing else moves:
nests are fused only with their neighbour in program order, so no other nest can run in between.

First every nest is canonicalized: an axis of extent 1 has one value, so a predicate on such axes
alone is decided at compile time (a reduction whose row fits one free tile stores unconditionally,
and can then fuse like any elementwise nest).
"""

from __future__ import annotations

from dataclasses import dataclass

from ncc.schemas import common_pb2, penguin_pb2
from ncc.tools.common import affine
from ncc.tools.hlo_opt.access_keys import base, box_key, view_key


@dataclass
class FusionStats:
    nests_before: int = 0
    nests_after: int = 0
    loads_removed: int = 0


def fuse_nests(program: penguin_pb2.Program) -> FusionStats:
    """Fuse adjacent producer/consumer nests in place; returns what changed."""
    tensors = {t.name: t for t in program.tensors}
    stats = FusionStats(nests_before=len(program.nests))
    fused: list[penguin_pb2.LoopNest] = []
    for nest in program.nests:
        _decide_single_point_predicates(nest)
        if fused and _try_fuse(fused[-1], nest, tensors, stats):
            continue
        copy = penguin_pb2.LoopNest()
        copy.CopyFrom(nest)
        fused.append(copy)
    del program.nests[:]
    program.nests.extend(fused)
    stats.nests_after = len(fused)
    return stats


def _try_fuse(producer: penguin_pb2.LoopNest, consumer: penguin_pb2.LoopNest,
              tensors: dict[str, penguin_pb2.TensorDecl], stats: FusionStats) -> bool:
    if len(producer.axes) != len(consumer.axes) or not producer.axes:
        return False
    if any(p.extent != c.extent for p, c in zip(producer.axes, consumer.axes, strict=True)):
        return False
    rename = {c.name: p.name for p, c in zip(producer.axes, consumer.axes, strict=True)}
    fixed = frozenset(a.name for a in producer.axes if a.extent == 1)  # always 0
    stored = _tile_stores(producer, tensors, fixed)  # (view key, box) -> producer's SBUF tile access
    if not stored:
        return False
    columns = _column_stores(producer, tensors, stored, fixed)
    written = {base(tensors, a.tensor) for st in producer.statements for a in st.outputs}
    read_by_producer = {base(tensors, a.tensor) for st in producer.statements for a in st.inputs}
    replaced: dict[str, penguin_pb2.Access] = {}  # consumer tile -> producer tile
    dropped: set[int] = set()
    spread: dict[int, penguin_pb2.Access] = {}  # consumer load -> the producer column tile it repeats

    def in_hbm(access: penguin_pb2.Access) -> bool:
        return tensors[access.tensor].memory == common_pb2.HBM

    for k, st in enumerate(consumer.statements):
        for access in st.outputs:  # the consumer must not write what the producer touches
            if in_hbm(access) and base(tensors, access.tensor) in written | read_by_producer:
                return False
        for access in st.inputs:
            if not in_hbm(access) or base(tensors, access.tensor) not in written:
                continue
            if not _is_tile_load(st):
                return False  # reads the producer's output other than as a tile load: needs all of it
            key = (view_key(tensors[access.tensor]), box_key(access, rename, fixed))
            tile = stored.get(key)
            target = st.outputs[0]
            if tile is None:
                column = columns.get(_column_key(tensors[access.tensor], access, rename, fixed))
                if column is None or tensors[column.tensor].dtype != tensors[target.tensor].dtype:
                    return False
                spread[k] = column
                continue
            if not _same_tile(tensors[tile.tensor], tensors[target.tensor]) \
                    or box_key(target, rename, fixed) != box_key(tile, {}, fixed):
                return False
            replaced[target.tensor] = tile
            dropped.add(k)
    if not replaced and not spread:
        return False
    kept = [(k, st) for k, st in enumerate(consumer.statements) if k not in dropped]
    if {a.tensor for _, st in kept for a in st.outputs} & set(replaced):
        return False  # the consumer overwrites a tile it loaded: keep them apart
    for k, st in kept:
        merged = producer.statements.add()
        merged.CopyFrom(st)
        merged.name = f"{consumer.name}.{st.name}"
        if k in spread:  # the load of a broadcast column becomes an on-chip broadcast of its tile
            merged.op, merged.engine = "tensor_copy", common_pb2.ACT
            merged.attributes["broadcast"] = "1"
            del merged.inputs[:]
            merged.inputs.add().CopyFrom(spread[k])
            _rename_access(merged.outputs[0], rename)
            continue
        for access in [*merged.inputs, *merged.outputs]:
            if access.tensor in replaced:
                access.tensor = replaced[access.tensor].tensor
            _rename_access(access, rename)
        for predicate in merged.predicates:
            _rename_expr(predicate.expr, rename)
        if merged.attributes.get("accumulate_axis") in rename:
            merged.attributes["accumulate_axis"] = rename[merged.attributes["accumulate_axis"]]
    for key, value in consumer.attributes.items():
        producer.attributes.setdefault(key, value)
    stats.loads_removed += len(dropped) + len(spread)
    return True


def _decide_single_point_predicates(nest: penguin_pb2.LoopNest) -> None:
    """Predicates over extent-1 axes only hold everywhere or nowhere: drop them, or the statement."""
    fixed = {axis.name: 0 for axis in nest.axes if axis.extent == 1}
    statements = []
    for st in nest.statements:
        decided = [p for p in st.predicates if all(t.var in fixed for t in p.expr.terms)]
        if not all(affine.holds(p, fixed) for p in decided):
            continue  # never runs
        kept = [p for p in st.predicates if not all(t.var in fixed for t in p.expr.terms)]
        if len(kept) != len(st.predicates):
            del st.predicates[:]
            st.predicates.extend(kept)
        statements.append(st)
    if len(statements) != len(nest.statements):
        del nest.statements[:]
        nest.statements.extend(statements)


def _tile_stores(nest: penguin_pb2.LoopNest, tensors: dict[str, penguin_pb2.TensorDecl],
                 fixed: frozenset[str]) -> dict[tuple, penguin_pb2.Access]:
    """Unconditional SBUF → HBM stores of a different box at every iteration, by (view, box), into
    tensors no other statement of the nest writes (so each stored box holds its final value)."""
    writers: dict[str, int] = {}
    for st in nest.statements:
        for name in {base(tensors, a.tensor) for a in st.outputs}:
            writers[name] = writers.get(name, 0) + 1
    stores = {}
    for st in nest.statements:
        if st.op != "dma" or st.predicates or len(st.inputs) != 1 or len(st.outputs) != 1:
            continue
        out, tile = st.outputs[0], st.inputs[0]
        if tensors[out.tensor].memory != common_pb2.HBM or tensors[tile.tensor].memory != common_pb2.SBUF \
                or writers[base(tensors, out.tensor)] != 1:
            continue
        moving = [a.name for a in nest.axes if a.name not in fixed]
        if _one_axis_per_dimension(out, moving, fixed):
            stores[(view_key(tensors[out.tensor]), box_key(out, {}, fixed))] = tile
    return stores


def _column_stores(nest: penguin_pb2.LoopNest, tensors: dict[str, penguin_pb2.TensorDecl],
                   stored: dict[tuple, penguin_pb2.Access],
                   fixed: frozenset[str]) -> dict[tuple, penguin_pb2.Access]:
    """The stores among `stored` of one column ([..., P, 1] tiles of a [..., N, 1] view): what a
    consumer that reads the column repeated across its free dimension can take from SBUF instead."""
    columns = {}
    for st in nest.statements:
        if st.op != "dma" or len(st.outputs) != 1 or len(st.inputs) != 1:
            continue
        out = st.outputs[0]
        view = tensors[out.tensor]
        if view.memory != common_pb2.HBM or not view.shape or view.shape[-1] != 1 or out.extents[-1] != 1:
            continue
        if (view_key(view), box_key(out, {}, fixed)) not in stored:
            continue
        strides = list(view.view_strides) or list(affine.row_major_strides(view.shape))
        leading = box_key(out, {}, fixed)
        columns[(view.view_of or view.name, view.dtype, view.view_offset, tuple(strides[:-1]),
                 tuple(view.shape[:-1]), leading[0][:-1], leading[1][:-1])] = st.inputs[0]
    return columns


def _column_key(view: penguin_pb2.TensorDecl, access: penguin_pb2.Access, rename: dict[str, str],
                fixed: frozenset[str]) -> tuple | None:
    """The `_column_stores` key a load reads when its view repeats one column (last stride 0)."""
    strides = list(view.view_strides)
    if not view.view_of or not strides or strides[-1] != 0:
        return None
    box = box_key(access, rename, fixed)
    return (view.view_of, view.dtype, view.view_offset, tuple(strides[:-1]), tuple(view.shape[:-1]),
            box[0][:-1], box[1][:-1])


def _one_axis_per_dimension(access: penguin_pb2.Access, axes: list[str], fixed: frozenset[str]) -> bool:
    """Every axis moves exactly one dimension's start: the box is a different tile at every point
    (axes of extent 1, `fixed`, have one point and need not appear)."""
    used: list[str] = []
    for start in access.starts:
        names = [t.var for t in start.terms if t.coeff and t.var not in fixed]
        if len(names) > 1:
            return False
        used += names
    return sorted(used) == sorted(axes)


def _is_tile_load(st: penguin_pb2.Statement) -> bool:
    return st.op == "dma" and not st.predicates and len(st.inputs) == 1 and len(st.outputs) == 1


def _same_tile(a: penguin_pb2.TensorDecl, b: penguin_pb2.TensorDecl) -> bool:
    return (a.memory, a.dtype, list(a.shape), list(a.block_shape)) == \
        (b.memory, b.dtype, list(b.shape), list(b.block_shape))


def _rename_access(access: penguin_pb2.Access, rename: dict[str, str]) -> None:
    for start in access.starts:
        _rename_expr(start, rename)


def _rename_expr(expr: penguin_pb2.AffineExpr, rename: dict[str, str]) -> None:
    for term in expr.terms:
        term.var = rename.get(term.var, term.var)
