"""Padding and windowed ops: pad as a fill plus a strided copy, convolution as im2col (a strided
view) into one dot per feature group, reduce-window as the reducer folded over window offsets,
select-and-scatter as a selection walk over the offsets then one masked update per offset.

A mixin of Lowering (lower.py): its methods call the rest of the lowering through `self`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ncc.schemas import common_pb2, hlo_pb2, penguin_pb2
from ncc.tools.common.dtypes import is_float, storage_dtype, to_compute
from ncc.tools.hlo.hlo_types import root_of
from ncc.tools.hlo.index_math import (
    pad_placement,
    pad_target,
    window_slices,
)
from ncc.tools.hlo2penguin.nest_builder import ceil_div
from ncc.tools.hlo2penguin.values import Splat, Value, broadcast_to, product
from ncc.tools.hlo2penguin.views import View


def _scan_identity(opcode: str, dtype: int) -> float | int | None:
    """The init that makes a scan's padding add nothing: 0 for add, 1 for multiply, the lowest
    value for maximum and the highest for minimum (±inf for floats); None for other reducers."""
    if opcode == "add":
        return 0.0
    if opcode == "multiply":
        return 1.0
    if opcode not in ("maximum", "minimum") or dtype == common_pb2.PRED:
        return None
    if is_float(dtype):
        return float("-inf") if opcode == "maximum" else float("inf")
    info = np.iinfo(storage_dtype(dtype))
    return int(info.min if opcode == "maximum" else info.max)  # exact, past 2**53 too


@dataclass(frozen=True)
class _Along:
    """A window dimension as window_slices reads it: one pass of a separable reduce-window."""

    size: int
    stride: int
    window_dilation: int


SEPARABLE_OFFSETS = 16  # windows of more elements than this run one dimension at a time...
# ...and max or min windows of more than this (equal values in any grouping): a 3x3 max pool runs as 3 + 3
# offsets (ResNet stage 1's on [56, 64] tiles: 6,901 µs in all against 7,102 folded as 9)
SEPARABLE_EXTREMA = 8


class WindowOps:
    def _pad(self, instr, ops: list[Value], shape: tuple[int, ...], dtype: int) -> Value:
        config = instr.padding_config.dimensions
        edges = [(e.edge_padding_low, e.edge_padding_high, e.interior_padding) for e in config]
        return self._padded(ops[0], ops[1], edges, instr.name)

    def _padded(self, operand: Value, value: Value, edges: list[tuple[int, int, int]], source: str) -> Value:
        """Fill a new tensor with the padding value, then copy the kept operand elements into their
        (interior-strided) places; negative padding crops the operand first."""
        if all(edge == (0, 0, 0) for edge in edges):
            return operand
        shape = tuple(low + high + n + max(n - 1, 0) * interior
                      for (low, high, interior), n in zip(edges, operand.shape, strict=True))
        if isinstance(operand, Splat) and isinstance(value, Splat) and operand.value == value.value:
            return Splat(value.value, operand.dtype, shape)
        kept = [pad_placement(low, interior, size, extent)
                for (low, _, interior), size, extent in zip(edges, operand.shape, shape, strict=True)]
        target = [pad_target(low, interior, first, last)
                  for (low, _, interior), (first, last) in zip(edges, kept, strict=True)]
        name = self.builder.hbm_tensor(f"{source}.pad", operand.dtype, shape, penguin_pb2.INTERNAL, source)
        out = View.whole(name, operand.dtype, shape)
        self._copy_into(broadcast_to(value, shape), out, source)
        if all(last > first for first, last in kept):
            piece = self._window(operand, tuple(first for first, _ in kept), tuple(last for _, last in kept))
            place = out.slice(tuple(t.start for t in target), tuple(t.stop for t in target),
                              tuple(t.step for t in target))
            self._copy_into(piece, place, source)
        return out

    def _convolution(self, instr, ops: list[Value], shape: tuple[int, ...], dtype: int) -> Value:
        """im2col as a view, then one dot per feature group: the input (padded and base-dilated) is read
        as [batch, out positions..., kernel positions..., features] with strides (stride x, dilation x
        the input's), which is linear in every index, so no gather is needed; the dot contracts
        (kernel positions, features) against the kernel, accumulating in PSUM."""
        lhs, rhs = (self._materialize(op, instr.name) if isinstance(op, Splat) else op for op in ops)
        dn, window = instr.convolution_dimension_numbers, instr.window.dimensions
        x = lhs.transpose((dn.input_batch_dimension, *dn.input_spatial_dimensions,
                           dn.input_feature_dimension))
        w = rhs.transpose((*dn.kernel_spatial_dimensions, dn.kernel_input_feature_dimension,
                           dn.kernel_output_feature_dimension))
        reversed_axes = tuple(axis for axis, d in enumerate(window) if d.window_reversal)
        w = w.reverse(reversed_axes) if reversed_axes else w
        spatial_edges = [(d.padding_low, d.padding_high, d.base_dilation - 1) for d in window]
        edges = [(0, 0, 0), *spatial_edges, (0, 0, 0)]
        x = self._padded(x, Splat(0.0, lhs.dtype, ()), edges, instr.name)
        if isinstance(x, Splat):
            x = self._materialize(x, instr.name)
        sizes = tuple(shape[d] for d in dn.output_spatial_dimensions)
        kernel = tuple(d.size for d in window)
        batch, features, out_features = x.shape[0], x.shape[-1], w.shape[-1]
        spatial = list(zip(x.strides[1:-1], window, strict=True))
        strides = (x.strides[0], *(s * d.stride for s, d in spatial),
                   *(s * d.window_dilation for s, d in spatial), x.strides[-1])
        columns = View(x.base, x.dtype, (batch, *sizes, *kernel, features), strides, x.offset)
        groups = max(1, instr.feature_group_count)
        in_group, out_group = features // groups, out_features // groups
        positions, taps = product(sizes), product(kernel)
        order = (dn.output_batch_dimension, *dn.output_spatial_dimensions, dn.output_feature_dimension)
        if groups > 1 and in_group == 1 and out_group == 1 and is_float(dtype):
            result = self._depthwise(instr, columns, w, kernel, dtype)
            return result.transpose(tuple(int(d) for d in np.argsort(order)))
        products = []
        for g in range(groups):
            rows = self._cut(columns, g * in_group, (g + 1) * in_group)
            weights = self._cut(w, g * out_group, (g + 1) * out_group)
            lhs_2d = self._reshape(rows, (batch * positions, taps * in_group), instr.name)
            rhs_2d = self._reshape(weights, (taps * in_group, out_group), instr.name)
            label = f"{instr.name}.g{g}" if groups > 1 else instr.name
            dot = hlo_pb2.HloInstructionProto(name=label, opcode="dot")
            dot.dot_dimension_numbers.lhs_contracting_dimensions.append(1)
            dot.dot_dimension_numbers.rhs_contracting_dimensions.append(0)
            partial = self._dot(dot, [lhs_2d, rhs_2d], (batch * positions, out_group), dtype)
            products.append(self._reshape_value(partial, (batch, *sizes, out_group), instr.name))
        result = products[0]
        if groups > 1:
            whole = (batch, *sizes, out_features)
            name = self.builder.hbm_tensor(instr.name, dtype, whole, penguin_pb2.INTERNAL, instr.name)
            result = View.whole(name, dtype, whole)
            for g, partial in enumerate(products):
                self._copy_into(partial, self._cut(result, g * out_group, (g + 1) * out_group), instr.name)
        return result.transpose(tuple(int(d) for d in np.argsort(order)))

    def _depthwise(self, instr, columns: View, w: View, kernel: tuple[int, ...], dtype: int) -> Value:
        """A depthwise convolution (one input and one output feature a group: MobileNet's, a
        ConvNeXt's 7x7, Mamba's causal conv1d) as a multiply-add per kernel tap on the vector
        engines: out = sum over taps of x[tap's window] * w[tap] (each feature's weight broadcast
        along the positions), in float32 and in the dot's tap order, rounded to `dtype` once. As
        one dot per feature it was `features` matmuls of a single column each (64 for a
        MobileNet block's [4, 56, 56, 64]: 52k instructions)."""
        f32 = common_pb2.F32
        batch_and_positions = columns.shape[:-1 - len(kernel)]
        features = columns.shape[-1]
        out_shape = (*batch_and_positions, features)
        total: Value | None = None
        for tap in np.ndindex(*kernel):
            starts = (0,) * len(batch_and_positions) + tuple(int(t) for t in tap) + (0,)
            limits = (*batch_and_positions, *(int(t) + 1 for t in tap), features)
            window = columns.slice(starts, limits, (1,) * len(starts)).reshape(out_shape)
            weight = w.slice((*(int(t) for t in tap), 0, 0), (*(int(t) + 1 for t in tap), 1, features),
                             (1,) * (len(kernel) + 2)).reshape((features,))
            if window.dtype != f32:
                window = self._synthetic(instr, "convert", [window], out_shape, f32)
            if weight.dtype != f32:
                weight = self._synthetic(instr, "convert", [weight], (features,), f32)
            spread = broadcast_to(weight, out_shape) if isinstance(weight, Splat) else \
                weight.broadcast(out_shape, (len(out_shape) - 1,))
            term = self._synthetic(instr, "multiply", [window, spread], out_shape, f32)
            total = term if total is None else self._synthetic(instr, "add", [total, term], out_shape, f32)
        if dtype != f32:
            total = self._synthetic(instr, "convert", [total], out_shape, dtype)
        return total

    def _reduce_window(self, instr, ops: list[Value]) -> Value:
        """The reducer folded over every window offset; each offset is a strided view of the (padded
        with the init value) input, so a window of W elements costs W applications of the reducer.
        An inclusive scan (`_scan_of`: cumsum, cumprod, cummax, cummin) takes ⌈log2 n⌉ instead."""
        k = len(ops) // 2
        inputs, inits = ops[:k], ops[k:]
        reducer = self.computations[instr.called_computation_ids[0]]
        scan = self._scan_of(instr, inputs, inits, reducer)
        if scan is not None:
            return self._scan(inputs[0], inits[0], reducer, *scan, instr.name)
        window = instr.window.dimensions
        edges = [(d.padding_low, d.padding_high, d.base_dilation - 1) for d in window]
        padded = [self._padded(x, init, edges, instr.name) for x, init in zip(inputs, inits, strict=True)]
        result_shape = instr.shape.tuple_shapes[0] if k > 1 else instr.shape
        sizes = self.region_shape + tuple(int(n) for n in result_shape.dimensions)
        if self._separable(instr, inputs, inits):
            (acc,) = padded
            for d, dim in enumerate(window):  # one dimension at a time: Σ sizes offsets, not Π
                if dim.size == 1 and dim.stride == 1:
                    continue
                alone = [_Along(1, 1, 1)] * len(window)
                alone[d] = _Along(dim.size, dim.stride, dim.window_dilation)
                shape = tuple(sizes[e] if e == d else acc.shape[e] for e in range(len(window)))
                (acc,) = self._fold_offsets(reducer, [acc], inits, alone, shape)
            return acc
        accs = self._fold_offsets(reducer, padded, inits, list(window), sizes)
        return tuple(accs) if k > 1 else accs[0]

    def _fold_offsets(self, reducer, padded: list[Value], inits: list[Value], window: list,
                      sizes: tuple[int, ...]) -> list[Value]:
        """The reducer folded over every offset of `window` (its dimensions' size, stride and
        window_dilation), each a strided view of the padded inputs, from the inits."""
        accs = [broadcast_to(init, sizes) for init in inits]
        for offset in np.ndindex(*(d.size for d in window)):
            at = window_slices(offset, window, sizes)
            elements = [self._window(value, tuple(a.start for a in at), tuple(a.stop for a in at),
                                     tuple(a.step for a in at)) for value in padded]
            accs = self._apply_reducer(reducer, accs + elements, sizes)
        return accs

    def _separable(self, instr, inputs: list[Value], inits: list[Value]) -> bool:
        """Whether the reduce-window may run one dimension at a time: one input, a plain add,
        multiply, maximum or minimum reducer (associative and commutative, so the window's elements
        may combine in any grouping) with its identity as init (each pass starts from it), outside
        a reducer's region, and a window of more than SEPARABLE_OFFSETS elements (SEPARABLE_EXTREMA
        for max and min, whose values do not depend on the grouping; a sum regrouped may round
        differently). A 4x4x4x3x3 window then costs 18 folded offsets instead of 576."""
        window = instr.window.dimensions
        if len(inputs) != 1 or self.region_shape:
            return False
        sizes = [d.size for d in window]
        opcode = self._reducer(instr)
        smallest = SEPARABLE_EXTREMA if opcode in ("maximum", "minimum") else SEPARABLE_OFFSETS
        if product(tuple(sizes)) <= smallest or any(d.window_reversal for d in window):
            return False  # a small window (a 2x2 pool, a 3x3 sum) folds as it is
        value = self._constant_scalar(inits[0])
        return opcode is not None and value is not None and _scan_identity(opcode, inits[0].dtype) == value

    def _constant_scalar(self, value: Value) -> float | int | None:
        """The number a compile-time scalar holds: a Splat's, or a one-element constant tensor's
        (`_scalar` keeps s64/u64 past 2**53 there; a mutated module may hold any dtype, NaN
        included); None for anything else."""
        if isinstance(value, Splat):
            return value.value
        if not isinstance(value, View) or any(value.strides):
            return None
        decl = self.builder.decl(value.base)
        if decl.role != penguin_pb2.CONSTANT or list(decl.shape) or not decl.data:
            return None
        storage = np.frombuffer(decl.data, dtype=storage_dtype(decl.dtype))[:1]
        return to_compute(storage, decl.dtype)[0].item()  # a float stays a float (NaN included)

    def _scan_of(self, instr, inputs: list[Value], inits: list[Value],
                 reducer: hlo_pb2.HloComputationProto) -> tuple[int, bool] | None:
        """(dimension, reverse) when the reduce-window is an inclusive scan: one input, a window as
        long as the input along one dimension and 1 along the others, stride 1, no dilation, that
        dimension padded n − 1 on one side only (reverse: on the high side), a reducer that is one
        of add, multiply, maximum and minimum of its two parameters, and an init that is its identity
        (`_scan_identity`: the padding then adds nothing). JAX's cumsum, cumprod, cummax and
        cummin lower to exactly this."""
        window = instr.window.dimensions
        if len(inputs) != 1 or self.region_shape or not isinstance(inits[0], Splat):
            return None
        if any(w.stride != 1 or w.base_dilation > 1 or w.window_dilation > 1 or w.window_reversal
               for w in window):
            return None
        long = [d for d, w in enumerate(window) if w.size != 1 or w.padding_low or w.padding_high]
        if len(long) != 1:
            return None
        (d,) = long
        n, w = inputs[0].shape[d], window[d]
        if n < 2 or w.size != n or sorted((w.padding_low, w.padding_high)) != [0, n - 1]:
            return None
        params = {p.id: p.parameter_number for p in reducer.instructions if p.opcode == "parameter"}
        root = root_of(reducer, reducer.instructions[-1])
        if len(reducer.instructions) != 3 or sorted(params.get(i, -1) for i in root.operand_ids) != [0, 1]:
            return None
        identity = _scan_identity(root.opcode, inits[0].dtype)
        if identity is None or inits[0].value != identity:
            return None
        return d, w.padding_high > 0

    def _scan(self, x: Value, init: Splat, reducer: hlo_pb2.HloComputationProto, d: int, reverse: bool,
              source: str) -> Value:
        """Hillis–Steele: ⌈log2 n⌉ steps, each combining every element with the one `step` before it
        (after it, reversed), or with the init where there is none; step doubles each time."""
        n, rank = x.shape[d], len(x.shape)
        acc, step = x, 1
        while step < n:
            edges = [(0, 0, 0)] * rank
            edges[d] = (0, step, 0) if reverse else (step, 0, 0)
            padded = self._padded(acc, init, edges, source)
            starts, limits = [0] * rank, list(x.shape)
            if reverse:
                starts[d], limits[d] = step, n + step
            shifted = self._window(padded, tuple(starts), tuple(limits))
            (acc,) = self._apply_reducer(reducer, [shifted, acc], x.shape)
            step *= 2
        return acc

    def _select_and_scatter(self, instr, ops: list[Value], shape: tuple[int, ...], dtype: int) -> Value:
        """XLA's select-and-scatter (max-pool's gradient) with whole-array ops. Every window walks
        its offsets in order, moving its choice to the next element whenever `select(chosen, next)`
        is false (padding is never chosen), and remembers the offset chosen. Then, for each offset
        from last to first (which is source order at any one position), the operand positions at
        that offset receive `scatter(current, source)` where their window chose that offset."""
        operand, source, init = ops
        window = instr.window.dimensions
        select, scatter = (self.computations[c] for c in instr.called_computation_ids)
        sizes = source.shape
        edges = [(d.padding_low, d.padding_high, 0) for d in window]
        padded = self._padded(operand, Splat(0.0, dtype, ()), edges, instr.name)
        inside, outside = Splat(1.0, common_pb2.PRED, operand.shape), Splat(0.0, common_pb2.PRED, ())
        valid = self._padded(inside, outside, edges, f"{instr.name}.valid")
        offsets = list(np.ndindex(*(d.size for d in window)))

        def op(opcode: str, operands: list[Value], kind: int, over: tuple[int, ...] = sizes,
               **fields) -> Value:
            return self._synthetic(instr, opcode, operands, over, kind, **fields)

        def at_offset(value: Value, offset: tuple[int, ...]) -> Value:
            at = window_slices(offset, window, sizes)
            return self._window(value, tuple(a.start for a in at), tuple(a.stop for a in at),
                                tuple(a.step for a in at))

        chosen: Value = Splat(0.0, common_pb2.S32, sizes)
        best, seen = at_offset(padded, offsets[0]), at_offset(valid, offsets[0])
        for k, offset in enumerate(offsets[1:], start=1):
            value, present = at_offset(padded, offset), at_offset(valid, offset)
            (keep,) = self._apply_reducer(select, [best, value], sizes)
            take = op("not", [keep], common_pb2.PRED)
            take = op("and", [present, op("or", [op("not", [seen], common_pb2.PRED), take], common_pb2.PRED)],
                      common_pb2.PRED)
            seen = op("or", [seen, present], common_pb2.PRED)
            best = op("select", [take, value, best], dtype)
            chosen = op("select", [take, Splat(float(k), common_pb2.S32, sizes), chosen], common_pb2.S32)

        out = self._new_output(instr, shape, dtype)
        self._copy_into(broadcast_to(init, shape), out, instr.name)
        strides = tuple(d.stride for d in window)
        lows = tuple(low for low, _, _ in edges)
        for k in reversed(range(len(offsets))):
            # the windows whose element at this offset lies inside the operand, and where it lies
            dims = list(zip(sizes, operand.shape, lows, offsets[k], strides, strict=True))
            first = tuple(max(0, ceil_div(low - o, s)) for _, _, low, o, s in dims)
            limits = tuple(min(count, (n - 1 + low - o) // s + 1) for count, n, low, o, s in dims)
            if any(b <= a for a, b in zip(first, limits, strict=True)):
                continue
            part = tuple(b - a for a, b in zip(first, limits, strict=True))
            starts = tuple(a * s + o - low for a, (_, _, low, o, s) in zip(first, dims, strict=True))
            stops = tuple(a + (p - 1) * s + 1 for a, p, s in zip(starts, part, strides, strict=True))
            target = out.slice(starts, stops, strides)
            here = op("compare", [self._window(chosen, first, limits), Splat(float(k), common_pb2.S32, part)],
                      common_pb2.PRED, part, comparison_direction="EQ")
            (combined,) = self._apply_reducer(scatter, [target, self._window(source, first, limits)], part)
            op("select", [here, combined, target], dtype, part, into=target)
        return out
