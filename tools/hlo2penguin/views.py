"""Strided views of HBM tensors: how layout ops (reshape, broadcast, transpose, slice, reverse,
bitcast) become free.

A View names a materialized HBM tensor and reads it through an offset and per-dimension strides
(in elements). Broadcast is a stride of 0, transpose a permutation of strides, slice an offset and
scaled strides, reverse a negated stride, and reshape a re-striding when the elements stay in
row-major order. Only when no such re-striding exists does a layout op cost a copy.
"""

from __future__ import annotations

from dataclasses import dataclass

from ncc.tools.common.affine import row_major_strides


@dataclass(frozen=True)
class View:
    base: str
    dtype: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0

    @staticmethod
    def whole(base: str, dtype: int, shape: tuple[int, ...]) -> View:
        return View(base, dtype, tuple(shape), row_major_strides(tuple(shape)), 0)

    def is_whole(self, base_shape: tuple[int, ...]) -> bool:
        """True when this view reads every element of a base of `base_shape` in row-major order."""
        size = 1
        for dim in self.shape:
            size *= dim
        base_size = 1
        for dim in base_shape:
            base_size *= dim
        return self.offset == 0 and size == base_size and self.is_contiguous()

    def is_contiguous(self) -> bool:
        expected = row_major_strides(self.shape)
        return all(s == e for s, e, d in zip(self.strides, expected, self.shape, strict=True) if d != 1)

    def transpose(self, permutation: tuple[int, ...]) -> View:
        return View(
            self.base,
            self.dtype,
            tuple(self.shape[p] for p in permutation),
            tuple(self.strides[p] for p in permutation),
            self.offset,
        )

    def broadcast(self, shape: tuple[int, ...], dimensions: tuple[int, ...]) -> View:
        """Output dim dimensions[k] comes from operand dim k; every other output dim repeats."""
        strides = [0] * len(shape)
        for operand_dim, output_dim in enumerate(dimensions):
            if self.shape[operand_dim] != 1:
                strides[output_dim] = self.strides[operand_dim]
        return View(self.base, self.dtype, tuple(shape), tuple(strides), self.offset)

    def slice(self, starts: tuple[int, ...], limits: tuple[int, ...], steps: tuple[int, ...]) -> View:
        offset = self.offset + sum(s * st for s, st in zip(starts, self.strides, strict=True))
        shape = tuple(
            max(0, -(-(lim - s) // step)) for s, lim, step in zip(starts, limits, steps, strict=True)
        )
        strides = tuple(st * step for st, step in zip(self.strides, steps, strict=True))
        return View(self.base, self.dtype, shape, strides, offset)

    def reverse(self, dimensions: tuple[int, ...]) -> View:
        """Read `dimensions` backwards: start at their last element and step with negated strides."""
        offset, strides = self.offset, list(self.strides)
        for d in dimensions:
            if self.shape[d] > 0:
                offset += (self.shape[d] - 1) * strides[d]
                strides[d] = -strides[d]
        return View(self.base, self.dtype, self.shape, tuple(strides), offset)

    def reshape(self, shape: tuple[int, ...]) -> View | None:
        """Re-stride for a row-major reshape, or None when the elements cannot be re-strided."""
        strides = _nocopy_reshape_strides(self.shape, self.strides, tuple(shape))
        if strides is None:
            return None
        return View(self.base, self.dtype, tuple(shape), strides, self.offset)


def _nocopy_reshape_strides(
    old_shape: tuple[int, ...], old_strides: tuple[int, ...], new_shape: tuple[int, ...]
) -> tuple[int, ...] | None:
    """numpy's attempt_nocopy_reshape: strides for new_shape over the same elements, or None."""
    old = [(d, s) for d, s in zip(old_shape, old_strides, strict=True) if d != 1]
    new_strides = [0] * len(new_shape)
    new_dims = [(i, d) for i, d in enumerate(new_shape) if d != 1]
    oi = ni = 0
    while oi < len(old) and ni < len(new_dims):
        old_start, new_start = oi, ni
        old_size, new_size = old[oi][0], new_dims[ni][1]
        while old_size != new_size:
            if old_size < new_size:
                oi += 1
                if oi >= len(old):
                    return None
                old_size *= old[oi][0]
            else:
                ni += 1
                if ni >= len(new_dims):
                    return None
                new_size *= new_dims[ni][1]
        for k in range(old_start, oi):
            if old[k][1] != old[k + 1][0] * old[k + 1][1]:
                return None  # the merged old dims are not contiguous with each other
        stride = old[oi][1]
        for k in range(ni, new_start - 1, -1):
            index, size = new_dims[k]
            new_strides[index] = stride
            stride *= size
        oi += 1
        ni += 1
    if oi != len(old) or ni != len(new_dims):
        return None
    return tuple(new_strides)
