"""On-chip forwarding: a load of an intermediate that an earlier nest stored from an SBUF tile reads
that tile instead of HBM, through PE's transpose when the consumer wants it the other way round.

Why: fusion joins only neighbouring nests over one iteration space, so between nests of different
shapes (a dot and the elementwise epilogue after it, an RMSNorm and the dots that read its output
transposed as their stationary operand) every intermediate still went to HBM and back: a store
and a load, each a DMA with its fixed latency, on the critical path. In a transformer block that
was 13 round trips, 46 of its 57 µs of critical path.

When. An internal HBM tensor T is written by exactly one statement of the program: an unconditional
(or single-point) tile store `dma(T-view box <- L box)` in nest A, whose SBUF tile L has the same box
and is written only by statements of A with that box and those predicates, so every block of L
holds, once A is done, the part of T it stored (a different block at every point of A: each axis
steps one dimension, or several step one as the digits of one index, tile_order's 256·io +
128·ii). A later
nest B's load `dma(tile box <- T-view box)` then maps, dimension by dimension, onto L's coordinates
(each of its view's strides a multiple of one of A's, offsets equal), within one block of L at every point of
B (checked by enumerating the starts; several view dimensions may fold into one, as heads and
their columns into a row, and a view dimension longer than the one it walks is cut into pieces,
one per row of L it crosses; a load of a whole dimension that crosses L's blocks is cut into one
piece per block, the last one what is left: a swapped dot's 197 moving columns from row tiles of
128 and 69), with B's tile of the same dtype (a dma that bitcasts moves bytes,
a copy would convert them), and:
  * in the same layout (partitions to partitions): the load becomes a `tensor_copy` from L;
  * transposed (B's partition dimension is A's free one and the other way round, each at most 128):
    a PE `transpose` of L's box into a PSUM tile, and a `tensor_copy` of that into B's tile; a
    later nest wanting the same box transposed into a tile like B's copies B's instead.
A copy is exact; a transpose is exact for finite values (docs/ir.md: the PE transposes through a
matmul against an identity), so only float tiles take it, and not a tile that may hold ±inf or NaN
by construction (a −inf mask fill and what is computed from it: nonfinite.py).
Software-pipelined nests take part (stage shifts are undone before writers and stores are
compared; stage guards decide where a box is checked). Tiles with replicated dimensions keep
their loads, and so does L whose blocks together pass `max_bytes` a partition: L then stays on
chip from A to B, and a large one would crowd SBUF into spills. `dce` (run again after this
pass) removes stores nobody reads any more.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from ncc.schemas import common_pb2, penguin_pb2
from ncc.tools.common import affine
from ncc.tools.common.access_keys import box_key
from ncc.tools.common.alu import ACT_OPERAND
from ncc.tools.common.dtypes import itemsize
from ncc.tools.hlo_opt.nonfinite import nonfinite_tensors
from ncc.tools.hlo_opt.passes import nests_naming
from ncc.tools.hlo_opt.passes.affine_tail import affine_tail, column_loads
from ncc.tools.hlo_opt.passes.broadcast_operands import BROADCAST
from ncc.tools.hlo_opt.passes.fusion import one_axis_per_dimension
from ncc.tools.target import PARTITIONS

MAX_BYTES = 20 * 1024  # a forwarded tile's blocks together, per partition
MAX_POINTS = 1 << 16  # points of a nest enumerated when checking the one-block rule
# Element types the PE carries exactly through its fp32 matmul against an identity (integers
# wider than 24 bits would round).
_PE_EXACT = frozenset({common_pb2.F32, common_pb2.BF16, common_pb2.F16})


@dataclass
class ForwardStats:
    loads_forwarded: int = 0
    copies: int = 0
    transposes: int = 0
    affine_tails: int = 0  # transposes whose copy applies the norm's γ and β (affine_tail.py)
    refused: dict[str, int] = field(default_factory=dict)  # why a candidate load kept its DMA

    def refuse(self, why: str) -> None:
        self.refused[why] = self.refused.get(why, 0) + 1


@dataclass(frozen=True)
class _Source:
    """The tile store that wrote an intermediate: its nest, its view of T and its SBUF tile."""

    nest: int
    view: penguin_pb2.TensorDecl
    tile: penguin_pb2.TensorDecl


@dataclass
class _Plan:
    """What one load's rewrite does besides its statements, applied only if every piece of it
    rewrites: its counts, and the transposed tiles later nests may copy."""

    copies: int = 0
    transposes: int = 0
    affine_tails: int = 0
    made: list[tuple[tuple, penguin_pb2.TensorDecl, penguin_pb2.Access]] = field(default_factory=list)
    refusal: str = ""  # why the load keeps its DMA, when _rewrite knows better than "layout"


def forward_tiles(program: penguin_pb2.Program, max_bytes: int = MAX_BYTES, affine_tails: bool = True
                  ) -> ForwardStats:
    """Rewrite, in place, the loads of intermediates whose producer's tile can serve them
    (`affine_tails`: a norm's γ and β move onto the copy out of a transpose, affine_tail.py)."""
    tensors = {t.name: t for t in program.tensors}
    stats = ForwardStats()
    sources = _sources(program, tensors)
    writes: dict[str, int] = {}  # on-chip tensor -> statements writing it
    for nest in program.nests:
        for st in nest.statements:
            for access in st.outputs:
                writes[access.tensor] = writes.get(access.tensor, 0) + 1
    named = nests_naming(program) if affine_tails else None
    transposed = _Transposed(writes, nonfinite_tensors(program), named)
    for k, nest in enumerate(program.nests):
        statements: list[penguin_pb2.Statement] = []
        changed = False
        for st in nest.statements:
            source = _candidate(st, tensors, sources)
            rewritten, plan = None, _Plan()
            if source is not None:
                why = _why_not(source, k, max_bytes)
                rewritten = None if why else _rewrite(st, source, nest, tensors, program, plan, transposed)
                if why or rewritten is None:
                    stats.refuse(why or plan.refusal or "layout")
            if rewritten is None:
                statements.append(st)
                continue
            statements += rewritten
            changed = True
            stats.loads_forwarded += 1
            stats.copies += plan.copies
            stats.transposes += plan.transposes
            stats.affine_tails += plan.affine_tails
            for key, target, access in plan.made:
                transposed.remember(key, target, access)
        if changed:
            del nest.statements[:]
            nest.statements.extend(statements)
    return stats


def _sources(program: penguin_pb2.Program, tensors: dict[str, penguin_pb2.TensorDecl]) -> dict[str, _Source]:
    """Internal HBM tensors with one writer, a tile store whose tile holds what it stored."""
    writers: dict[str, list[tuple[int, penguin_pb2.Statement]]] = {}
    tile_writers: dict[str, list[tuple[int, penguin_pb2.Statement]]] = {}
    for k, nest in enumerate(program.nests):
        for st in nest.statements:
            for access in st.outputs:
                decl = tensors[access.tensor]
                if decl.memory == common_pb2.HBM:
                    writers.setdefault(decl.view_of or decl.name, []).append((k, st))
                else:
                    tile_writers.setdefault(decl.name, []).append((k, st))
    sources: dict[str, _Source] = {}
    for name, found in writers.items():
        if len(found) != 1 or tensors[name].role != penguin_pb2.INTERNAL:
            continue
        k, store = found[0]
        if store.op != "dma" or len(store.inputs) != 1 or len(store.outputs) != 1:
            continue
        view, tile_access = tensors[store.outputs[0].tensor], store.inputs[0]
        tile = tensors[tile_access.tensor]
        if tile.memory != common_pb2.SBUF or tile.dtype != view.dtype or tile.replicated_dims \
                or tile.num_buffers > 1:
            continue
        if box_key(tile_access) != box_key(store.outputs[0]) or list(tile.shape) != list(view.shape):
            continue
        nest = program.nests[k]
        if not _distinct_blocks(nest, store, tile_access):
            continue
        same = _unshifted(store, store.inputs[0], nest)
        body = list(nest.statements)
        # (software pipelining orders a nest's body by stage: there a writer that comes after the
        # store works on a later iteration's tile, and legality kept each writer before its store)
        after = [] if _pipelined_axis(nest) else body[body.index(store) + 1:]
        if all(j == k and len(st.outputs) == 1 and _unshifted(st, st.outputs[0], nest) == same
               and not any(st is later for later in after)
               for j, st in tile_writers.get(tile.name, [])):
            sources[name] = _Source(k, view, tile)
    return sources


def _pipelined_axis(nest: penguin_pb2.LoopNest) -> str:
    """The axis software pipelining extended, or ''."""
    return next((a.name for a in nest.axes if "pipelined" in a.attributes), "")


def _unshifted(st: penguin_pb2.Statement, access: penguin_pb2.Access, nest: penguin_pb2.LoopNest) -> tuple:
    """The box and predicates of `access` of `st` as they were before software pipelining moved
    the statement's stage s to iteration iv - s (so a tile's writer and its store, in different
    stages, compare equal when they work on one iteration's tile)."""
    axis = _pipelined_axis(nest)
    stage = int(st.attributes.get("stage", "0") or 0) if axis else 0
    if not stage:
        return box_key(access), _predicate_key(st)

    def back(expr: penguin_pb2.AffineExpr) -> penguin_pb2.AffineExpr:
        moved = penguin_pb2.AffineExpr()
        moved.CopyFrom(expr)
        moved.constant += stage * sum(t.coeff for t in expr.terms if t.var == axis)
        return moved

    box = penguin_pb2.Access(tensor=access.tensor, extents=access.extents)
    box.starts.extend(back(start) for start in access.starts)
    guards = penguin_pb2.Statement()
    for predicate in st.predicates:
        guards.predicates.add(expr=back(predicate.expr), relation=predicate.relation)
    return box_key(box), _predicate_key(guards)


def _predicate_key(st: penguin_pb2.Statement) -> tuple:
    return tuple(sorted((tuple(sorted((t.var, t.coeff) for t in p.expr.terms if t.coeff)), p.expr.constant,
                         p.relation) for p in st.predicates))


def _distinct_blocks(nest: penguin_pb2.LoopNest, store: penguin_pb2.Statement,
                     access: penguin_pb2.Access) -> bool:
    """Whether the store runs at most once per box, each box its own: every axis it runs over
    (not fixed by an `axis == c` predicate, of extent > 1) moves exactly one dimension's start
    (software pipelining's stage guards, `>=`, only narrow the points it runs at)."""
    fixed = {a.name for a in nest.axes if a.extent == 1}
    for predicate in store.predicates:  # `>=` ones only narrow the range the store runs over
        terms = [t for t in predicate.expr.terms if t.coeff]
        if predicate.relation == penguin_pb2.GE:
            continue
        if len(terms) != 1 or abs(terms[0].coeff) != 1:
            return False
        fixed.add(terms[0].var)
    moving = [a.name for a in nest.axes if a.name not in fixed]
    if one_axis_per_dimension(access, moving, frozenset(fixed)):
        return True
    # several axes may move one dimension as the digits of one index (a strip-mined row loop:
    # 256·io + 128·ii over boxes of 128), each step past the whole range of the finer ones
    extents = {a.name: a.extent for a in nest.axes}
    used: list[str] = []
    for start, extent in zip(access.starts, access.extents, strict=True):
        digits = sorted((abs(t.coeff), t.var) for t in start.terms if t.coeff and t.var not in fixed)
        reach = extent
        for coeff, var in digits:
            if coeff < reach:
                return False
            reach = coeff * extents[var]
        used += [var for _, var in digits]
    return sorted(used) == sorted(moving)


def _candidate(st: penguin_pb2.Statement, tensors: dict[str, penguin_pb2.TensorDecl],
               sources: dict[str, _Source]) -> _Source | None:
    """The source of a plain tile load of a forwardable intermediate, else None."""
    if st.op != "dma" or len(st.inputs) != 1 or len(st.outputs) != 1:
        return None
    view, tile = tensors[st.inputs[0].tensor], tensors[st.outputs[0].tensor]
    if view.memory != common_pb2.HBM or tile.memory != common_pb2.SBUF:
        return None
    return sources.get(view.view_of or view.name)


def _why_not(source: _Source, nest: int, max_bytes: int) -> str:
    if source.nest >= nest:
        return "same nest"
    shape = list(source.tile.shape)
    partitions = min(PARTITIONS, shape[-2]) if len(shape) >= 2 else 1
    if math.prod(shape) * itemsize(source.tile.dtype) / max(1, partitions) > max_bytes:
        return "size"
    return ""


class _Transposed:
    """Tiles already made by a forwarded transpose: a later nest that wants the same box of the
    same tile transposed, into a tile of the same shape at the same box (the q, k and v dots all
    read the normed activations transposed), copies the first one's instead of transposing again;
    and the tiles that may hold ±inf or NaN by construction, which are never transposed."""

    def __init__(self, writes: dict[str, int], nonfinite: set[str], nests_of: dict[str, set[int]] | None
                 ) -> None:
        self.writes = writes
        self.nonfinite = nonfinite
        # tensor -> the nests naming it, as the pass found them (affine_tail's "named in one nest
        # only"); None when the pass moves no norm's γ and β (forward_tiles(affine_tails=False)),
        # which then spares building it
        self.nests_of = nests_of
        self.made: dict[tuple, tuple[penguin_pb2.TensorDecl, penguin_pb2.Access]] = {}

    @property
    def affine_tails(self) -> bool:
        """Whether a transpose's copy may apply a norm's γ and β (affine_tail.py)."""
        return self.nests_of is not None

    @staticmethod
    def key(load: penguin_pb2.Statement, tile_access: penguin_pb2.Access, target: penguin_pb2.TensorDecl,
            nest: penguin_pb2.LoopNest) -> tuple:
        return (tile_access.tensor, box_key(tile_access), box_key(load.outputs[0]), _predicate_key(load),
                tuple((a.name, a.extent) for a in nest.axes), target.dtype, tuple(target.shape),
                tuple(target.block_shape), tuple(target.replicated_dims))

    def earlier(self, key: tuple) -> penguin_pb2.Access | None:
        found = self.made.get(key)
        return None if found is None else found[1]

    def remember(self, key: tuple, target: penguin_pb2.TensorDecl, access: penguin_pb2.Access) -> None:
        if self.writes.get(target.name) == 1:  # written by this load alone: it keeps what it got
            self.made.setdefault(key, (target, access))


def _rewrite(load: penguin_pb2.Statement, source: _Source, nest: penguin_pb2.LoopNest,
             tensors: dict[str, penguin_pb2.TensorDecl], program: penguin_pb2.Program,
             plan: _Plan, transposed: _Transposed) -> list[penguin_pb2.Statement] | None:
    """The statements that replace `load`, or None when its box does not map onto the tile."""
    target_access, read = load.outputs[0], load.inputs[0]
    target = tensors[target_access.tensor]
    view_b = tensors[read.tensor]
    if len(target.shape) != len(read.starts) or list(target_access.extents) != list(read.extents):
        return None
    if target.dtype != view_b.dtype:  # a dma moves bytes (bitcast-convert); a copy would convert them
        return None
    mapping = _Mapping.of(view_b, source.view)
    if mapping is None:
        return None
    for d, (_, n) in mapping.span.items():
        if read.extents[d] > n:  # one piece per row of A it crosses, each forwarded alone
            return _split(load, d, n, source, nest, tensors, program, plan, transposed)
    slab = _slab(source.tile)
    single = {axis.name for axis in nest.axes if axis.extent == 1}
    for d, (a, r) in enumerate(zip(mapping.dim_of, mapping.ratio, strict=True)):
        start = read.starts[d]
        if a >= 0 and r == 1 and min(read.extents[d], view_b.shape[d]) > slab[a] and start.constant == 0 \
                and all(t.var in single for t in start.terms if t.coeff):
            # the whole dimension, across A's row tiles: one piece per tile
            return _split(load, d, slab[a], source, nest, tensors, program, plan, transposed,
                          whole=view_b.shape[d])
    starts, _ = mapping.box(read)
    extents = mapping.exact(read, nest, slab, list(load.predicates))
    if extents is None:
        return None
    rank_a, rank_b = len(source.tile.shape), len(read.starts)
    if any(extents[d] != 1 for d in range(rank_a - 2)) or any(e != 1 for e in read.extents[:rank_b - 2]):
        return None
    tile_access = penguin_pb2.Access(tensor=source.tile.name, starts=starts, extents=extents)
    part_b, free_b = (mapping.dim_of[rank_b - 2], mapping.dim_of[rank_b - 1])
    if (part_b, free_b) == (rank_a - 2, rank_a - 1):
        plan.copies += 1
        return [_statement(load, "tensor_copy", common_pb2.DVE, target_access, tile_access, ".forward")]
    if (part_b, free_b) != (rank_a - 1, rank_a - 2) or max(extents[-2:]) > PARTITIONS:
        return None
    return _forward_transposed(load, source, mapping, starts, extents, nest, program, tensors, plan,
                               transposed)


def _forward_transposed(load: penguin_pb2.Statement, source: _Source, mapping: _Mapping,
                        starts: list[penguin_pb2.AffineExpr], extents: list[int], nest: penguin_pb2.LoopNest,
                        program: penguin_pb2.Program, tensors: dict[str, penguin_pb2.TensorDecl], plan: _Plan,
                        transposed: _Transposed) -> list[penguin_pb2.Statement] | None:
    """`load` of the tile box (`starts`, `extents`) with its two minor dimensions swapped: a PE
    transpose into a staging tile, then a copy to the load's target on ACT, or, where the tile is
    the output of a norm's affine tail (affine_tail.py), an activation that applies its γ and β
    on the way out; a copy of an earlier such transpose of the same box when there is one. None
    where the PE would not move the values exactly."""
    target_access = load.outputs[0]
    target = tensors[target_access.tensor]
    tile_access = penguin_pb2.Access(tensor=source.tile.name, starts=starts, extents=extents)
    if target.dtype not in _PE_EXACT:
        return None
    if source.tile.name in transposed.nonfinite:
        plan.refusal = "non-finite"  # the PE would spread an inf or a NaN along its column
        return None
    producer = program.nests[source.nest]
    tail = None
    if transposed.affine_tails and not _pipelined_axis(producer) and not mapping.span:
        assert transposed.nests_of is not None
        tail = affine_tail(producer, source.tile.name, tensors, transposed.nests_of, source.nest)
    loads = None
    if tail is not None and tail.data not in transposed.nonfinite:
        loads = column_loads(load, tail, mapping.dim_of, mapping.ratio, program, tensors)
    if loads is not None:  # transpose x̂ and apply the norm's γ and β on the way out (affine_tail.py)
        tile_access = penguin_pb2.Access(tensor=tail.data, starts=starts, extents=extents)
    key = (*_Transposed.key(load, tile_access, target, nest), loads is not None)
    earlier = transposed.earlier(key)
    if earlier is not None:
        plan.copies += 1
        return [_statement(load, "tensor_copy", common_pb2.DVE, target_access, earlier, ".forward")]
    plan.made.append((key, target, target_access))
    staging = _staging_tensor(target, program, tensors)
    staged = penguin_pb2.Access(tensor=staging.name)
    staged.starts.extend(target_access.starts)
    staged.extents.extend(target_access.extents)
    plan.transposes += 1
    transpose = _statement(load, "transpose", common_pb2.PE, staged, tile_access, ".transpose")
    if loads is None:
        return [transpose, _statement(load, "tensor_copy", common_pb2.ACT, target_access, staged, ".forward")]
    plan.affine_tails += 1
    statements, columns = loads
    act = _statement(load, "activation", common_pb2.ACT, target_access, staged, ".forward")
    act.func = "identity"
    act.scalars.extend([1.0, -0.0])  # x̂·1·γ + (−0) + β: the multiply's and the add's roundings
    act.inputs.extend(columns)
    act.attributes[ACT_OPERAND] = tail.role
    act.attributes[BROADCAST] = ",".join(str(k) for k in range(1, len(columns) + 1))
    return [transpose, *statements, act]


def _split(load: penguin_pb2.Statement, d: int, n: int, source: _Source, nest: penguin_pb2.LoopNest,
           tensors: dict[str, penguin_pb2.TensorDecl], program: penguin_pb2.Program,
           plan: _Plan, transposed: _Transposed, whole: int = 0) -> list[penguin_pb2.Statement] | None:
    """`load` cut along dimension d into loads n long (its box and its tile's alike), each
    rewritten; None unless every piece is. `whole`: the dimension's size, when the load reads all
    of it from 0 (its box may be longer: a moving tile's 512 columns over 197 tokens); the last
    piece then holds what is left, where otherwise n must divide the box."""
    extent = min(load.inputs[0].extents[d], whole) if whole else load.inputs[0].extents[d]
    if extent % n and not whole:
        return None
    pieces: list[penguin_pb2.Statement] = []
    for j in range(-(-extent // n)):
        piece = penguin_pb2.Statement()
        piece.CopyFrom(load)
        piece.name = f"{load.name}.{j}"
        for access in (piece.inputs[0], piece.outputs[0]):
            access.starts[d].constant += n * j
            access.extents[d] = min(n, extent - n * j)
        rewritten = _rewrite(piece, source, nest, tensors, program, plan, transposed)
        if rewritten is None:
            return None
        pieces += rewritten
    return pieces


@dataclass
class _Mapping:
    """How B's view of T walks A's view of T: each B dimension of size > 1 moves one A dimension,
    by `ratio` of that dimension's steps a step (several B dimensions may fold into one A
    dimension, as heads [4, 64] into a row of 256), and at most one of them (ratio 1) is the
    box's extent there."""

    dim_of: list[int]  # per B dimension: the A dimension it moves (-1: size 1, moves nothing)
    ratio: list[int]
    shape_a: list[int]
    shape_b: list[int]
    # B dimension -> (the A dimension outside the one it moves, that one's size n): a B dimension
    # longer than its A dimension walks on into the next (heads [128, 4, 64] read as rows of 256);
    # a box of it at a multiple of n and at most n long is a box of A
    span: dict[int, tuple[int, int]] = field(default_factory=dict)

    @classmethod
    def of(cls, view_b: penguin_pb2.TensorDecl, view_a: penguin_pb2.TensorDecl) -> _Mapping | None:
        strides_a = list(view_a.view_strides) or list(affine.row_major_strides(view_a.shape))
        strides_b = list(view_b.view_strides) or list(affine.row_major_strides(view_b.shape))
        if view_a.view_offset != view_b.view_offset or view_a.dtype != view_b.dtype:
            return None
        sizes = enumerate(zip(strides_a, view_a.shape, strict=True))
        moving = sorted(((stride, d) for d, (stride, size) in sizes if size > 1), reverse=True)
        if any(stride <= 0 for stride, _ in moving) or len({stride for stride, _ in moving}) != len(moving):
            return None
        dim_of, ratio = [], []
        reach = [0] * len(view_a.shape)  # the largest coordinate B can reach in each A dimension
        for stride, size in zip(strides_b, view_b.shape, strict=True):
            if size == 1:
                dim_of.append(-1)
                ratio.append(0)
                continue
            a = next((d for step, d in moving if step <= stride), None)
            if a is None or stride % strides_a[a]:
                return None
            dim_of.append(a)
            ratio.append(stride // strides_a[a])
            reach[a] += ratio[-1] * (size - 1)
        span: dict[int, tuple[int, int]] = {}
        for d, (a, r) in enumerate(zip(dim_of, ratio, strict=True)):
            if a < 0 or r != 1 or reach[a] < view_a.shape[a] or dim_of.count(a) != 1:
                continue
            n = view_a.shape[a]
            outer = next((o for step, o in moving if step == strides_a[a] * n), None)
            if outer is None or view_b.shape[d] % n:
                return None
            span[d] = (outer, n)
            reach[a], reach[outer] = n - 1, reach[outer] + view_b.shape[d] // n - 1
        if any(reach[d] >= view_a.shape[d] for d in range(len(reach)) if reach[d]):
            return None
        units = [a for a, r in zip(dim_of, ratio, strict=True) if r == 1]
        if len(units) != len(set(units)):  # two B dimensions stepping one A dimension alike
            return None
        return cls(dim_of, ratio, list(view_a.shape), list(view_b.shape), span)

    def box(self, read: penguin_pb2.Access) -> tuple[list[penguin_pb2.AffineExpr], list[int]]:
        """B's box in A's coordinates: each A dimension's start sums its B dimensions' starts
        times their ratios; its extent is that of its ratio-1 B dimension (1 if none)."""
        terms: list[dict[str, int]] = [{} for _ in self.shape_a]
        constants = [0] * len(self.shape_a)
        extents = [1] * len(self.shape_a)
        for d, (a, r) in enumerate(zip(self.dim_of, self.ratio, strict=True)):
            if a < 0:
                continue
            if d in self.span:  # the outer A dimension takes start / n; the box starts a row
                outer, n = self.span[d]
                start = read.starts[d]
                if start.constant % n or any(t.coeff % n for t in start.terms) or read.extents[d] > n:
                    extents[a] = -1
                    continue
                for term in start.terms:
                    terms[outer][term.var] = terms[outer].get(term.var, 0) + term.coeff // n
                constants[outer] += start.constant // n
                extents[a] = read.extents[d]
                continue
            for term in read.starts[d].terms:
                terms[a][term.var] = terms[a].get(term.var, 0) + r * term.coeff
            constants[a] += r * read.starts[d].constant
            if r == 1:
                extents[a] = read.extents[d]
            elif read.extents[d] != 1:
                extents[a] = -1  # a folded dimension with an extent: not a box of A
        return [affine.expr(t, c) for t, c in zip(terms, constants, strict=True)], extents

    def exact(self, read: penguin_pb2.Access, nest: penguin_pb2.LoopNest, block: list[int],
              predicates=()) -> list[int] | None:
        """A's extents of the box, when at every point of the nest where the load runs (the
        starts' axes enumerated, its predicates holding) it is a box of A (its folded dimensions
        have extent 1) that A's tile clips exactly as B's view clips the load (a partial last
        tile: 200 rows are 128 and 72 in both) and that lies in one block of the tile; else None.
        An extent is the longest the load reads in that dimension (64 of a 128-wide box over a
        64-wide head)."""
        starts, extents = self.box(read)
        if any(e < 0 for e in extents):
            return None
        ranges = {axis.name: axis.extent for axis in nest.axes}
        names = sorted({t.var for s in read.starts for t in s.terms if t.coeff})
        if any(n not in ranges for n in names) or math.prod(ranges[n] for n in names) > MAX_POINTS:
            return None
        unit = [next((d for d, (dim, r) in enumerate(zip(self.dim_of, self.ratio, strict=True))
                      if dim == a and r == 1), None) for a in range(len(starts))]
        guards = [p for p in predicates if all(t.var in names for t in p.expr.terms if t.coeff)]
        points: list[tuple[list[int], list[int]]] = []  # per point: A's starts, B's clipped lengths
        for values in itertools.product(*(range(ranges[n]) for n in names)):
            point = dict(zip(names, values, strict=True))
            if not all(affine.holds(p, point) for p in guards):
                continue  # the load does not run here (a pipelining stage guard)
            b_starts = [affine.evaluate(start, point) for start in read.starts]
            if any(first >= size for first, size in zip(b_starts, self.shape_b, strict=True)):
                continue  # clipped to nothing: the load does not run here
            lengths = [min(extent, self.shape_b[d] - b_starts[d]) if d is not None else 1
                       for extent, d in zip(extents, unit, strict=True)]
            points.append(([affine.evaluate(start, point) for start in starts], lengths))
        longest = [max((lengths[a] for _, lengths in points), default=1) for a in range(len(starts))]
        for firsts, lengths in points:
            for a, (first, length) in enumerate(zip(firsts, lengths, strict=True)):
                if first < 0 or min(longest[a], self.shape_a[a] - first) != length:
                    return None
                if first // block[a] != (first + length - 1) // block[a]:
                    return None
        return longest


def _slab(tile: penguin_pb2.TensorDecl) -> list[int]:
    """The extent, per dimension, of one virtual buffer of the tile (bir_codegen): its block, at
    most 128 rows (software pipelining widens a block into a ring of such slabs)."""
    block = list(tile.block_shape) or list(tile.shape)
    return [*block[:-2], min(block[-2], PARTITIONS), block[-1]] if len(block) >= 2 else block


def _staging_tensor(like: penguin_pb2.TensorDecl, program: penguin_pb2.Program,
                    tensors: dict[str, penguin_pb2.TensorDecl]) -> penguin_pb2.TensorDecl:
    """The PSUM tile a transpose lands in before its copy into `like` (one per consumer tile)."""
    name = f"{like.name}.T"
    if name not in tensors:
        staging = program.tensors.add()
        staging.CopyFrom(like)
        staging.name, staging.memory, staging.role = name, common_pb2.PSUM, penguin_pb2.INTERNAL
        del staging.replicated_dims[:]
        tensors[name] = staging
    return tensors[name]


def _statement(like: penguin_pb2.Statement, op: str, engine: int, out: penguin_pb2.Access,
               source: penguin_pb2.Access, suffix: str) -> penguin_pb2.Statement:
    """A statement in `like`'s place: its predicates, attributes and HLO source, `op` on `engine`."""
    st = penguin_pb2.Statement(name=like.name + suffix, op=op, engine=engine, source=like.source)
    st.outputs.add().CopyFrom(out)
    st.inputs.add().CopyFrom(source)
    st.predicates.extend(like.predicates)
    for key, value in like.attributes.items():
        st.attributes[key] = value
    return st
