"""Lower a verified HLO module to Penguin IR: tiled loop nests over 128-partition tiles.

Layout ops (reshape, broadcast, transpose, slice, reverse, bitcast) cost nothing: they become
strided views that the consuming nest's DMAs read through (views.py). Scalar constants fold into
tensor_scalar immediates. Every computing op becomes nests that load operands from HBM into SBUF,
compute on the engine that owns the op, and store the result to HBM:

  elementwise    DVE tensor_tensor / tensor_scalar, ACT activation, POOL select / integer ops
  reduce         DVE tensor_reduce per free tile, combined across free tiles; any other reducer,
                 and variadic reduce, as a halving tree of the reducer applied to whole arrays
  dot            PE matmul into PSUM over 128-row K tiles (8-bit integers while exact in fp32; other
                 integers: POOL multiply, DVE sums)
  convolution    im2col as a strided view, one dot per feature group (depthwise: a multiply-add per tap)
  reduce-window  the reducer folded over window offsets (strided views of a padded input)
  pad, concatenate, dynamic-update-slice   copies into strided views of a new tensor
  gather, scatter, run-time dynamic slices  POOL's indirect dmas over rows of a table
  sort, topk     a bitonic network of compare-and-select nests (small-k topk: k selections)
  while          kept as a loop (a Repeat region: repeat.py) or unrolled while its condition folds to
                 a constant; conditional: both branches
  iota           POOL iota
  popcnt, clz    shift/mask/add bit tricks in the operand's own integer type
  bitcast-convert  a dma that reinterprets bytes; across widths, shifts and ors of the pieces
  rng-bit-generator  XLA:CPU's Threefry / Philox rounds in one POOL nest over counters (random.py)

`call` and `fusion` are inlined; tuples are plumbing. Anything else was refused by the verifier.
"""

from __future__ import annotations

import functools

import numpy as np

from ncc.schemas import common_pb2, hlo_pb2, penguin_pb2
from ncc.tools.common import affine
from ncc.tools.common.alu import IDENTITY_SCALE_BIAS
from ncc.tools.common.dtypes import from_compute, is_float, is_signed
from ncc.tools.common.errors import CompileError
from ncc.tools.common.penguin_budget import AUTO_ROLL_ABOVE
from ncc.tools.common.row_blocks import MAX_ROW_BLOCK
from ncc.tools.hlo.elementwise import apply
from ncc.tools.hlo.hlo_types import compute_dtype, ncc_dtype, root_of, xla_type
from ncc.tools.hlo.index_math import (
    physical_order,
)
from ncc.tools.hlo.literals import literal_to_numpy
from ncc.tools.hlo2penguin import affine_masks
from ncc.tools.hlo2penguin.bits import BIT_COUNTS, BitOps
from ncc.tools.hlo2penguin.control import ControlOps
from ncc.tools.hlo2penguin.dot_orientation import OTHER, Readers, product_readers, swap_pays
from ncc.tools.hlo2penguin.expand import expand_composites
from ncc.tools.hlo2penguin.first_nan import FirstNanOps
from ncc.tools.hlo2penguin.hlo_cse import eliminate_common_subexpressions
from ncc.tools.hlo2penguin.identities import identity_operand
from ncc.tools.hlo2penguin.indexed import IndexedOps
from ncc.tools.hlo2penguin.nest_builder import (
    FRONTEND_PREFIX,
    PARTITIONS,
    ProgramBuilder,
    Tiling,
    add_statement,
    canonical_shape,
    ceil_div,
    unwritten_read,
)
from ncc.tools.hlo2penguin.random import RandomOps
from ncc.tools.hlo2penguin.repeat import RepeatOps
from ncc.tools.hlo2penguin.reroll import reroll_repeats
from ncc.tools.hlo2penguin.sorting import SortOps
from ncc.tools.hlo2penguin.tile_plan import (
    FEW_TILES,
    TilePlan,
    compact_write,
    followed_plan,
    kept_as_written,
    plan_tiling,
    tile_count,
)
from ncc.tools.hlo2penguin.transpose_folding import fold_transposes
from ncc.tools.hlo2penguin.values import (
    ACT,
    DVE,
    FREE_TILE,
    PE,
    POOL,
    SP,
    Splat,
    Value,
    broadcast_to,
    is_integer,
    product,
    transposed,
)
from ncc.tools.hlo2penguin.views import View
from ncc.tools.hlo2penguin.windows import WindowOps

MATMUL_N_TILE = 512      # one PSUM bank of fp32
MATMUL_K_TILE = 128      # contraction rows per matmul (partitions)
MATMUL_M_TILE = 128      # stationary free size
LAYOUT_OPS = frozenset({"broadcast", "reshape", "transpose", "slice", "reverse", "bitcast"})
REGION_MOVES = LAYOUT_OPS | {"pad", "dynamic-slice", "dynamic-update-slice", "reduce", "reduce-window", "dot",
                             "gather", "sort"}


# HLO op -> the device function that computes it (docs/ir.md): binary ops on DVE (floats) or POOL
# (integers and pred), tensor_tensor or, with a constant operand, tensor_scalar.
BINARY = {"add": "add", "subtract": "subtract", "multiply": "multiply", "divide": "divide",
          "maximum": "maximum", "minimum": "minimum", "power": "power", "remainder": "remainder",
          "atan2": "atan2", "and": "and", "or": "or", "xor": "xor", "shift-left": "shift_left",
          "shift-right-logical": "shift_right_logical", "shift-right-arithmetic": "shift_right_arithmetic"}
# Float unary ops: one ACT activation each.
ACTIVATIONS = {"exponential": "exp", "log": "log", "tanh": "tanh", "erf": "erf", "logistic": "logistic",
               "rsqrt": "rsqrt", "sqrt": "sqrt", "exponential-minus-one": "expm1", "log-plus-one": "log1p",
               "sine": "sin", "cosine": "cos", "tan": "tan", "cbrt": "cbrt", "floor": "floor", "ceil": "ceil",
               "round-nearest-even": "round_even", "round-nearest-afz": "round_afz", "abs": "abs",
               "sign": "sign"}
COMPARE = {"EQ": "eq", "NE": "ne", "LT": "lt", "LE": "le", "GT": "gt", "GE": "ge"}
REDUCERS = {"add": ("add", 0.0), "maximum": ("maximum", -np.inf), "minimum": ("minimum", np.inf),
            "multiply": ("multiply", 1.0)}




class Lowering(IndexedOps, WindowOps, ControlOps, RepeatOps, SortOps, BitOps, RandomOps, FirstNanOps):
    """Walks the entry computation in order and emits Penguin tensors and nests."""

    def __init__(self, module: hlo_pb2.HloModuleProto, loops: str = "auto",
                 repeat_above: int = AUTO_ROLL_ABOVE) -> None:
        self.module = module
        self.loops = loops  # --loops: whether a while loop may stay a loop (repeat.py)
        self.repeat_above = repeat_above  # ... when unrolled it would be this many instructions
        self.in_repeat = False  # lowering the body of a while loop kept as a loop
        self.inplace_carries: set[str] = set()  # carries a dynamic-update-slice may write in place
        self.inplace_writes: list[tuple[str, int]] = []  # (carry, nests when its update was emitted)
        self.computations = {c.id: c for c in module.computations}
        self.instructions = {i.id: i for c in module.computations for i in c.instructions}
        self.computation_of = {i.id: c for c in module.computations for i in c.instructions}
        self.readers: dict[int, Readers] = {}  # computation id -> its readers index (dot orientation)
        self.builder = ProgramBuilder(penguin_pb2.Program(name=module.name))
        self.produced: set[str] = set()  # HBM tensors written by a nest of this program
        self.plans: dict[str, TilePlan] = {}  # HBM tensor -> the plan of the elementwise nest that wrote it
        self.region_shape: tuple[int, ...] = ()  # set while a reducer is applied elementwise to arrays
        # id(value) -> (value, its affine_masks form): values that are affine functions of their index
        self.forms: dict[int, tuple[Value, affine_masks.Form]] = {}
        # tensors stored transposed by a swapped dot (`_swapped_dot`) and the elementwise ops that
        # follow its layout: their readers see them through a transpose
        self.swapped: set[str] = set()

    # ---- driver -------------------------------------------------------------------------
    def run(self) -> penguin_pb2.Program:
        entry = self._entry()
        args: list[Value] = []
        params = sorted((i for i in entry.instructions if i.opcode == "parameter"),
                        key=lambda i: i.parameter_number)
        for instr in params:
            if instr.shape.element_type == hlo_pb2.TUPLE:
                message = f"tuple-shaped parameter '{instr.name}' is not supported"
                raise CompileError("E207", message, instr.name)
            shape, dtype = self._shape(instr), ncc_dtype(instr.shape.element_type)
            name = self.builder.hbm_tensor(instr.name, dtype, shape, penguin_pb2.INPUT, instr.name,
                                           index=instr.parameter_number)
            args.append(View.whole(name, dtype, shape))
        result = self._computation(entry, args)
        outputs = list(result) if isinstance(result, tuple) else [result]
        for index, value in enumerate(outputs):
            self._bind_output(index, value)
        problem = unwritten_read(self.builder.program)
        if problem is not None:  # a lowering bug: refuse it rather than compute from garbage
            raise RuntimeError(f"internal: the lowering's nests are out of order: {problem}")
        return self.builder.program

    def _entry(self) -> hlo_pb2.HloComputationProto:
        for comp in self.module.computations:
            if comp.id == self.module.entry_computation_id or comp.name == self.module.entry_computation_name:
                return comp
        return self.module.computations[-1]

    def _computation(self, comp: hlo_pb2.HloComputationProto, args: list[Value]) -> Value:
        values: dict[int, Value] = {}
        for instr in comp.instructions:
            operands = [values[i] for i in instr.operand_ids]
            values[instr.id] = self._instruction(instr, operands, args)
            self._note_form(instr, operands, values[instr.id])
        return values[comp.root_id if comp.root_id in values else comp.instructions[-1].id]

    def _note_form(self, instr: hlo_pb2.HloInstructionProto, operands: list[Value], result: Value) -> None:
        """Remember `result`'s affine_masks form, if it has one (not inside a reducer applied to arrays,
        whose scalars stand for arrays)."""
        if self.region_shape or not isinstance(result, View) or id(result) in self.forms:
            return
        if not all(isinstance(op, (View, Splat)) for op in operands):
            return
        forms = [self._form(op) for op in operands]
        form = affine_masks.form_of(instr, forms, result.shape, ncc_dtype(instr.shape.element_type),
                                    [op.shape for op in operands])
        if form is not None:
            self.forms[id(result)] = (result, form)

    def _form(self, value: Value) -> affine_masks.Form | None:
        if isinstance(value, Splat):
            return affine_masks.constant_form(value.value, value.dtype, len(value.shape))
        known = self.forms.get(id(value))
        return known[1] if known is not None and known[0] is value else None

    def _bind_output(self, index: int, value: Value) -> None:
        if isinstance(value, tuple):
            raise CompileError("E207", "nested tuple results are not supported", f"result {index}")
        decl = self.builder.decl(value.base) if isinstance(value, View) else None
        if (
            decl is not None
            and value.base in self.produced
            and decl.role == penguin_pb2.INTERNAL
            and value.is_whole(tuple(decl.shape))
        ):
            decl.role = penguin_pb2.OUTPUT
            decl.index = index
            del decl.shape[:]
            decl.shape.extend(value.shape)
            return
        name = self.builder.hbm_tensor(f"out{index}", value.dtype, value.shape, penguin_pb2.OUTPUT, "result",
                                       index=index)
        self._copy_into(value, View.whole(name, value.dtype, value.shape), f"out{index}")

    # ---- per instruction ----------------------------------------------------------------
    def _shape(self, instr: hlo_pb2.HloInstructionProto) -> tuple[int, ...]:
        """The instruction's shape; inside a reducer applied to whole arrays (`region_shape`), every
        scalar of the reducer stands for an array of that shape."""
        return self.region_shape + tuple(int(d) for d in instr.shape.dimensions)

    def _instruction(self, instr: hlo_pb2.HloInstructionProto, ops: list[Value], args: list[Value]) -> Value:
        opcode = instr.opcode
        shape = self._shape(instr)
        if opcode == "parameter":
            return args[instr.parameter_number]
        if opcode == "tuple":
            return tuple(ops)
        if opcode == "get-tuple-element":
            return ops[0][instr.tuple_index]
        if opcode == "opt-barrier":  # it only stops XLA's own optimizer: the values pass through
            return ops[0]
        if opcode in ("call", "fusion"):  # a fusion is XLA's grouping; ncc re-derives its own
            return self._computation(self.computations[instr.called_computation_ids[0]], ops)
        if opcode == "while":
            return self._while(instr, ops[0])
        if opcode == "conditional":
            return self._conditional(instr, ops)
        if opcode == "rng-bit-generator":
            return self._rng_bit_generator(instr, ops[0])
        if self.region_shape and opcode in REGION_MOVES:
            return self._region_move(instr, ops, shape)
        if opcode == "reduce-window":
            return self._reduce_window(instr, ops)
        if opcode == "sort":
            return self._sort(instr, ops)
        if opcode == "topk":
            return self._topk(instr, ops)
        if opcode == "reduce" and not self._plain_reduce(instr, ops):
            return self._reduce_tree(instr, ops)
        dtype = ncc_dtype(instr.shape.element_type)
        if 0 in shape:
            return Splat(0.0, dtype, shape)  # no elements: nothing to compute, whatever the op
        if opcode == "constant":
            return self._constant(instr, shape, dtype)
        if opcode in BIT_COUNTS:
            return self._bit_count(instr, ops[0], shape, dtype)
        if opcode == "bitcast-convert":
            return self._bitcast_convert(instr, ops[0], shape, dtype)
        if opcode in LAYOUT_OPS:
            return self._layout(instr, ops[0], shape)
        if opcode == "pad":
            return self._pad(instr, ops, shape, dtype)
        if opcode == "select-and-scatter":
            return self._select_and_scatter(instr, ops, shape, dtype)
        if opcode == "convolution":
            return self._convolution(instr, ops, shape, dtype)
        if opcode == "dynamic-slice":
            return self._dynamic_slice(instr, ops, shape)
        if opcode == "dynamic-update-slice":
            return self._update_slice(instr, ops, shape, dtype)
        if opcode == "gather":
            return self._gather(instr, ops, shape)
        if opcode == "scatter":
            return self._scatter(instr, ops, shape, dtype)

        if opcode == "concatenate":
            return self._concatenate(instr, ops, shape, dtype)
        if opcode == "iota":
            return self._iota(instr, shape, dtype)
        if opcode == "reduce":
            return self._reduce(instr, ops, shape, dtype)
        if opcode == "dot":
            return self._dot(instr, ops, shape, dtype)
        return self._elementwise(instr, ops, shape, dtype)

    def _constant(self, instr: hlo_pb2.HloInstructionProto, shape: tuple[int, ...], dtype: int) -> Value:
        values = literal_to_numpy(instr.literal, instr.shape, instr.name)
        flat = values.reshape(-1)
        if flat.size == 0:
            return Splat(0.0, dtype, shape)
        if np.all(flat == flat[0]) and not np.isnan(flat[0]):
            return self._scalar(flat[0], dtype, shape, instr.name)
        own = tuple(int(d) for d in instr.shape.dimensions)  # in a reducer applied to arrays, a scalar
        name = self.builder.hbm_tensor(instr.name, dtype, own, penguin_pb2.CONSTANT, instr.name,
                                       data=from_compute(values, dtype).tobytes())
        whole = View.whole(name, dtype, own)
        return whole if own == shape else whole.broadcast(shape, ())

    def _layout(self, instr: hlo_pb2.HloInstructionProto, operand: Value, shape: tuple[int, ...]) -> Value:
        if isinstance(operand, Splat):
            return Splat(operand.value, operand.dtype, shape)
        dims = tuple(int(d) for d in instr.dimensions)
        if instr.opcode == "broadcast":
            return operand.broadcast(shape, dims)
        if instr.opcode == "transpose":
            return operand.transpose(dims)
        if instr.opcode == "reverse":
            return operand.reverse(dims)
        if instr.opcode == "bitcast":  # the same bytes: through the operand's physical order and back
            source = self._operand_shape(instr)
            source_order = physical_order(source.layout.minor_to_major, len(operand.shape))
            target_order = physical_order(instr.shape.layout.minor_to_major, len(shape))
            physical = self._reshape(operand.transpose(tuple(source_order)),
                                     tuple(shape[d] for d in target_order), instr.name)
            return physical.transpose(tuple(int(d) for d in np.argsort(target_order)))
        if instr.opcode == "slice":
            s = instr.slice_dimensions
            return operand.slice(tuple(d.start for d in s), tuple(d.limit for d in s),
                                 tuple(d.stride or 1 for d in s))
        return self._reshape(operand, shape, instr.name)

    def _region_move(self, instr, ops: list[Value], shape: tuple[int, ...]) -> Value:
        """An op of a reducer applied to arrays that only moves its scalars: the same values."""
        opcode = instr.opcode
        if opcode == "dynamic-update-slice":
            return ops[1]  # the update replaces the whole scalar
        if opcode == "sort":  # one element is sorted
            return tuple(ops) if len(ops) > 1 else ops[0]
        if opcode in ("reduce", "reduce-window"):  # reducing a scalar applies the reducer once
            k = len(ops) // 2
            return self._computation(self.computations[instr.called_computation_ids[0]], ops[k:] + ops[:k])
        if opcode == "dot":
            return self._synthetic(instr, "multiply", ops, shape, ncc_dtype(instr.shape.element_type))
        return ops[0]

    def _operand_shape(self, instr) -> hlo_pb2.ShapeProto:
        return self.instructions[instr.operand_ids[0]].shape

    def _window(self, value: Value, starts: tuple[int, ...], limits: tuple[int, ...],
                steps: tuple[int, ...] | None = None) -> Value:
        """Elements starts..limits (by steps) of every dimension: a view, or a smaller Splat."""
        steps = steps or (1,) * len(starts)
        if isinstance(value, Splat):
            shape = tuple(max(0, -(-(b - a) // s)) for a, b, s in zip(starts, limits, steps, strict=True))
            return Splat(value.value, value.dtype, shape)
        return value.slice(tuple(starts), tuple(limits), tuple(steps))

    def _synthetic(self, instr, opcode: str, ops: list[Value], shape: tuple[int, ...], dtype: int,
                   into: View | None = None, **fields) -> Value:
        """An elementwise op the lowering adds on behalf of `instr` (named after it)."""
        made = hlo_pb2.HloInstructionProto(name=f"{instr.name}.{opcode}", opcode=opcode, **fields)
        return self._elementwise(made, ops, shape, dtype, into)

    def _reshape(self, view: View, shape: tuple[int, ...], source: str) -> View:
        reshaped = view.reshape(shape)
        if reshaped is None:  # not re-stridable: materialize row-major, then reshape for free
            reshaped = self._materialize(view, source).reshape(shape)
        return reshaped

    def _materialize(self, value: Value, source: str) -> View:
        name = self.builder.hbm_tensor(f"{source}.copy", value.dtype, value.shape, penguin_pb2.INTERNAL,
                                       source)
        target = View.whole(name, value.dtype, value.shape)
        self._copy_into(value, target, source)
        return target

    def _concatenate(self, instr, ops: list[Value], shape: tuple[int, ...], dtype: int) -> View:
        axis = int(instr.dimensions[0])
        name = self.builder.hbm_tensor(instr.name, dtype, shape, penguin_pb2.INTERNAL, instr.name)
        whole = View.whole(name, dtype, shape)
        start = 0
        for operand in ops:
            starts = [0] * len(shape)
            limits = list(shape)
            starts[axis], limits[axis] = start, start + operand.shape[axis]
            self._copy_into(operand, whole.slice(tuple(starts), tuple(limits), (1,) * len(shape)), instr.name)
            start += operand.shape[axis]
        return whole

    # ---- tiled nests --------------------------------------------------------------------
    def _tiling(self, shape: tuple[int, ...], free_tile: int = FREE_TILE) -> Tiling:
        canon = canonical_shape(shape)
        # max(1, ...): a zero-element array has no tiles (an axis of extent 0), not a zero-wide tile
        return Tiling(canon, max(1, min(canon[-1], free_tile)))

    def _load(self, nest, tiling: Tiling, value: Value, hint: str, index: int) -> penguin_pb2.Access:
        """Statements that bring `value` into an SBUF tile of the current tile; returns the tile box."""
        tile = self.builder.tile(f"{hint}.in{index}", value.dtype, tiling.shape,
                                 (1,) * (len(tiling.shape) - 2) + (PARTITIONS, tiling.free_tile))
        if isinstance(value, Splat):
            add_statement(nest, f"fill{index}", "iota", POOL, [tiling.box(tile)], [],
                          scalars=(value.value, 0.0, 0.0))
        else:
            view = self._canonical_view(value, tiling.shape, hint)
            add_statement(nest, f"load{index}", "dma", SP, [tiling.box(tile)],
                          [tiling.box(self.builder.view(view))])
        return tiling.box(tile)

    def _canonical_view(self, view: View, canon: tuple[int, ...], source: str) -> View:
        return self._reshape(view, canon, source)

    def _store(self, nest, tiling: Tiling, tile_box: penguin_pb2.Access, target: View, source: str,
               **kw) -> None:
        view = self._canonical_view(target, tiling.shape, source)
        add_statement(nest, "store", "dma", SP, [tiling.box(self.builder.view(view))], [tile_box], **kw)
        self.produced.add(target.base)

    def _new_output(self, instr, shape: tuple[int, ...], dtype: int) -> View:
        name = self.builder.hbm_tensor(instr.name, dtype, shape, penguin_pb2.INTERNAL, instr.name)
        return View.whole(name, dtype, shape)

    def _attributes(self, instr) -> dict[str, str]:
        return {f"{FRONTEND_PREFIX}{k}": v for k, v in instr.frontend_attributes.map.items()}

    def _copy_into(self, value: Value, target: View, source: str) -> None:
        plan = plan_tiling(target.shape, [target] + ([value] if isinstance(value, View) else []), FREE_TILE)
        if plan is not None:  # a copy may walk its elements in any order: both sides alike
            value, target = plan.walk(value), plan.apply(target)
        elif (order := _copy_order(target.shape) if isinstance(value, View) else None) is not None \
                and compact_write(target.transpose(order), FREE_TILE):
            value, target = value.transpose(order), target.transpose(order)
        tiling = self._tiling(target.shape)
        nest = self.builder.nest(f"{source}.copy", source, tiling.axes())
        box = self._load(nest, tiling, value, source, 0)
        self._store(nest, tiling, box, target, source)

    def _elementwise(self, instr, ops: list[Value], shape: tuple[int, ...], dtype: int,
                     into: View | None = None) -> Value:
        """One nest computing the op tile by tile; the result goes to a new tensor, or to `into`
        (a view of an existing one, which then holds a constant result too)."""
        opcode = instr.opcode
        if opcode == "copy" and into is None:
            return ops[0]  # values are immutable: a copy is the value itself
        if opcode == "compare" and instr.comparison_type == "TOTALORDER" and is_float(ops[0].dtype):
            return self._total_order_compare(instr, ops, shape, into)  # sorting.py
        if into is None and (operand := identity_operand(opcode, ops, dtype)) is not None:
            return operand  # x * 1, max(x, -inf), ...: the operand itself (identities.py)
        if all(isinstance(op, Splat) for op in ops):
            folded = self._fold(instr, ops, shape, dtype)
            if into is not None:
                self._copy_into(folded, into, instr.name)
                return into
            return folded
        condition = self._form(ops[0]) if opcode == "select" and into is None else None
        ops = [op if isinstance(op, Splat) or op.shape == shape else op.broadcast(shape, ()) for op in ops]
        if condition is not None and (selected := self._affine_select(instr, condition, ops, shape, dtype)):
            return selected
        if opcode == "copy":
            self._copy_into(ops[0], into, instr.name)
            return into
        if into is None and (order := _stored_order(ops, shape, self.swapped)) is not None:
            # the operands are a tensor stored transposed (a swapped dot's product): compute in
            # its memory order and read the result back through the same transpose
            permuted = tuple(shape[d] for d in order)
            walked = [transposed(op, order) for op in ops]
            result_ = self._elementwise(instr, walked, permuted, dtype)
            if isinstance(result_, View):
                self.swapped.add(result_.base)
            return result_.transpose(tuple(order.index(d) for d in range(len(shape))))
        out = into if into is not None else self._new_output(instr, shape, dtype)
        result = out
        views = [out] + [op for op in ops if isinstance(op, View)]
        producers = [self.plans[v.base] for v in views[1:] if v.base in self.plans]
        plan = followed_plan(plan_tiling(shape, views, FREE_TILE), producers, shape, views, FREE_TILE)
        if plan is not None:  # elementwise: any walk of the elements, alike for every operand
            if into is None:
                self.plans[out.base] = plan
            ops = [plan.walk(op) for op in ops]
            out, shape = plan.apply(out), plan.shape
        tiling = self._tiling(shape)
        nest = self.builder.nest(instr.name, instr.name, tiling.axes(), self._attributes(instr))
        body = _Body(self, nest, tiling, instr.name)
        out_box = body.tile(dtype)
        operand_dtype = next(op.dtype for op in ops if not isinstance(op, Splat))
        engine = DVE if is_float(operand_dtype) else POOL
        if opcode in BINARY or opcode == "compare":
            func = BINARY.get(opcode) or COMPARE[instr.comparison_direction]
            body.binary(func, engine, out_box, ops[0], ops[1])
        elif opcode in ACTIVATIONS and is_float(dtype):
            body.emit("activation", ACT, out_box, [ops[0]], func=ACTIVATIONS[opcode],
                      scalars=IDENTITY_SCALE_BIAS)
        elif opcode == "negate":
            body.binary("multiply", engine, out_box, ops[0], Splat(-1.0, dtype, shape))
        elif opcode == "abs" and not is_signed(dtype):
            body.emit("tensor_copy", POOL, out_box, [ops[0]])
        elif opcode == "abs":  # an integer: max(x, -x), which wraps MIN to MIN as XLA does
            negated = body.tile(dtype)
            body.binary("multiply", engine, negated, ops[0], Splat(-1.0, dtype, shape))
            body.binary("maximum", engine, out_box, ops[0], negated)
        elif opcode == "sign":  # an integer: (x > 0) - (x < 0)
            positive, negative = body.tile(dtype), body.tile(dtype)
            body.binary("gt", engine, positive, ops[0], Splat(0.0, dtype, shape))
            body.binary("lt", engine, negative, ops[0], Splat(0.0, dtype, shape))
            body.binary("subtract", engine, out_box, positive, negative)
        elif opcode == "not":  # all bits flipped; pred is 0/1, so its not is xor 1
            mask = 1.0 if dtype == common_pb2.PRED else -1.0
            body.binary("xor", POOL, out_box, ops[0], Splat(mask, dtype, shape))
        elif opcode == "is-finite":  # x - x is 0 exactly when x is finite (inf - inf and NaN give NaN)
            difference = body.tile(common_pb2.F32)
            body.binary("subtract", DVE, difference, ops[0], ops[0])
            body.binary("eq", DVE, out_box, difference, Splat(0.0, common_pb2.F32, shape))
        elif opcode == "clamp":
            low, x, high = ops
            raised = body.tile(dtype)
            body.binary("maximum", engine, raised, x, low)
            body.binary("minimum", engine, out_box, raised, high)
        elif opcode == "convert":
            body.emit("tensor_copy", DVE if is_float(operand_dtype) or is_float(dtype) else POOL, out_box,
                      [ops[0]])
        elif opcode == "select":
            body.emit("select", POOL, out_box, ops)
        else:
            raise CompileError("E201", f"unsupported opcode '{opcode}'", instr.name)
        self._store(nest, tiling, out_box, out, instr.name)
        return result

    def _affine_select(self, instr, condition: affine_masks.Form, ops: list[Value], shape: tuple[int, ...],
                       dtype: int) -> View | None:
        """A select between a tile and a constant whose predicate is affine in the element's row and
        column (a causal mask: affine_masks.py): one POOL affine_select that computes the predicate
        as it goes, reading only the tile. None when the select is not one."""
        _, on_true, on_false = ops
        mask = affine_masks.select_mask(condition, len(shape))
        if mask is None or not is_float(dtype) or canonical_shape(shape) != shape:
            return None
        if isinstance(on_false, Splat) and isinstance(on_true, View):
            kept, fill = on_true, on_false.value
        elif isinstance(on_true, Splat) and isinstance(on_false, View):
            kept, fill, mask = on_false, on_true.value, affine_masks.negated(mask)
        else:
            return None
        out = self._new_output(instr, shape, dtype)
        tiling = self._tiling(shape)
        nest = self.builder.nest(instr.name, instr.name, tiling.axes(), self._attributes(instr))
        body = _Body(self, nest, tiling, instr.name)
        out_box = body.tile(dtype)
        row, column = mask.coeffs[-2:]
        body.emit("affine_select", POOL, out_box, [kept], scalars=(fill, float(mask.const), row, column))
        self._store(nest, tiling, out_box, out, instr.name)
        return out

    def _fold(self, instr, ops: list[Splat], shape: tuple[int, ...], dtype: int) -> Value:
        """An elementwise op of constants is a constant: computed with the evaluator's semantics,
        in the result's type (bf16 keeps 8 bits, integers wrap)."""
        opcode = instr.comparison_direction if instr.opcode == "compare" else instr.opcode
        if instr.opcode == "convert":
            opcode = "copy"
        values = [np.asarray([op.value]).astype(compute_dtype(xla_type(op.dtype))) for op in ops]
        result = apply(opcode, values, xla_type(dtype))
        return self._scalar(result[0], dtype, shape, instr.name)

    def _scalar(self, value, dtype: int, shape: tuple[int, ...], source: str) -> Value:
        """A compile-time scalar over `shape`: a Splat when an instruction's double `scalars` field
        holds it exactly; an s64/u64 integer past 2**53 becomes a one-element constant tensor."""
        exact = isinstance(value, (bool, float, np.bool_, np.floating)) or abs(int(value)) <= 1 << 53
        if exact:
            return Splat(float(value), dtype, shape)
        name = self.builder.hbm_tensor(source, dtype, (), penguin_pb2.CONSTANT, source,
                                       data=from_compute(np.asarray([value]), dtype).tobytes())
        return View.whole(name, dtype, ()).broadcast(shape, ())

    def _iota(self, instr, shape: tuple[int, ...], dtype: int) -> View:
        out = self._new_output(instr, shape, dtype)
        # a vector's iota counts along partitions: as (n, 1), its value is the partition index
        tiling = self._tiling(shape) if len(shape) != 1 else Tiling((shape[0], 1), 1)
        canon_dim = int(instr.dimensions[0]) if len(shape) >= 2 else 0
        nest = self.builder.nest(instr.name, instr.name, tiling.axes(), self._attributes(instr))
        tile = self.builder.tile(f"{instr.name}.out", dtype, tiling.shape,
                                 (1,) * (len(tiling.shape) - 2) + (PARTITIONS, tiling.free_tile))
        add_statement(nest, "compute", "iota", POOL, [tiling.box(tile)], [], scalars=(0.0, 0.0, 0.0),
                      attributes={"iota_dimension": str(canon_dim)})
        self._store(nest, tiling, tiling.box(tile), out, instr.name)
        return out

    def _reducer(self, instr) -> str | None:
        """'add'/'maximum'/'minimum'/'multiply' when the reducer is just that op on its two parameters."""
        comp = self.computations[instr.called_computation_ids[0]]
        root = root_of(comp, comp.instructions[-1])
        params = {i.id for i in comp.instructions if i.opcode == "parameter"}
        if root.opcode in REDUCERS and len(params) == 2 and set(root.operand_ids) == params:
            return root.opcode
        return None

    def _plain_reduce(self, instr, ops: list[Value]) -> bool:
        """One input, a constant init and a reducer DVE's tensor_reduce has: the fast path."""
        return len(ops) == 2 and isinstance(ops[1], Splat) and self._reducer(instr) is not None \
            and ops[1].dtype != common_pb2.PRED

    def _reduce_tree(self, instr, ops: list[Value]) -> Value:
        """Any reducer, any number of inputs (argmax's (value, index) pairs): the reducer's scalar
        computation is applied to whole arrays, halving the reduced width each level — log2(width)
        levels, each a few elementwise nests. XLA leaves the order of a reduction unspecified (its
        reducers are associative and commutative, and the init an identity), so a tree is valid."""
        k = len(ops) // 2
        inputs, inits = ops[:k], ops[k:]
        reducer = self.computations[instr.called_computation_ids[0]]
        reduced = sorted(int(d) for d in instr.dimensions)
        rank = len(inputs[0].shape)
        kept = [d for d in range(rank) if d not in reduced]
        kept_shape = tuple(inputs[0].shape[d] for d in kept)
        width = _size(inputs[0], reduced) if reduced else 1
        rows = [self._as_rows(value, kept, reduced, kept_shape + (width,), instr.name) for value in inputs]

        def combine(first: list[Value], second: list[Value], shape: tuple[int, ...]) -> list[Value]:
            return self._apply_reducer(reducer, first + second, shape)

        columns = rows
        rows = self._halving(instr, rows, combine)
        starts = [broadcast_to(init, kept_shape + (1,)) for init in inits]
        results = self._apply_reducer(reducer, starts + rows, kept_shape + (1,))
        if self._keeps_first_nan(instr, reducer, inputs, inits, reduced):  # first_nan.py
            results[1] = self._first_nan_index(instr, columns, results)
        shaped = [self._reshape_value(value, kept_shape, instr.name) for value in results]
        return tuple(shaped) if k > 1 else shaped[0]

    def _halving(self, instr, rows: list[Value], combine) -> list[Value]:
        """Combine the columns of (kept..., width) arrays pairwise, halving the width each level,
        down to (kept..., 1); `combine(first, second, shape)` merges two column ranges."""
        width = rows[0].shape[-1]
        kept_shape = rows[0].shape[:-1]
        while width > 1:
            half = width // 2
            left = [self._cut(row, 0, half) for row in rows]
            right = [self._cut(row, half, 2 * half) for row in rows]
            combined = combine(left, right, kept_shape + (half,))
            if width % 2:  # fold the odd last column into column 0
                first = [self._cut(row, 0, 1) for row in combined]
                last = [self._cut(row, width - 1, width) for row in rows]
                head = combine(first, last, kept_shape + (1,))
                combined = [self._join_columns(instr, h, self._cut(row, 1, half)) for h, row in
                            zip(head, combined, strict=True)]
            rows, width = combined, half
        return rows

    def _apply_reducer(self, reducer, args: list[Value], shape: tuple[int, ...]) -> list[Value]:
        saved, self.region_shape = self.region_shape, shape
        try:
            result = self._computation(reducer, args)
        finally:
            self.region_shape = saved
        return list(result) if isinstance(result, tuple) else [result]

    def _as_rows(self, value: Value, kept: list[int], reduced: list[int], shape: tuple[int, ...],
                 source: str) -> Value:
        """`value` with its kept dimensions first and the reduced ones flattened into the last."""
        if isinstance(value, Splat):
            return Splat(value.value, value.dtype, shape)
        return self._reshape(value.transpose(tuple(kept + reduced)), shape, source)

    def _cut(self, value: Value, start: int, stop: int) -> Value:
        """Columns [start, stop) of the last dimension."""
        rank = len(value.shape)
        return self._window(value, (0,) * (rank - 1) + (start,), (*value.shape[:-1], stop))

    def _join_columns(self, instr, head: Value, tail: Value) -> Value:
        """[head | tail] along the last dimension, in a new tensor."""
        shape = head.shape[:-1] + (head.shape[-1] + tail.shape[-1],)
        name = self.builder.hbm_tensor(f"{instr.name}.join", head.dtype, shape, penguin_pb2.INTERNAL,
                                       instr.name)
        joined = View.whole(name, head.dtype, shape)
        self._copy_into(head, self._cut(joined, 0, head.shape[-1]), instr.name)
        if tail.shape[-1]:
            self._copy_into(tail, self._cut(joined, head.shape[-1], shape[-1]), instr.name)
        return joined

    def _reshape_value(self, value: Value, shape: tuple[int, ...], source: str) -> Value:
        if isinstance(value, Splat):
            return Splat(value.value, value.dtype, shape)
        return self._reshape(value, shape, source)

    def _reduce(self, instr, ops: list[Value], shape: tuple[int, ...], dtype: int) -> Value:
        operand, init = ops
        func, identity = REDUCERS[self._reducer(instr)]
        if any(operand.shape[int(d)] == 0 for d in instr.dimensions):
            return Splat(init.value, dtype, shape)  # reducing no elements: every result is the init value
        if isinstance(operand, Splat):
            operand = self._materialize(operand, instr.name)
        reduced = sorted(int(d) for d in instr.dimensions)
        kept = [d for d in range(len(operand.shape)) if d not in reduced]
        moved = operand.transpose(tuple(kept + reduced))
        width = int(np.prod([operand.shape[d] for d in reduced], dtype=np.int64)) if reduced else 1
        kept_shape = tuple(operand.shape[d] for d in kept)
        in_shape = (kept_shape or (1,)) + (width,)
        view = self._reshape(moved, in_shape, instr.name)
        many = tile_count(in_shape, FREE_TILE) > FEW_TILES or not kept_as_written(in_shape, FREE_TILE)
        # the kept dimensions as one: row tiles, not one per index (unless each index is whole row
        # tiles already: then the tiles are the same, and the nest keeps the axes its elementwise
        # neighbours have, so that fusion can join them)
        if len(kept_shape) > 1 and many and kept_shape[-1] % PARTITIONS \
                and (rows := view.reshape((product(kept_shape), width))) is not None:
            view, in_shape = rows, rows.shape
        out = self._new_output(instr, shape, dtype)
        tiling = Tiling(canonical_shape(in_shape) if len(in_shape) >= 2 else in_shape, min(width, FREE_TILE))
        acc_shape = tiling.shape[:-1] + (1,)
        block = (1,) * (len(tiling.shape) - 2) + (PARTITIONS, 1)
        nest = self.builder.nest(instr.name, instr.name, tiling.axes(), self._attributes(instr))
        box = self._load(nest, tiling, view, instr.name, 0)
        acc_dtype = dtype if is_integer(dtype) else common_pb2.F32  # floats accumulate in fp32
        acc = self.builder.tile(f"{instr.name}.acc", acc_dtype, acc_shape, block)
        part = self.builder.tile(f"{instr.name}.part", acc_dtype, acc_shape, block)
        acc_box, part_box = tiling.box(acc, col_tile=1), tiling.box(part, col_tile=1)
        last = tiling.col_tiles() - 1
        j = tiling.col_axis
        add_statement(nest, "reduce", "tensor_reduce", DVE, [acc_box], [box], func=func,
                      predicates=(affine.equals(j, 0),))
        if last > 0:
            add_statement(nest, "reduce_part", "tensor_reduce", DVE, [part_box], [box], func=func,
                          predicates=(affine.at_least(j, 1),))
            add_statement(nest, "combine", "tensor_tensor", DVE, [acc_box], [acc_box, part_box], func=func,
                          predicates=(affine.at_least(j, 1),))
        if init.value != identity:
            add_statement(nest, "init", "tensor_scalar", DVE, [acc_box], [acc_box], func=func,
                          scalars=(init.value,), predicates=(affine.equals(j, last),))
        result_box = acc_box
        if dtype != acc_dtype:  # a DMA never converts: narrow the fp32 accumulator (bf16, f16) on DVE first
            result = self.builder.tile(f"{instr.name}.out", dtype, acc_shape, block)
            result_box = tiling.box(result, col_tile=1)
            add_statement(nest, "narrow", "tensor_copy", DVE, [result_box], [acc_box],
                          predicates=(affine.equals(j, last),))
        out_view = self._reshape(out, acc_shape, instr.name)
        add_statement(nest, "store", "dma", SP, [tiling.box(self.builder.view(out_view), col_tile=1)],
                      [result_box], predicates=(affine.equals(j, last),))
        self.produced.add(out.base)
        return out

    def _dot(self, instr, ops: list[Value], shape: tuple[int, ...], dtype: int) -> View:
        lhs, rhs = (self._materialize(op, instr.name) if isinstance(op, Splat) else op for op in ops)
        dn = instr.dot_dimension_numbers
        lb, lc = list(dn.lhs_batch_dimensions), list(dn.lhs_contracting_dimensions)
        rb, rc = list(dn.rhs_batch_dimensions), list(dn.rhs_contracting_dimensions)
        lf = [d for d in range(len(lhs.shape)) if d not in lb + lc]
        rf = [d for d in range(len(rhs.shape)) if d not in rb + rc]
        batch, m, k, n = _size(lhs, lb), _size(lhs, lf), _size(lhs, lc), _size(rhs, rf)
        if k == 0:
            return Splat(0.0, dtype, shape)  # an empty contraction: all zeros
        if is_integer(dtype) and k * _magnitude(lhs.dtype) * _magnitude(rhs.dtype) < PE_EXACT_SUM:
            return self._integer_dot_on_pe(instr, lhs, rhs, shape, dtype)
        if not is_integer(dtype) and swap_pays(m, k, n, common_pb2.F32 in (lhs.dtype, rhs.dtype),
                                               functools.partial(self._product_readers, instr)):
            # the PE's stationary side (dot_orientation.py); an integer dot off PE keeps its form
            return self._swapped_dot(instr, lhs, rhs, shape, dtype)
        lhs_bmk = self._reshape(lhs.transpose(tuple(lb + lf + lc)), (batch, m, k), instr.name)
        rhs_bkn = self._reshape(rhs.transpose(tuple(rb + rc + rf)), (batch, k, n), instr.name)
        out = self._new_output(instr, shape, dtype)
        out_bmn = self._reshape(out, (batch, m, n), instr.name)
        if is_integer(dtype):
            return self._integer_dot(instr, lhs_bmk, rhs_bkn, out, out_bmn)
        # rows in groups: lhs free dims [g..., r] get an axis g of their own, so a product tile's
        # rows are rows of r alone (a grouped attention's [group, query] scores: the softmax over a
        # query's row then joins the scores' nest, epilogues.py; a batch of sequences: its norms
        # do), where r is whole row tiles that tile_order's row blocks (1, 2 or MAX_ROW_BLOCK
        # tiles) divide or that divide them: [8, 256] rows by a [1024, 2048] weight 491 -> 393 us;
        # three tiles a group broke the blocks and re-read the weights ([4, 384]: 479 -> 547 us)
        row_tiles = lhs.shape[lf[-1]] // MATMUL_M_TILE if lf and lhs.shape[lf[-1]] % MATMUL_M_TILE == 0 else 0
        grouping = len(lf) > 1 and row_tiles > 0 and (MAX_ROW_BLOCK % row_tiles == 0
                                                      or row_tiles % MAX_ROW_BLOCK == 0)
        groups = _size(lhs, lf[:-1]) if grouping else 1
        grouped = groups > 1
        if grouped:
            m //= groups
            lhs_bmk = self._reshape(lhs.transpose(tuple(lb + lf + lc)), (batch, groups, m, k), instr.name)
            out_bmn = self._reshape(out, (batch, groups, m, n), instr.name)
        lhs_t = lhs_bmk.transpose((0, 1, 3, 2) if grouped else (0, 2, 1))
        axes = [penguin_pb2.Axis(name="b", extent=batch),
                *([penguin_pb2.Axis(name="g", extent=groups)] if grouped else []),
                penguin_pb2.Axis(name="i", extent=ceil_div(m, MATMUL_M_TILE)),
                penguin_pb2.Axis(name="j", extent=ceil_div(n, MATMUL_N_TILE)),
                penguin_pb2.Axis(name="k", extent=ceil_div(k, MATMUL_K_TILE))]
        nest = self.builder.nest(instr.name, instr.name, axes, self._attributes(instr))

        def box(tensor: str, rows: tuple[str, int], cols: tuple[str, int], in_group: bool = grouped
                ) -> penguin_pb2.Access:
            group = [affine.expr({"g": 1})] if in_group else []
            starts = [affine.expr({"b": 1}), *group, affine.expr({rows[0]: rows[1]}),
                      affine.expr({cols[0]: cols[1]})]
            extents = [1, *[1] * len(group), rows[1], cols[1]]
            return penguin_pb2.Access(tensor=tensor, starts=starts, extents=extents)

        kk, ii, jj = ("k", MATMUL_K_TILE), ("i", MATMUL_M_TILE), ("j", MATMUL_N_TILE)
        by_group = (groups,) if grouped else ()
        one = (1,) if grouped else ()
        km_block, kn_block = (1, *one, MATMUL_K_TILE, MATMUL_M_TILE), (1, MATMUL_K_TILE, MATMUL_N_TILE)
        mn_block = (1, *one, MATMUL_M_TILE, MATMUL_N_TILE)
        stationary = self.builder.tile(f"{instr.name}.lhsT", lhs.dtype, (batch, *by_group, k, m), km_block)
        moving = self.builder.tile(f"{instr.name}.rhs", rhs.dtype, (batch, k, n), kn_block)
        psum = self.builder.tile(f"{instr.name}.psum", common_pb2.F32, (batch, *by_group, m, n), mn_block,
                                 memory=common_pb2.PSUM)
        result = self.builder.tile(f"{instr.name}.out", dtype, (batch, *by_group, m, n), mn_block)
        add_statement(nest, "load_lhsT", "dma", SP, [box(stationary, kk, ii)],
                      [box(self.builder.view(lhs_t), kk, ii)])
        add_statement(nest, "load_rhs", "dma", SP, [box(moving, kk, jj, False)],
                      [box(self.builder.view(rhs_bkn), kk, jj, False)])
        add_statement(nest, "matmul", "matmul", PE, [box(psum, ii, jj)],
                      [box(stationary, kk, ii), box(moving, kk, jj, False)],
                      attributes={"accumulate_axis": "k"})
        last = (affine.equals("k", ceil_div(k, MATMUL_K_TILE) - 1),)
        add_statement(nest, "evacuate", "tensor_copy", ACT, [box(result, ii, jj)], [box(psum, ii, jj)],
                      predicates=last)
        add_statement(nest, "store", "dma", SP, [box(self.builder.view(out_bmn), ii, jj)],
                      [box(result, ii, jj)], predicates=last)
        self.produced.add(out.base)
        return out

    def _product_readers(self, dot) -> str:
        """What reads `dot`'s result (dot_orientation.product_readers); a dot the lowering made
        itself (a scatter-add's, a convolution's) is not in the module: OTHER, the cautious answer."""
        comp, known = self.computation_of.get(dot.id), self.instructions.get(dot.id)
        if comp is None or known is None or known.name != dot.name:
            return OTHER
        readers = self.readers.get(comp.id)
        if readers is None:
            readers = self.readers[comp.id] = Readers(comp)
        return product_readers(readers, self.instructions, dot)

    def _swapped_dot(self, instr, lhs: View, rhs: View, shape: tuple[int, ...], dtype: int) -> View:
        """dot(lhs, rhs) computed as dot(rhs, lhs) and read back transposed (a view, no copy):
        the rhs free dimensions across the product tiles' partitions, the lhs rows along them."""
        dn = instr.dot_dimension_numbers
        swapped = hlo_pb2.HloInstructionProto()
        swapped.CopyFrom(instr)
        swapped.name = f"{instr.name}.t"
        numbers = swapped.dot_dimension_numbers
        numbers.Clear()
        numbers.lhs_batch_dimensions.extend(dn.rhs_batch_dimensions)
        numbers.lhs_contracting_dimensions.extend(dn.rhs_contracting_dimensions)
        numbers.rhs_batch_dimensions.extend(dn.lhs_batch_dimensions)
        numbers.rhs_contracting_dimensions.extend(dn.lhs_contracting_dimensions)
        batch = len(dn.lhs_batch_dimensions)
        lhs_free = len(lhs.shape) - batch - len(dn.lhs_contracting_dimensions)
        order = [*range(batch), *range(batch + lhs_free, len(shape)), *range(batch, batch + lhs_free)]
        product_ = self._dot(swapped, [rhs, lhs], tuple(shape[d] for d in order), dtype)
        back = [order.index(d) for d in range(len(shape))]
        self.swapped.add(product_.base)
        return product_.transpose(tuple(back))

    def _integer_dot_on_pe(self, instr, lhs: View, rhs: View, shape: tuple[int, ...], dtype: int) -> Value:
        """An integer dot whose every partial sum stays below 2^24 in magnitude (int8 operands up to
        K = 1,023: a quantized matmul) runs on PE, exactly: its operands are integers bf16 holds
        exactly (|x| <= 256), PE multiplies them exactly and accumulates in fp32, which is exact
        for integers below 2^24, and the fp32 result converts to s32 exactly (then to `dtype`,
        wrapping as XLA's integer dot does)."""
        bf16, f32, s32 = common_pb2.BF16, common_pb2.F32, common_pb2.S32
        as_float = [self._synthetic(instr, "convert", [op], op.shape, bf16) for op in (lhs, rhs)]
        floating = hlo_pb2.HloInstructionProto()
        floating.CopyFrom(instr)
        floating.name = f"{instr.name}.pe"
        product_ = self._dot(floating, as_float, shape, f32)
        result = self._synthetic(instr, "convert", [product_], shape, s32)
        return result if dtype == s32 else self._synthetic(instr, "convert", [result], shape, dtype)

    def _integer_dot(self, instr, lhs_bmk: View, rhs_bkn: View, out: View, out_bmn: View) -> View:
        """An integer dot, exact: PE multiplies in fp32 (24-bit significands), so integers take the
        vector engines instead. Per output column n: POOL multiplies the lhs rows by rhs column n
        (a DMA broadcasts it over the partitions), DVE sums each row in int64, and the [128, 1]
        column is stored. Products and sums wrap as XLA's integer arithmetic does."""
        batch, m, k = lhs_bmk.shape
        n = rhs_bkn.shape[2]
        dtype = out.dtype
        k_tile = min(k, FREE_TILE)
        columns = rhs_bkn.transpose((0, 2, 1)).broadcast((batch, n, m, k), (0, 1, 3))  # [b,n,·,k]
        axes = [penguin_pb2.Axis(name="b", extent=batch),
                penguin_pb2.Axis(name="i", extent=ceil_div(m, PARTITIONS)),
                penguin_pb2.Axis(name="n", extent=n),
                penguin_pb2.Axis(name="k", extent=ceil_div(k, k_tile))]
        nest = self.builder.nest(instr.name, instr.name, axes, self._attributes(instr))

        def box(tensor: str, starts: dict[str, int], extents: list[int]) -> penguin_pb2.Access:
            return penguin_pb2.Access(tensor=tensor, extents=extents,
                                      starts=[affine.expr({a: c}) if a else affine.expr() for a, c in starts])

        rows_at, rows_extent = [("b", 1), ("i", PARTITIONS), ("k", k_tile)], [1, PARTITIONS, k_tile]
        column_at = [("b", 1), ("n", 1), ("i", PARTITIONS), ("k", k_tile)]
        column_extent = [1, 1, PARTITIONS, k_tile]
        acc_at, acc_extent = [("b", 1), ("i", PARTITIONS), ("n", 1)], [1, PARTITIONS, 1]

        def sbuf(hint: str, tile_dtype: int, tile_shape: tuple, at: list, extent: list) -> penguin_pb2.Access:
            name = self.builder.tile(f"{instr.name}.{hint}", tile_dtype, tile_shape, tuple(extent))
            return box(name, at, extent)

        rows = sbuf("lhs", lhs_bmk.dtype, (batch, m, k), rows_at, rows_extent)
        column = sbuf("rhs", rhs_bkn.dtype, (batch, n, m, k), column_at, column_extent)
        product = sbuf("product", dtype, (batch, m, k), rows_at, rows_extent)
        acc = sbuf("acc", dtype, (batch, m, n), acc_at, acc_extent)
        part = sbuf("part", dtype, (batch, m, n), acc_at, acc_extent)
        k_tiles = ceil_div(k, k_tile)
        first, rest, last = affine.equals("k", 0), affine.at_least("k", 1), affine.equals("k", k_tiles - 1)
        add_statement(nest, "load_lhs", "dma", SP, [rows],
                      [box(self.builder.view(lhs_bmk), rows_at, rows_extent)])
        add_statement(nest, "load_rhs", "dma", SP, [column],
                      [box(self.builder.view(columns), column_at, column_extent)])
        add_statement(nest, "multiply", "tensor_tensor", POOL, [product], [rows, column], func="multiply")
        add_statement(nest, "reduce", "tensor_reduce", DVE, [acc], [product], func="add", predicates=(first,))
        if k_tiles > 1:
            add_statement(nest, "reduce_part", "tensor_reduce", DVE, [part], [product], func="add",
                          predicates=(rest,))
            add_statement(nest, "combine", "tensor_tensor", DVE, [acc], [acc, part], func="add",
                          predicates=(rest,))
        add_statement(nest, "store", "dma", SP, [box(self.builder.view(out_bmn), acc_at, acc_extent)], [acc],
                      predicates=(last,))
        self.produced.add(out.base)
        return out


class _Body:
    """The statements of one elementwise nest: operands load (or fill) into tiles once each, and
    every intermediate gets its own tile of the nest's tiling."""

    def __init__(self, lowering: Lowering, nest: penguin_pb2.LoopNest, tiling: Tiling, name: str) -> None:
        self.lowering, self.nest, self.tiling, self.name = lowering, nest, tiling, name
        self.loaded: list[tuple[Value, penguin_pb2.Access]] = []
        self.count = 0  # tiles made
        self.computes = 0  # compute statements emitted

    def tile(self, dtype: int) -> penguin_pb2.Access:
        block = (1,) * (len(self.tiling.shape) - 2) + (PARTITIONS, self.tiling.free_tile)
        suffix = "out" if self.count == 0 else f"t{self.count}"
        self.count += 1
        name = self.lowering.builder.tile(f"{self.name}.{suffix}", dtype, self.tiling.shape, block)
        return self.tiling.box(name)

    def operand(self, value: Value | penguin_pb2.Access) -> penguin_pb2.Access:
        if isinstance(value, penguin_pb2.Access):
            return value
        for seen, access in self.loaded:
            if seen is value:
                return access
        access = self.lowering._load(self.nest, self.tiling, value, self.name, len(self.loaded))
        self.loaded.append((value, access))
        return access

    def emit(self, op: str, engine: int, out: penguin_pb2.Access, inputs: list, **kw) -> None:
        operands = [self.operand(value) for value in inputs]
        self.computes += 1
        name = "compute" if self.computes == 1 else f"compute{self.computes}"
        add_statement(self.nest, name, op, engine, [out], operands, **kw)

    def binary(self, func: str, engine: int, out: penguin_pb2.Access, a, b) -> None:
        """out = a func b; a constant operand becomes tensor_scalar's immediate (reversed if it is a)."""
        if isinstance(b, Splat):
            self.emit("tensor_scalar", engine, out, [a], func=func, scalars=(b.value,))
        elif isinstance(a, Splat):
            self.emit("tensor_scalar", engine, out, [b], func=func, scalars=(a.value,),
                      attributes={"reverse": "1"})
        else:
            self.emit("tensor_tensor", engine, out, [a, b], func=func)


def _copy_order(shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The dimension order to tile a copy of rank >= 3 in: the last dimension stays innermost, and
    the largest leading one moves onto the partitions when the second-to-last is narrower than
    the 128 partitions. Why: a copy tiles its leading dimensions one step at a time, so
    [128, 4, 64] (a transpose materialized before a reshape) was 128 steps of 4-partition tiles,
    256 dmas of 1 KiB; in the order (1, 0, 2) it is 4 steps of [128, 64] tiles."""
    if len(shape) < 3 or shape[-2] >= PARTITIONS:
        return None
    widest = max(range(len(shape) - 1), key=lambda d: (shape[d], d))
    if shape[widest] <= shape[-2]:
        return None
    leading = [d for d in range(len(shape) - 1) if d != widest]
    return (*leading, widest, len(shape) - 1)


def _stored_order(ops: list[Value], shape: tuple[int, ...], swapped: set[str]) -> tuple[int, ...] | None:
    """The dimension order in which every operand that streams all its elements is stored, when
    each is a whole tensor a swapped dot wrote (or an op that followed one: `swapped`) read through
    one permutation other than the order as written; else None."""
    orders = set()
    for op in ops:
        if isinstance(op, Splat) or 0 in op.strides:
            continue
        if op.base not in swapped:
            return None
        order = tuple(sorted(range(len(shape)), key=lambda d: -op.strides[d]))
        if any(s < 0 for s in op.strides) or not op.transpose(order).is_contiguous():
            return None
        orders.add(order)
    if len(orders) != 1:
        return None
    order = orders.pop()
    kept = [d for d in order if shape[d] != 1]
    return order if kept != sorted(kept) else None


def _size(view: View, dims: list[int]) -> int:
    """Elements spanned by `dims` of `view` (1 for no dims)."""
    return int(np.prod([view.shape[d] for d in dims], dtype=np.int64))


# Integer dots go to PE when k * max|lhs| * max|rhs| stays below this (fp32 holds such sums exactly).
PE_EXACT_SUM = 1 << 24
_MAGNITUDE = {common_pb2.PRED: 1, common_pb2.S8: 128, common_pb2.U8: 255}


def _magnitude(dtype: int) -> int:
    """The largest |value| of an integer type bf16 holds exactly (8 bits at most), else one past
    PE_EXACT_SUM (the type takes the vector engines)."""
    return _MAGNITUDE.get(dtype, PE_EXACT_SUM)


def lower_module(module: hlo_pb2.HloModuleProto, loops: str = "auto",
                 repeat_above: int = AUTO_ROLL_ABOVE) -> penguin_pb2.Program:
    """Lower a verified module to a Penguin program (repeated instructions merged first:
    hlo_cse.py; composite ops expanded: expand.py; and transposes of dots folded into them:
    transpose_folding.py); `loops` is --loops, and a while loop stays a loop (repeat.py) when
    `loops` allows and its trips would unroll to at least `repeat_above` backend instructions.
    Unless `loops` is "unrolled", repeated blocks of straight-line code are first rolled into a
    while loop (reroll.py)."""
    module = expand_composites(fold_transposes(eliminate_common_subexpressions(module)))
    if loops != "unrolled":
        module = reroll_repeats(module)
    return Lowering(module, loops, repeat_above).run()

