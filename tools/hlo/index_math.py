"""Index arithmetic of the data-movement ops, shared by the golden evaluator and the lowering so
both place every element the same way: bitcast's physical orders, pad's placement of the operand,
and the clamping of dynamic-slice start indices."""

from __future__ import annotations

from collections.abc import Sequence


def physical_order(minor_to_major: Sequence[int], rank: int) -> list[int]:
    """The dimensions from major to minor (row-major order when the layout is absent)."""
    if not minor_to_major:
        return list(range(rank))
    return list(reversed(list(minor_to_major)))


def pad_placement(low: int, interior: int, size: int, extent: int) -> tuple[int, int]:
    """The operand elements [first, last) a padded dimension keeps: element i lands at
    low + i * (interior + 1), and only positions inside [0, extent) survive (negative padding crops)."""
    step = interior + 1
    first = min(size, max(0, -(low // step)))
    last = min(size, (extent - 1 - low) // step + 1) if extent - 1 - low >= 0 else 0
    return first, max(first, last)


def pad_target(low: int, interior: int, first: int, last: int) -> slice:
    """Where operand elements [first, last) of a padded dimension land in the result."""
    if last <= first:
        return slice(0, 0)
    step = interior + 1
    start = low + first * step
    return slice(start, start + (last - first - 1) * step + 1, step)


def clamped_starts(shape: Sequence[int], sizes: Sequence[int], starts: Sequence[object]) -> list[int]:
    """dynamic-slice start indices clamped, as XLA does, so the slice lies inside the operand."""
    bounds = zip(starts, shape, sizes, strict=True)
    return [min(max(int(start), 0), dim - size) for start, dim, size in bounds]
