"""The golden HLO interpreter: runs a (verified) HloModuleProto on numpy arrays with XLA semantics.

It is the reference every compiled program is compared against, so it favours being plainly right
over being clever: one numpy operation per HLO instruction. Values are held as numpy arrays —
floats as float32 (bf16 and f16 values rounded to their type after every op that produces them),
integers in their own width (so arithmetic wraps as XLA's does), pred as bool. Dot and reductions
accumulate in fp32 and round once. Reducers the evaluator recognises (add, multiply, maximum,
minimum) run as one numpy reduction; any other reducer is folded element by element along the
reduced dimensions, vectorised over the kept ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ncc.schemas import hlo_pb2
from ncc.tools.common.dtypes import float_to_int, from_compute, storage_dtype, to_compute
from ncc.tools.common.errors import CompileError
from ncc.tools.common.numerics import total_order_key
from ncc.tools.hlo import composite_ops
from ncc.tools.hlo.elementwise import BINARY_OPCODES, UNARY_OPCODES, apply, round_to
from ncc.tools.hlo.hlo_types import (
    FLOAT_TYPES,
    SIGNED_TYPES,
    UNSIGNED_TYPES,
    T,
    compute_dtype,
    dims,
    entry_computation,
    is_tuple,
    leaf_shapes,
    ncc_dtype,
    parameters,
    root_of,
    shape_str,
)
from ncc.tools.hlo.hlo_verify import verify_module
from ncc.tools.hlo.index_math import (
    clamped_starts,
    gather_output_order,
    pad_placement,
    pad_target,
    physical_order,
    window_slices,
)
from ncc.tools.hlo.literals import literal_to_numpy
from ncc.tools.hlo.rng_bits import rng_bit_generator
from ncc.tools.hlo_opt.golden.sort import key_order, partition_order, simple_key

Instr = hlo_pb2.HloInstructionProto

_FAST_REDUCERS: dict[str, np.ufunc] = {
    "add": np.add,
    "multiply": np.multiply,
    "maximum": np.maximum,
    "minimum": np.minimum,
}
SEQUENTIAL_FOLD = 1024  # reduced elements folded in order by any reducer; a tree past that (_fold)
MAX_WHILE_ITERATIONS = 1_000_000  # a loop that runs longer is refused rather than evaluated forever
# identities on scalars: in a scalar region they pass their (vectorised) operand through
_SHAPE_ONLY = frozenset({"broadcast", "reshape", "transpose", "slice", "reverse", "bitcast", "pad",
                         "dynamic-slice", "gather"})


def evaluate(
    module: hlo_pb2.HloModuleProto, args: Sequence[np.ndarray], *, verify: bool = True
) -> list[np.ndarray]:
    """Run the entry computation on `args` (one per entry parameter, in parameter order).

    Returns one array per result leaf (a tuple root gives several, depth first). bf16 results are
    float32 arrays holding bf16 values; pred results are bool arrays.
    """
    if verify:
        verify_module(module)
    entry = entry_computation(module)
    params = parameters(entry)
    if len(args) != len(params):
        raise CompileError(
            "E104", f"the module takes {len(params)} inputs, {len(args)} were given", entry.name
        )
    values = [_coerce(arg, param.shape, param.name) for arg, param in zip(args, params, strict=True)]
    with np.errstate(all="ignore"):
        result = _Evaluator(module).run(entry, values)
    return [np.asarray(leaf, order="C") for leaf in _leaves(result)]


def make_inputs(module: hlo_pb2.HloModuleProto, seed: int) -> list:
    """Seeded inputs for the entry parameters: floats ~ N(0, 1), small integers, random preds."""
    rng = np.random.default_rng(seed)
    entry = entry_computation(module)
    if entry is None:
        raise CompileError("E204", "the module has no entry computation", module.name)
    return [_random(rng, param.shape) for param in parameters(entry)]


def _random(rng: np.random.Generator, shape: hlo_pb2.ShapeProto):
    if is_tuple(shape):
        return tuple(_random(rng, sub) for sub in shape.tuple_shapes)
    kind, size = shape.element_type, dims(shape)
    if kind in FLOAT_TYPES:
        return round_to(rng.standard_normal(size, dtype=np.float32), kind)
    if kind in SIGNED_TYPES:
        return rng.integers(-8, 9, size).astype(compute_dtype(kind))
    if kind in UNSIGNED_TYPES:
        return rng.integers(0, 16, size).astype(compute_dtype(kind))
    return rng.random(size) < 0.5


def _coerce(arg, shape: hlo_pb2.ShapeProto, name: str):
    """An input as the evaluator holds values of `shape`; a shape mismatch is E104."""
    if is_tuple(shape):
        if not isinstance(arg, (tuple, list)) or len(arg) != len(shape.tuple_shapes):
            count = len(shape.tuple_shapes)
            raise CompileError("E104", f"input for parameter '{name}' must be a tuple of {count}", name)
        return tuple(_coerce(a, sub, name) for a, sub in zip(arg, shape.tuple_shapes, strict=True))
    array = np.asarray(arg)
    if array.shape != dims(shape):
        raise CompileError(
            "E104",
            f"input for parameter '{name}' has shape {list(array.shape)}, the module "
            f"expects {shape_str(shape)}",
            name,
        )
    if shape.element_type in FLOAT_TYPES:
        return round_to(array.astype(np.float32), shape.element_type)
    if shape.element_type == T.PRED:
        return array != 0
    return array.astype(compute_dtype(shape.element_type))


def _leaves(value) -> list[np.ndarray]:
    if isinstance(value, tuple):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


class _Evaluator:
    def __init__(self, module: hlo_pb2.HloModuleProto) -> None:
        self.comps = {comp.id: comp for comp in module.computations}
        self.instrs = {instr.id: instr for comp in module.computations for instr in comp.instructions}
        self.reducer_kinds: dict[int, str | None] = {}
        self.dead_after: dict[int, list[list[int]]] = {}

    def _dead_after(self, comp: hlo_pb2.HloComputationProto) -> list[list[int]]:
        """Per instruction of `comp`, the values no later instruction reads (the root's excepted):
        dropped as soon as they die, so a long chain holds a few arrays, not all of them."""
        if comp.id not in self.dead_after:
            last_read = {instr.id: k for k, instr in enumerate(comp.instructions)}
            for k, instr in enumerate(comp.instructions):
                for operand in instr.operand_ids:
                    last_read[operand] = k
            dead: list[list[int]] = [[] for _ in comp.instructions]
            for value, k in last_read.items():
                if value != comp.root_id:
                    dead[k].append(value)
            self.dead_after[comp.id] = dead
        return self.dead_after[comp.id]

    def run(self, comp: hlo_pb2.HloComputationProto, args: list, scalar_region: bool = False):
        """Evaluate `comp` on `args`. In a scalar region (a reducer folded over arrays) values carry
        extra leading dimensions, so ops that only reshape scalars are identities."""
        values: dict[int, object] = {}
        dead_after = self._dead_after(comp)
        for position, instr in enumerate(comp.instructions):
            operands = [values[i] for i in instr.operand_ids]
            opcode = instr.opcode
            if opcode == "parameter":
                values[instr.id] = args[instr.parameter_number]
            elif opcode in ("call", "fusion"):
                callee = self.comps[instr.called_computation_ids[0]]
                values[instr.id] = self.run(callee, operands, scalar_region)
            elif scalar_region and opcode in _SHAPE_ONLY:
                values[instr.id] = operands[0]
            elif scalar_region and opcode == "dot":  # a dot of two scalars is their product
                kind = instr.shape.element_type
                work = np.float32 if kind in FLOAT_TYPES else None
                values[instr.id] = round_to(np.multiply(operands[0], operands[1], dtype=work), kind)
            elif scalar_region and opcode == "dynamic-update-slice":  # the update replaces the scalar
                values[instr.id] = operands[1]
            elif scalar_region and opcode == "sort":  # one element is sorted
                values[instr.id] = tuple(operands) if len(operands) > 1 else operands[0]
            elif scalar_region and opcode in ("reduce", "reduce-window"):  # a scalar: the reducer once
                k = len(operands) // 2
                reducer = self.comps[instr.called_computation_ids[0]]
                values[instr.id] = self.run(reducer, operands[k:] + operands[:k], True)
            else:
                values[instr.id] = _OPS[opcode](self, instr, operands)
            for value in dead_after[position]:
                del values[value]
        return values[comp.root_id]

    # ---- data movement ---------------------------------------------------------------------------
    def _constant(self, instr: Instr, _: list) -> object:
        return _literal(instr.literal, instr.shape)

    def _broadcast(self, instr: Instr, ops: list) -> np.ndarray:
        operand, mapping, out = ops[0], list(instr.dimensions), dims(instr.shape)
        order = sorted(range(len(mapping)), key=lambda i: mapping[i])
        operand = np.transpose(operand, order)
        expanded = [1] * len(out)
        for i in order:
            expanded[mapping[i]] = out[mapping[i]]
        return np.broadcast_to(np.reshape(operand, expanded), out)

    def _reshape(self, instr: Instr, ops: list) -> np.ndarray:
        return np.reshape(ops[0], dims(instr.shape))

    def _transpose(self, instr: Instr, ops: list) -> np.ndarray:
        return np.transpose(ops[0], list(instr.dimensions))

    def _slice(self, instr: Instr, ops: list) -> np.ndarray:
        return ops[0][tuple(slice(b.start, b.limit, b.stride) for b in instr.slice_dimensions)]

    def _concatenate(self, instr: Instr, ops: list) -> np.ndarray:
        return np.concatenate(ops, axis=instr.dimensions[0])

    def _iota(self, instr: Instr, _: list) -> np.ndarray:
        out, axis = dims(instr.shape), instr.dimensions[0]
        if 0 in out:  # no elements: never build the index line (an axis may be 10**12 long)
            return np.zeros(out, dtype=compute_dtype(instr.shape.element_type))
        line = np.arange(out[axis], dtype=np.int64)
        expanded = [1] * len(out)
        expanded[axis] = out[axis]
        kind = instr.shape.element_type
        values = line.astype(np.float32) if kind in FLOAT_TYPES else line
        return np.broadcast_to(round_to(values, kind).reshape(expanded), out)

    def _bitcast(self, instr: Instr, ops: list) -> np.ndarray:
        """The same bytes read with the result's shape and layout: into the operand's physical
        (major-to-minor) order, reshape, back out of the result's physical order."""
        operand = np.asarray(ops[0])
        source_shape = self.instrs[instr.operand_ids[0]].shape
        source_order = physical_order(source_shape.layout.minor_to_major, operand.ndim)
        target_order = physical_order(instr.shape.layout.minor_to_major, len(instr.shape.dimensions))
        physical = np.transpose(operand, source_order).reshape([dims(instr.shape)[d] for d in target_order])
        return np.transpose(physical, np.argsort(target_order))

    def _reverse(self, instr: Instr, ops: list) -> np.ndarray:
        return np.flip(ops[0], axis=tuple(instr.dimensions))

    def _pad(self, instr: Instr, ops: list) -> np.ndarray:
        edges = [(e.edge_padding_low, e.edge_padding_high, e.interior_padding)
                 for e in instr.padding_config.dimensions]
        return pad_array(np.asarray(ops[0]), ops[1], edges)

    def _convolution(self, instr: Instr, ops: list) -> np.ndarray:
        """Sum over kernel positions of (strided input window) @ (kernel slice), per feature group;
        with batch_group_count G, output feature group g convolves the g-th of G equal runs of the
        input batch (g-major, as XLA's evaluator indexes it)."""
        dn = instr.convolution_dimension_numbers
        batch_groups = max(1, instr.batch_group_count)
        if batch_groups > 1:
            lhs, rhs = np.asarray(ops[0]), np.asarray(ops[1])
            single = Instr()
            single.CopyFrom(instr)
            single.batch_group_count = 1
            per = lhs.shape[dn.input_batch_dimension] // batch_groups
            made = rhs.shape[dn.kernel_output_feature_dimension] // batch_groups
            single.shape.dimensions[dn.output_feature_dimension] = made
            parts = [self._convolution(single, [
                np.take(lhs, range(g * per, (g + 1) * per), axis=dn.input_batch_dimension),
                np.take(rhs, range(g * made, (g + 1) * made), axis=dn.kernel_output_feature_dimension)])
                for g in range(batch_groups)]
            return np.concatenate(parts, axis=dn.output_feature_dimension)
        window = instr.window.dimensions
        kind = instr.shape.element_type
        work = np.float32 if kind in FLOAT_TYPES else np.int64
        x = np.transpose(np.asarray(ops[0]), [dn.input_batch_dimension, *dn.input_spatial_dimensions,
                                              dn.input_feature_dimension]).astype(work)
        kernel_order = [*dn.kernel_spatial_dimensions, dn.kernel_input_feature_dimension,
                        dn.kernel_output_feature_dimension]
        w = np.transpose(np.asarray(ops[1]), kernel_order).astype(work)
        for axis, dim in enumerate(window):
            if dim.window_reversal:
                w = np.flip(w, axis=axis)
        spatial_edges = [(d.padding_low, d.padding_high, d.base_dilation - 1) for d in window]
        x = pad_array(x, 0, [(0, 0, 0), *spatial_edges, (0, 0, 0)])
        sizes = [dims(instr.shape)[d] for d in dn.output_spatial_dimensions]
        groups = max(1, instr.feature_group_count)
        in_group, out_group = x.shape[-1] // groups, w.shape[-1] // groups
        out = np.zeros((x.shape[0], *sizes, w.shape[-1]), dtype=work)
        if 0 not in sizes:
            for position in np.ndindex(*w.shape[:-2]):
                patch = x[(slice(None), *window_slices(position, window, sizes))]
                for g in range(groups):
                    taken = slice(g * in_group, (g + 1) * in_group)
                    made = slice(g * out_group, (g + 1) * out_group)
                    out[..., made] += patch[..., taken] @ w[position][:, made]
        order = [dn.output_batch_dimension, *dn.output_spatial_dimensions, dn.output_feature_dimension]
        return round_to(np.transpose(out, np.argsort(order)), kind)

    def _gather(self, instr: Instr, ops: list) -> np.ndarray:
        """XLA gather, every batch position at once: its start indices (clamped so the slice fits)
        pick a slice of the operand, and each operand batching dimension starts at the position's
        coordinate in its paired indices dimension; collapsed and batching dimensions go; slices
        land at offset_dims."""
        operand, indices = np.asarray(ops[0]), np.asarray(ops[1]).astype(np.int64)
        dn, sizes = instr.gather_dimension_numbers, list(instr.gather_slice_sizes)
        vector = dn.index_vector_dim
        if vector == indices.ndim:
            indices = indices[..., None]
        indices = np.moveaxis(indices, vector, -1)
        batch = indices.shape[:-1]
        dropped = set(dn.collapsed_slice_dims) | set(dn.operand_batching_dims)
        kept = [d for d in range(operand.ndim) if d not in dropped]
        paired = _batch_pairs(dn.operand_batching_dims, dn.start_indices_batching_dims, vector)
        starts = _window_starts(batch, operand.ndim, indices, dn.start_index_map, paired)
        for d in range(operand.ndim):
            starts[d] = np.clip(starts[d], 0, operand.shape[d] - sizes[d])
        picked = operand[_element_indices(starts, sizes, len(batch))]  # (*batch, *sizes)
        natural = picked.reshape((*batch, *(sizes[d] for d in kept)))
        order = gather_output_order(dn.offset_dims, len(batch), natural.ndim)
        return np.transpose(natural, order)

    def _scatter(self, instr: Instr, ops: list) -> np.ndarray:
        """XLA scatter: update windows apply in order, a window that does not fit in the operand is
        skipped, and the update computation combines the old value with the update's. Vectorised
        by rounds: round r applies every element's r-th update (an element's updates keep their
        order, and different elements never interact), so a scatter costs as many evaluations of
        the update computation as the most-updated element has updates; a plain add, multiply,
        maximum or minimum on f32 or integers is numpy's unbuffered ufunc.at (the same sequence of
        operations), and a computation that returns the update keeps each element's last one."""
        out = np.array(ops[0], copy=True)
        indices, updates = np.asarray(ops[1]).astype(np.int64), np.asarray(ops[2])
        dn = instr.scatter_dimension_numbers
        if dn.index_vector_dim == indices.ndim:
            indices = indices[..., None]
        indices = np.moveaxis(indices, dn.index_vector_dim, -1)
        window_dims = list(dn.update_window_dims)
        scatter_dims = [d for d in range(updates.ndim) if d not in window_dims]
        moved = np.transpose(updates, scatter_dims + window_dims)
        dropped = set(dn.inserted_window_dims) | set(dn.input_batching_dims)
        operand_window = [d for d in range(out.ndim) if d not in dropped]
        paired = _batch_pairs(dn.input_batching_dims, dn.scatter_indices_batching_dims, dn.index_vector_dim)
        sizes = [1] * out.ndim
        for d, n in zip(operand_window, moved.shape[len(scatter_dims):], strict=True):
            sizes[d] = n
        batch = indices.shape[:-1]
        starts = _window_starts(batch, out.ndim, indices, dn.scatter_dims_to_operand_dims, paired)
        fits = np.ones(batch, dtype=bool)
        for d in range(out.ndim):
            fits &= (starts[d] >= 0) & (starts[d] + sizes[d] <= out.shape[d])
        where = _element_indices(starts, sizes, len(batch))
        target = np.ravel_multi_index(tuple(np.broadcast_to(w, (*batch, *sizes)) for w in where),
                                      out.shape, mode="clip")[fits].reshape(-1)
        values = moved.reshape((*batch, *sizes))[fits].reshape(-1)
        flat = out.reshape(-1)
        combine = self.comps[instr.called_computation_ids[0]]
        kind = instr.shape.element_type
        fast = self._reducer_kind(combine)
        if fast is not None and (kind == T.F32 or kind in SIGNED_TYPES or kind in UNSIGNED_TYPES):
            _FAST_REDUCERS[fast].at(flat, target, values)  # in order, unbuffered: sequential exactly
            return flat.reshape(out.shape)
        if _returns_parameter(combine, 1):  # the update replaces the value: the last one stays
            last = len(target) - 1 - np.unique(target[::-1], return_index=True)[1]
            flat[target[last]] = round_to(values[last], kind)
            return flat.reshape(out.shape)
        # the rank of each update among the earlier updates of its element: its round
        by_target = np.argsort(target, kind="stable")
        sorted_target = target[by_target]
        first = np.searchsorted(sorted_target, sorted_target, side="left")
        rank = np.empty_like(target)
        rank[by_target] = np.arange(len(target)) - first
        for r in range(int(rank.max()) + 1 if len(rank) else 0):
            now = rank == r
            at = target[now]
            flat[at] = round_to(np.asarray(self.run(combine, [flat[at], values[now]], True)), kind)
        return flat.reshape(out.shape)

    def _sort(self, instr: Instr, ops: list) -> object:
        """A stable sort with the comparator (sort.py): numpy's argsort for a comparator that
        compares one key, else a merge sort whose levels ask the comparator about whole arrays."""
        dim = instr.dimensions[0]
        arrays = [np.moveaxis(np.asarray(op), dim, -1) for op in ops]
        shape = arrays[0].shape
        n = shape[-1] if shape else 1
        rows = int(np.prod(shape[:-1], dtype=np.int64)) if shape else 1
        flat = [a.reshape(rows, n) for a in arrays]
        comparator = self.comps[instr.called_computation_ids[0]]
        simple = simple_key(comparator)
        order = None
        if simple is not None and n:
            keys = flat[simple[0]]
            root = root_of(comparator)
            if root.comparison_type == "TOTALORDER" and keys.dtype.kind == "f":
                keys = total_order_key(keys)
            order = key_order(keys, simple[1])
        if order is None:

            linear = [a.reshape(-1) for a in flat]

            def before(first: np.ndarray, second: np.ndarray) -> np.ndarray:
                args = [a[at] for a in linear for at in (first, second)]
                return np.broadcast_to(np.asarray(self.run(comparator, args, True), dtype=bool), first.shape)

            order = partition_order(rows, n, before)
        results = [np.moveaxis(np.take_along_axis(a, order, axis=1).reshape(shape), -1, dim) for a in flat]
        return tuple(results) if len(ops) > 1 else results[0]

    def _topk(self, instr: Instr, ops: list) -> tuple:
        """The k largest (or smallest) along the last dimension, the lower index first among equals."""
        values = np.asarray(ops[0])
        keys = total_order_key(values) if values.dtype.kind == "f" else values.astype(np.int64)  # NaN largest
        order = np.argsort(-keys if instr.largest else keys, axis=-1, kind="stable")[..., :instr.k]
        return np.take_along_axis(values, order, axis=-1), order.astype(np.int32)

    def _reduce_window(self, instr: Instr, ops: list) -> object:
        """Fold the reducer over every window offset, vectorised over the output positions; padding
        holds the init value."""
        k = len(ops) // 2
        inputs, inits = [np.asarray(x) for x in ops[:k]], ops[k:]
        window = instr.window.dimensions
        kinds = [s.element_type for s in (instr.shape.tuple_shapes if k > 1 else [instr.shape])]
        sizes = dims(instr.shape.tuple_shapes[0] if k > 1 else instr.shape)
        edges = [(d.padding_low, d.padding_high, d.base_dilation - 1) for d in window]
        padded = [pad_array(x, init, edges) for x, init in zip(inputs, inits, strict=True)]
        accs = [np.full(sizes, init, dtype=x.dtype) for x, init in zip(inputs, inits, strict=True)]
        reducer = self.comps[instr.called_computation_ids[0]]
        scan = self._scan(instr, inputs, inits) if k == 1 else None
        if scan is not None:
            return round_to(scan, kinds[0])
        if 0 not in sizes:
            for offset in np.ndindex(*[d.size for d in window]):
                at = tuple(window_slices(offset, window, sizes))
                result = self.run(reducer, accs + [x[at] for x in padded], True)
                accs = list(result) if k > 1 else [result]
        results = [round_to(np.broadcast_to(acc, sizes), kind) for acc, kind in zip(accs, kinds, strict=True)]
        return tuple(results) if k > 1 else results[0]

    def _scan(self, instr: Instr, inputs: list[np.ndarray], inits: list) -> np.ndarray | None:
        """An inclusive scan (JAX's cumsum, cumprod, cummax, cummin: one dimension's window as long
        as the input and padded n - 1 on one side, the others 1, no stride or dilation, a plain
        add/multiply/maximum/minimum reducer with its identity as init) as numpy's accumulate,
        one pass instead of one per window offset; None for any other reduce-window."""
        window, x = instr.window.dimensions, inputs[0]
        kind = self._reducer_kind(self.comps[instr.called_computation_ids[0]])
        plain = all(w.stride == 1 and w.base_dilation <= 1 and w.window_dilation <= 1
                    and not w.window_reversal
                    for w in window)
        if kind is None or x.dtype == bool or not plain:
            return None
        long = [d for d, w in enumerate(window) if w.size != 1 or w.padding_low or w.padding_high]
        if len(long) != 1 or x.shape[long[0]] < 2:
            return None
        d, ufunc = long[0], _FAST_REDUCERS[kind]
        n, w = x.shape[d], window[long[0]]
        if w.size != n or sorted((w.padding_low, w.padding_high)) != [0, n - 1]:
            return None
        if np.asarray(inits[0], dtype=x.dtype) != _identity(kind, x.dtype):  # padding must add nothing
            return None
        if w.padding_high:  # a reverse scan: accumulate from the end
            return np.flip(ufunc.accumulate(np.flip(x, axis=d), axis=d), axis=d)
        return ufunc.accumulate(x, axis=d)

    def _select_and_scatter(self, instr: Instr, ops: list) -> np.ndarray:
        """XLA's select-and-scatter, vectorised over the windows. Each window's element is chosen by
        walking its offsets in order and moving to the next element whenever `select(chosen, next)`
        is false (padding is never chosen). The source is then combined into the chosen elements; a
        position chosen by several windows receives them in source order, which per position is
        the window offsets in reverse, so the offsets are applied last to first."""
        operand, source, init = (np.asarray(x) for x in ops)
        window = instr.window.dimensions
        select, scatter = (self.comps[c] for c in instr.called_computation_ids)
        edges = [(d.padding_low, d.padding_high, 0) for d in window]
        padded = pad_array(operand, np.zeros((), operand.dtype), edges)
        valid = pad_array(np.ones(operand.shape, bool), np.zeros((), bool), edges)
        sizes = source.shape
        offsets = list(np.ndindex(*[d.size for d in window]))
        chosen = np.full(sizes, -1, dtype=np.int64)
        best = np.zeros(sizes, operand.dtype)
        for k, offset in enumerate(offsets):
            at = tuple(window_slices(offset, window, sizes))
            value, present = padded[at], valid[at]
            keep = np.asarray(self.run(select, [best, value], True), dtype=bool)
            take = present & ((chosen < 0) | ~keep)
            best = np.where(take, value, best)
            chosen = np.where(take, k, chosen)
        out = np.full(operand.shape, init, dtype=operand.dtype)
        bordered = pad_array(out, np.zeros((), out.dtype), edges)
        for k in reversed(range(len(offsets))):
            at = tuple(window_slices(offsets[k], window, sizes))
            current = bordered[at]
            combined = np.asarray(self.run(scatter, [current, source], True))
            bordered[at] = np.where(chosen == k, combined, current)
        inner = tuple(slice(lo, lo + n) for (lo, _, _), n in zip(edges, operand.shape, strict=True))
        return round_to(bordered[inner], instr.shape.element_type)

    def _dynamic_slice(self, instr: Instr, ops: list) -> np.ndarray:
        operand = np.asarray(ops[0])
        starts = clamped_starts(operand.shape, list(instr.dynamic_slice_sizes), ops[1:])
        return operand[tuple(slice(s, s + n) for s, n in zip(starts, instr.dynamic_slice_sizes, strict=True))]

    def _dynamic_update_slice(self, instr: Instr, ops: list) -> np.ndarray:
        operand, update = np.asarray(ops[0]), np.asarray(ops[1])
        starts = clamped_starts(operand.shape, list(update.shape), ops[2:])
        out = operand.copy()
        out[tuple(slice(s, s + n) for s, n in zip(starts, update.shape, strict=True))] = update
        return out

    def _while(self, instr: Instr, ops: list) -> object:
        body, condition = (self.comps[c] for c in instr.called_computation_ids)
        state = ops[0]
        for _ in range(MAX_WHILE_ITERATIONS):
            if not bool(self.run(condition, [state])):
                return state
            state = self.run(body, [state])
        raise CompileError("E207", f"while loop '{instr.name}' ran {MAX_WHILE_ITERATIONS} iterations without "
                                   "ending", instr.name)

    def _conditional(self, instr: Instr, ops: list) -> object:
        selector, branches = ops[0], list(instr.called_computation_ids)
        if np.asarray(selector).dtype == bool:
            index = 0 if bool(selector) else 1
        else:  # an out-of-range branch index runs the last branch, as XLA defines it
            index = int(selector) if 0 <= int(selector) < len(branches) else len(branches) - 1
        return self.run(self.comps[branches[index]], [ops[1 + index]])

    def _tuple(self, instr: Instr, ops: list) -> tuple:
        return tuple(ops)

    def _get_tuple_element(self, instr: Instr, ops: list) -> object:
        return ops[0][instr.tuple_index]

    def _opt_barrier(self, instr: Instr, ops: list) -> object:
        return ops[0]

    # ---- arithmetic ------------------------------------------------------------------------------
    def _elementwise(self, instr: Instr, ops: list) -> np.ndarray:
        return apply(instr.opcode, ops, instr.shape.element_type)

    def _compare(self, instr: Instr, ops: list) -> np.ndarray:
        """A TOTALORDER compare of floats (JAX's sort comparators) compares their total-order keys:
        NaN after +inf, -0 before +0; IEEE's compare calls NaN unordered with everything."""
        if instr.comparison_type == "TOTALORDER" and np.asarray(ops[0]).dtype.kind == "f":
            ops = [total_order_key(op) for op in ops]
        return apply(instr.comparison_direction, ops, T.PRED)

    def _convert(self, instr: Instr, ops: list) -> np.ndarray:
        return _convert(np.asarray(ops[0]), instr.shape.element_type)

    def _bitcast_convert(self, instr: Instr, ops: list) -> np.ndarray:
        """The operand's stored bytes (little-endian) read as the result type."""
        source = ncc_dtype(self.instrs[instr.operand_ids[0]].shape.element_type)
        target = ncc_dtype(instr.shape.element_type)
        stored = np.ascontiguousarray(from_compute(np.asarray(ops[0]), source))
        raw = stored.view(storage_dtype(target)).reshape(tuple(instr.shape.dimensions))
        return round_to(to_compute(raw, target), instr.shape.element_type)

    def _rng_bit_generator(self, instr: Instr, ops: list) -> tuple:
        """(new state, bits) exactly as XLA:CPU computes them (tools/hlo/rng_bits.py)."""
        bits_shape = instr.shape.tuple_shapes[1]
        return rng_bit_generator(np.asarray(ops[0]), dims(bits_shape), compute_dtype(bits_shape.element_type),
                                 instr.rng_algorithm)

    def _dot(self, instr: Instr, ops: list) -> np.ndarray:
        lhs, rhs = np.asarray(ops[0]), np.asarray(ops[1])
        dn = instr.dot_dimension_numbers
        lb, lc = list(dn.lhs_batch_dimensions), list(dn.lhs_contracting_dimensions)
        rb, rc = list(dn.rhs_batch_dimensions), list(dn.rhs_contracting_dimensions)
        lf = [d for d in range(lhs.ndim) if d not in lb and d not in lc]
        rf = [d for d in range(rhs.ndim) if d not in rb and d not in rc]
        batch = [lhs.shape[d] for d in lb]
        m = int(np.prod([lhs.shape[d] for d in lf], dtype=np.int64))
        n = int(np.prod([rhs.shape[d] for d in rf], dtype=np.int64))
        k = int(np.prod([lhs.shape[d] for d in lc], dtype=np.int64))
        b = int(np.prod(batch, dtype=np.int64))
        kind = instr.shape.element_type
        work = np.float32 if kind in FLOAT_TYPES else np.int64
        left = np.transpose(lhs, lb + lf + lc).astype(work, copy=False).reshape(b, m, k)
        right = np.transpose(rhs, rb + rc + rf).astype(work, copy=False).reshape(b, k, n)
        return round_to(np.matmul(left, right).reshape(dims(instr.shape)), kind)

    def _reduce(self, instr: Instr, ops: list) -> object:
        k = len(ops) // 2
        inputs, inits = [np.asarray(x) for x in ops[:k]], ops[k:]
        axes = tuple(instr.dimensions)
        reducer = self.comps[instr.called_computation_ids[0]]
        kinds = [s.element_type for s in (instr.shape.tuple_shapes if k > 1 else [instr.shape])]
        fast = self._reducer_kind(reducer) if k == 1 else None
        if fast is not None and kinds[0] != T.PRED:
            ufunc, data = _FAST_REDUCERS[fast], inputs[0]
            if any(data.shape[a] == 0 for a in axes):
                kept = [s for d, s in enumerate(data.shape) if d not in axes]
                return round_to(np.broadcast_to(inits[0], kept), kinds[0])
            return round_to(ufunc(inits[0], ufunc.reduce(data, axis=axes)), kinds[0])
        return self._fold(reducer, inputs, inits, axes, kinds)

    def _fold(
        self,
        reducer: hlo_pb2.HloComputationProto,
        inputs: list[np.ndarray],
        inits: list,
        axes: tuple[int, ...],
        kinds: list[int],
    ) -> object:
        """Any reducer, vectorised over the kept elements. Up to SEQUENTIAL_FOLD reduced elements
        it is folded over them in order, from the init (XLA:CPU's order, which decides the result
        of a reducer that is not associative); past that, as the lowering applies it (hlo2penguin
        `_reduce_tree`): combined pairwise, halving their count each level (an odd last one folds
        into the first), then the init with the one left, so a reduce of a million elements costs
        20 evaluations of the reducer, not a million. XLA leaves the order unspecified."""
        rank = inputs[0].ndim
        kept = [d for d in range(rank) if d not in axes]
        out_shape = [inputs[0].shape[d] for d in kept]
        count = int(np.prod([inputs[0].shape[d] for d in axes], dtype=np.int64))
        rows = [np.transpose(x, kept + list(axes)).reshape(*out_shape, count) for x in inputs]
        accs = [np.broadcast_to(init, out_shape) for init in inits]
        if count <= SEQUENTIAL_FOLD:
            for r in range(count):
                accs = self._combine(reducer, accs, [x[..., r] for x in rows])
        else:
            while count > 1:
                half = count // 2
                merged = self._combine(reducer, [r[..., :half] for r in rows],
                                       [r[..., half:2 * half] for r in rows])
                if count % 2:
                    head = self._combine(reducer, [m[..., :1] for m in merged],
                                         [r[..., count - 1:] for r in rows])
                    merged = [np.concatenate([h, m[..., 1:]], axis=-1)
                              for h, m in zip(head, merged, strict=True)]
                rows, count = merged, half
            accs = self._combine(reducer, accs, [r[..., 0] for r in rows])
        results = [
            round_to(np.broadcast_to(acc, out_shape), kind) for acc, kind in zip(accs, kinds, strict=True)
        ]
        return tuple(results) if len(inputs) > 1 else results[0]

    def _combine(self, reducer: hlo_pb2.HloComputationProto, first: list, second: list) -> list[np.ndarray]:
        """The reducer applied elementwise to (first..., second...), its results as a list."""
        shape = np.broadcast_shapes(*(np.shape(x) for x in first + second))
        result = self.run(reducer, first + second, True)
        results = result if isinstance(result, tuple) else (result,)
        return [np.broadcast_to(np.asarray(r), shape) for r in results]

    def _reducer_kind(self, reducer: hlo_pb2.HloComputationProto) -> str | None:
        """'add'/'multiply'/'maximum'/'minimum' when the reducer is just that op on its two parameters."""
        if reducer.id not in self.reducer_kinds:
            params = {i.id: i.parameter_number for i in reducer.instructions if i.opcode == "parameter"}
            root = root_of(reducer)
            plain = (
                root.opcode in _FAST_REDUCERS
                and len(params) == 2
                and sorted(params.get(i, -1) for i in root.operand_ids) == [0, 1]
            )
            self.reducer_kinds[reducer.id] = root.opcode if plain else None
        return self.reducer_kinds[reducer.id]


def _literal(literal: hlo_pb2.LiteralProto, shape: hlo_pb2.ShapeProto) -> object:
    if is_tuple(shape):
        pairs = zip(literal.tuple_literals, shape.tuple_shapes, strict=True)
        return tuple(_literal(sub_literal, sub_shape) for sub_literal, sub_shape in pairs)
    return literal_to_numpy(literal, shape, "constant").astype(compute_dtype(shape.element_type))


def _batch_pairs(operand_dims, indices_dims, index_vector_dim: int) -> list[tuple[int, int]]:
    """(operand dimension, position among the indices' batch dimensions) for each batching pair."""
    return [(dim, b - (b > index_vector_dim)) for dim, b in zip(operand_dims, indices_dims, strict=True)]


def _returns_parameter(comp: hlo_pb2.HloComputationProto, number: int) -> bool:
    """Whether the computation's root is its parameter `number` (scatter's "replace")."""
    root = root_of(comp)
    return root.opcode == "parameter" and root.parameter_number == number


def _identity(kind: str, dtype: np.dtype) -> object:
    """The value a fast reducer leaves every element alone with: 0, 1, the lowest, the highest."""
    if kind in ("add", "multiply"):
        return 0 if kind == "add" else 1
    lowest = kind == "maximum"
    if np.dtype(dtype).kind == "f":
        return -np.inf if lowest else np.inf
    info = np.iinfo(dtype)
    return info.min if lowest else info.max


def _window_starts(batch: tuple[int, ...], rank: int, indices: np.ndarray, index_map, paired) -> list:
    """Per operand dimension, the start of every batch position's window (arrays of the batch
    shape): from the position's index vector through `index_map`, or its coordinate along the
    paired batch dimension, else 0."""
    starts: list = [np.zeros(batch, dtype=np.int64) for _ in range(rank)]
    for k, dim in enumerate(index_map):
        starts[dim] = indices[..., k]
    for dim, batch_dim in paired:
        shape = [1] * len(batch)
        shape[batch_dim] = batch[batch_dim]
        starts[dim] = np.broadcast_to(np.arange(batch[batch_dim]).reshape(shape), batch)
    return starts


def _element_indices(starts: list, sizes: list[int], batch_rank: int) -> tuple:
    """Index arrays of shape (*batch, *sizes) for every element of every window: start plus the
    offset within the window, per operand dimension."""
    rank = len(sizes)
    index = []
    for d, (start, size) in enumerate(zip(starts, sizes, strict=True)):
        offset = np.arange(size).reshape([1] * batch_rank + [size if e == d else 1 for e in range(rank)])
        index.append(np.asarray(start).reshape(np.shape(start) + (1,) * rank) + offset)
    return tuple(index)


def pad_array(operand: np.ndarray, value: object, edges: list[tuple[int, int, int]]) -> np.ndarray:
    """`operand` padded by (low, high, interior) per dimension with `value` (negative edges crop)."""
    shape = [low + high + n + max(n - 1, 0) * interior for (low, high, interior), n in
             zip(edges, operand.shape, strict=True)]
    out = np.full(shape, value, dtype=operand.dtype)
    source, target = [], []
    for (low, _, interior), size, extent in zip(edges, operand.shape, shape, strict=True):
        first, last = pad_placement(low, interior, size, extent)
        source.append(slice(first, last))
        target.append(pad_target(low, interior, first, last))
    out[tuple(target)] = operand[tuple(source)]
    return out


def _convert(values: np.ndarray, kind: int) -> np.ndarray:
    """XLA convert: float → int truncates toward zero and saturates (NaN → 0); int → int wraps."""
    if kind == T.PRED:
        return values != 0
    if kind in FLOAT_TYPES:
        return round_to(values.astype(np.float32), kind)
    dtype = compute_dtype(kind)
    if values.dtype.kind != "f":
        return values.astype(np.int64).astype(dtype) if values.dtype != bool else values.astype(dtype)
    return float_to_int(values, np.dtype(dtype))


def _reduce_precision(_: _Evaluator, instr: Instr, ops: list) -> np.ndarray:
    rounded = composite_ops.reduce_precision(ops[0], instr.exponent_bits, instr.mantissa_bits)
    return round_to(rounded, instr.shape.element_type)


def _batch_norm(_: _Evaluator, instr: Instr, ops: list) -> object:
    """The three batch norms (composite_ops.py), each result rounded to the operand's type."""
    compute = {"batch-norm-inference": composite_ops.batch_norm_inference,
               "batch-norm-training": composite_ops.batch_norm_training,
               "batch-norm-grad": composite_ops.batch_norm_grad}[instr.opcode]
    kind = leaf_shapes(instr.shape)[0].element_type
    result = compute(*ops, instr.epsilon, instr.feature_index)
    if isinstance(result, tuple):
        return tuple(round_to(part, kind) for part in result)
    return round_to(result, kind)


_OPS: dict[str, Callable[[_Evaluator, Instr, list], object]] = {
    "reduce-precision": _reduce_precision,
    "batch-norm-inference": _batch_norm,
    "batch-norm-training": _batch_norm,
    "batch-norm-grad": _batch_norm,
    "constant": _Evaluator._constant,
    "broadcast": _Evaluator._broadcast,
    "reshape": _Evaluator._reshape,
    "transpose": _Evaluator._transpose,
    "slice": _Evaluator._slice,
    "concatenate": _Evaluator._concatenate,
    "iota": _Evaluator._iota,
    "tuple": _Evaluator._tuple,
    "get-tuple-element": _Evaluator._get_tuple_element,
    "opt-barrier": _Evaluator._opt_barrier,
    "compare": _Evaluator._compare,
    "convert": _Evaluator._convert,
    "dot": _Evaluator._dot,
    "bitcast": _Evaluator._bitcast,
    "bitcast-convert": _Evaluator._bitcast_convert,
    "rng-bit-generator": _Evaluator._rng_bit_generator,
    "reverse": _Evaluator._reverse,
    "pad": _Evaluator._pad,
    "convolution": _Evaluator._convolution,
    "reduce-window": _Evaluator._reduce_window,
    "gather": _Evaluator._gather,
    "scatter": _Evaluator._scatter,
    "sort": _Evaluator._sort,
    "select-and-scatter": _Evaluator._select_and_scatter,
    "topk": _Evaluator._topk,
    "dynamic-slice": _Evaluator._dynamic_slice,
    "dynamic-update-slice": _Evaluator._dynamic_update_slice,
    "while": _Evaluator._while,
    "conditional": _Evaluator._conditional,
    "reduce": _Evaluator._reduce,
    **{op: _Evaluator._elementwise for op in UNARY_OPCODES | BINARY_OPCODES | {"select", "clamp", "copy",
                                                                             "is-finite"}},
}
