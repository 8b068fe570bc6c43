"""Ops on the bits of a value: popcnt, count-leading-zeros and bitcast-convert.

The engines have no population-count or leading-zero instruction, so both are built from the
integer ops they do have, in the operand's own type (shifts are logical, so the sign bit is just a
bit): popcnt is the classic SWAR sum (pairs, nibbles, bytes, then one multiply gathers the byte
counts into the top byte); clz smears the highest set bit into every lower position and counts
what is set. bitcast-convert between types of one width is a dma that moves bytes without
converting them; across widths, the wide value is cut into (or assembled from) its little-endian
pieces with shifts, narrowing converts and ors.

A mixin of Lowering (lower.py): its methods call the rest of the lowering through `self`.
"""

from __future__ import annotations

import numpy as np

from ncc.schemas import common_pb2
from ncc.tools.common import dtypes
from ncc.tools.hlo2penguin.nest_builder import PARTITIONS, add_statement
from ncc.tools.hlo2penguin.values import SP, Splat, Value
from ncc.tools.hlo2penguin.views import View

BIT_COUNTS = frozenset({"popcnt", "count-leading-zeros"})
UNSIGNED_OF_WIDTH = {1: common_pb2.U8, 2: common_pb2.U16, 4: common_pb2.U32, 8: common_pb2.U64}


def _repeat_byte(byte: int, width: int) -> int:
    """`byte` repeated over `width` bytes (0x55 over 4 bytes is 0x55555555)."""
    return int.from_bytes(bytes([byte]) * width, "little")


class BitOps:
    def _bit_count(self, instr, x: Value, shape: tuple[int, ...], dtype: int) -> Value:
        width = dtypes.itemsize(dtype)

        def op(opcode: str, a: Value, b: Value | int) -> Value:
            if isinstance(b, int):
                b = self._scalar(b, dtype, shape, f"{instr.name}.k")
            return self._synthetic(instr, opcode, [a, b], shape, dtype)

        if instr.opcode == "count-leading-zeros":
            shift = 1
            while shift < 8 * width:
                x = op("or", x, op("shift-right-logical", x, shift))
                shift *= 2
        pairs = op("subtract", x, op("and", op("shift-right-logical", x, 1), _repeat_byte(0x55, width)))
        quads = op("add", op("and", pairs, _repeat_byte(0x33, width)),
                   op("and", op("shift-right-logical", pairs, 2), _repeat_byte(0x33, width)))
        count = op("and", op("add", quads, op("shift-right-logical", quads, 4)), _repeat_byte(0x0F, width))
        if width > 1:  # every byte's count summed into the top byte
            count = op("shift-right-logical", op("multiply", count, _repeat_byte(0x01, width)), 8 * width - 8)
        if instr.opcode == "count-leading-zeros":
            count = op("subtract", self._scalar(8 * width, dtype, shape, instr.name), count)
        return count

    def _bitcast_convert(self, instr, x: Value, shape: tuple[int, ...], dtype: int) -> Value:
        have, want = dtypes.itemsize(x.dtype), dtypes.itemsize(dtype)
        if have == want:
            return self._reinterpret(instr, x, dtype)
        if have > want:
            return self._split_bits(instr, x, shape, dtype)
        return self._join_bits(instr, x, shape, dtype)

    def _split_bits(self, instr, x: Value, shape: tuple[int, ...], dtype: int) -> Value:
        """A wide value into its little-endian pieces along a new last dimension."""
        have, want = dtypes.itemsize(x.dtype), dtypes.itemsize(dtype)
        wide, narrow = UNSIGNED_OF_WIDTH[have], UNSIGNED_OF_WIDTH[want]
        bits = self._reinterpret(instr, x, wide)
        out = self._new_output(instr, shape, dtype)
        for k in range(have // want):
            shifted = bits if k == 0 else self._synthetic(
                instr, "shift-right-logical", [bits, self._scalar(8 * want * k, wide, x.shape, instr.name)],
                x.shape, wide)
            starts = (0,) * (len(shape) - 1) + (k,)
            piece = out.slice(starts, shape[:-1] + (k + 1,), (1,) * len(shape)).reshape(x.shape)
            if dtype == narrow:
                self._synthetic(instr, "convert", [shifted], x.shape, narrow, into=piece)
            else:
                low = self._synthetic(instr, "convert", [shifted], x.shape, narrow)
                self._reinterpret(instr, low, dtype, into=piece)
        return out

    def _join_bits(self, instr, x: Value, shape: tuple[int, ...], dtype: int) -> Value:
        """Little-endian pieces along the last dimension assembled into one wide value."""
        have, want = dtypes.itemsize(x.dtype), dtypes.itemsize(dtype)
        narrow, wide = UNSIGNED_OF_WIDTH[have], UNSIGNED_OF_WIDTH[want]
        total = None
        for k in range(want // have):
            starts = (0,) * len(shape) + (k,)
            piece = self._reshape_value(self._window(x, starts, shape + (k + 1,)), shape, instr.name)
            bits = self._reinterpret(instr, piece, narrow)
            widened = self._synthetic(instr, "convert", [bits], shape, wide)
            if k:
                place = self._scalar(8 * have * k, wide, shape, instr.name)
                widened = self._synthetic(instr, "shift-left", [widened, place], shape, wide)
            total = widened if total is None else self._synthetic(instr, "or", [total, widened], shape, wide)
        return self._reinterpret(instr, total, dtype)

    def _reinterpret(self, instr, x: Value, dtype: int, into: View | None = None) -> Value:
        """`x`'s bytes read as `dtype` of the same width: one load dma into a tile of the new type."""
        if x.dtype == dtype:
            if into is not None:
                self._copy_into(x, into, instr.name)
                return into
            return x
        if isinstance(x, Splat):
            stored = dtypes.from_compute(np.asarray([x.value]), x.dtype)
            value = dtypes.to_compute(stored.view(dtypes.storage_dtype(dtype)), dtype)[0]
            folded = self._scalar(value, dtype, x.shape, instr.name)
            if into is not None:
                self._copy_into(folded, into, instr.name)
                return into
            return folded
        out = into if into is not None else self._new_output(instr, x.shape, dtype)
        tiling = self._tiling(x.shape)
        nest = self.builder.nest(f"{instr.name}.bits", instr.name, tiling.axes(), self._attributes(instr))
        tile = self.builder.tile(f"{instr.name}.bits", dtype, tiling.shape,
                                 (1,) * (len(tiling.shape) - 2) + (PARTITIONS, tiling.free_tile))
        view = self._canonical_view(x, tiling.shape, instr.name)
        add_statement(nest, "load0", "dma", SP, [tiling.box(tile)], [tiling.box(self.builder.view(view))])
        self._store(nest, tiling, tiling.box(tile), out, instr.name)
        return out
