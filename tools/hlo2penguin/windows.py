"""Padding and windowed ops: pad as a fill plus a strided copy, convolution as im2col (a strided
view) into one dot per feature group, reduce-window as the reducer folded over window offsets.

A mixin of Lowering (lower.py): its methods call the rest of the lowering through `self`.
"""

from __future__ import annotations

import numpy as np

from ncc.schemas import hlo_pb2, penguin_pb2
from ncc.tools.hlo.index_math import (
    pad_placement,
    pad_target,
    window_slices,
)
from ncc.tools.hlo2penguin.values import Splat, Value, broadcast_to, product
from ncc.tools.hlo2penguin.views import View


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
        order = (dn.output_batch_dimension, *dn.output_spatial_dimensions, dn.output_feature_dimension)
        return result.transpose(tuple(int(d) for d in np.argsort(order)))

    def _reduce_window(self, instr, ops: list[Value]) -> Value:
        """The reducer folded over every window offset; each offset is a strided view of the (padded
        with the init value) input, so a window of W elements costs W applications of the reducer."""
        k = len(ops) // 2
        inputs, inits = ops[:k], ops[k:]
        window = instr.window.dimensions
        edges = [(d.padding_low, d.padding_high, d.base_dilation - 1) for d in window]
        padded = [self._padded(x, init, edges, instr.name) for x, init in zip(inputs, inits, strict=True)]
        result_shape = instr.shape.tuple_shapes[0] if k > 1 else instr.shape
        sizes = self.region_shape + tuple(int(n) for n in result_shape.dimensions)
        accs = [broadcast_to(init, sizes) for init in inits]
        reducer = self.computations[instr.called_computation_ids[0]]
        for offset in np.ndindex(*(d.size for d in window)):
            at = window_slices(offset, window, sizes)
            elements = [self._window(value, tuple(a.start for a in at), tuple(a.stop for a in at),
                                     tuple(a.step for a in at)) for value in padded]
            accs = self._apply_reducer(reducer, accs + elements, sizes)
        return tuple(accs) if k > 1 else accs[0]
