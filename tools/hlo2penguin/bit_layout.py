"""Bit layouts of a sorting network's rows: where element i of a row of 2^n lives, and the strided
views of a compare-exchange stage in a layout.

A bitonic stage pairs element i with i xor 2^j and picks its direction by bit k of i. As strided
views of a row stored in order, the elements of one (direction, pair) part are runs of 2^j
consecutive elements, then runs of bits j+1 .. k-1, then the bits above k: three dimensions, two
of which a 128 x 2048 tile can cover. At middling j and k all three are short (2^20 elements,
j = 6, k = 13: 64 x 64 x 64), and the stage's dozen nests are 64 tiles each instead of one.

A layout stores a row as a matrix transposed: the low `low` bits of the logical index become the
physical high bits (Layout(n, low)), so a stage whose pair and direction bits are low finds long
runs of consecutive elements again. Layout(n, 0) is the row in order. The network switches
layout (one transposing copy per operand) when the other layout needs far fewer tiles.
"""

from __future__ import annotations

from dataclasses import dataclass

from ncc.tools.hlo2penguin.views import View


@dataclass(frozen=True)
class Layout:
    """Rows of 2^n elements, logical bit b stored at physical bit `physical(b)`."""

    n: int
    low: int = 0  # logical bits below this go to the top of the physical index

    def physical(self, bit: int) -> int:
        return bit + self.n - self.low if bit < self.low else bit - self.low


def views(bases: list[tuple[View, Layout]], fixed: dict[int, int], free: list[int]) -> list[View]:
    """For each (rows x 2^n view, layout) of `bases`, the view of the elements whose logical bits in
    `fixed` hold the given values, over the logical bits in `free` (rows first). The views have
    the same dimensions, each a run of free bits consecutive in every layout, ordered by the
    first base's memory order, so elementwise nests over them walk its memory in order."""
    runs: list[list[int]] = []
    for bit in sorted(free):
        if runs and runs[-1][-1] == bit - 1 and all(
                layout.physical(bit) == layout.physical(bit - 1) + 1 for _, layout in bases):
            runs[-1].append(bit)
        else:
            runs.append([bit])
    first = bases[0][1]
    runs.sort(key=lambda run: -first.physical(run[0]))
    made = []
    for base, layout in bases:
        row_stride, step = base.strides
        offset = base.offset + sum(value * (step << layout.physical(bit)) for bit, value in fixed.items())
        shape = (base.shape[0], *(1 << len(run) for run in runs))
        strides = (row_stride, *(step << layout.physical(run[0]) for run in runs))
        made.append(View(base.base, base.dtype, shape, strides, offset))
    return made
