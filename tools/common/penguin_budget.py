"""The instruction budget of a Penguin program: count what it would unroll to, refuse too much (E302).

Before unrolling, the instructions a program would unroll to are counted from the nests' extents
and predicates (no unrolling): `instruction_count` gives the BIR instructions the frontend writes,
`backend_instruction_count` the instructions the backend will hold once split_dma has cut every
large tile DMA into pieces (tools/target.dma_pieces, the rule split_dma applies; up to 8 per
DMA, DMA_SPLIT_MAX_EXTRA more pieces than dmas in all; where the DMA queues are the program's
bound split_dma cuts fewer, so this is then a bound). A program of more than MAX_INSTRUCTIONS
backend instructions, or whose nests have more than MAX_INSTRUCTIONS iteration points in all, is
refused with E302 naming the largest nest and the HLO
instruction it came from. The first job checks only what the Penguin optimizer cannot remove
(`surviving`: the dmas of HBM intermediates left out, since fusion keeps those on chip), and the
Frontend job checks the exact count after its passes, before it unrolls. A legal HLO shape (up
to 16 GiB per array) could otherwise unroll to billions of instructions and run the compiler out
of time and memory. The limit follows the
backend's cost, measured here (`make bench-scale` and generated MLPs): an elementwise chain costs
about 0.3 ms of CPU and 6 KB of peak memory per backend instruction (677k: 227 s, 4.2 GB); a
spill-heavy matmul program (an MLP at D = 8192) about 0.8 ms and 12 KB. So 1M backend
instructions keeps a compile within about 5 to 13 minutes and 6 to 12 GB on a 2-core, 24 GB
machine.
"""

from __future__ import annotations

import itertools
import math

from ncc.schemas import common_pb2, penguin_pb2
from ncc.tools.common import affine
from ncc.tools.common.access_keys import box_key, view_key
from ncc.tools.common.dtypes import itemsize
from ncc.tools.common.errors import CompileError
from ncc.tools.target import DMA_SPLIT_MAX_EXTRA, dma_pieces

MAX_INSTRUCTIONS = 1_000_000  # backend instructions; E302 beyond this (the budget documented above)
# `--loops auto` keeps loops rolled in a program (and a while loop as a loop) that would unroll to
# at least this many backend instructions, and unrolls a smaller one: there the backend's list
# scheduler, free to interleave every tile, is worth the compile time, which is a few seconds at
# most (docs/architecture.md).
AUTO_ROLL_ABOVE = 20_000
_ENUMERATE_LIMIT = 1 << 16     # predicates coupling several axes are counted by enumeration up to this


def instruction_count(program: penguin_pb2.Program) -> tuple[int, int, penguin_pb2.LoopNest | None, int]:
    """(instructions, iteration points, the nest with most instructions, its count), unrolling nothing.

    Exact for predicates on one axis each (all the lowering writes); for predicates that couple axes
    over more than _ENUMERATE_LIMIT points, an upper bound. Clipped-away empty boxes count too. A
    Repeat region (a while loop kept as a loop) counts its nests once and its `loop` entry.
    """
    total, points, largest_count = len(program.repeats), 0, 0
    largest = None
    tensors = {t.name: t for t in program.tensors}
    for nest in program.nests:
        points += math.prod(max(0, int(axis.extent)) for axis in nest.axes)
        count = nest_instructions(nest, tensors)
        total += count
        if largest is None or count > largest_count:
            largest, largest_count = nest, count
    return total, points, largest, largest_count


def nest_instructions(nest: penguin_pb2.LoopNest, tensors: dict) -> int:
    """The BIR instructions one nest unrolls to (instruction_count's term for it): one per point of
    each statement, two for a row broadcast (the row's load and its spread over the partitions)."""
    extents = {axis.name: max(0, int(axis.extent)) for axis in nest.axes}
    return sum(_statement_points(nest, st, extents) * (1 + _row_broadcast(st, tensors))
               for st in nest.statements)


def backend_instruction_count(program: penguin_pb2.Program, surviving: bool = False,
                              ) -> tuple[int, penguin_pb2.LoopNest | None, int]:
    """(backend instructions, the nest with most of them, its count): instruction_count with every
    dma statement counted as the pieces split_dma will cut it into (its full block: a bound), the
    nests' extra pieces spent in program order up to DMA_SPLIT_MAX_EXTRA, as split_dma spends them
    (at most: it also keeps dmas outside loops whole where the queues have no slack for pieces).

    `surviving`: count only what the Penguin optimizer cannot remove, a lower bound of what the
    backend will hold, for the check before the optimizer has run: the dmas of intermediates in
    HBM are left out (fusion keeps those on chip), and a load of a module input or constant counts
    once however many nests repeat it with the same view and box (fused, cse loads it once)."""
    tensors = {t.name: t for t in program.tensors}
    largest_count = 0
    largest = None
    seen_loads: set[tuple] | None = set() if surviving else None
    all_whole = all_extra = 0
    for nest in program.nests:
        whole, extra = nest_backend_instructions(nest, tensors, seen_loads)
        count = whole + min(extra, max(0, DMA_SPLIT_MAX_EXTRA - all_extra))  # pieces left for it
        all_whole, all_extra = all_whole + whole, all_extra + extra
        if largest is None or count > largest_count:
            largest, largest_count = nest, count
    return with_pieces(all_whole + len(program.repeats), all_extra), largest, largest_count


def nest_backend_instructions(nest: penguin_pb2.LoopNest, tensors: dict,
                              seen_loads: set[tuple] | None = None) -> tuple[int, int]:
    """(instructions with every dma whole, the extra pieces split_dma's size rule would cut its
    dmas into) for one nest; with `seen_loads`, only what survives the Penguin optimizer, given the
    loads counted already."""
    extents = {axis.name: max(0, int(axis.extent)) for axis in nest.axes}
    whole = extra = 0
    for st in nest.statements:
        if seen_loads is not None and not _survives(nest, st, tensors, seen_loads):
            continue
        points = _statement_points(nest, st, extents)
        if st.op != "dma":
            whole += points
            continue
        whole += points * (1 + _row_broadcast(st, tensors))
        extra += points * (_dma_pieces(st, tensors) - 1)
    return whole, extra


def with_pieces(whole: int, extra: int) -> int:
    """Backend instructions of a program with `whole` instructions counting each dma once and
    `extra` more pieces by the size rule: split_dma cuts no more than DMA_SPLIT_MAX_EXTRA of them."""
    return whole + min(extra, DMA_SPLIT_MAX_EXTRA)


def _survives(nest: penguin_pb2.LoopNest, st: penguin_pb2.Statement, tensors: dict,
              seen_loads: set[tuple]) -> bool:
    """Whether the optimizer must keep `st`: not a dma of an HBM intermediate, nor a load (of an
    input or constant) that an earlier nest makes with the same view and box."""
    if st.op != "dma":
        return True
    if any(_internal_hbm(access.tensor, tensors) for access in [*st.inputs, *st.outputs]):
        return False
    source = st.inputs[0] if st.inputs else None
    if st.predicates or source is None or source.tensor not in tensors \
            or tensors[source.tensor].memory != common_pb2.HBM:
        return True
    position = {axis.name: f"#{k}" for k, axis in enumerate(nest.axes)}  # names differ between nests
    extents = tuple(axis.extent for axis in nest.axes)
    key = (view_key(tensors[source.tensor]), box_key(source, position), extents)
    if key in seen_loads:
        return False
    seen_loads.add(key)
    return True


def _dma_pieces(st: penguin_pb2.Statement, tensors: dict) -> int:
    """1, or for a dma between HBM and chip the pieces split_dma's size rule makes of its on-chip box."""
    if st.op != "dma":
        return 1
    for access in [*st.inputs, *st.outputs]:
        tensor = tensors.get(access.tensor)
        if tensor is None or tensor.memory == common_pb2.HBM or len(access.extents) < 2:
            continue
        partitions = int(access.extents[-2])
        elements = math.prod(int(e) for e in access.extents)
        return dma_pieces(partitions, elements * itemsize(tensor.dtype))
    return 1


def _row_broadcast(st: penguin_pb2.Statement, tensors: dict) -> int:
    """1 for a load whose HBM view repeats its rows across the partitions (stride 0), else 0:
    bir_codegen reads such a row once and spreads it on chip (two instructions)."""
    if st.op != "dma" or not st.inputs:
        return 0
    source = tensors.get(st.inputs[0].tensor)
    if source is None or source.memory != common_pb2.HBM or len(source.view_strides) < 2:
        return 0
    return int(source.view_strides[-2] == 0)


def _internal_hbm(name: str, tensors: dict) -> bool:
    tensor = tensors.get(name)
    if tensor is None or tensor.memory != common_pb2.HBM:
        return False
    base = tensors.get(tensor.view_of, tensor) if tensor.view_of else tensor
    return base.role == penguin_pb2.INTERNAL


def _statement_points(nest: penguin_pb2.LoopNest, st: penguin_pb2.Statement, extents: dict[str, int]) -> int:
    """How many iteration points of `nest` satisfy the predicates of `st`."""
    if not st.predicates:  # most statements: every point (the fuzzed scatters count 677k of them)
        return math.prod(extents.values())
    ranges = {name: [0, extent - 1] for name, extent in extents.items()}  # inclusive bounds per axis
    coupled: list[penguin_pb2.Predicate] = []
    for predicate in st.predicates:
        if predicate.relation not in (penguin_pb2.EQ, penguin_pb2.GE):
            raise CompileError("E301", f"statement '{st.name}' of nest '{nest.name}' has a predicate with an "
                                       f"unknown relation {predicate.relation}", st.name)
        for term in predicate.expr.terms:
            if term.var not in extents:
                raise CompileError("E301", f"a predicate of statement '{st.name}' uses '{term.var}', which "
                                           f"is not an axis of nest '{nest.name}'", st.name)
        terms = [term for term in predicate.expr.terms if term.coeff != 0]
        k = predicate.expr.constant
        if not terms:
            if not affine.holds(predicate, {}):
                return 0
        elif len(terms) == 1:
            var, c = terms[0].var, terms[0].coeff
            bounds = ranges[var]
            if predicate.relation == penguin_pb2.EQ:  # c·v + k == 0
                if k % c:
                    return 0
                bounds[0], bounds[1] = max(bounds[0], -k // c), min(bounds[1], -k // c)
            elif c > 0:  # v >= ceil(-k / c)
                bounds[0] = max(bounds[0], -(k // c))
            else:  # v <= floor(k / -c)
                bounds[1] = min(bounds[1], k // -c)
        else:
            coupled.append(predicate)
    sizes = {name: max(0, hi - lo + 1) for name, (lo, hi) in ranges.items()}
    count = math.prod(sizes.values())
    names = sorted({term.var for p in coupled for term in p.expr.terms if term.coeff != 0})
    subspace = math.prod(sizes[name] for name in names)
    if count == 0 or not coupled or subspace > _ENUMERATE_LIMIT:
        return count
    hits = sum(
        all(affine.holds(p, dict(zip(names, point, strict=True))) for p in coupled)
        for point in itertools.product(*(range(ranges[n][0], ranges[n][1] + 1) for n in names))
    )
    return count // subspace * hits


def check_budget(program: penguin_pb2.Program, limit: int = MAX_INSTRUCTIONS, surviving: bool = False) -> int:
    """The program's BIR instruction count; E302 when its backend instructions, or its iteration
    space, exceed `limit`. `surviving` (before the Penguin optimizer runs): only what it cannot remove
    counts, and the exact check comes again after it, before unrolling."""
    total, points, _, _ = instruction_count(program)
    backend, largest, largest_count = backend_instruction_count(program, surviving=surviving)
    if backend > limit or points > limit:
        where = largest.source or largest.name if largest is not None else program.name
        what = f"{backend:,} backend instructions" if backend > limit else f"{points:,} loop iterations"
        raise CompileError("E302", f"program too large: {what} (limit {limit:,}); the largest nest, from "
                                   f"HLO instruction '{where}', unrolls to {largest_count:,} instructions",
                           where)
    return total
