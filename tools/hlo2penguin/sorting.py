"""Sort and topk: a bitonic network of compare-and-select nests over strided views (stable, with a
carried position), and for small k a topk that selects the best k times with a pairwise tree.

A mixin of Lowering (lower.py): its methods call the rest of the lowering through `self`.
"""

from __future__ import annotations

import numpy as np

from ncc.schemas import common_pb2, hlo_pb2, penguin_pb2
from ncc.tools.common import dtypes
from ncc.tools.common.dtypes import is_float
from ncc.tools.common.errors import CompileError
from ncc.tools.common.numerics import total_order_key, total_order_of_bits
from ncc.tools.hlo.hlo_types import root_of
from ncc.tools.hlo2penguin.bit_layout import Layout
from ncc.tools.hlo2penguin.bit_layout import views as bit_views
from ncc.tools.hlo2penguin.nest_builder import ceil_div
from ncc.tools.hlo2penguin.tile_plan import best_plan, tile_count
from ncc.tools.hlo2penguin.values import FREE_TILE, Splat, Value, product
from ncc.tools.hlo2penguin.views import View

RELAYOUT_BITS = 12  # rows of 4096 elements or more may change bit layout (smaller ones tile whole)
RELAYOUT_GAIN = 4  # ... when the other layout needs this many times fewer tiles for a stage
TOPK_BY_SELECTION = 16  # up to this k, topk selects the best k times; beyond it, it sorts
# A sorting network's elementwise tile operations (network_cost); E306 beyond. Measured with
# --verify at load 4 on 2 cores, about 4.5 ms each: one row of 8,192 (3,396) 15 s, of 16,384
# (4,224) 20 s, of 65,536 (7,188) 38 s, of 1M (32,544) 217 s. The limit refuses what would take
# more than about 40 s there, and passes every sort of the random bench (at most 1,599).
SORT_MAX_TILE_OPS = 8_000
_NOT_COMPUTED = frozenset({"parameter", "constant", "tuple", "get-tuple-element"})  # a comparator's free ops
SIGNED_OF_WIDTH = {2: common_pb2.S16, 4: common_pb2.S32}  # the total-order keys of bf16/f16 and f32
_NUMPY_FLOAT = {common_pb2.F16: np.float16, common_pb2.F32: np.float32}


class SortOps:
    def _total_order_key(self, instr, x: Value) -> Value:
        """A float as its bits read as a signed integer with the magnitude bits of negatives
        flipped: integers in the order of IEEE 754's totalOrder (-NaN < -inf < ... < -0 < +0 <
        ... < +inf < +NaN), which XLA's TOTALORDER comparisons, JAX's sorts and top-k use (NaN
        sorts last, not anywhere). Flipping is its own inverse (_from_total_order_key).
        Integers are their own keys."""
        if not is_float(x.dtype):
            return x
        key_dtype = SIGNED_OF_WIDTH[dtypes.itemsize(x.dtype)]
        if isinstance(x, Splat):
            return Splat(float(_key_of_constant(x.value, x.dtype)), key_dtype, x.shape)
        return self._flip_negatives(instr, self._bitcast_convert(instr, x, x.shape, key_dtype))

    def _from_total_order_key(self, instr, key: Value, dtype: int) -> Value:
        """The float of dtype `dtype` whose _total_order_key is `key`."""
        if not is_float(dtype):
            return key
        return self._bitcast_convert(instr, self._flip_negatives(instr, key), key.shape, dtype)

    def _flip_negatives(self, instr, bits: Value) -> Value:
        """Negative integers with every bit but the sign flipped; the rest as they are."""
        kind, shape = bits.dtype, bits.shape
        magnitude = Splat(float((1 << (8 * dtypes.itemsize(kind) - 1)) - 1), kind, ())
        negative = self._synthetic(instr, "compare", [bits, Splat(0.0, kind, ())], shape, common_pb2.PRED,
                                   comparison_direction="LT")
        flipped = self._synthetic(instr, "xor", [bits, magnitude], shape, kind)
        return self._synthetic(instr, "select", [negative, flipped, bits], shape, kind)

    def _total_order_compare(self, instr, ops: list[Value], shape: tuple[int, ...],
                             into: View | None) -> Value:
        """compare(..., type=TOTALORDER) of floats: the same direction on their total-order keys."""
        plain = hlo_pb2.HloInstructionProto(name=instr.name, opcode="compare",
                                            comparison_direction=instr.comparison_direction)
        keys = [self._total_order_key(instr, op) for op in ops]
        return self._elementwise(plain, keys, shape, common_pb2.PRED, into)

    def _sort(self, instr, ops: list[Value]) -> Value:
        """Sort along `dimensions[0]` with the comparator computation, stably (ties keep their order).
        A comparator that compares one operand's elements after the same function of each
        (`_keyed_comparator`: JAX's sorts canonicalize NaN and -0 before a TOTALORDER compare)
        has that function applied once, before the network, and the network compares its values
        with one compare (on their total-order keys for a TOTALORDER compare of floats) instead
        of running the comparator's ops in every stage; the keys travel as one more operand,
        or, when the function is the identity, in place of the operand, converted back after."""
        comparator = self.computations[instr.called_computation_ids[0]]
        dimension = int(instr.dimensions[0])
        keyed = _keyed_comparator(comparator)
        root = root_of(comparator)
        identity = keyed is not None and keyed[1] == _parameter_id(comparator, 2 * keyed[0])
        in_place = identity and is_float(ops[keyed[0]].dtype) and root.comparison_type == "TOTALORDER"
        if identity and not in_place:
            keyed = None  # compare(a, b) itself: one op a comparison already, keys would add a copy
        if keyed is None:
            def less(first: list[Value], second: list[Value], shape: tuple[int, ...]) -> Value:
                args = [value for pair in zip(first, second, strict=True) for value in pair]
                (verdict,) = self._apply_reducer(comparator, args, shape)
                return verdict

            sorted_values = self._sort_network(instr, ops, dimension, less, _comparator_ops(comparator))
            return tuple(sorted_values) if len(ops) > 1 else sorted_values[0]
        operand, key_root = keyed
        key = self._key_values(comparator, key_root, 2 * operand, ops[operand])
        fields = {"comparison_direction": root.comparison_direction}
        if root.comparison_type == "TOTALORDER" and is_float(key.dtype):
            key = self._total_order_key(instr, key)  # a plain compare of these orders them
        elif root.comparison_type:
            fields["comparison_type"] = root.comparison_type

        def compare_keys(first: list[Value], second: list[Value], shape: tuple[int, ...]) -> Value:
            return self._synthetic(instr, "compare", [first[0], second[0]], shape, common_pb2.PRED, **fields)

        if in_place:
            moved = [key, *(op for k, op in enumerate(ops) if k != operand)]
            values = self._sort_network(instr, moved, dimension, compare_keys, 1)
            values.insert(operand, self._from_total_order_key(instr, values.pop(0), ops[operand].dtype))
        else:
            values = self._sort_network(instr, [key, *ops], dimension, compare_keys, 1)[1:]
        return tuple(values) if len(ops) > 1 else values[0]

    def _key_values(self, comparator: hlo_pb2.HloComputationProto, key_root: int, parameter: int,
                    operand: Value) -> Value:
        """The comparator's instructions that `key_root` depends on, applied to a whole operand bound
        to `parameter`."""
        cone = _cone(comparator, key_root)
        args: list[Value | None] = [None] * (parameter + 1)
        args[parameter] = operand
        values: dict[int, Value] = {}
        saved, self.region_shape = self.region_shape, operand.shape
        try:
            for op in comparator.instructions:
                if op.id in cone:
                    values[op.id] = self._instruction(op, [values[i] for i in op.operand_ids], args)
        finally:
            self.region_shape = saved
        return values[key_root]

    def _topk(self, instr, ops: list[Value]) -> Value:
        """The k largest (or smallest) along the last dimension, in order, with their indices (the
        lower index first among equals). Small k: k rounds of a pairwise (value, index) tree that
        finds the best, then masks it out; large k: a stable sort of (values, iota), cut to k."""
        dtype = ops[0].dtype
        operand = self._total_order_key(instr, ops[0])  # floats in total order: NaN is the largest
        rank, k = len(operand.shape), int(instr.k)
        index = self._iota(hlo_pb2.HloInstructionProto(name=f"{instr.name}.index", opcode="iota",
                                                       dimensions=[rank - 1]), operand.shape, common_pb2.S32)
        direction = "GT" if instr.largest else "LT"
        if k <= TOPK_BY_SELECTION or isinstance(operand, Splat):
            values, indices = self._topk_by_selection(instr, self._materialize(operand, instr.name)
                                                      if isinstance(operand, Splat) else operand, index, k,
                                                      direction)
        else:
            def less(first: list[Value], second: list[Value], shape: tuple[int, ...]) -> Value:
                return self._synthetic(instr, "compare", [first[0], second[0]], shape, common_pb2.PRED,
                                       comparison_direction=direction)

            rows = product(operand.shape[:-1])
            rounds, _ = _tournament(rows, operand.shape[-1], k, instr.name)
            values, indices = operand, index
            for chunk in rounds:
                values, indices = self._topk_round(instr, values, indices, k, chunk, less, direction)
            values, indices = self._sort_network(instr, [values, indices], rank - 1, less, 1)
            values, indices = self._cut(values, 0, k), self._cut(indices, 0, k)
        return self._from_total_order_key(instr, values, dtype), indices

    def _topk_round(self, instr, values: View, indices: View, k: int, chunk: int, less, direction: str
                    ) -> tuple[View, View]:
        """One round of a tournament: each row cut into chunks of `chunk` elements (the last padded
        with values that lose to every other, at positions after every real one), each chunk
        sorted by its own network (the chunks are rows of it: many rows, which tile well), and
        each chunk's first k kept. The k best of a row are among its chunks' k best, and the kept
        ones stay in chunk order, so equal values keep the lower index first."""
        *rows, n = values.shape
        count = ceil_div(n, chunk)
        if count * chunk != n:
            limits = np.iinfo(dtypes.storage_dtype(values.dtype))
            worst = float(limits.min if direction == "GT" else limits.max)
            edges = [(0, 0, 0)] * len(rows) + [(0, count * chunk - n, 0)]
            values = self._padded(values, Splat(worst, values.dtype, ()), edges, instr.name)
            indices = self._padded(indices, Splat(float(np.iinfo(np.int32).max), common_pb2.S32, ()), edges,
                                   instr.name)
        chunked = [self._reshape(self._materialize(v, instr.name) if isinstance(v, Splat) else v,
                                 (*rows, count, chunk), instr.name) for v in (values, indices)]
        best = self._sort_network(instr, chunked, len(rows) + 1, less, 1)
        return tuple(self._reshape(self._cut(v, 0, k), (*rows, count * k), instr.name) for v in best)

    def _topk_by_selection(self, instr, operand: View, index: View, k: int, direction: str) -> tuple:
        pred = common_pb2.PRED
        shape = operand.shape
        out_shape = (*shape[:-1], k)
        values_out, indices_out = (
            View.whole(self.builder.hbm_tensor(f"{instr.name}.top", dtype, out_shape, penguin_pb2.INTERNAL,
                                               instr.name), dtype, out_shape)
            for dtype in (operand.dtype, common_pb2.S32))

        def better(first: list[Value], second: list[Value], part: tuple[int, ...]) -> list[Value]:
            def op(opcode: str, operands: list[Value], **fields) -> Value:
                return self._synthetic(instr, opcode, operands, part, pred, **fields)

            wins = op("compare", first[:1] + second[:1], comparison_direction=direction)
            ties = op("compare", first[:1] + second[:1], comparison_direction="EQ")
            earlier = op("compare", [first[1], second[1]], comparison_direction="LT")
            take = op("or", [wins, op("and", [ties, earlier])])
            return [self._synthetic(instr, "select", [take, a, b], part, a.dtype) for a, b in
                    zip(first, second, strict=True)]

        # a taken element loses to every other: the worst value, and an index after every real one
        limits = np.iinfo(dtypes.storage_dtype(operand.dtype)) if not is_float(operand.dtype) else None
        worst = (-np.inf if direction == "GT" else np.inf) if limits is None else \
            float(limits.min if direction == "GT" else limits.max)
        exhausted = Splat(worst, operand.dtype, ())
        never = Splat(float(np.iinfo(np.int32).max), common_pb2.S32, ())
        remaining, positions = operand, index
        for taken in range(k):
            best_value, best_index = self._halving(instr, [remaining, positions], better)
            self._copy_into(best_value, self._cut(values_out, taken, taken + 1), instr.name)
            self._copy_into(best_index, self._cut(indices_out, taken, taken + 1), instr.name)
            if taken + 1 < k:
                spread = self._spread_column(best_index, shape)
                chosen = self._synthetic(instr, "compare", [positions, spread], shape, pred,
                                         comparison_direction="EQ")
                remaining = self._synthetic(instr, "select", [chosen, exhausted, remaining], shape,
                                            operand.dtype)
                positions = self._synthetic(instr, "select", [chosen, never, positions], shape,
                                            common_pb2.S32)
        return values_out, indices_out

    def _spread_column(self, column: View, shape: tuple[int, ...]) -> View:
        """A (kept..., 1) column repeated along the last dimension to `shape`."""
        return View(column.base, column.dtype, shape, (*column.strides[:-1], 0), column.offset)

    def _sort_network(self, instr, ops: list[Value], dim: int, less, comparisons: int) -> list[Value]:
        """A bitonic sorting network over `dim`, padded to a power of two N: log2(N) (log2(N) + 1) / 2
        compare-exchange stages, each elementwise on strided views of every operand (the pairs i and
        i xor j, ascending or descending by block). A position operand carried along marks padding
        (it sorts last) and breaks ties, so the sort is stable whatever the network does. Rows move
        between bit layouts (bit_layout.py) when a stage's parts tile far better in the other.
        `comparisons`: the elementwise ops one call of `less` emits (for the budget, E306)."""
        shape = ops[0].shape
        count = shape[dim]
        kept = [d for d in range(len(shape)) if d != dim]
        rows = product(tuple(shape[d] for d in kept))
        values = [self._materialize(op, instr.name) if isinstance(op, Splat) else op for op in ops]
        if count > 1:
            size = 1 << (count - 1).bit_length()
            _check_network_budget(instr.name, rows, count, len(ops), comparisons)
            flat = [self._as_rows(v, kept, [dim], (rows, count), instr.name) for v in values]
            flat = [self._padded(v, Splat(0.0, v.dtype, ()), [(0, 0, 0), (0, size - count, 0)], instr.name)
                    for v in flat]
            counter = hlo_pb2.HloInstructionProto(name=f"{instr.name}.position", opcode="iota",
                                                  dimensions=[1])
            flat.append(self._iota(counter, (rows, size), common_pb2.S32))
            bits = size.bit_length() - 1
            layout = Layout(bits)
            for block, distance, better in _schedule(rows, bits):
                if better != layout:
                    flat = [self._relayout(instr, view, layout, better) for view in flat]
                    layout = better
                flat = self._bitonic_stage(instr, flat, layout, block, distance, count, less)
            if layout.low:
                flat = [self._relayout(instr, view, layout, Layout(bits)) for view in flat]
            moved = (*(shape[d] for d in kept), count)
            back = tuple(int(d) for d in np.argsort((*kept, dim)))
            values = [self._reshape(self._cut(v, 0, count), moved, instr.name).transpose(back)
                      for v in flat[:-1]]
        return values

    def _relayout(self, instr, view: View, old: Layout, new: Layout) -> View:
        """The rows of `view` (stored in layout `old`) copied into a new tensor in layout `new`."""
        name = self.builder.hbm_tensor(f"{instr.name}.layout", view.dtype, view.shape, penguin_pb2.INTERNAL,
                                       instr.name)
        target = View.whole(name, view.dtype, view.shape)
        destination, source = bit_views([(target, new), (view, old)], {}, list(range(old.n)))
        self._copy_into(source, destination, instr.name)
        return target

    def _bitonic_stage(self, instr, flat: list[View], layout: Layout, block: int, distance: int, count: int,
                       less) -> list[View]:
        """One compare-exchange stage: element i (bit `distance` clear) pairs with i + distance;
        blocks of `block` elements alternate ascending and descending (all ascending in the last)."""
        rows, size = flat[0].shape
        pair_bit, direction_bit = distance.bit_length() - 1, block.bit_length() - 1
        directions = 1 if block == size else 2
        free = [b for b in range(layout.n) if b != pair_bit and (directions == 1 or b != direction_bit)]

        def part(view: View, direction: int, pair: int) -> View:
            fixed = {pair_bit: pair, **({direction_bit: direction} if directions == 2 else {})}
            return bit_views([(view, layout)], fixed, free)[0]

        fresh = []
        for view in flat:
            name = self.builder.hbm_tensor(f"{instr.name}.stage", view.dtype, (rows, size),
                                           penguin_pb2.INTERNAL, instr.name)
            fresh.append(View.whole(name, view.dtype, (rows, size)))
        for direction in range(directions):
            low = [part(view, direction, 0) for view in flat]
            high = [part(view, direction, 1) for view in flat]
            targets = [[part(view, direction, pair) for view in fresh] for pair in (0, 1)]
            # every nest of the stage walks its parts in one order, the one of fewest tiles (the
            # network owns these nests: no other nest's fusion or loops depend on their shape)
            best = best_plan(low[0].shape, [*targets[0], *targets[1], *low, *high], FREE_TILE)
            if best is not None:
                plan = best[1]
                low, high = [plan.apply(v) for v in low], [plan.apply(v) for v in high]
                targets = [[plan.apply(v) for v in written] for written in targets]
            shape = low[0].shape
            first, second = (high, low) if direction == 0 else (low, high)
            swap = self._before(instr, first, second, count, shape, less)
            for k, (view, a, b) in enumerate(zip(fresh, low, high, strict=True)):
                for pair, operands in ((0, [swap, b, a]), (1, [swap, a, b])):
                    self._synthetic(instr, "select", operands, shape, view.dtype, into=targets[pair][k])
        return fresh

    def _before(self, instr, first: list[View], second: list[View], count: int, shape: tuple[int, ...],
                less) -> Value:
        """Whether `first` must come before `second`: it is not padding, and the other is padding, or
        the comparator says so, or neither is less and it came first (stability)."""
        pred = common_pb2.PRED
        limit = Splat(float(count), common_pb2.S32, ())

        def op(opcode: str, operands: list[Value], **fields) -> Value:
            return self._synthetic(instr, opcode, operands, shape, pred, **fields)

        ahead = less(first[:-1], second[:-1], shape)
        behind = less(second[:-1], first[:-1], shape)
        earlier = op("compare", [first[-1], second[-1]], comparison_direction="LT")
        tie_break = op("and", [op("not", [behind]), earlier])
        ordered = op("or", [ahead, tie_break])
        if count & (count - 1) == 0:  # a power of two: the network holds no padding
            return ordered
        real_first = op("compare", [first[-1], limit], comparison_direction="LT")
        padding_second = op("compare", [second[-1], limit], comparison_direction="GE")
        return op("and", [real_first, op("or", [padding_second, ordered])])


def _cone(comparator: hlo_pb2.HloComputationProto, root: int) -> set[int]:
    """The ids of the instructions `root` depends on, itself included."""
    by_id = {op.id: op for op in comparator.instructions}
    cone, todo = set(), [root]
    while todo:
        current = todo.pop()
        if current not in cone:
            cone.add(current)
            todo.extend(by_id[current].operand_ids)
    return cone


def _parameter_id(comparator: hlo_pb2.HloComputationProto, number: int) -> int | None:
    return next((op.id for op in comparator.instructions
                 if op.opcode == "parameter" and op.parameter_number == number), None)


def _keyed_comparator(comparator: hlo_pb2.HloComputationProto) -> tuple[int, int] | None:
    """(k, the root of g's instructions on parameter 2k) when the comparator is
    compare(g(p[2k]), g(p[2k + 1])), LT or GT, for one function g of one parameter (the same
    instructions on either side, reading constants and that parameter only) and no other parameter
    read: then a < b exactly when g(a) compares below g(b), and g may run once per element."""
    by_id = {op.id: op for op in comparator.instructions}
    root = by_id.get(comparator.root_id)
    if root is None or root.opcode != "compare" or root.comparison_direction not in ("LT", "GT") \
            or len(root.operand_ids) != 2:
        return None
    left, right = root.operand_ids
    memo: dict[tuple[int, int], bool] = {}

    def same(a: int, b: int, number: int) -> bool:
        """Whether a (over parameter number) and b (over number + 1) are one function."""
        if (a, b) in memo:
            return memo[(a, b)]
        x, y = by_id[a], by_id[b]
        if x.opcode == "parameter" or y.opcode == "parameter":
            result = x.opcode == y.opcode == "parameter" and x.parameter_number == number \
                and y.parameter_number == number + 1
        else:
            result = len(x.operand_ids) == len(y.operand_ids) and _signature(x) == _signature(y) and \
                all(same(i, j, number) for i, j in zip(x.operand_ids, y.operand_ids, strict=True))
        memo[(a, b)] = result
        return result

    parameters = [by_id[i] for i in _cone(comparator, left) if by_id[i].opcode == "parameter"]
    if len(parameters) != 1 or parameters[0].parameter_number % 2:
        return None
    number = parameters[0].parameter_number
    if not same(left, right, number):
        return None
    return number // 2, left


def _signature(op: hlo_pb2.HloInstructionProto) -> bytes:
    """An instruction without its name, id and operands: equal for the same operation on the same
    kinds of values (opcode, shape, literal, attributes)."""
    bare = hlo_pb2.HloInstructionProto()
    bare.CopyFrom(op)
    for name in ("name", "id", "operand_ids", "metadata"):
        bare.ClearField(name)
    return bare.SerializeToString(deterministic=True)


def _comparator_ops(comparator: hlo_pb2.HloComputationProto) -> int:
    """The elementwise ops one application of `comparator` lowers to: one per computed instruction,
    seven for a TOTALORDER compare of floats (each side's total-order key: a compare, an xor and a
    select, what JAX's comparators all are)."""
    types = {op.id: op.shape.element_type for op in comparator.instructions}
    count = 0
    for op in comparator.instructions:
        if op.opcode in _NOT_COMPUTED:
            continue
        total_order = op.opcode == "compare" and op.comparison_type == "TOTALORDER" and \
            is_float(types.get(op.operand_ids[0], common_pb2.PRED))
        count += 7 if total_order else 1
    return max(1, count)


def _schedule(rows: int, bits: int) -> list[tuple[int, int, Layout]]:
    """The stages of the network over rows of 2^bits elements, in order: (block, distance, the
    layout the stage runs in), the layout switching where _better_layout says so."""
    stages, layout, size, block = [], Layout(bits), 1 << bits, 2
    while block <= size:
        distance = block // 2
        while distance >= 1:
            layout = _better_layout(layout, rows, block, distance)
            stages.append((block, distance, layout))
            distance //= 2
        block *= 2
    return stages


def network_cost(rows: int, count: int, operands: int, comparisons: int) -> tuple[int, int]:
    """(stages, tile operations) of the network sorting `rows` rows of `count` elements with
    `operands` operands and a comparator of `comparisons` elementwise ops: every elementwise op of
    every stage counted once per tile it steps through (what the lowering's instruction count, and
    each later job's time, follow). A stage runs one part per direction, each part
    2 x comparisons + 4 ops deciding the swap (3 more with padding), then a select into each half
    of each operand and of the carried position."""
    size = 1 << (count - 1).bit_length()
    per_part = 2 * comparisons + 4 + (3 if count != size else 0) + 2 * (operands + 1)
    stages = _schedule(rows, size.bit_length() - 1)
    steps = sum(_stage_tiles(layout, rows, block, distance) * (1 if block == size else 2)
                for block, distance, layout in stages)
    return len(stages), steps * per_part


def _check_network_budget(name: str, rows: int, count: int, operands: int, comparisons: int) -> None:
    """E306 when the network would take more than SORT_MAX_TILE_OPS tile operations, decided from
    the shapes before any of it is built."""
    stages, tile_ops = network_cost(rows, count, operands, comparisons)
    if tile_ops > SORT_MAX_TILE_OPS:
        row_word = "row" if rows == 1 else "rows"
        raise CompileError("E306", f"sort too large: '{name}' sorts {rows:,} {row_word} of {count:,} "
                                   f"elements as a bitonic network of {stages} stages, {tile_ops:,} "
                                   f"elementwise tile operations (limit {SORT_MAX_TILE_OPS:,}), which "
                                   f"would compile for minutes", name)


def _tournament(rows: int, count: int, k: int, name: str) -> tuple[list[int], int]:
    """The rounds of a top-k of `rows` rows of `count` elements (each round's chunk size, a power of
    two at least 2k, so that a round at least halves a row) before the final sort, and the tile
    operations of them all: the plan of fewest (network_cost, value and index operands), where
    one sort of the whole row is the plan of no rounds. A row of 32,000 by k = 50: chunks of
    1,024 in 256 rows, then a sort of 1,600, instead of one network over 8 rows of 32,768 (past
    the budget). E306 when even the cheapest plan passes SORT_MAX_TILE_OPS."""
    memo: dict[int, tuple[list[int], int]] = {}

    def best(n: int) -> tuple[list[int], int]:
        if n in memo:
            return memo[n]
        plan: tuple[list[int], int] = ([], network_cost(rows, n, 2, 1)[1]) if n > 1 else ([], 0)
        chunk = 1 << max(1, (2 * k - 1).bit_length())
        while chunk * 2 <= n:
            chunks = -(-n // chunk)
            rest, rest_cost = best(chunks * k)
            cost = network_cost(rows * chunks, chunk, 2, 1)[1] + rest_cost
            if cost < plan[1]:
                plan = ([chunk, *rest], cost)
            chunk *= 2
        memo[n] = plan
        return plan

    rounds, cost = best(count)
    if cost > SORT_MAX_TILE_OPS:
        raise CompileError("E306", f"top-k too large: '{name}' selects {k:,} of {count:,} elements in "
                                   f"{rows:,} rows with bitonic networks of {cost:,} elementwise tile "
                                   f"operations at best (limit {SORT_MAX_TILE_OPS:,}), which would compile "
                                   f"for minutes", name)
    return rounds, cost


def _stage_tiles(layout: Layout, rows: int, block: int, distance: int) -> int:
    """Tiles one nest of a stage's parts takes in `layout` (its best tiling plan)."""
    size = 1 << layout.n
    pair_bit, direction_bit = distance.bit_length() - 1, block.bit_length() - 1
    fixed = {pair_bit: 0, **({direction_bit: 0} if block < size else {})}
    free = [b for b in range(layout.n) if b not in fixed]
    (part,) = bit_views([(View.whole("x", 0, (rows, size)), layout)], fixed, free)
    best = best_plan(part.shape, [part], FREE_TILE)  # the stage writes parts strided alike
    return best[0] if best is not None else tile_count(part.shape, FREE_TILE)


def _better_layout(layout: Layout, rows: int, block: int, distance: int) -> Layout:
    """The layout a stage runs in: the current one, unless the other (the row in order, or its
    low half of bits on top) tiles its parts RELAYOUT_GAIN times better, which pays the copies."""
    if layout.n < RELAYOUT_BITS:
        return layout
    other = Layout(layout.n, 0 if layout.low else layout.n // 2)
    now = _stage_tiles(layout, rows, block, distance)
    return other if _stage_tiles(other, rows, block, distance) * RELAYOUT_GAIN <= now else layout


def _key_of_constant(value: float, dtype: int) -> int:
    """_total_order_key of one constant, computed here."""
    if dtype in _NUMPY_FLOAT:
        return int(total_order_key(np.array(value, dtype=_NUMPY_FLOAT[dtype])))
    # bf16: the top half of the f32 (a bf16 constant is exactly an f32)
    return int(total_order_of_bits(int(np.array(value, dtype=np.float32).view("<i4")) >> 16, 16))
