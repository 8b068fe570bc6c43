"""Tile order: a matmul nest's row loop is strip-mined and its inner part sunk below the contraction
loop, so that a moving tile (a block of the weights) loaded once serves several row tiles.

Lowered, a dot is the nest (…, i, j, k): for each 128-row tile i of the result and each 512-column
tile j, the k loop loads the stationary tile lhsT[k, i] and the moving tile rhs[k, j] and
accumulates into the PSUM tile (i, j). Each moving tile is loaded again for every row tile and each
stationary tile for every column tile: gelu(x @ W1) @ W2 at D = 2048, B = 1024 moved 7.8× its
minimum HBM bytes, and its DMA queues, not the PE, set its time.

This pass rewrites the nest as (…, io, j, k, ii) with i = R·io + ii (a guard R·io + ii < extent
when R does not divide it). The R accumulators of a row block fill side by side, R consecutive
matmuls use the same moving tile, and `invariant_loads` (which runs after) then loads each moving
tile once per row block (at ii = 0) and each stationary tile once per row block (at j = 0), kept on
chip across the column tiles. The weights are read ⌈rows / R⌉ times instead of once per row tile,
the activations once instead of once per column tile.

R is the largest power of two up to MAX_ROW_BLOCK and the row tiles there are such that the R
accumulators take at most half of PSUM (the other half lets the next block start while this one
is evacuated) and the row block's stationary tiles (R × the k extent) fit in
STATIONARY_BUDGET_BYTES per partition, then halved (down to 2) until it divides the row tiles
where a block of 2 or more does: an `epilogues` consumer visits each tile once and cannot join a
guarded nest (a swapped dot's 18 row tiles, lower.py `_swapped_dot`, go in blocks of 2, not 4
with a guard, and the bias after it joins). The new schedule is checked with ISL (dependences.py): a
nest whose dependences it would reverse is left as it was. Nests that ask for software pipelining
keep the loop order the request was made on; a reordered nest is marked `row_block` = R, and
`--num-stages` then leaves it unpipelined (pipelining a loop of it would hold several row blocks'
accumulators at once, more than PSUM has).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from ncc.schemas import penguin_pb2
from ncc.tools.common.dtypes import itemsize
from ncc.tools.common.row_blocks import MAX_ROW_BLOCK
from ncc.tools.hlo_opt.dependences import axis_names, first_reversed_dependence, instance
from ncc.tools.hlo_opt.passes.pipelining import ROW_BLOCK, requests_pipelining
from ncc.tools.target import load_target

# per partition: the stationary tiles kept across column tiles. 96 KiB lets a row block of four
# keep the LLaMA FFN's 86 bf16 stationary tiles a row (22 KiB), where 64 KiB allowed two and its
# down projection's 90 MB of weights were read 8 times: the prefill 23,163.2 -> 22,091.9 us
STATIONARY_BUDGET_BYTES = 96 * 1024
PSUM_SHARE = 2  # the accumulators of a row block take at most 1/PSUM_SHARE of PSUM


@dataclass
class TileOrderStats:
    nests_reordered: int = 0
    row_block: int = 0  # the largest R chosen
    nests_refused: int = 0  # reordering would reverse a dependence (left alone)


@dataclass
class _Matmul:
    row: int  # index of axis i
    stationary: penguin_pb2.Access
    psum: penguin_pb2.Access


def order_tiles(program: penguin_pb2.Program, max_row_block: int = MAX_ROW_BLOCK) -> TileOrderStats:
    """Strip-mine and interchange the row loop of every matmul nest that gains from it, in place."""
    tensors = {t.name: t for t in program.tensors}
    stats = TileOrderStats()
    for nest in program.nests:
        found = _matmul_nest(nest)
        if found is None:
            continue
        block = _row_block(nest, found, tensors, max_row_block)
        if block < 2:
            continue
        names = axis_names(nest)
        outer, (row, col, red) = names[:-3], names[-3:]
        schedule = [", ".join([*outer, f"floor({row}/{block})", col, red, f"{row} mod {block}", str(k)])
                    for k in range(len(nest.statements))]
        violation = first_reversed_dependence(nest, tensors, schedule)
        if violation is not None:
            _log(f"nest '{nest.name}' keeps its loop order: reordering reverses the {violation.kind} "
                 f"dependence {instance(nest, violation.source, violation.first[0])} -> "
                 f"{instance(nest, violation.sink, violation.first[1])} on '{violation.tensor}'")
            stats.nests_refused += 1
            continue
        row_name = nest.axes[-3].name
        _strip_mine(nest, block)
        nest.attributes[ROW_BLOCK] = str(block)
        _log(f"nest '{nest.name}': loop {row_name} in blocks of {block} row tiles, "
             f"order {', '.join(a.name for a in nest.axes)}")
        stats.nests_reordered += 1
        stats.row_block = max(stats.row_block, block)
    return stats


def _log(text: str) -> None:
    print(f"tile_order: {text}", file=sys.stderr)


def _uses(access: penguin_pb2.Access, var: str) -> bool:
    return any(term.var == var and term.coeff for start in access.starts for term in start.terms)


def _matmul_nest(nest: penguin_pb2.LoopNest) -> _Matmul | None:
    """The nest's shape when it is a dot's (…, i, j, k) nest: one matmul accumulating over the last
    axis k, whose stationary operand walks i and not j and whose moving operand walks j and not i."""
    if len(nest.axes) < 3 or requests_pipelining(nest):
        return None
    matmuls = [st for st in nest.statements if st.op == "matmul"]
    if len(matmuls) != 1:
        return None
    (mm,) = matmuls
    row, col, red = (axis.name for axis in nest.axes[-3:])
    if mm.attributes.get("accumulate_axis") != red or len(mm.inputs) != 2 or len(mm.outputs) != 1:
        return None
    stationary, moving = mm.inputs
    if not (_uses(stationary, row) and not _uses(stationary, col) and _uses(moving, col)
            and not _uses(moving, row)):
        return None
    if nest.axes[-3].extent < 2:
        return None
    return _Matmul(len(nest.axes) - 3, stationary, mm.outputs[0])


def _row_block(nest: penguin_pb2.LoopNest, found: _Matmul, tensors: dict[str, penguin_pb2.TensorDecl],
               largest: int) -> int:
    """R: the largest power of two within the limits the module docstring states, preferring one
    that divides the row tiles (1: no gain)."""
    psum = tensors[found.psum.tensor]
    stationary = tensors[found.stationary.tensor]
    psum_bytes = psum.block_shape[-1] * itemsize(psum.dtype)
    kept_bytes = nest.axes[-1].extent * stationary.block_shape[-1] * itemsize(stationary.dtype)
    psum_capacity = load_target().psum_bytes_per_partition
    block = 1
    while (block * 2 <= min(largest, nest.axes[found.row].extent)
           and block * 2 * psum_bytes * PSUM_SHARE <= psum_capacity
           and block * 2 * kept_bytes <= STATIONARY_BUDGET_BYTES):
        block *= 2
    extent = nest.axes[found.row].extent
    dividing = block
    while dividing > 2 and extent % dividing:
        dividing //= 2
    return dividing if extent % dividing == 0 else block


def _strip_mine(nest: penguin_pb2.LoopNest, block: int) -> None:
    """(…, i, j, k) -> (…, io, j, k, ii) with i = block·io + ii, guarded when block ∤ extent."""
    row, col, red = nest.axes[-3:]
    taken = {axis.name for axis in nest.axes}
    outer_name, inner_name = _fresh(f"{row.name}o", taken), _fresh(f"{row.name}i", taken)
    extent = row.extent
    outer = penguin_pb2.Axis(name=outer_name, extent=-(-extent // block))
    outer.attributes.update(row.attributes)
    inner = penguin_pb2.Axis(name=inner_name, extent=block)
    kept = [penguin_pb2.Axis(), penguin_pb2.Axis()]
    kept[0].CopyFrom(col)
    kept[1].CopyFrom(red)
    del nest.axes[-3:]
    nest.axes.extend([outer, *kept, inner])
    for st in nest.statements:
        for access in [*st.inputs, *st.outputs]:
            for start in access.starts:
                _substitute(start, row.name, outer_name, inner_name, block)
        for predicate in st.predicates:
            _substitute(predicate.expr, row.name, outer_name, inner_name, block)
        if extent % block:
            guard = st.predicates.add(relation=penguin_pb2.GE)  # block·io + ii <= extent − 1
            guard.expr.constant = extent - 1
            guard.expr.terms.add(var=outer_name, coeff=-block)
            guard.expr.terms.add(var=inner_name, coeff=-1)


def _substitute(expr: penguin_pb2.AffineExpr, name: str, outer: str, inner: str, block: int) -> None:
    """Replace name by block·outer + inner in `expr`."""
    coeff = sum(term.coeff for term in expr.terms if term.var == name)
    if not coeff:
        return
    kept = [(term.var, term.coeff) for term in expr.terms if term.var != name]
    del expr.terms[:]
    for var, c in [*kept, (outer, coeff * block), (inner, coeff)]:
        expr.terms.add(var=var, coeff=c)


def _fresh(name: str, taken: set[str]) -> str:
    while name in taken:
        name += "_"
    taken.add(name)
    return name
