"""rng-bit-generator: XLA:CPU's Threefry-2x32 and Philox-4x32 bits computed on the device.

The state is a run-time input, so nothing is precomputed: one loop nest on POOL does the whole
generator tile by tile in SBUF. Its statements make each element's counter (a u64 iota of the
element's row-major position plus the state's counter, broadcast from HBM), run the rounds with
integer add/xor/shift/and/multiply on tiles reused in place, and store the words where XLA puts
them (tools/hlo/rng_bits.py states the algorithm and the layout; this builds the same arithmetic):

  Threefry  u32 words; a rotation is two shifts and an or. For a 32-bit output the nest runs over
            the shape with its split dimension halved, and stores word w of counter (.., j, ..)
            to element (.., 2j + w, ..) of the output (a strided view); 64 bits: word 0 | word 1 << 32.
  Philox    the four words held in u64, so a 32x32->64 product is one u64 multiply; its high and
            low halves are a shift and a mask. The nest runs over the counters; word w of counter
            i goes to element 4i + w (a 64-bit output: words 2p, 2p + 1 joined to element 2i + p).

Narrow and signed outputs convert (keeping the low bits) before the store. The new state (the
counter advanced by the counters used; with u64[3], a 128-bit add) is a few small nests.

A mixin of Lowering (lower.py): its methods call the rest of the lowering through `self`.
"""

from __future__ import annotations

import numpy as np

from ncc.schemas import common_pb2, penguin_pb2
from ncc.tools.common import dtypes
from ncc.tools.common.affine import row_major_strides
from ncc.tools.hlo.hlo_types import ncc_dtype
from ncc.tools.hlo.rng_bits import (
    MASK32,
    PHILOX_KEY_STEPS,
    PHILOX_MULTIPLIERS,
    PHILOX_ROUNDS,
    RNG_THREE_FRY,
    THREEFRY_PARITY,
    THREEFRY_ROTATIONS,
    philox_counters,
    resolve,
    split_dimension,
    threefry_counters,
)
from ncc.tools.hlo2penguin.nest_builder import PARTITIONS, add_statement
from ncc.tools.hlo2penguin.values import POOL, SP, Splat, Value, broadcast_to, product
from ncc.tools.hlo2penguin.views import View

RNG_FREE_TILE = 512  # elements per partition in the generator's tiles (a dozen of them live at once)
U32, U64 = common_pb2.U32, common_pb2.U64
Access = penguin_pb2.Access


class RandomOps:
    def _rng_bit_generator(self, instr, state: Value) -> tuple[Value, Value]:
        """(the new state, the bits) of a verified rng-bit-generator of a u64[2] or u64[3] state."""
        bits_shape = instr.shape.tuple_shapes[1]
        shape = tuple(int(d) for d in bits_shape.dimensions)
        dtype = ncc_dtype(bits_shape.element_type)
        width = 8 if dtypes.itemsize(dtype) == 8 else 4
        count = product(shape)
        three_fry = resolve(instr.rng_algorithm) == RNG_THREE_FRY
        used = threefry_counters(shape, width) if three_fry else philox_counters(count, width)
        key, counter = self._state_word(state, 0, instr.name), self._state_word(state, 1, instr.name)
        if not count:
            bits: Value = Splat(0.0, dtype, shape)
        elif three_fry:
            bits = self._threefry(instr, key, counter, shape, dtype)
        else:  # u64[2]: the 128-bit counter's high half is the key (XLA reverses the state)
            high = self._state_word(state, 2, instr.name) if state.shape[0] >= 3 else key
            bits = self._philox(instr, key, counter, high, shape, dtype)
        return self._advance_state(instr, state, used), bits

    def _state_word(self, state: Value, k: int, source: str) -> Value:
        """state[k] as a scalar (shape ())."""
        return self._reshape_value(self._window(state, (k,), (k + 1,)), (), source)

    def _advance_state(self, instr, state: Value, used: int) -> Value:
        """The key kept, the counter (state[1], or the 128-bit state[1..2]) plus `used`."""
        n = state.shape[0]
        if used == 0:
            return state
        step = np.zeros(n, dtype=np.uint64)
        step[1] = used
        name = self.builder.hbm_tensor(f"{instr.name}.step", U64, (n,), penguin_pb2.CONSTANT, instr.name,
                                       data=dtypes.from_compute(step, U64).tobytes())
        added = self._synthetic(instr, "add", [state, View.whole(name, U64, (n,))], (n,), U64)
        if n == 2:
            return added
        low, old_low = self._window(added, (1,), (2,)), self._window(state, (1,), (2,))
        carry = self._synthetic(instr, "compare", [low, old_low], (1,), common_pb2.PRED,
                                comparison_direction="LT")
        bump = self._synthetic(instr, "convert", [carry], (1,), U64)
        high = self._synthetic(instr, "add", [self._window(state, (2,), (3,)), bump], (1,), U64)
        return self._join_columns(instr, self._window(added, (0,), (2,)), high)

    # ---- Threefry-2x32 ----------------------------------------------------------------------
    def _threefry(self, instr, key: Value, counter: Value, shape: tuple[int, ...], dtype: int) -> View:
        wide = dtypes.itemsize(dtype) == 8
        if wide:
            grid = _grid(product(shape))
        elif not shape:
            grid = (1,)
        else:
            d = split_dimension(shape)
            grid = shape[:d] + ((shape[d] + 1) // 2,) + shape[d + 1:]
        f = _Fused(self, instr, grid)
        ctr = f.op("add", f.index(), f.load(counter))
        x0 = f.copy(ctr, U32)
        x1 = f.copy(f.op("shift_right_logical", ctr, 32), U32)
        k = f.load(key)
        k0 = f.copy(k, U32)
        k1 = f.copy(f.op("shift_right_logical", k, 32), U32)
        k2 = f.op("xor", f.op("xor", k0, k1, out=f.tile(U32)), THREEFRY_PARITY)
        ks = (k0, k1, k2)
        f.op("add", x0, k0)
        f.op("add", x1, k1)
        spare = f.tile(U32)
        for block in range(5):
            for rotation in THREEFRY_ROTATIONS[block % 2]:
                f.op("add", x0, x1)
                f.op("shift_left", x1, rotation, out=spare)
                f.op("shift_right_logical", x1, 32 - rotation)
                f.op("or", x1, spare)
                f.op("xor", x1, x0)
            f.op("add", x0, ks[(block + 1) % 3])
            f.op("add", f.op("add", x1, ks[(block + 2) % 3]), block + 1)
        if wide:  # word 0 | word 1 << 32, one element per counter
            joined = f.op("shift_left", f.copy(x1, U64), 32)
            f.op("or", joined, f.copy(x0, U64))
            out = self._new_output(instr, (product(grid),), dtype)
            f.store(f.cast(joined, dtype), out.reshape(grid))
            return self._take(out, shape)
        if not shape:  # a scalar is word 0 of counter 0
            out = self._new_output(instr, (1,), dtype)
            f.store(f.cast(x0, dtype), out)
            return out.reshape(())
        d = split_dimension(shape)
        pairs = grid[:d + 1] + (2,) + grid[d + 1:]
        out = self._new_output(instr, pairs, dtype)
        for w, word in enumerate((x0, x1)):
            starts = tuple(w if k == d + 1 else 0 for k in range(len(pairs)))
            limits = tuple(w + 1 if k == d + 1 else n for k, n in enumerate(pairs))
            f.store(f.cast(word, dtype), out.slice(starts, limits, (1,) * len(pairs)).reshape(grid))
        even = shape[:d] + (2 * grid[d],) + shape[d + 1:]
        interleaved = out.reshape(even)
        if even == shape:
            return interleaved
        return interleaved.slice((0,) * len(shape), shape, (1,) * len(shape))

    # ---- Philox-4x32 ------------------------------------------------------------------------
    def _philox(self, instr, key: Value, low: Value, high: Value, shape: tuple[int, ...], dtype: int) -> View:
        wide = dtypes.itemsize(dtype) == 8
        count = product(shape)
        grid = _grid(philox_counters(count, 8 if wide else 4))
        f = _Fused(self, instr, grid)
        index = f.index()
        low_tile = f.load(low)
        lo = f.op("add", index, low_tile)  # the 128-bit counter + index: low half, then the carry
        carry = f.op("lt", lo, low_tile, out=low_tile)
        hi = f.op("add", carry, f.load(high))
        x = [f.op("and", lo, MASK32, out=f.tile(U64)), f.op("shift_right_logical", lo, 32),
             f.op("and", hi, MASK32, out=f.tile(U64)), f.op("shift_right_logical", hi, 32)]
        k = f.load(key)
        keys = [f.copy(k, U32), f.copy(f.op("shift_right_logical", k, 32), U32)]
        spare = f.tile(U64)
        for round_ in range(PHILOX_ROUNDS):
            f.op("multiply", x[0], PHILOX_MULTIPLIERS[0])  # x0 becomes product 0, x2 product 1
            f.op("multiply", x[2], PHILOX_MULTIPLIERS[1])
            word0 = f.op("xor", f.op("shift_right_logical", x[2], 32, out=spare), x[1])
            f.op("xor", word0, keys[0])
            word2 = f.op("xor", f.op("shift_right_logical", x[0], 32, out=x[1]), x[3])
            f.op("xor", word2, keys[1])
            word1, word3 = f.op("and", x[2], MASK32), f.op("and", x[0], MASK32)
            x, spare = [word0, word1, word2, word3], x[3]
            if round_ + 1 < PHILOX_ROUNDS:
                for j in range(2):
                    f.op("add", keys[j], PHILOX_KEY_STEPS[j])
        per_counter = 2 if wide else 4
        total = product(grid)
        out = self._new_output(instr, (total, per_counter), dtype)
        for w in range(per_counter):
            if wide:  # words 2w and 2w + 1 make one u64
                word = f.op("or", f.op("shift_left", x[2 * w + 1], 32), x[2 * w])
            else:
                word = x[w]
            column = out.slice((0, w), (total, w + 1), (1, 1)).reshape(grid)
            f.store(f.cast(word, dtype), column)
        return self._take(out, shape)

    def _take(self, out: View, shape: tuple[int, ...]) -> View:
        """The first elements of `out`, row-major, as an array of `shape`."""
        flat = out.reshape((product(out.shape),))
        return flat.slice((0,), (product(shape),), (1,)).reshape(shape)


def _grid(count: int) -> tuple[int, ...]:
    """The shape a nest over `count` counters runs on: (count,) up to a partition's worth, else
    about 128 rows of ceil(count / 128) (the few counters past `count` are computed and dropped)."""
    if count <= PARTITIONS:
        return (count,)
    cols = -(-count // PARTITIONS)
    return (-(-count // cols), cols)


class _Fused:
    """The one nest a generator runs in: SBUF tiles of its tiling, statements on POOL in order."""

    def __init__(self, lowering, instr, shape: tuple[int, ...]) -> None:
        self.lowering, self.name = lowering, instr.name
        self.tiling = lowering._tiling(shape, RNG_FREE_TILE)
        self.shape = shape
        self.nest = lowering.builder.nest(f"{instr.name}.bits", instr.name, self.tiling.axes(),
                                          lowering._attributes(instr))
        self.dtypes: dict[str, int] = {}
        self.count = 0

    def tile(self, dtype: int) -> Access:
        block = (1,) * (len(self.tiling.shape) - 2) + (PARTITIONS, self.tiling.free_tile)
        name = self.lowering.builder.tile(f"{self.name}.t", dtype, self.tiling.shape, block)
        self.dtypes[name] = dtype
        return self.tiling.box(name)

    def _emit(self, op: str, out: Access, inputs: list[Access], **kw) -> Access:
        self.count += 1
        add_statement(self.nest, f"s{self.count}", op, POOL, [out], inputs, **kw)
        return out

    def load(self, scalar: Value) -> Access:
        """A scalar (shape ()) repeated over the tile."""
        self.count += 1
        box = self.lowering._load(self.nest, self.tiling, broadcast_to(scalar, self.shape), self.name,
                                  self.count)
        self.dtypes[box.tensor] = scalar.dtype
        return box

    def op(self, func: str, a: Access, b: Access | int, out: Access | None = None) -> Access:
        """out = a func b, `b` a tile or an integer immediate; in place (out = a) unless told."""
        out = a if out is None else out
        if isinstance(b, int):
            return self._emit("tensor_scalar", out, [a], func=func, scalars=(float(b),))
        return self._emit("tensor_tensor", out, [a, b], func=func)

    def copy(self, a: Access, dtype: int) -> Access:
        """`a` converted to `dtype` (integers keep their low bits) in a new tile."""
        return self._emit("tensor_copy", self.tile(dtype), [a])

    def cast(self, a: Access, dtype: int) -> Access:
        return a if self.dtypes[a.tensor] == dtype else self.copy(a, dtype)

    def index(self) -> Access:
        """Each element's row-major position in the nest's shape, as u64: one iota per dimension
        (the tiling's shape has the elements in the same order) scaled by its stride and summed."""
        canon = self.tiling.shape
        total = None
        for d, stride in enumerate(row_major_strides(canon)):
            if canon[d] == 1:
                continue
            part = self._emit("iota", self.tile(U64), [], scalars=(0.0, 0.0, 0.0),
                              attributes={"iota_dimension": str(d)})
            if stride != 1:
                self.op("multiply", part, stride)
            total = part if total is None else self.op("add", total, part)
        if total is None:  # one element: position 0
            total = self._emit("iota", self.tile(U64), [], scalars=(0.0, 0.0, 0.0))
        return total

    def store(self, box: Access, target: View) -> None:
        view = self.lowering._canonical_view(target, self.tiling.shape, self.name)
        self.count += 1
        add_statement(self.nest, f"store{self.count}", "dma", SP,
                      [self.tiling.box(self.lowering.builder.view(view))], [box])
        self.lowering.produced.add(target.base)
