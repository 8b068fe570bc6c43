"""Gather, scatter and dynamic slices: rows of a table moved by POOL's indirect dmas (dma_gather,
dma_scatter) with s32 row numbers in SBUF, and windows at constant starts as views. Rows may be
keyed by one dimension or by several (flattened into one row number: MoE's [expert, slot]).
Gathers and scatters that do not move whole rows use a table of single elements, with each
element's operand position computed on the device.

A mixin of Lowering (lower.py): its methods call the rest of the lowering through `self`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ncc.schemas import common_pb2, hlo_pb2, penguin_pb2
from ncc.tools.common import affine
from ncc.tools.hlo.index_math import (
    clamped_starts,
    gather_batch_shape,
    gather_output_order,
)
from ncc.tools.hlo2penguin.control import Budget
from ncc.tools.hlo2penguin.nest_builder import PARTITIONS, Tiling, add_statement
from ncc.tools.hlo2penguin.values import FREE_TILE, POOL, SP, Splat, Value, product, transposed
from ncc.tools.hlo2penguin.views import View

# A scatter-add of count rows into extent rows runs as a one-hot matmul up to this many elements
# of the one-hot matrix (4M: 16 MiB of f32 written and read once; an embedding gradient of 4,096
# tokens over a 50,257-word vocabulary, 206M, keeps its row-by-row scatter)
ONE_HOT_MAX_ELEMENTS = 1 << 22


class IndexedOps:
    @staticmethod
    def _runtime_dims(operand_shape: tuple[int, ...], sizes: tuple[int, ...],
                      starts: list[Value]) -> list[int]:
        """The dimensions whose start is computed at run time and matters (a window as wide as its
        dimension always starts at 0)."""
        return [d for d, start in enumerate(starts)
                if not isinstance(start, Splat) and sizes[d] < operand_shape[d]]

    def _known_starts(self, operand_shape: tuple[int, ...], sizes: tuple[int, ...], starts: list[Value],
                      skip: int | None) -> list[int]:
        """Clamped compile-time starts; the run-time dimension `skip` gets 0 (its rows are indexed)."""
        known = [0 if d == skip or not isinstance(start, Splat) else int(start.value)
                 for d, start in enumerate(starts)]
        return clamped_starts(operand_shape, sizes, known)

    def _dynamic_slice(self, instr, ops: list[Value], shape: tuple[int, ...]) -> Value:
        return self._slice_at(instr, ops[0], ops[1:], tuple(int(n) for n in instr.dynamic_slice_sizes))

    def _slice_at(self, instr, operand: Value, starts: list[Value], sizes: tuple[int, ...]) -> Value:
        """The window of `sizes` at `starts` (each clamped as XLA does). Constant starts make a view;
        a run-time start in one dimension d gathers rows start..start+size-1 of d with POOL's
        indirect dma. Several run-time starts take one dimension at a time: rows of the first,
        whole along the others, then the window of that (clamping each start on its own, as the
        one window does)."""
        runtime = self._runtime_dims(operand.shape, sizes, starts)
        if len(runtime) > 1:
            d, later = runtime[0], set(runtime[1:])
            zero = Splat(0.0, common_pb2.S32, ())
            wide = tuple(operand.shape[k] if k in later else n for k, n in enumerate(sizes))
            first = [zero if k in later else start for k, start in enumerate(starts)]
            rows = self._slice_at(instr, operand, first, wide)
            then = [start if k in later else zero for k, start in enumerate(starts)]
            return self._slice_at(instr, rows, then, sizes)
        d = runtime[0] if runtime else None
        known = self._known_starts(operand.shape, sizes, starts, d)
        if d is None:
            return self._window(operand, tuple(known), _ends(known, sizes))
        window = list(sizes)
        window[d] = operand.shape[d]
        narrowed = self._window(operand, tuple(known), _ends(known, window))
        if isinstance(narrowed, Splat):
            return Splat(narrowed.value, narrowed.dtype, sizes)
        rows = self._window_rows(instr, starts[d], operand.shape[d], sizes[d])
        order = (d, *(k for k in range(len(sizes)) if k != d))
        gathered = self._gather_rows(instr, narrowed.transpose(order), rows)
        return gathered.transpose(tuple(int(k) for k in np.argsort(order)))

    def _window_rows(self, instr, start: Value, extent: int, size: int) -> View:
        """s32 row numbers clamp(start, 0, extent - size) + [0, size), computed on the device."""
        index_dtype = common_pb2.S32
        if start.dtype != index_dtype:
            start = self._synthetic(instr, "convert", [start], (), index_dtype)
        spread = start.broadcast((size,), ()) if isinstance(start, View) else start
        low, high = Splat(0.0, index_dtype, ()), Splat(float(extent - size), index_dtype, ())
        first = self._synthetic(instr, "clamp", [low, spread, high], (size,), index_dtype)
        counter = hlo_pb2.HloInstructionProto(name=f"{instr.name}.rows", opcode="iota", dimensions=[0])
        counting = self._iota(counter, (size,), index_dtype)
        return self._synthetic(instr, "add", [first, counting], (size,), index_dtype)

    def _gather(self, instr, ops: list[Value], shape: tuple[int, ...]) -> Value:
        """Whole rows along one dimension (embedding lookups, `take`): the indices go to SBUF and
        POOL's indirect dma brings row index[p] of the table into partition p. Any other form
        gathers element by element (`_gather_elements`)."""
        operand, indices = ops
        dn, sizes = instr.gather_dimension_numbers, [int(n) for n in instr.gather_slice_sizes]
        rank = len(operand.shape)
        if isinstance(operand, Splat):
            return Splat(operand.value, operand.dtype, shape)
        if len(dn.start_index_map) > 1 and not dn.operand_batching_dims \
                and _whole_rows(operand.shape, sizes, dn.start_index_map, dn.collapsed_slice_dims):
            return self._gather_keyed_rows(instr, operand, indices, shape)
        d = dn.start_index_map[0] if len(dn.start_index_map) == 1 else -1
        if d < 0 or any(sizes[k] != operand.shape[k] for k in range(rank) if k != d) or sizes[d] != 1 \
                or dn.operand_batching_dims:
            return self._gather_elements(instr, operand, indices, shape)
        batch = gather_batch_shape(indices.shape, dn.index_vector_dim)
        count = product(tuple(batch))
        rows = self._reshape_value(indices, (count,), instr.name)
        if isinstance(rows, Splat) or rows.dtype != common_pb2.S32:
            rows = self._synthetic(instr, "convert", [rows], (count,), common_pb2.S32)
        order = (d, *(k for k in range(rank) if k != d))
        gathered = self._gather_rows(instr, operand.transpose(order), rows)  # (count, others...)
        kept = [sizes[k] for k in range(rank) if k not in dn.collapsed_slice_dims]
        if d in dn.collapsed_slice_dims:
            natural = self._reshape_value(gathered, (*batch, *kept), instr.name)
        else:  # the size-1 row dimension stays, at its place among the slice dimensions
            with_row = (*batch, 1, *(operand.shape[k] for k in order[1:]))
            moved = self._reshape_value(gathered, with_row, instr.name)
            slice_order = tuple(range(len(batch))) + tuple(len(batch) + order.index(k) for k in range(rank))
            natural = moved.transpose(slice_order)
        out_order = gather_output_order(dn.offset_dims, len(batch), len(shape))
        return natural.transpose(tuple(out_order))

    def _gather_keyed_rows(self, instr, operand: View, indices: Value, shape: tuple[int, ...]) -> Value:
        """Whole rows keyed by several dimensions (`buffers[expert, slot]` of [E, C, d]): the keyed
        dimensions, in start_index_map's order, go outermost and flatten into one row dimension,
        each index vector becomes that row's number (every coordinate clamped as XLA does), and one
        row gather moves them, instead of one indirect-dma row per element."""
        dn = instr.gather_dimension_numbers
        keyed = list(dn.start_index_map)
        rank = len(operand.shape)
        others = [k for k in range(rank) if k not in keyed]
        table = self._keyed_table(instr, operand.transpose((*keyed, *others)), len(keyed))
        batch = gather_batch_shape(indices.shape, dn.index_vector_dim)
        rows = self._keyed_row_numbers(instr, tuple(operand.shape[k] for k in keyed), indices,
                                       dn.index_vector_dim, clamp=True)
        gathered = self._gather_rows(instr, table, rows)  # (count, others...)
        natural = self._reshape_value(gathered, (*batch, *(operand.shape[k] for k in others)), instr.name)
        return natural.transpose(tuple(gather_output_order(dn.offset_dims, len(batch), len(shape))))

    def _keyed_table(self, instr, ordered: View, keys: int) -> View:
        """`ordered` (keyed dimensions first) as a table whose first dimension is their row number."""
        shape = (product(ordered.shape[:keys]), *ordered.shape[keys:])
        return self._reshape(ordered, shape, instr.name)

    def _keyed_row_numbers(self, instr, extents: tuple[int, ...], indices: Value, vector: int,
                           clamp: bool) -> View:
        """The s32 row number Σ index[k]·stride[k] of every index vector, over the row-major
        `extents` of the keyed dimensions (index component k keys dimension k), flattened to
        (count,): with `clamp` each coordinate clamped into its extent (a gather), else -1 where
        any coordinate is outside it (a scatter skips such rows)."""
        batch = tuple(gather_batch_shape(indices.shape, vector))
        positions, fits = self._element_positions(
            instr, extents, indices, vector, list(range(len(extents))), [1] * len(extents), batch,
            list(range(len(batch))), {}, {}, clamp=clamp)
        if fits is not None:
            positions = self._synthetic(instr, "select", [fits, positions, Splat(-1.0, common_pb2.S32, ())],
                                        batch, common_pb2.S32)
        count = product(batch)
        rows = self._reshape_value(positions, (count,), instr.name)
        if isinstance(rows, Splat):
            rows = self._materialize(rows, instr.name)
        return rows

    def _gather_rows(self, instr, table: View, rows: View) -> View:
        """(count, others...) = table[rows[i], ...] for a table whose first dimension is indexed."""
        extent, others = table.shape[0], table.shape[1:]
        width = product(others)
        flat = table.reshape((extent, width))
        if flat is None:  # rows that are not evenly strided: copy the table row-major first
            flat = self._materialize(table, instr.name).reshape((extent, width))
        count = rows.shape[0]
        name = self.builder.hbm_tensor(f"{instr.name}.rows", table.dtype, (count, width),
                                       penguin_pb2.INTERNAL, instr.name)
        out = View.whole(name, table.dtype, (count, width))
        tiling = Tiling((count, width), max(1, min(width, FREE_TILE)))
        index = self._index_column(rows, instr.name)  # before the nest: it may need a nest of its own
        nest = self.builder.nest(f"{instr.name}.gather", instr.name, tiling.axes(), self._attributes(instr))
        index_box = self._index_tile(nest, tiling, index, instr.name)
        block = (PARTITIONS, tiling.free_tile)
        tile = self.builder.tile(f"{instr.name}.rows", table.dtype, (count, width), block)
        add_statement(nest, "gather", "dma_gather", POOL, [tiling.box(tile)],
                      [self._every_row(flat, tiling), index_box])
        self._store(nest, tiling, tiling.box(tile), out, instr.name)
        return out.reshape((count, *others))

    def _every_row(self, flat: View, tiling: Tiling) -> penguin_pb2.Access:
        """The current column tile of every row of an indexed table: what an indirect dma may touch."""
        starts = [affine.expr(), affine.expr({tiling.col_axis: tiling.free_tile})]
        return penguin_pb2.Access(tensor=self.builder.view(flat), extents=[flat.shape[0], tiling.free_tile],
                                  starts=starts)

    def _index_column(self, rows: Value, source: str) -> View:
        """The s32 row numbers as a (count, 1) tensor view an index tile loads from. A constant
        row number is written to a tensor first (the DMA reads it from one all the same): by a
        nest of its own, so this must run before the nest that loads it opens, or that nest
        would come first and read the tensor unwritten (every row 0: `x.at[3].set(u)` wrote
        row 0)."""
        if isinstance(rows, Splat):
            rows = self._materialize(rows, source)
        return self._reshape(rows, (rows.shape[0], 1), source)

    def _index_tile(self, nest, tiling: Tiling, index: View, source: str) -> penguin_pb2.Access:
        """Load the s32 row numbers of the current row tile (of `index`, from _index_column) into
        SBUF, one per partition."""
        count = index.shape[0]
        tile = self.builder.tile(f"{source}.index", common_pb2.S32, (count, 1), (PARTITIONS, 1))
        column = Tiling((count, 1), 1, col_axis=tiling.col_axis)
        box = column.box(tile, col_tile=1)
        source_box = column.box(self.builder.view(index), col_tile=1)
        add_statement(nest, "load_index", "dma", SP, [box], [source_box])
        return box

    def _update_slice(self, instr, ops: list[Value], shape: tuple[int, ...], dtype: int) -> View:
        return self._update_at(instr, ops[0], ops[1], ops[2:], shape, dtype)

    def _update_at(self, instr, operand: Value, update: Value, starts: list[Value], shape: tuple[int, ...],
                   dtype: int) -> View:
        """A new tensor: the operand with the update written over the clamped window. A run-time
        start in one dimension d, the update whole along the others, scatters the update's rows
        with POOL's indirect dma into a tensor laid out with d outermost, so each row is
        contiguous. Otherwise (several run-time starts, or a window that is part of another
        dimension) the rows d covers are read, updated there (one run-time start fewer), and
        written back: the same clamped window, as d's start clamps the same way both times."""
        d_all = self._runtime_dims(shape, update.shape, starts)
        d = d_all[0] if d_all else None
        known = self._known_starts(shape, update.shape, starts, d)
        limits = tuple(s + n for s, n in zip(known, update.shape, strict=True))
        if d is None and isinstance(operand, View) and operand.base in self.inplace_carries \
                and operand == View.whole(operand.base, operand.dtype, shape):
            # a kept loop's carry updated in place (repeat.py checks nothing reads it again)
            if isinstance(update, View) and update.base == operand.base:
                update = self._materialize(update, instr.name)
            self._copy_into(update, operand.slice(tuple(known), limits, (1,) * len(shape)), instr.name)
            self.inplace_writes.append((operand.base, len(self.builder.program.nests)))
            return operand
        if d is None:
            out = self._new_output(instr, shape, dtype)
            self._copy_into(operand, out, instr.name)
            self._copy_into(update, out.slice(tuple(known), limits, (1,) * len(shape)), instr.name)
            return out
        if any(update.shape[k] != shape[k] for k in range(len(shape)) if k != d):
            zero = Splat(0.0, common_pb2.S32, ())
            row_starts = [s if k == d else zero for k, s in enumerate(starts)]
            row_sizes = tuple(n if k == d else shape[k] for k, n in enumerate(update.shape))
            rows = self._slice_at(instr, operand, row_starts, row_sizes)
            if isinstance(rows, Splat):
                rows = self._materialize(rows, instr.name)
            inner = [zero if k == d else s for k, s in enumerate(starts)]
            updated = self._update_at(instr, rows, update, inner, row_sizes, dtype)
            return self._update_at(instr, operand, updated, row_starts, shape, dtype)
        order = (d, *(k for k in range(len(shape)) if k != d))
        laid_out = self._new_output(instr, tuple(shape[k] for k in order), dtype)
        back = tuple(int(k) for k in np.argsort(order))
        self._copy_into(operand, laid_out.transpose(back), instr.name)
        rows = self._window_rows(instr, starts[d], shape[d], update.shape[d])
        self._scatter_rows(instr, laid_out, rows, transposed(update, order))
        return laid_out.transpose(back)

    def _scatter(self, instr, ops: list[Value], shape: tuple[int, ...], dtype: int) -> View:
        """Whole rows along one dimension (`x.at[i].add(u)`, `x.at[i].set(u)`): the result is laid out
        with that dimension outermost; each update row is gathered, combined with its update by the
        update computation, and scattered back (an out-of-range row is skipped, as XLA does). Any
        other form (points, partial windows, batching dimensions) goes element by element."""
        operand, indices, updates = ops
        dn, rank = instr.scatter_dimension_numbers, len(shape)
        if dn.input_batching_dims:
            return self._scatter_elements(instr, ops, shape, dtype)
        window_dims = list(dn.update_window_dims)
        operand_window = [k for k in range(rank) if k not in dn.inserted_window_dims]
        window = [1] * rank
        for operand_dim, update_dim in zip(operand_window, window_dims, strict=True):
            window[operand_dim] = updates.shape[update_dim]
        if len(dn.scatter_dims_to_operand_dims) > 1 \
                and _whole_rows(shape, window, dn.scatter_dims_to_operand_dims, dn.inserted_window_dims):
            return self._scatter_keyed_rows(instr, ops, shape, dtype)
        d = dn.scatter_dims_to_operand_dims[0] if len(dn.scatter_dims_to_operand_dims) == 1 else -1
        if d < 0 or window[d] != 1 or any(window[k] != shape[k] for k in range(rank) if k != d):
            return self._scatter_elements(instr, ops, shape, dtype)
        scatter_dims = [k for k in range(len(updates.shape)) if k not in window_dims]
        count = product(tuple(updates.shape[k] for k in scatter_dims))
        order = (d, *(k for k in range(rank) if k != d))
        row_shape = tuple(shape[k] for k in order[1:])
        rows = self._reshape_value(indices, (count,), instr.name)
        if isinstance(rows, Splat) or rows.dtype != common_pb2.S32:
            rows = self._synthetic(instr, "convert", [rows], (count,), common_pb2.S32)
        ordered = updates.transpose((*scatter_dims, *window_dims)) if isinstance(updates, View) else updates
        values = self._reshape_value(ordered, (count, *row_shape), instr.name)
        back = tuple(int(k) for k in np.argsort(order))
        if self._sums_by_matmul(instr, dtype, count, shape[d]):
            moved = transposed(operand, order)
            return self._scatter_add_by_matmul(instr, moved, rows, values).transpose(back)
        laid_out = self._new_output(instr, tuple(shape[k] for k in order), dtype)
        self._copy_into(operand, laid_out.transpose(back), instr.name)
        self._combine_rows(instr, laid_out, rows, values)
        return laid_out.transpose(back)

    def _sums_by_matmul(self, instr, dtype: int, count: int, extent: int) -> bool:
        """Whether a scatter of `count` rows into `extent` rows is a segment sum PE can do at once:
        an f32 add (XLA leaves the order of repeated indices' adds unspecified), not known unique
        (unique rows go in one batch anyway), its one-hot matrix at most ONE_HOT_MAX_ELEMENTS."""
        return dtype == common_pb2.F32 and not instr.unique_indices and self._reducer(instr) == "add" \
            and count * extent <= ONE_HOT_MAX_ELEMENTS

    def _scatter_add_by_matmul(self, instr, operand: Value, rows: Value, values: Value) -> Value:
        """table + onehot(rows)^T @ values: jax.ops.segment_sum, a GNN's messages summed by node, an
        embedding bag; row i of the one-hot [count, extent] matrix is 1 at column rows[i] (none for
        a row out of range, which XLA skips), so the product sums each table row's updates on PE
        in fp32, at once, where the rows had gone one at a time (2,000 edges into 500 nodes: 8.9 ms
        simulated and a 100 s compile; 86 us as a matmul)."""
        extent, row_shape = operand.shape[0], operand.shape[1:]
        count, width = rows.shape[0], product(row_shape)
        f32, s32 = common_pb2.F32, common_pb2.S32
        column = hlo_pb2.HloInstructionProto(name=f"{instr.name}.columns", opcode="iota", dimensions=[1])
        columns = self._iota(column, (count, extent), s32)
        spread = Splat(rows.value, rows.dtype, (count, extent)) if isinstance(rows, Splat) else \
            rows.broadcast((count, extent), (0,))  # (every row to one place: a constant index)
        matches = self._synthetic(instr, "compare", [spread, columns],
                                  (count, extent), common_pb2.PRED, comparison_direction="EQ")
        one_hot = self._synthetic(instr, "select", [matches, Splat(1.0, f32, ()), Splat(0.0, f32, ())],
                                  (count, extent), f32)
        flat = self._reshape_value(values, (count, width), instr.name)
        dot = hlo_pb2.HloInstructionProto(name=f"{instr.name}.sums", opcode="dot")
        dot.dot_dimension_numbers.lhs_contracting_dimensions.append(0)
        dot.dot_dimension_numbers.rhs_contracting_dimensions.append(0)
        sums = self._dot(dot, [one_hot, flat], (extent, width), f32)
        table = self._reshape_value(operand, (extent, width), instr.name)
        total = self._synthetic(instr, "add", [table, sums], (extent, width), f32)
        return self._reshape_value(total, (extent, *row_shape), instr.name)

    def _scatter_keyed_rows(self, instr, ops: list[Value], shape: tuple[int, ...], dtype: int) -> View:
        """Whole rows keyed by several dimensions (`buffers.at[expert, slot].set(x)`): laid out with
        the keyed dimensions outermost, each update row's number computed as in
        `_gather_keyed_rows` (-1, which the dma skips, when a coordinate is out of range: one out
        of range must not land in a neighbouring row), combined row by row in order."""
        operand, indices, updates = ops
        dn = instr.scatter_dimension_numbers
        keyed = list(dn.scatter_dims_to_operand_dims)
        others = [k for k in range(len(shape)) if k not in keyed]
        order = (*keyed, *others)
        rows = self._keyed_row_numbers(instr, tuple(shape[k] for k in keyed), indices, dn.index_vector_dim,
                                       clamp=False)
        window_dims = list(dn.update_window_dims)
        scatter_dims = [k for k in range(len(updates.shape)) if k not in window_dims]
        ordered = updates.transpose((*scatter_dims, *window_dims)) if isinstance(updates, View) else updates
        values = self._reshape_value(ordered, (rows.shape[0], *(shape[k] for k in others)), instr.name)
        laid_out = self._new_output(instr, tuple(shape[k] for k in order), dtype)
        back = tuple(int(k) for k in np.argsort(order))
        self._copy_into(operand, laid_out.transpose(back), instr.name)
        self._combine_rows(instr, self._keyed_table(instr, laid_out, len(keyed)), rows, values)
        return laid_out.transpose(back)

    def _combine_rows(self, instr, table: View, rows: View, values: Value) -> None:
        """table[rows[i]] = update(table[rows[i]], values[i]) for every i, in order: each row is
        gathered, combined by the update computation and scattered back. With unique_indices all
        rows go at once; otherwise one at a time, so repeated rows combine in order."""
        count, row_shape = rows.shape[0], table.shape[1:]
        combine = self.computations[instr.called_computation_ids[0]]
        batches = [(0, count)] if instr.unique_indices else [(i, i + 1) for i in range(count)]
        budget = Budget(self.builder.program, instr.name, "scatter", planned=len(batches))
        for first, last in batches:
            some_rows = self._cut(rows, first, last) if (first, last) != (0, count) else rows
            old = self._gather_rows(instr, table, some_rows)
            new = self._window(values, (first,) + (0,) * len(row_shape), (last, *row_shape))
            (combined,) = self._apply_reducer(combine, [old, new], (last - first, *row_shape))
            self._scatter_rows(instr, table, some_rows, combined)
            budget.charge()

    def _gather_elements(self, instr, operand: View, indices: Value, shape: tuple[int, ...]) -> Value:
        """Any gather, one element per indirect-dma row: the operand is a table of single elements,
        and each output element's row is its operand position, computed on the device."""
        dn, sizes = instr.gather_dimension_numbers, [int(n) for n in instr.gather_slice_sizes]
        rank = len(operand.shape)
        batch_positions = [p for p in range(len(shape)) if p not in dn.offset_dims]
        dropped = set(dn.collapsed_slice_dims) | set(dn.operand_batching_dims)
        kept = [d for d in range(rank) if d not in dropped]
        positions, _ = self._element_positions(
            instr, operand.shape, indices, dn.index_vector_dim, list(dn.start_index_map), sizes, shape,
            batch_positions, dict(zip(kept, sorted(dn.offset_dims), strict=True)),
            dict(zip(dn.operand_batching_dims, dn.start_indices_batching_dims, strict=True)), clamp=True)
        count = product(shape)
        table = self._element_table(operand, instr.name)
        rows = self._reshape_value(positions, (count,), instr.name)
        return self._reshape_value(self._gather_rows(instr, table, rows), shape, instr.name)

    def _scatter_elements(self, instr, ops: list[Value], shape: tuple[int, ...], dtype: int) -> View:
        """Any scatter, one element per indirect-dma row: every update element's operand position
        is computed on the device (-1, which the dma skips, where its window does not fit), then
        the elements combine in order as whole-row scatters do."""
        operand, indices, updates = ops
        dn = instr.scatter_dimension_numbers
        rank = len(shape)
        window_dims = sorted(dn.update_window_dims)
        batch_positions = [p for p in range(len(updates.shape)) if p not in window_dims]
        dropped = set(dn.inserted_window_dims) | set(dn.input_batching_dims)
        window_of = dict(zip([d for d in range(rank) if d not in dropped], window_dims, strict=True))
        sizes = [updates.shape[window_of[d]] if d in window_of else 1 for d in range(rank)]
        positions, fits = self._element_positions(
            instr, shape, indices, dn.index_vector_dim, list(dn.scatter_dims_to_operand_dims), sizes,
            updates.shape, batch_positions, window_of,
            dict(zip(dn.input_batching_dims, dn.scatter_indices_batching_dims, strict=True)), clamp=False)
        if fits is not None:
            positions = self._synthetic(instr, "select", [fits, positions, Splat(-1.0, common_pb2.S32, ())],
                                        updates.shape, common_pb2.S32)
        count = product(updates.shape)
        out = self._new_output(instr, shape, dtype)
        self._copy_into(operand, out, instr.name)
        rows = self._reshape_value(positions, (count,), instr.name)
        if isinstance(rows, Splat):
            rows = self._materialize(rows, instr.name)
        values = self._reshape_value(updates, (count, 1), instr.name)
        self._combine_rows(instr, out.reshape((product(shape), 1)), rows, values)
        return out

    def _element_table(self, operand: View, source: str) -> View:
        """The operand as a (elements, 1) table: one element per row."""
        flat = operand.reshape((product(operand.shape), 1))
        if flat is None:
            flat = self._materialize(operand, source).reshape((product(operand.shape), 1))
        return flat

    def _element_positions(self, instr, operand_shape: tuple[int, ...], indices: Value, vector: int,
                           index_map: list[int], sizes: list[int], shape: tuple[int, ...],
                           batch_positions: list[int], window_of: dict[int, int], batching: dict[int, int],
                           clamp: bool) -> tuple[Value, Value | None]:
        """For every element of `shape` (a gather's output, a scatter's updates), the row-major
        position in the operand it reads or writes, as s32: per operand dimension, the window start
        (an index coordinate, clamped when `clamp`; or the paired batch coordinate) plus the
        element's offset in the window. Without `clamp`, also whether every start lets the window
        fit (a scatter skips the windows that do not)."""
        s32 = common_pb2.S32
        batch_shape = tuple(n for k, n in enumerate(indices.shape) if k != vector)

        def op(opcode: str, operands: list[Value], kind: int = s32, **fields) -> Value:
            return self._synthetic(instr, opcode, operands, shape, kind, **fields)

        def spread(value: Value) -> Value:  # a value over the indices' batch dimensions, over `shape`
            if isinstance(value, Splat):
                return Splat(value.value, value.dtype, shape)
            return value.broadcast(shape, tuple(batch_positions))

        def along(position: int) -> Value:
            counter = hlo_pb2.HloInstructionProto(name=f"{instr.name}.at", opcode="iota",
                                                  dimensions=[position])
            return self._iota(counter, shape, s32)

        def coordinate(k: int) -> Value:
            if vector == len(indices.shape):
                part = indices
            else:
                starts = tuple(k if a == vector else 0 for a in range(len(indices.shape)))
                limits = tuple(k + 1 if a == vector else n for a, n in enumerate(indices.shape))
                part = self._reshape_value(self._window(indices, starts, limits), batch_shape, instr.name)
            if part.dtype != s32:
                part = self._synthetic(instr, "convert", [part], batch_shape, s32)
            return spread(part)

        strides = affine.row_major_strides(operand_shape)
        total: Value = Splat(0.0, s32, shape)
        fits: Value | None = None
        for d in range(len(operand_shape)):
            term: Value | None = None
            if d in index_map:
                term = coordinate(index_map.index(d))
                low, high = Splat(0.0, s32, shape), Splat(float(operand_shape[d] - sizes[d]), s32, shape)
                if clamp:
                    term = op("clamp", [low, term, high])
                else:
                    above = op("compare", [term, low], common_pb2.PRED, comparison_direction="GE")
                    below = op("compare", [term, high], common_pb2.PRED, comparison_direction="LE")
                    inside = op("and", [above, below], common_pb2.PRED)
                    fits = inside if fits is None else op("and", [fits, inside], common_pb2.PRED)
            elif d in batching:
                paired = batching[d] - (batching[d] > vector)
                term = along(batch_positions[paired])
            if d in window_of and sizes[d] > 1:
                offset = along(window_of[d])
                term = offset if term is None else op("add", [term, offset])
            if term is not None:
                stride = Splat(float(strides[d]), s32, shape)
                scaled = term if strides[d] == 1 else op("multiply", [term, stride])
                total = op("add", [total, scaled])
        return total, fits

    def _scatter_rows(self, instr, table: View, rows: View, values: Value) -> None:
        """table[rows[i], ...] = values[i, ...] for a row-major table whose first dimension is indexed."""
        extent, width = table.shape[0], product(table.shape[1:])
        count = rows.shape[0]
        flat = table.reshape((extent, width))
        tiling = Tiling((count, width), max(1, min(width, FREE_TILE)))
        index = self._index_column(rows, instr.name)  # before the nest, as in _gather_rows
        source = values if isinstance(values, Splat) else self._reshape(values, (count, width), instr.name)
        nest = self.builder.nest(f"{instr.name}.scatter", instr.name, tiling.axes(), self._attributes(instr))
        index_box = self._index_tile(nest, tiling, index, instr.name)
        tile_box = self._load(nest, tiling, source, instr.name, 1)
        add_statement(nest, "scatter", "dma_scatter", POOL, [self._every_row(flat, tiling)],
                      [tile_box, index_box])
        self.produced.add(table.base)


def _whole_rows(shape: tuple[int, ...], sizes: Sequence[int], keyed: Sequence[int],
                dropped: Sequence[int]) -> bool:
    """A gather's slice or a scatter's window is one whole row keyed by the `keyed` dimensions:
    size 1 in each of them (all dropped from the slice) and the full extent in every other."""
    return all(k in dropped and sizes[k] == 1 for k in keyed) and len(set(keyed)) == len(keyed) \
        and all(sizes[k] == shape[k] for k in range(len(shape)) if k not in keyed)


def _ends(starts: list[int], sizes) -> tuple[int, ...]:
    return tuple(s + n for s, n in zip(starts, sizes, strict=True))
