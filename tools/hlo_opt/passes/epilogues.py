"""Epilogue fusion: the nest after a matmul nest that reads the product tile by tile runs inside the
matmul nest, on the tile the matmul just evacuated from PSUM.

`fusion` joins nests that iterate one space; a dot's nest iterates its contraction too, and
stores each output tile once, at the contraction's last step (`tile_order` then strip-mines its
rows). So a bias add and GELU after a projection, or the softmax after attention scores, ran as
their own nest: the product went to HBM and back, and the consumer's engines waited for the
whole matmul. Here such a consumer C joins the dot's nest D when

  * C reads D's output only by one plain tile load L (a dma, no predicates), writes nothing D
    reads or writes, and every on-chip tile C reads was written earlier in the same iteration of
    C (nothing carried across C's iterations: no reduction across its tiles, no kept tile);
  * C computes something: a copy (a layout change) stays apart, where `forward` and
    `direct_copies` move it whole; fused, its store wrote each head's 64 columns of block's
    attention output on its own, and block took 26.3 -> 29.6 us;
  * D writes that output by one store S of an SBUF tile T, from a statement with S's predicates;
  * both name the output through plain views (row-major, offset 0) whose shapes agree once
    dimensions of size 1 are dropped, their tiles lay it out alike (as many partitions by as many
    free elements: a vector-matrix product's [1, n] row tile is not the [n, 1] column tile its
    consumer loads), and either
      - exact: L's box is S's box (same extents), and each of C's axes is an affine function of
        D's (C's start `c * a` in a dimension where D's is `c * e(D's axes)`), as many tiles
        either way: C's statements keep their boxes, with C's axes replaced by D's; or
      - retiled: C is elementwise (every access has L's box on a tensor of the output's shape):
        its boxes and tiles all become S's box, whatever C's tile was (a GELU over whole rows
        after a matmul of 512-column tiles).
    A C that is not elementwise (a softmax whose rows are one tile of attention scores) joins
    too, unless the option `row_wise` is off: the scores then never go to HBM. It was off by
    default while the softmax was DVE-bound (BERT's layer 782.6 -> 818.8 us joined: the score
    matmuls of every head ran ahead and their tiles waited on chip); with act_operands taking
    the softmax's shift and sum to ACT, joined is faster (BERT 760.8 -> 638.3 us, ViT 270.2 ->
    264.7).
    So does a row-wise C whose row is several of D's tiles side by side (wide rows: GPT-2's rows
    of 1,024 scores in 512-column PSUM tiles), when those are the tiles of one axis c of D (start
    W * c, W times c's extent the row) and the other dimensions map as in the exact case: T's
    block widens to the row, each evacuation writes its slice, and C runs at c's last value,
    after every slice of its row (the points that wrote them differ from it in c alone). The
    evacuation stays (`_read_psum` finds C reading the whole row, not one PSUM tile). GPT-2
    30.6 -> 28.3 ms: the scores of every head went to HBM and back (96 MB a layer).

C's statements then follow S in D's body under S's predicates, reading T where they read L's
tile. When no other nest reads the output, S goes, and a statement of C on ACT or DVE that alone
reads T reads the PSUM tile T was copied from, and the copy goes (`_read_psum`). The pass runs
after `tile_order` (D's loops are final) and before `invariant_loads` (which then keeps C's broadcast
bias loads once per row block). Counters: epilogues (nests joined), retiled (of them, tiled anew),
nests_moved, wide_rows, refused (why each other consumer of a dot nest stayed apart).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ncc.schemas import common_pb2, penguin_pb2
from ncc.tools.common import affine
from ncc.tools.common.access_keys import base
from ncc.tools.hlo_opt import rolling
from ncc.tools.hlo_opt.passes import ELEMENTWISE_OPS

ONCHIP = (common_pb2.SBUF, common_pb2.PSUM)
EPILOGUE_OPS = ELEMENTWISE_OPS | {"dma", "tensor_reduce"}
READS_PSUM = {"activation", "tensor_tensor", "tensor_scalar", "tensor_copy"}  # on ACT or DVE
KEPT_ATTRIBUTES = {"reverse", "broadcast"}  # positional facts that stay true inside D
MAX_MOVED = 16  # nests moved before one dot nest at most


@dataclass
class EpilogueStats:
    epilogues: int = 0
    retiled: int = 0
    wide_rows: int = 0  # of them, row-wise consumers of rows several stored tiles wide
    nests_moved: int = 0
    refused: Counter = field(default_factory=Counter)  # reason -> consumers of a dot nest left apart


def fuse_epilogues(program: penguin_pb2.Program, row_wise: bool = True) -> EpilogueStats:
    """Join each dot nest's consumer nest into it where that is safe (module docstring), in place;
    a consumer that is not elementwise (a softmax over rows of one tile) only with `row_wise`
    (the default).
    Nests between the two that the dot nest does not touch (BERT's mask, computed from an input
    between the scores and their softmax) move before the dot nest, MAX_MOVED at most."""
    tensors = {t.name: t for t in program.tensors}
    users = rolling.onchip_users(program)
    private = _read_by_one_nest(program, tensors)
    stats = EpilogueStats()
    kept: list[penguin_pb2.LoopNest] = []
    dot: penguin_pb2.LoopNest | None = None  # the last dot nest, while consumers may still join it
    dot_rolls = False
    between: list[penguin_pb2.LoopNest] = []  # nests after it that it does not touch
    for nest in program.nests:
        if dot is not None:
            reason = _join(dot, nest, tensors, row_wise, None if dot_rolls else users, private)
            if reason in (None, "retiled", "wide rows"):
                stats.epilogues += 1
                stats.retiled += reason == "retiled"
                stats.wide_rows += reason == "wide rows"
                stats.nests_moved += len(between)
                kept += between
                between = []
                continue
            if reason != "unrelated":
                stats.refused[reason] += 1
            elif len(between) < MAX_MOVED and not _is_dot(nest) and _independent(dot, nest, tensors):
                between.append(nest)
                continue
            kept += [dot, *between]
            dot, between = None, []
        if _is_dot(nest):
            dot, dot_rolls = nest, _rolls(nest, tensors, users)
        else:
            kept.append(nest)
    if dot is not None:
        kept += [dot, *between]
    del program.nests[:]
    program.nests.extend(kept)
    return stats


def _read_by_one_nest(program: penguin_pb2.Program, tensors: dict[str, penguin_pb2.TensorDecl]) -> set[str]:
    """The HBM tensors (bases) that one nest alone reads and that are not module outputs."""
    readers: Counter[str] = Counter()
    for nest in program.nests:
        readers.update({base(tensors, a.tensor) for st in nest.statements for a in st.inputs
                        if _hbm(tensors, a)})
    return {name for name, count in readers.items()
            if count == 1 and tensors[name].role != penguin_pb2.OUTPUT}


def _rolls(nest: penguin_pb2.LoopNest, tensors: dict[str, penguin_pb2.TensorDecl],
           users: dict[str, set[str]]) -> bool:
    """Would some loop of `nest` stay a loop (tools/hlo_opt/rolling.py)?"""
    elsewhere = rolling.TouchedElsewhere(users, nest.name)
    return rolling.plan_rolling(nest, tensors, elsewhere, min_trip=2) is not None


def _is_dot(nest: penguin_pb2.LoopNest) -> bool:
    return any(st.op == "matmul" for st in nest.statements)


def _independent(dot: penguin_pb2.LoopNest, nest: penguin_pb2.LoopNest,
                 tensors: dict[str, penguin_pb2.TensorDecl]) -> bool:
    """May `nest` run before `dot`: it reads nothing the dot writes, and writes nothing it touches?"""
    dot_writes = {base(tensors, a.tensor) for st in dot.statements for a in st.outputs}
    dot_reads = {base(tensors, a.tensor) for st in dot.statements for a in st.inputs}
    for st in nest.statements:
        if any(base(tensors, a.tensor) in dot_writes for a in st.inputs):
            return False
        if any(base(tensors, a.tensor) in dot_writes | dot_reads for a in st.outputs):
            return False
    return True


def _join(dot: penguin_pb2.LoopNest, consumer: penguin_pb2.LoopNest,
          tensors: dict[str, penguin_pb2.TensorDecl], row_wise: bool,
          unrolled: dict[str, set[str]] | None, private: set[str]) -> str | None:
    """Append `consumer` to `dot` when that is safe: None or "retiled" when done, else why not.
    `private`: the HBM tensors only one nest reads, none of them a module output (_read_psum).
    `unrolled` (the on-chip tensors' users) when the dot's nest has no loop that stays a loop:
    then a consumer that would keep one stays apart (MoE's expert GELU: fused, it unrolled with
    the dot's nest, 26k instructions instead of 68 and a loop, and 24.2 -> 26.6 ms)."""
    written: dict[str, list[int]] = {}
    read: set[str] = set()
    for k, st in enumerate(dot.statements):
        for access in st.outputs:
            written.setdefault(base(tensors, access.tensor), []).append(k)
        read.update(base(tensors, a.tensor) for a in st.inputs)
    loads = [k for k, st in enumerate(consumer.statements)
             if any(_hbm(tensors, a) and base(tensors, a.tensor) in written for a in st.inputs)]
    if not loads:
        return "unrelated"
    if len(loads) > 1:
        return "several reads of the product"
    load = consumer.statements[loads[0]]
    if all(st.op == "dma" for st in consumer.statements):
        return "a copy"
    if not _plain_load(load, tensors):
        return "product read other than by a tile load"
    reason = _consumer_problem(consumer, load, tensors, written, read)
    if reason:
        return reason
    product = base(tensors, load.inputs[0].tensor)
    store = _the_store(dot, written[product], tensors)
    if store is None:
        return "product not stored once from an SBUF tile"
    tile = store.inputs[0]
    if not any(tile.tensor in {a.tensor for a in st.outputs} and list(st.predicates) == list(store.predicates)
               for st in dot.statements):
        return "product tile not written under the store's predicates"
    ours, theirs = _plain(tensors, store.outputs[0]), _plain(tensors, load.inputs[0])
    if ours is None or theirs is None or [d[0] for d in ours] != [d[0] for d in theirs]:
        return "views of the product differ"
    if _box_key(_squeezed(tensors, tile)) != _box_key(ours) \
            or _box_key(_squeezed(tensors, load.outputs[0])) != _box_key(theirs):
        return "tiles hold other boxes than they move"
    if _partition_dim(tensors[tile.tensor]) != _partition_dim(tensors[load.outputs[0].tensor]):
        return "tiles lay the product out otherwise"  # a vector's [1, n] row tile against [n, 1]
    elementwise = _elementwise(consumer, load, tensors)
    row_end: penguin_pb2.Predicate | None = None  # wide rows: the consumer runs at the row's last tile
    if [d[2] for d in ours] == [d[2] for d in theirs]:
        if not (elementwise or row_wise):
            return "row-wise consumer (row_wise=0)"
        mapping = _axis_mapping(dot, store, consumer, ours, theirs)
        if mapping is None:
            return "tiles do not correspond"
        rewrite = _substituted(mapping)
        outcome = None
    elif elementwise:
        rewrite = _retiled(ours, tensors)
        outcome = "retiled"
    else:
        wide = _wide_rows(dot, store, consumer, ours, theirs) if row_wise else None
        if wide is None:
            return "tiles differ and the consumer is not elementwise"
        mapping, column, count = wide
        rewrite = _substituted(mapping)
        row_end = affine.equals(column, count - 1)
        outcome = "wide rows"
    if unrolled is not None and _rolls(consumer, tensors, unrolled):
        return "the dot's nest unrolls, its consumer's would not"
    if row_end is not None:  # T's block holds the whole row; each tile of it is one slice
        decl = tensors[tile.tensor]
        decl.block_shape[-1] = decl.block_shape[-1] * count
    fixed = frozenset(axis.name for axis in dot.axes if axis.extent == 1)
    for k, st in enumerate(consumer.statements):
        if k == loads[0]:
            continue
        fused = dot.statements.add()
        fused.CopyFrom(st)
        fused.name = f"{consumer.name}.{st.name}"
        fused.predicates.extend(store.predicates)
        if row_end is not None:
            fused.predicates.append(row_end)
        for access in (*fused.inputs, *fused.outputs):
            if access.tensor == load.outputs[0].tensor:
                _onto_tile(access, rewrite, tile, tensors, fixed)
            else:
                rewrite(access)
    for key, value in consumer.attributes.items():
        dot.attributes.setdefault(key, value)
    if product in private:
        _read_psum(dot, store, tensors)
    return outcome


def _read_psum(dot: penguin_pb2.LoopNest, store: penguin_pb2.Statement,
               tensors: dict[str, penguin_pb2.TensorDecl]) -> None:
    """The product's store, now that nothing else reads the product, goes; and when one ACT or
    DVE statement alone reads the evacuated tile T, it reads the PSUM tile the evacuation copied
    instead, and the copy goes (ACT's evacuation of each tile was a second pass over it: a bias
    add on DVE, or the GELU itself on ACT, reads PSUM as the copy did)."""
    statements = [st for st in dot.statements if st is not store]
    tile = store.inputs[0]
    writers = [st for st in statements if any(a.tensor == tile.tensor for a in st.outputs)]
    readers = [st for st in statements if any(a.tensor == tile.tensor for a in st.inputs)]
    copy: penguin_pb2.Statement | None = None  # the evacuation, when it goes
    if len(writers) == 1 and len(readers) == 1:
        (evacuate,), (reader,) = writers, readers
        psum = evacuate.inputs[0] if evacuate.op == "tensor_copy" and len(evacuate.inputs) == 1 else None
        uses = [a for a in reader.inputs if a.tensor == tile.tensor]
        if psum is not None and tensors[psum.tensor].memory == common_pb2.PSUM \
                and reader.op in READS_PSUM and reader.engine in (common_pb2.ACT, common_pb2.DVE) \
                and len(uses) == 1 and uses[0] == evacuate.outputs[0] \
                and list(psum.starts) == list(evacuate.outputs[0].starts) \
                and list(psum.extents) == list(evacuate.outputs[0].extents) \
                and _same_layout(tensors[psum.tensor], tensors[tile.tensor]):
            uses[0].CopyFrom(psum)
            copy = evacuate
    kept = [st for st in statements if st is not copy]
    del dot.statements[:]
    dot.statements.extend(kept)


def _partition_dim(tile: penguin_pb2.TensorDecl) -> int | None:
    """Which dimension of size > 1 (counted as _squeezed counts them) an on-chip tensor's blocks
    put across partitions (their second-to-last dimension), or None for one of size 1."""
    shape = list(tile.shape)
    dim = len(shape) - 2
    if dim < 0 or shape[dim] == 1:
        return None
    return sum(1 for size in shape[:dim] if size != 1)


def _same_layout(a: penguin_pb2.TensorDecl, b: penguin_pb2.TensorDecl) -> bool:
    """Same dtype, shape and blocks: an access of one names the same elements of the other."""
    return (a.dtype, list(a.shape), list(a.block_shape)) == (b.dtype, list(b.shape), list(b.block_shape))


def _consumer_problem(consumer: penguin_pb2.LoopNest, load: penguin_pb2.Statement,
                      tensors: dict[str, penguin_pb2.TensorDecl], written: dict[str, list[int]],
                      read: set[str]) -> str | None:
    """Why `consumer` cannot run inside the dot's iterations, or None."""
    fresh = {load.outputs[0].tensor}  # on-chip tiles written so far in one iteration
    for st in consumer.statements:
        if st.op not in EPILOGUE_OPS:
            return f"op {st.op}"
        if st.predicates:
            return "predicated statement"
        if set(st.attributes) - KEPT_ATTRIBUTES:
            return "statement attributes"
        for access in st.outputs:
            name = base(tensors, access.tensor)
            if _hbm(tensors, access) and (name in written or name in read):
                return "writes what the dot touches"
        if st is not load:
            for access in st.inputs:
                if tensors[access.tensor].memory in ONCHIP and access.tensor not in fresh:
                    return "reads an on-chip tile from an earlier iteration"
        fresh.update(a.tensor for a in st.outputs if tensors[a.tensor].memory in ONCHIP)
    return None


def _the_store(dot: penguin_pb2.LoopNest, writers: list[int],
               tensors: dict[str, penguin_pb2.TensorDecl]) -> penguin_pb2.Statement | None:
    if len(writers) != 1:
        return None
    store = dot.statements[writers[0]]
    if store.op != "dma" or len(store.inputs) != 1:
        return None
    if tensors[store.inputs[0].tensor].memory != common_pb2.SBUF:
        return None
    return store


def _plain_load(st: penguin_pb2.Statement, tensors: dict[str, penguin_pb2.TensorDecl]) -> bool:
    """A dma into SBUF that moves the values as they are: one between element types of one width
    reinterprets the bits (a bitcast-convert: MoE's top-k reads the router's probabilities as
    integers), which reading the product's tile in place would not."""
    return (st.op == "dma" and not st.predicates and len(st.inputs) == 1 and len(st.outputs) == 1
            and tensors[st.outputs[0].tensor].memory == common_pb2.SBUF
            and tensors[st.outputs[0].tensor].dtype == tensors[st.inputs[0].tensor].dtype)


def _hbm(tensors: dict[str, penguin_pb2.TensorDecl], access: penguin_pb2.Access) -> bool:
    return tensors[access.tensor].memory == common_pb2.HBM


# ---- boxes in the product's dimensions ------------------------------------------------------------
# A dimension of a box, squeezed: (its size in the tensor, start expression, extent); dimensions
# of size 1 are left out, so a [1, 12, 512, 512] view and a [12, 512, 512] tensor compare.
Dim = tuple[int, penguin_pb2.AffineExpr, int]


def _squeezed(tensors: dict[str, penguin_pb2.TensorDecl], access: penguin_pb2.Access) -> list[Dim]:
    """The access's dimensions of size above 1 in its tensor's (or view's) shape, extents clipped
    at the size (a 512-column tile of a 256-column product holds 256)."""
    decl = tensors[access.tensor]
    return [(int(size), start, min(int(extent), int(size)))
            for size, start, extent in zip(decl.shape, access.starts, access.extents, strict=True)
            if size != 1]


def _plain(tensors: dict[str, penguin_pb2.TensorDecl], access: penguin_pb2.Access) -> list[Dim] | None:
    """_squeezed, or None when the access's tensor is a view other than a row-major reading of
    its base from offset 0 (the product's two names must order its elements alike; the stride of
    a dimension of size 1 does not matter)."""
    decl = tensors[access.tensor]
    if decl.view_of and decl.view_strides:
        dense = affine.row_major_strides(decl.shape)
        if decl.view_offset or any(size != 1 and stride != want for size, stride, want
                                   in zip(decl.shape, decl.view_strides, dense, strict=True)):
            return None
    return _squeezed(tensors, access)


def _axis_mapping(dot: penguin_pb2.LoopNest, store: penguin_pb2.Statement, consumer: penguin_pb2.LoopNest,
                  ours: list[Dim], theirs: list[Dim], skip: str = ""
                  ) -> dict[str, penguin_pb2.AffineExpr] | None:
    """Each of the consumer's moving axes as an affine expression of the dot's axes, so that the
    consumer's tile at that point is the dot's stored tile; None when there is no such map, or
    the two do not visit as many tiles (the dot's axis `skip` left out of its count: wide rows'
    column tiles, which one consumer tile holds all of)."""
    extents = {axis.name: axis.extent for axis in consumer.axes}
    dot_extents = {axis.name: axis.extent for axis in dot.axes}
    mapping: dict[str, penguin_pb2.AffineExpr] = {}
    for (_, dot_start, _), (_, start, _) in zip(ours, theirs, strict=True):
        terms = [t for t in start.terms if t.coeff and extents[t.var] > 1]
        dot_terms = [t for t in dot_start.terms if t.coeff and dot_extents[t.var] > 1]
        if not terms:
            if start.constant or dot_terms or dot_start.constant:
                return None
            continue
        if len(terms) > 1 or start.constant or terms[0].var in mapping:
            return None
        coeff = terms[0].coeff
        if dot_start.constant % coeff or any(t.coeff % coeff for t in dot_terms):
            return None
        mapping[terms[0].var] = penguin_pb2.AffineExpr(
            terms=[penguin_pb2.AffineTerm(var=t.var, coeff=t.coeff // coeff) for t in dot_terms],
            constant=dot_start.constant // coeff)
    moving = [name for name, extent in extents.items() if extent > 1]
    if sorted(mapping) != sorted(moving):
        return None
    stored = {t.var for s in store.outputs[0].starts for t in s.terms
              if t.coeff and dot_extents[t.var] > 1 and t.var != skip}
    tiles = 1
    for name in stored:
        tiles *= dot_extents[name]
    consumer_tiles = 1
    for name in moving:
        consumer_tiles *= extents[name]
    return mapping if tiles == consumer_tiles else None


def _wide_rows(dot: penguin_pb2.LoopNest, store: penguin_pb2.Statement, consumer: penguin_pb2.LoopNest,
               ours: list[Dim], theirs: list[Dim]
               ) -> tuple[dict[str, penguin_pb2.AffineExpr], str, int] | None:
    """A row-wise consumer whose tile is a whole row of the product while the dot stores it in
    `count` tiles side by side along one of its axes (`column`: GPT-2's scores, rows of 1,024 in
    512-column PSUM tiles): (the axis mapping of the other dimensions, column, count), or None.
    The row's tiles are stored at points that differ from the row's last one in `column` only,
    so they all precede it; the consumer runs there, on the evacuated tile T widened to the row
    (the module docstring: wide rows)."""
    if len(ours) != len(theirs) or not ours:
        return None
    if [d[2] for d in ours[:-1]] != [d[2] for d in theirs[:-1]]:
        return None
    size, start, width = ours[-1]
    _, their_start, their_width = theirs[-1]
    dot_extents = {axis.name: axis.extent for axis in dot.axes}
    terms = [t for t in start.terms if t.coeff and dot_extents[t.var] > 1]
    if len(terms) != 1 or start.constant or terms[0].coeff != width:
        return None
    column, count = terms[0].var, int(dot_extents[terms[0].var])
    if width * count != size or their_width != size:
        return None
    extents = {axis.name: axis.extent for axis in consumer.axes}
    if their_start.constant or any(t.coeff and extents[t.var] > 1 for t in their_start.terms):
        return None
    if any(t.coeff and t.var == column for _, other, _ in ours[:-1] for t in other.terms):
        return None
    mapping = _axis_mapping(dot, store, consumer, ours[:-1], theirs[:-1], skip=column)
    return None if mapping is None else (mapping, column, count)


def _substituted(mapping: dict[str, penguin_pb2.AffineExpr]):
    """An access rewrite replacing the consumer's axes by the dot's (extent-1 axes by 0)."""

    def rewrite(access: penguin_pb2.Access) -> None:
        for start in access.starts:
            terms, constant = {}, start.constant
            for term in start.terms:
                if term.var in mapping:
                    for inner in mapping[term.var].terms:
                        terms[inner.var] = terms.get(inner.var, 0) + term.coeff * inner.coeff
                    constant += term.coeff * mapping[term.var].constant
                # an axis with no mapping has extent 1: always 0
            del start.terms[:]
            start.terms.extend(penguin_pb2.AffineTerm(var=v, coeff=c) for v, c in terms.items() if c)
            start.constant = constant

    return rewrite


def _elementwise(consumer: penguin_pb2.LoopNest, load: penguin_pb2.Statement,
                 tensors: dict[str, penguin_pb2.TensorDecl]) -> bool:
    """Every statement elementwise and every access the load's box on a tensor of its shape, on
    chip a tile of the consumer alone."""
    box = _box_key(_squeezed(tensors, load.inputs[0]))
    for st in consumer.statements:
        if st.op != "dma" and st.op not in ELEMENTWISE_OPS or st.attributes.get("broadcast"):
            return False
        if any(_box_key(_squeezed(tensors, access)) != box for access in (*st.inputs, *st.outputs)):
            return False
    return True


def _box_key(dims: list[Dim], fixed: frozenset[str] = frozenset()) -> tuple:
    """Dims as a comparable key; terms in the axes `fixed` (extent 1: always 0) left out."""
    return tuple((size, tuple(sorted((t.var, t.coeff) for t in start.terms
                                     if t.coeff and t.var not in fixed)),
                  start.constant, extent) for size, start, extent in dims)


def _retiled(ours: list[Dim], tensors: dict[str, penguin_pb2.TensorDecl]):
    """An access rewrite giving every box the dot's stored box (and every on-chip tile its shape)."""

    def rewrite(access: penguin_pb2.Access) -> None:
        _set_box(access, ours, tensors)
        decl = tensors[access.tensor]
        if decl.memory in ONCHIP:
            del decl.block_shape[:]
            decl.block_shape.extend(access.extents)

    return rewrite


def _set_box(access: penguin_pb2.Access, dims: list[Dim], tensors: dict[str, penguin_pb2.TensorDecl],
             like: penguin_pb2.Access | None = None) -> None:
    """The squeezed box `dims` written into `access`'s own dimensions; a size-1 one starts where
    `like` (another access of the tensor) starts it, else at 0, with extent 1."""
    shape = list(tensors[access.tensor].shape)
    del access.starts[:]
    del access.extents[:]
    remaining = iter(dims)
    for dim, size in enumerate(shape):
        if size == 1:
            start = access.starts.add()
            if like is not None:
                start.CopyFrom(like.starts[dim])
            access.extents.append(1)
        else:
            _, start, extent = next(remaining)
            access.starts.add().CopyFrom(start)
            access.extents.append(extent)


def _onto_tile(access: penguin_pb2.Access, rewrite, tile: penguin_pb2.Access,
               tensors: dict[str, penguin_pb2.TensorDecl], fixed: frozenset[str]) -> None:
    """An access of the consumer's loaded tile, made an access of the dot's tile T: the same
    elements, in T's dimensions; T's own access where it names the same box, so that every
    access of T names one box (rolling keeps T private to an iteration only then)."""
    rewrite(access)
    dims = _squeezed(tensors, access)
    if _box_key(dims, fixed) == _box_key(_squeezed(tensors, tile), fixed):
        access.CopyFrom(tile)
        return
    access.tensor = tile.tensor
    _set_box(access, dims, tensors, like=tile)
