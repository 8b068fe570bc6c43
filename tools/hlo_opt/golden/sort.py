"""The golden evaluator's sort: XLA's stable sort with any comparator, vectorised with numpy.

The comparator is an HLO computation on scalars; the evaluator runs it on whole arrays (a scalar
region), so asking it about a million pairs costs one numpy pass, not a million Python calls.
A sort of f32[1048576] as one merge sort asking the comparator pair by pair ran for minutes.

Two ways, the same result:
- a comparator that is one `compare` of a key's two parameters (LT or GT, the shape JAX and XLA's
  own tests write) is numpy's stable argsort of that key (GT: of the key's bitwise complement for
  integers, its negation for floats), unless a float key holds a NaN;
- any other comparator drives a quicksort whose every level partitions all unfinished segments
  of all rows at once around their middle elements (two comparator passes a level, about 2 log2 n
  levels: a million elements in a few seconds).
Both are stable: among elements the comparator calls equal, the earlier stays first.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ncc.schemas import hlo_pb2
from ncc.tools.hlo.hlo_types import root_of

# before(first, second): the comparator's verdicts for pairs of elements given by their flat
# indices (row * n + index) into the (rows, n) operands
Before = Callable[[np.ndarray, np.ndarray], np.ndarray]


def simple_key(comparator: hlo_pb2.HloComputationProto) -> tuple[int, bool] | None:
    """(operand, descending) when the comparator is compare(p[2i], p[2i+1]) LT or GT (either way
    round), i.e. a plain sort by operand i; None otherwise."""
    params = {i.id: i.parameter_number for i in comparator.instructions if i.opcode == "parameter"}
    root = root_of(comparator)
    if root.opcode != "compare" or root.comparison_direction not in ("LT", "GT") \
            or len(root.operand_ids) != 2:
        return None
    first, second = (params.get(i, -1) for i in root.operand_ids)
    if first < 0 or second < 0 or first // 2 != second // 2 or first == second:
        return None
    descending = root.comparison_direction == "GT"
    return first // 2, descending != (first > second)


def key_order(keys: np.ndarray, descending: bool) -> np.ndarray | None:
    """The stable order of each row of `keys` (rows, n) under < (descending: >), or None for float
    keys holding a NaN (no strict weak order: the merge sort asks the comparator instead)."""
    if keys.dtype.kind == "f":
        if np.isnan(keys).any():
            return None
        return np.argsort(-keys if descending else keys, axis=-1, kind="stable")
    if keys.dtype == bool:
        keys = keys.astype(np.uint8)
    return np.argsort(np.invert(keys) if descending else keys, axis=-1, kind="stable")


def partition_order(rows: int, n: int, before: Before) -> np.ndarray:
    """The stable order (rows, n) of a sort whose comparator is `before`, by a quicksort whose
    every level partitions all unfinished segments of all rows at once: each segment's middle
    element is its pivot, and its elements go, keeping their order, to the part before the pivot,
    the part equal to it (finished: stability keeps their order) or the part after it. About two
    comparator passes over the unfinished elements a level, some 2 log2(n) levels."""
    size = rows * n
    perm = np.arange(size, dtype=np.int64)          # position -> element (row * n + index)
    start = np.repeat(np.arange(rows, dtype=np.int64) * n, n)  # position -> its segment's bounds
    end = start + n
    while True:
        active = np.flatnonzero(end - start > 1)
        if not len(active):
            break
        first, last = start[active], end[active]
        pivot = perm[first + (last - first) // 2]
        mine = perm[active]
        kind = np.where(before(mine, pivot), 0, np.where(before(pivot, mine), 2, 1))
        # rank of each element among its segment's elements of its kind, and the kinds' counts
        is_head = np.r_[True, first[1:] != first[:-1]]
        heads = np.flatnonzero(is_head)
        seg = np.cumsum(is_head) - 1
        ranks, counts = [], []
        for k in range(3):
            mask = kind == k
            total = np.cumsum(mask)
            before_segment = np.where(heads > 0, total[heads - 1], 0)
            ranks.append(total - 1 - before_segment[seg])
            counts.append(np.add.reduceat(mask.astype(np.int64), heads))
        low, equal = counts[0][seg], counts[1][seg]
        place = first + np.where(kind == 0, ranks[0],
                                 np.where(kind == 1, low + ranks[1], low + equal + ranks[2]))
        perm[place] = mine
        # the part before and the part after are segments again; an equal part is done (each of
        # its elements a segment of one: stability keeps their order)
        start[place] = np.where(kind == 0, first, np.where(kind == 1, place, first + low + equal))
        end[place] = np.where(kind == 0, first + low, np.where(kind == 1, place + 1, last))
    return (perm % n).reshape(rows, n)
