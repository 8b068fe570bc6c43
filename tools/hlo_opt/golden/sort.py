"""The golden evaluator's sort: XLA's stable sort with any comparator, vectorised with numpy.

The comparator is an HLO computation on scalars; the evaluator runs it on whole arrays (a scalar
region), so asking it about a million pairs costs one numpy pass, not a million Python calls.
A sort of f32[1048576] as one merge sort asking the comparator pair by pair ran for minutes.

Two ways, the same result:
- a comparator that is one `compare` of a key's two parameters (LT or GT, the shape JAX and XLA's
  own tests write) is numpy's stable argsort of that key (GT: of the key's bitwise complement for
  integers, its negation for floats), unless a float key holds a NaN;
- any other comparator drives a bottom-up merge sort whose every level is vectorised over all
  rows and runs: an element's place in the merged run is its place in its own run plus how many
  elements of the other run go before it, found by a binary search (log2 of the run length
  comparator passes per level, about 200 over a million elements).
Both are stable: among elements the comparator calls equal, the earlier stays first.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ncc.schemas import hlo_pb2

# before(first, second): comparator results for pairs given as (rows, m) positions into the rows
Before = Callable[[np.ndarray, np.ndarray], np.ndarray]


def simple_key(comparator: hlo_pb2.HloComputationProto) -> tuple[int, bool] | None:
    """(operand, descending) when the comparator is compare(p[2i], p[2i+1]) LT or GT (either way
    round), i.e. a plain sort by operand i; None otherwise."""
    params = {i.id: i.parameter_number for i in comparator.instructions if i.opcode == "parameter"}
    root = next(i for i in comparator.instructions if i.id == comparator.root_id)
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


def merge_order(rows: int, n: int, before: Before) -> np.ndarray:
    """The stable order (rows, n) of a sort whose comparator is `before`, by a vectorised
    bottom-up merge sort: each level merges runs of `width` pairwise, placing every element at its
    run start + its index in its run + the elements of the other run that go before it."""
    order = np.broadcast_to(np.arange(n, dtype=np.int64), (rows, n)).copy()
    index = np.arange(n, dtype=np.int64)
    width = 1
    while width < n:
        start = index // (2 * width) * (2 * width)
        in_left = index - start < width
        own = np.where(in_left, start, start + width)
        other = np.where(in_left, start + width, start)
        other_len = np.clip(np.minimum(other + width, n) - other, 0, None)
        low = np.zeros((rows, n), dtype=np.int64)
        high = np.broadcast_to(other_len, (rows, n)).copy()
        while (low < high).any():
            middle = (low + high) // 2
            probe = np.minimum(other + middle, n - 1)
            theirs = np.take_along_axis(order, probe, axis=1)
            # a left element counts the right ones strictly before it (it stays first among equals);
            # a right element counts the left ones not after it
            goes = np.where(in_left, before(theirs, order), ~before(order, theirs))
            active = low < high
            low = np.where(active & goes, middle + 1, low)
            high = np.where(active & ~goes, middle, high)
        merged = np.empty_like(order)
        np.put_along_axis(merged, start + (index - own) + low, order, axis=1)
        order = merged
        width *= 2
    return order
