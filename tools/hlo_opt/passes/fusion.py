"""Loop fusion: a consumer nest that reads, tile for tile, what the nest before it just stored joins
that nest and reads the producer's SBUF tile instead of HBM.

The lowering gives every HLO op its own nest that loads its operands from HBM and stores its result
back, so an elementwise chain round-trips every intermediate through HBM. Two adjacent nests fuse
when they iterate the same space and the consumer loads a tensor the producer stores with the same
box at the same iteration, where that box is a different tile at every iteration (so the stored
value is final when it is stored). The fused nest runs the producer's statements, then the
consumer's with that load gone and its tile renamed to the producer's. The producer's store stays;
dead-store elimination (dce.py) removes it when no one else reads the tensor. Nests are fused
only with their neighbour in program order, so no other nest runs in between; but a nest that
fuses with nothing and is independent of the open nest (reads nothing it writes, writes nothing
it touches: the attention mask, computed from inputs between the scores' scaling and the mask's
addition) moves before it, up to MAX_DEFERRED of them, and the open nest stays open for the
nests after it. A moved nest then stands next to nests the sweep has passed, so the nests are
swept again while a sweep fuses more (`fuse_nests`).

First every nest is canonicalized: an axis of extent 1 has one value, so a predicate on such axes
alone is decided at compile time (a reduction whose row fits one free tile stores unconditionally,
and can then fuse like any elementwise nest).
"""

from __future__ import annotations

from dataclasses import dataclass

from ncc.schemas import common_pb2, penguin_pb2
from ncc.tools.common import affine
from ncc.tools.common.access_keys import base, box_key, view_key

MAX_DEFERRED = 16  # independent nests moved before one open nest at most
MAX_SWEEPS = 4  # passes over the nests at most (a sweep that fuses nothing ends them sooner)


@dataclass
class FusionStats:
    nests_before: int = 0
    nests_after: int = 0
    loads_removed: int = 0
    nests_moved: int = 0  # independent nests moved before the nest they stood after


def fuse_nests(program: penguin_pb2.Program) -> FusionStats:
    """Fuse adjacent producer/consumer nests in place, again while a sweep fuses more; returns what
    changed. Moving an independent nest before the open one makes it the neighbour of nests it
    was not next to, which the sweep has passed: jax's exact gelu computes x * 0.5, then the
    erfc of -x as a chain that moves before it, then their product, which fuses with x * 0.5;
    the next sweep fuses that nest with the chain, and the gelu is one function of x again
    (act_functions.py). Only the first sweep moves nests."""
    stats = FusionStats(nests_before=len(program.nests))
    for sweep in range(MAX_SWEEPS):
        before = len(program.nests)
        _sweep(program, stats, move=sweep == 0)
        stats.nests_after = len(program.nests)
        if stats.nests_after == before:
            break
    return stats


def _sweep(program: penguin_pb2.Program, stats: FusionStats, move: bool) -> None:
    """One pass over the nests in program order (module docstring); independent nests move
    before the open nest only when `move` (the first sweep: later ones fuse the neighbours it
    made and keep the order, which the schedule follows)."""
    tensors = {t.name: t for t in program.tensors}
    fused: list[penguin_pb2.LoopNest] = []
    summary: _NestSummary | None = None
    deferred: list[_NestSummary] = []  # independent of the open nest: they go before it
    for nest in program.nests:
        _decide_single_point_predicates(nest)
        if summary is not None and _try_fuse(summary, nest, stats):
            continue
        copy = penguin_pb2.LoopNest()
        copy.CopyFrom(nest)
        movable = move and summary is not None and len(deferred) < MAX_DEFERRED
        if movable and _independent(summary, copy, tensors):
            stats.nests_moved += 1
            if not (deferred and _try_fuse(deferred[-1], copy, stats)):  # they fuse among themselves
                deferred.append(_NestSummary(copy, tensors))
            continue
        if summary is not None:
            fused += [*(moved.nest for moved in deferred), summary.nest]
            deferred = []
        summary = _NestSummary(copy, tensors)
    if summary is not None:
        fused += [*(moved.nest for moved in deferred), summary.nest]
    del program.nests[:]
    program.nests.extend(fused)


def _independent(summary: _NestSummary, nest: penguin_pb2.LoopNest,
                 tensors: dict[str, penguin_pb2.TensorDecl]) -> bool:
    """Whether `nest` may run before the open nest: it reads nothing that nest writes and writes
    nothing it reads or writes (a mask computed from inputs between two nests of one row chain)."""
    for st in nest.statements:
        if any(base(tensors, a.tensor) in summary.writers for a in st.inputs):
            return False
        for access in st.outputs:
            name = base(tensors, access.tensor)
            if name in summary.writers or name in summary.read:
                return False
    return True


class _NestSummary:
    """What fusion needs to know of the nest that grows as consumers join it, kept up to date one
    appended statement at a time (re-scanning the whole nest per join made a long chain quadratic).

    `writers` counts the statements writing each HBM base; `stores` and `columns` hold every
    candidate tile store by key with the base it writes, valid while that base has one writer."""

    def __init__(self, nest: penguin_pb2.LoopNest, tensors: dict[str, penguin_pb2.TensorDecl]):
        self.nest, self.tensors = nest, tensors
        self.fixed = frozenset(a.name for a in nest.axes if a.extent == 1)  # always 0
        self.moving = [a.name for a in nest.axes if a.name not in self.fixed]
        self.writers: dict[str, int] = {}
        self.read: set[str] = set()
        self.stores: dict[tuple, tuple[str, penguin_pb2.Access]] = {}
        self.columns: dict[tuple, tuple[str, penguin_pb2.Access]] = {}
        for st in nest.statements:
            self.add(st)

    def add(self, st: penguin_pb2.Statement) -> None:
        tensors = self.tensors
        for name in {base(tensors, a.tensor) for a in st.outputs}:
            self.writers[name] = self.writers.get(name, 0) + 1
        self.read.update(base(tensors, a.tensor) for a in st.inputs)
        if st.op != "dma" or st.predicates or len(st.inputs) != 1 or len(st.outputs) != 1:
            return
        out, tile = st.outputs[0], st.inputs[0]
        view = tensors[out.tensor]
        if view.memory != common_pb2.HBM or tensors[tile.tensor].memory != common_pb2.SBUF:
            return
        if not one_axis_per_dimension(out, self.moving, self.fixed):
            return
        written = base(tensors, out.tensor)
        box = box_key(out, {}, self.fixed)
        self.stores[(view_key(view), box)] = (written, tile)
        if view.shape and view.shape[-1] == 1 and out.extents[-1] == 1:
            strides = list(view.view_strides) or list(affine.row_major_strides(view.shape))
            self.columns[_column_tuple(view, strides, box)] = (written, tile)

    def written(self, name: str) -> bool:
        return name in self.writers

    def store(self, key: tuple | None, table: dict) -> penguin_pb2.Access | None:
        """The SBUF tile of the unconditional store under `key`, if its tensor has no other writer
        (so each stored box holds its final value)."""
        entry = table.get(key) if key is not None else None
        if entry is None or self.writers[entry[0]] != 1:
            return None
        return entry[1]


def _try_fuse(summary: _NestSummary, consumer: penguin_pb2.LoopNest, stats: FusionStats) -> bool:
    producer, tensors, fixed = summary.nest, summary.tensors, summary.fixed
    if len(producer.axes) != len(consumer.axes) or not producer.axes:
        return False
    if any(p.extent != c.extent for p, c in zip(producer.axes, consumer.axes, strict=True)):
        return False
    rename = {c.name: p.name for p, c in zip(producer.axes, consumer.axes, strict=True)}
    replaced: dict[str, penguin_pb2.Access] = {}  # consumer tile -> producer tile
    dropped: set[int] = set()
    spread: dict[int, penguin_pb2.Access] = {}  # consumer load -> the producer column tile it repeats

    def in_hbm(access: penguin_pb2.Access) -> bool:
        return tensors[access.tensor].memory == common_pb2.HBM

    for k, st in enumerate(consumer.statements):
        for access in st.outputs:  # the consumer must not write what the producer touches
            name = base(tensors, access.tensor)
            if in_hbm(access) and (summary.written(name) or name in summary.read):
                return False
        for access in st.inputs:
            if not in_hbm(access) or not summary.written(base(tensors, access.tensor)):
                continue
            if not _is_tile_load(st):
                return False  # reads the producer's output other than as a tile load: needs all of it
            key = (view_key(tensors[access.tensor]), box_key(access, rename, fixed))
            tile = summary.store(key, summary.stores)
            target = st.outputs[0]
            if tile is None:
                column = summary.store(_column_key(tensors[access.tensor], access, rename, fixed),
                                       summary.columns)
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
            merged.attributes["broadcast"] = "0"  # its input 0 (broadcast_operands.py)
            del merged.inputs[:]
            merged.inputs.add().CopyFrom(spread[k])
            _rename_access(merged.outputs[0], rename)
        else:
            for access in [*merged.inputs, *merged.outputs]:
                if access.tensor in replaced:
                    access.tensor = replaced[access.tensor].tensor
                _rename_access(access, rename)
            for predicate in merged.predicates:
                _rename_expr(predicate.expr, rename)
            if merged.attributes.get("accumulate_axis") in rename:
                merged.attributes["accumulate_axis"] = rename[merged.attributes["accumulate_axis"]]
        summary.add(merged)
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


def _column_key(view: penguin_pb2.TensorDecl, access: penguin_pb2.Access, rename: dict[str, str],
                fixed: frozenset[str]) -> tuple | None:
    """The `_NestSummary.columns` key a load reads when its view repeats one column (last stride 0)."""
    strides = list(view.view_strides)
    if not view.view_of or not strides or strides[-1] != 0:
        return None
    return _column_tuple(view, strides, box_key(access, rename, fixed))


def _column_tuple(view: penguin_pb2.TensorDecl, strides: list[int], box: tuple) -> tuple:
    """A column of an HBM view, whatever its last dimension: everything but that dimension."""
    return (view.view_of or view.name, view.dtype, view.view_offset, tuple(strides[:-1]),
            tuple(view.shape[:-1]), box[0][:-1], box[1][:-1])


def one_axis_per_dimension(access: penguin_pb2.Access, axes: list[str], fixed: frozenset[str]) -> bool:
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
