"""A transpose of a dot's result folded into the dot: transpose(dot(a, b)) becomes a dot of the
operands, transposed (views in the lowering, no copy), whose result is already in that order.

The lowering puts a dot's lhs free dimensions across the partitions of its product tiles and the
rhs free dimensions along each tile's row, and stores the product in the dot's own order. JAX
writes a grouped-query attention's scores (the LLaMA layer) as dot(k, q), [.., keys, queries,
group], and then transposes them to [.., group, queries, keys]: the product tiles held the keys
across partitions, and the softmax over keys (a nest of its own) read each row of scores across
the stored product's strides, in many small transfers. Computed as dot(q, k), with the group an
axis of the dot's nest of its own (the lowering's row groups, `Lowering._dot`), each product tile
holds one group's queries by their keys, the softmax joins the scores' nest (`epilogues`) and
the f32 scores never go to HBM: the LLaMA prefill 25,245.4 -> 23,163.2 us (folded alone,
24,199.3), its cut 46.1 -> 35.7 us. XLA's algebraic simplifier makes the same rewrite.

Where: the transpose is the dot's only reader; its permutation keeps the dot's batch dimensions
first, in their order; the rest is the free dimensions of one operand (in any order) followed by
those of the other (in any order); and the new dot's product tiles fill as many partitions as the
old ones did, up to 128 (a decode step's scores, one query a head against the cache, are better
with the cache's keys across the partitions: llama_decode_cut 37.5 -> 38.9 us folded). The new
dot's lhs is the operand whose free dimensions come first, transposed to [batch..., its free
dimensions in their output order, contracting...], its rhs the other likewise (an operand
already in that order is read as it is), the contracting dimensions paired as before. It takes
over the transpose's id, name and shape, so the transpose's users and the root need no change,
and the old dot goes. Values: the same products summed over the same contraction (the backend
may add them in another order, within rounding).
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

import numpy as np

from ncc.schemas import hlo_pb2
from ncc.tools.hlo.hlo_types import dims
from ncc.tools.hlo2penguin.hlo_edit import HloEditor

Instr = hlo_pb2.HloInstructionProto
PARTITIONS = 128  # the rows of a product tile


class _Operand(NamedTuple):
    source: int  # which operand of the old dot: 0 lhs, 1 rhs
    batch: list[int]
    contracting: list[int]
    free: list[int]  # in the order the transpose puts them


def fold_transposes(module: hlo_pb2.HloModuleProto) -> hlo_pb2.HloModuleProto:
    """`module` itself when no transpose of a dot folds, else a copy with each folded."""
    found = [_foldable(comp) for comp in module.computations]  # by instruction id: the same in a copy
    if not any(found):
        return module
    folded = hlo_pb2.HloModuleProto()
    folded.CopyFrom(module)
    editor = HloEditor(folded)
    for comp, transposes in zip(folded.computations, found, strict=True):
        if transposes:
            _rewrite(comp, transposes, editor)
    return folded


def _foldable(comp: hlo_pb2.HloComputationProto) -> dict[int, tuple[_Operand, _Operand]]:
    """Transpose id -> the new dot's (lhs, rhs) as parts of the old dot's operands, for the
    transposes of `comp` that fold (module docstring)."""
    by_id = {i.id: i for i in comp.instructions}
    readers: dict[int, int] = defaultdict(int)
    for instr in comp.instructions:
        for operand in instr.operand_ids:
            readers[operand] += 1
    readers[comp.root_id] += 1
    found = {}
    for instr in comp.instructions:
        if instr.opcode != "transpose":
            continue
        dot = by_id.get(instr.operand_ids[0])
        if dot is None or dot.opcode != "dot" or readers[dot.id] != 1:
            continue
        order = _new_order(dot, list(instr.dimensions), by_id)
        if order is not None:
            found[instr.id] = order
    return found


def _new_order(dot: Instr, permutation: list[int],
               by_id: dict[int, Instr]) -> tuple[_Operand, _Operand] | None:
    numbers = dot.dot_dimension_numbers
    lhs_rank, rhs_rank = (len(dims(by_id[i].shape)) for i in dot.operand_ids[:2])
    lhs_batch, rhs_batch = list(numbers.lhs_batch_dimensions), list(numbers.rhs_batch_dimensions)
    lhs_contracting = list(numbers.lhs_contracting_dimensions)
    rhs_contracting = list(numbers.rhs_contracting_dimensions)
    lhs_free = [d for d in range(lhs_rank) if d not in lhs_batch + lhs_contracting]
    rhs_free = [d for d in range(rhs_rank) if d not in rhs_batch + rhs_contracting]
    batch = len(lhs_batch)
    # the dot's output dimensions: batch, then lhs free, then rhs free, each the operand dimension
    owner = [("batch", d) for d in range(batch)]
    owner += [("lhs", d) for d in lhs_free] + [("rhs", d) for d in rhs_free]
    if permutation[:batch] != list(range(batch)) or permutation == sorted(permutation):
        return None
    rest = [owner[p] for p in permutation[batch:]]
    sides = [side for side, _ in rest]
    first = sides[0] if sides else "lhs"
    split = sides.count(first)
    if any(side != first for side in sides[:split]):
        return None
    lhs = _Operand(0, lhs_batch, lhs_contracting, [d for side, d in rest if side == "lhs"])
    rhs = _Operand(1, rhs_batch, rhs_contracting, [d for side, d in rest if side == "rhs"])
    new_lhs = lhs if first == "lhs" else rhs
    rows = [_extent(by_id[dot.operand_ids[part.source]], part.free) for part in (lhs, new_lhs)]
    if rows[1] < min(PARTITIONS, rows[0]):
        return None  # the new product tiles would hold fewer rows (a decode step's one query)
    return (lhs, rhs) if first == "lhs" else (rhs, lhs)


def _extent(operand: Instr, dimensions: list[int]) -> int:
    return int(np.prod([dims(operand.shape)[d] for d in dimensions], dtype=np.int64))


def _rewrite(comp: hlo_pb2.HloComputationProto, found: dict[int, tuple[_Operand, _Operand]],
             editor: HloEditor) -> None:
    by_id = {i.id: i for i in comp.instructions}
    dots = {by_id[t].operand_ids[0]: t for t in found}
    rewritten: list[Instr] = []
    for instr in comp.instructions:
        if instr.id in dots:
            continue  # its transpose, now the dot, comes later in the order
        if instr.id not in found:
            rewritten.append(instr)
            continue
        dot = by_id[instr.operand_ids[0]]
        editor.out, editor.base = rewritten, instr.name
        parts = found[instr.id]
        operands = [_ordered(editor, by_id[dot.operand_ids[part.source]], part) for part in parts]
        new = editor.emit("dot", instr.shape, operands)
        operand_ids = list(new.operand_ids)
        new.CopyFrom(dot)  # precision, metadata and the rest as the dot had them
        new.id, new.name = instr.id, instr.name  # the transpose's users and the root keep pointing at it
        new.shape.CopyFrom(instr.shape)
        del new.operand_ids[:]
        new.operand_ids.extend(operand_ids)
        numbers = new.dot_dimension_numbers
        numbers.Clear()
        batch = len(parts[0].batch)
        for side, part in zip(("lhs", "rhs"), parts, strict=True):
            getattr(numbers, f"{side}_batch_dimensions").extend(range(batch))
            start = batch + len(part.free)
            contracting = range(start, start + len(part.contracting))
            getattr(numbers, f"{side}_contracting_dimensions").extend(contracting)
    del comp.instructions[:]
    comp.instructions.extend(rewritten)


def _ordered(editor: HloEditor, source: Instr, part: _Operand) -> Instr:
    """`source` transposed to [batch..., free..., contracting...] as `part` orders them."""
    permutation = [*part.batch, *part.free, *part.contracting]
    if permutation == list(range(len(permutation))):
        return source
    sizes = [dims(source.shape)[d] for d in permutation]
    return editor.array("transpose", source.shape.element_type, sizes, [source], dimensions=permutation)
