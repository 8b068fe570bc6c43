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


def window_output_size(size: int, window: int, stride: int, low: int, high: int, window_dilation: int,
                       base_dilation: int) -> int:
    """Positions of a (dilated) window sliding over a (dilated, padded) dimension (XLA's rule)."""
    dilated_base = (size - 1) * base_dilation + 1 if size else 0
    padded = dilated_base + low + high
    dilated_window = (window - 1) * window_dilation + 1
    return max(0, (padded - dilated_window) // stride + 1) if padded >= dilated_window else 0


def window_slices(offset: Sequence[int], window: Sequence[object], sizes: Sequence[int]) -> list[slice]:
    """Where window element `offset` sits for every output position: per dimension, the input
    positions offset * window_dilation + i * stride for i < size (`window` holds WindowDimensions)."""
    slices = []
    for o, dim, n in zip(offset, window, sizes, strict=True):
        start = o * dim.window_dilation
        slices.append(slice(start, start + (n - 1) * dim.stride + 1, dim.stride))
    return slices


def gather_batch_shape(indices_shape: Sequence[int], index_vector_dim: int) -> list[int]:
    """The batch dimensions of a gather: the indices' dimensions without the index vector one."""
    return [n for d, n in enumerate(indices_shape) if d != index_vector_dim]


def gather_output_order(offset_dims: Sequence[int], batch_rank: int, out_rank: int) -> list[int]:
    """For each output dimension, the dimension of (batch dims..., slice dims...) it comes from:
    slice dims sit at `offset_dims`, batch dims fill the other positions in order."""
    order, batch, offsets = [], 0, sorted(offset_dims)
    for position in range(out_rank):
        if position in offsets:
            order.append(batch_rank + offsets.index(position))
        else:
            order.append(batch)
            batch += 1
    return order
