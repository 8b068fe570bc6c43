"""Lower a verified HLO module to Penguin IR: one tiled loop nest per computing HLO op.

Layout ops (reshape, broadcast, transpose, slice) cost nothing: they become strided views that
the consuming nest's DMAs read through (views.py). Scalar constants fold into tensor_scalar
immediates. Every other op becomes a nest over 128-partition tiles that loads its operands from
HBM into SBUF, computes on the engine that owns the op, and stores its result to HBM:

  elementwise   DVE tensor_tensor / tensor_scalar, ACT activation, POOL select / integer ops
  reduce        DVE tensor_reduce per free tile, combined across free tiles into an accumulator
  dot           PE matmul into PSUM accumulated over 128-row K tiles, ACT copies PSUM to SBUF
  iota          POOL iota

`call` is inlined; tuples are plumbing. Anything else was refused by the verifier.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ncc.schemas import common_pb2, hlo_pb2, penguin_pb2
from ncc.tools.common import affine
from ncc.tools.common.dtypes import from_compute, to_compute
from ncc.tools.common.errors import CompileError
from ncc.tools.hlo2penguin.hlo_types import ncc_dtype
from ncc.tools.hlo2penguin.literals import literal_to_numpy
from ncc.tools.hlo2penguin.nest_builder import (
    FRONTEND_PREFIX,
    PARTITIONS,
    ProgramBuilder,
    Tiling,
    add_statement,
    canonical_shape,
    ceil_div,
)
from ncc.tools.hlo2penguin.views import View

FREE_TILE = 2048         # elements per partition in an elementwise tile
MATMUL_N_TILE = 512      # one PSUM bank of fp32
MATMUL_K_TILE = 128      # contraction rows per matmul (partitions)
MATMUL_M_TILE = 128      # stationary free size

SP, ACT, DVE, POOL, PE = common_pb2.SP, common_pb2.ACT, common_pb2.DVE, common_pb2.POOL, common_pb2.PE

BINARY = {"add": "add", "subtract": "subtract", "multiply": "multiply", "divide": "divide",
          "maximum": "maximum", "minimum": "minimum"}
ACTIVATIONS = {"exponential": "exp", "log": "log", "tanh": "tanh", "logistic": "logistic",
               "rsqrt": "rsqrt", "sqrt": "sqrt"}
COMPARE = {"EQ": "eq", "NE": "ne", "LT": "lt", "LE": "le", "GT": "gt", "GE": "ge"}
REDUCERS = {"add": ("add", 0.0), "maximum": ("maximum", -np.inf), "minimum": ("minimum", np.inf),
            "multiply": ("multiply", 1.0)}
NUMPY_BINARY = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
                "maximum": np.maximum, "minimum": np.minimum}
NUMPY_UNARY = {"exponential": np.exp, "log": np.log, "tanh": np.tanh, "sqrt": np.sqrt,
               "logistic": lambda x: 1.0 / (1.0 + np.exp(-x)), "rsqrt": lambda x: 1.0 / np.sqrt(x),
               "negate": np.negative}


@dataclass(frozen=True)
class Splat:
    """A value known at compile time to be one scalar repeated over `shape`."""

    value: float
    dtype: int
    shape: tuple[int, ...]


Value = View | Splat | tuple


def is_integer(dtype: int) -> bool:
    return dtype in (common_pb2.S32, common_pb2.U32, common_pb2.U8, common_pb2.S8)


class Lowering:
    """Walks the entry computation in order and emits Penguin tensors and nests."""

    def __init__(self, module: hlo_pb2.HloModuleProto) -> None:
        self.module = module
        self.computations = {c.id: c for c in module.computations}
        self.builder = ProgramBuilder(penguin_pb2.Program(name=module.name))
        self.produced: set[str] = set()  # HBM tensors written by a nest of this program

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
        return values[comp.root_id if comp.root_id in values else comp.instructions[-1].id]

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
        return tuple(int(d) for d in instr.shape.dimensions)

    def _instruction(self, instr: hlo_pb2.HloInstructionProto, ops: list[Value], args: list[Value]) -> Value:
        opcode = instr.opcode
        shape = self._shape(instr)
        if opcode == "parameter":
            return args[instr.parameter_number]
        if opcode == "tuple":
            return tuple(ops)
        if opcode == "get-tuple-element":
            return ops[0][instr.tuple_index]
        if opcode == "call":
            return self._computation(self.computations[instr.called_computation_ids[0]], ops)
        dtype = ncc_dtype(instr.shape.element_type)
        if opcode == "constant":
            return self._constant(instr, shape, dtype)
        if opcode in ("broadcast", "reshape", "transpose", "slice"):
            return self._layout(instr, ops[0], shape)
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
        if flat.size == 0 or np.all(flat == flat[0]) and not np.isnan(flat[0]):
            return Splat(float(flat[0]) if flat.size else 0.0, dtype, shape)
        name = self.builder.hbm_tensor(instr.name, dtype, shape, penguin_pb2.CONSTANT, instr.name,
                                       data=from_compute(values, dtype).tobytes())
        return View.whole(name, dtype, shape)

    def _layout(self, instr: hlo_pb2.HloInstructionProto, operand: Value, shape: tuple[int, ...]) -> Value:
        if isinstance(operand, Splat):
            return Splat(operand.value, operand.dtype, shape)
        dims = tuple(int(d) for d in instr.dimensions)
        if instr.opcode == "broadcast":
            return operand.broadcast(shape, dims)
        if instr.opcode == "transpose":
            return operand.transpose(dims)
        if instr.opcode == "slice":
            s = instr.slice_dimensions
            return operand.slice(tuple(d.start for d in s), tuple(d.limit for d in s),
                                 tuple(d.stride or 1 for d in s))
        return self._reshape(operand, shape, instr.name)

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
        tiling = self._tiling(target.shape)
        nest = self.builder.nest(f"{source}.copy", source, tiling.axes())
        box = self._load(nest, tiling, value, source, 0)
        self._store(nest, tiling, box, target, source)

    def _elementwise(self, instr, ops: list[Value], shape: tuple[int, ...], dtype: int) -> Value:
        opcode = instr.opcode
        if all(isinstance(op, Splat) for op in ops):
            folded = self._fold(instr, [op.value for op in ops])
            # the result takes its type's rounding: bf16 keeps 8 bits, an integer truncates
            exact = float(to_compute(from_compute(np.asarray([folded]), dtype), dtype)[0])
            return Splat(exact, dtype, shape)
        out = self._new_output(instr, shape, dtype)
        tiling = self._tiling(shape)
        nest = self.builder.nest(instr.name, instr.name, tiling.axes(), self._attributes(instr))
        result = self.builder.tile(f"{instr.name}.out", dtype, tiling.shape,
                                   (1,) * (len(tiling.shape) - 2) + (PARTITIONS, tiling.free_tile))
        out_box = tiling.box(result)
        int_engine = POOL if is_integer(dtype) else DVE
        if opcode in BINARY or opcode == "compare":
            func = BINARY.get(opcode) or COMPARE[instr.comparison_direction]
            engine = POOL if is_integer(ops[0].dtype) else DVE
            splats = [isinstance(op, Splat) for op in ops]
            if any(splats):
                scalar = ops[0] if splats[0] else ops[1]
                tensor = ops[1] if splats[0] else ops[0]
                box = self._load(nest, tiling, tensor, instr.name, 0)
                add_statement(nest, "compute", "tensor_scalar", engine, [out_box], [box], func=func,
                              scalars=(scalar.value,), attributes={"reverse": "1"} if splats[0] else None)
            else:
                boxes = [self._load(nest, tiling, op, instr.name, k) for k, op in enumerate(ops)]
                add_statement(nest, "compute", "tensor_tensor", engine, [out_box], boxes, func=func)
        elif opcode in ACTIVATIONS:
            box = self._load(nest, tiling, ops[0], instr.name, 0)
            add_statement(nest, "compute", "activation", ACT, [out_box], [box], func=ACTIVATIONS[opcode],
                          scalars=(1.0, 0.0))
        elif opcode == "negate":
            box = self._load(nest, tiling, ops[0], instr.name, 0)
            add_statement(nest, "compute", "tensor_scalar", int_engine, [out_box], [box], func="multiply",
                          scalars=(-1.0,))
        elif opcode == "convert":
            box = self._load(nest, tiling, ops[0], instr.name, 0)
            add_statement(nest, "compute", "tensor_copy", int_engine, [out_box], [box])
        elif opcode == "select":
            boxes = [self._load(nest, tiling, op, instr.name, k) for k, op in enumerate(ops)]
            add_statement(nest, "compute", "select", POOL, [out_box], boxes)
        else:
            raise CompileError("E201", f"unsupported opcode '{opcode}'", instr.name)
        self._store(nest, tiling, out_box, out, instr.name)
        return out

    def _fold(self, instr, values: list[float]) -> float:
        opcode = instr.opcode
        with np.errstate(all="ignore"):
            args = [np.float32(v) for v in values]
            if opcode in NUMPY_BINARY:
                return float(NUMPY_BINARY[opcode](*args))
            if opcode in NUMPY_UNARY:
                return float(NUMPY_UNARY[opcode](args[0]))
            if opcode == "convert":
                return values[0]
            if opcode == "compare":
                fn = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal,
                      "GT": np.greater, "GE": np.greater_equal}[instr.comparison_direction]
                return float(fn(*args))
            if opcode == "select":
                return values[1] if values[0] else values[2]
        raise CompileError("E201", f"unsupported opcode '{opcode}'", instr.name)

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

    def _reducer(self, instr) -> str:
        comp = self.computations[instr.called_computation_ids[0]]
        root = next((i for i in comp.instructions if i.id == comp.root_id), comp.instructions[-1])
        params = {i.id for i in comp.instructions if i.opcode == "parameter"}
        if root.opcode in REDUCERS and len(params) == 2 and set(root.operand_ids) == params:
            return root.opcode
        raise CompileError("E207", f"reduce with computation '{comp.name}' ({root.opcode}) is not supported",
                           instr.name)

    def _reduce(self, instr, ops: list[Value], shape: tuple[int, ...], dtype: int) -> Value:
        if len(ops) != 2:
            raise CompileError("E207", "variadic reduce is not supported", instr.name)
        operand, init = ops
        if not isinstance(init, Splat):
            raise CompileError("E207", "reduce needs a constant initial value", instr.name)
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
        lhs_bmk = self._reshape(lhs.transpose(tuple(lb + lf + lc)), (batch, m, k), instr.name)
        rhs_bkn = self._reshape(rhs.transpose(tuple(rb + rc + rf)), (batch, k, n), instr.name)
        lhs_t = lhs_bmk.transpose((0, 2, 1))
        out = self._new_output(instr, shape, dtype)
        out_bmn = self._reshape(out, (batch, m, n), instr.name)
        axes = [penguin_pb2.Axis(name="b", extent=batch),
                penguin_pb2.Axis(name="i", extent=ceil_div(m, MATMUL_M_TILE)),
                penguin_pb2.Axis(name="j", extent=ceil_div(n, MATMUL_N_TILE)),
                penguin_pb2.Axis(name="k", extent=ceil_div(k, MATMUL_K_TILE))]
        nest = self.builder.nest(instr.name, instr.name, axes, self._attributes(instr))

        def box(tensor: str, rows: tuple[str, int], cols: tuple[str, int]) -> penguin_pb2.Access:
            starts = [affine.expr({"b": 1}), affine.expr({rows[0]: rows[1]}), affine.expr({cols[0]: cols[1]})]
            return penguin_pb2.Access(tensor=tensor, starts=starts, extents=[1, rows[1], cols[1]])

        kk, ii, jj = ("k", MATMUL_K_TILE), ("i", MATMUL_M_TILE), ("j", MATMUL_N_TILE)
        km_block, kn_block = (1, MATMUL_K_TILE, MATMUL_M_TILE), (1, MATMUL_K_TILE, MATMUL_N_TILE)
        mn_block = (1, MATMUL_M_TILE, MATMUL_N_TILE)
        stationary = self.builder.tile(f"{instr.name}.lhsT", lhs.dtype, (batch, k, m), km_block)
        moving = self.builder.tile(f"{instr.name}.rhs", rhs.dtype, (batch, k, n), kn_block)
        psum = self.builder.tile(f"{instr.name}.psum", common_pb2.F32, (batch, m, n), mn_block,
                                 memory=common_pb2.PSUM)
        result = self.builder.tile(f"{instr.name}.out", dtype, (batch, m, n), mn_block)
        add_statement(nest, "load_lhsT", "dma", SP, [box(stationary, kk, ii)],
                      [box(self.builder.view(lhs_t), kk, ii)])
        add_statement(nest, "load_rhs", "dma", SP, [box(moving, kk, jj)],
                      [box(self.builder.view(rhs_bkn), kk, jj)])
        add_statement(nest, "matmul", "matmul", PE, [box(psum, ii, jj)],
                      [box(stationary, kk, ii), box(moving, kk, jj)], attributes={"accumulate_axis": "k"})
        last = (affine.equals("k", ceil_div(k, MATMUL_K_TILE) - 1),)
        add_statement(nest, "evacuate", "tensor_copy", ACT, [box(result, ii, jj)], [box(psum, ii, jj)],
                      predicates=last)
        add_statement(nest, "store", "dma", SP, [box(self.builder.view(out_bmn), ii, jj)],
                      [box(result, ii, jj)], predicates=last)
        self.produced.add(out.base)
        return out


def _size(view: View, dims: list[int]) -> int:
    """Elements spanned by `dims` of `view` (1 for no dims)."""
    return int(np.prod([view.shape[d] for d in dims], dtype=np.int64))


def lower_module(module: hlo_pb2.HloModuleProto) -> penguin_pb2.Program:
    """Lower a verified module to a Penguin program."""
    return Lowering(module).run()

