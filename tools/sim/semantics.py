"""What each BIR instruction computes (docs/ir.md), checked and executed with numpy.

`validate` is the static half: operand counts, engine rules, element counts, matmul shapes and
function names, raising CompileError E603 naming the instruction. `execute` is the functional
half: it reads the operands, computes in float32 (any float operand), uint64 (u64 operands, so
comparisons and division see unsigned values) or int64 (other integers), and narrows the result
to the output dtype (bf16 rounds to nearest even). A dma moves bytes: between element types of
one width it reinterprets them (bitcast-convert). Everything is vectorised over the whole
operand; nothing here knows about time or ordering.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ncc.schemas import common_pb2
from ncc.tools.common import alu, dtypes
from ncc.tools.common.alu import ACT_OPERAND
from ncc.tools.common.errors import CompileError
from ncc.tools.sim.instruction import Op, engine_name
from ncc.tools.sim.memory import Access
from ncc.tools.target import Target

ALL_ENGINES = frozenset({common_pb2.PE, common_pb2.ACT, common_pb2.POOL, common_pb2.DVE, common_pb2.SP})


@dataclass(frozen=True)
class OpSpec:
    engines: frozenset[int]
    inputs: int
    outputs: int
    optional_inputs: int = 0  # operands it may take beyond `inputs` and `outputs`
    optional_outputs: int = 0


SPECS: dict[str, OpSpec] = {
    "dma": OpSpec(ALL_ENGINES, 1, 1),
    "dma_gather": OpSpec(frozenset({common_pb2.POOL}), 2, 1),  # (HBM table, SBUF s32 indices) -> rows
    "dma_scatter": OpSpec(frozenset({common_pb2.POOL}), 2, 1),  # (rows, SBUF s32 indices) -> HBM table
    "matmul": OpSpec(frozenset({common_pb2.PE}), 2, 1),
    "transpose": OpSpec(frozenset({common_pb2.PE}), 1, 1),  # PE's transpose mode: data, no arithmetic
    # (data, [per-partition bias]) -> (out, [per-partition sum of out])
    "activation": OpSpec(frozenset({common_pb2.ACT}), 1, 1, 2, 1),
    "tensor_tensor": OpSpec(frozenset({common_pb2.DVE, common_pb2.POOL}), 2, 1),
    "tensor_scalar": OpSpec(frozenset({common_pb2.DVE, common_pb2.POOL}), 1, 1),
    "tensor_reduce": OpSpec(frozenset({common_pb2.DVE}), 1, 1),
    "tensor_copy": OpSpec(frozenset({common_pb2.DVE, common_pb2.ACT, common_pb2.POOL}), 1, 1),
    "iota": OpSpec(frozenset({common_pb2.POOL}), 0, 1),
    "select": OpSpec(frozenset({common_pb2.POOL, common_pb2.DVE}), 3, 1),
    "affine_select": OpSpec(frozenset({common_pb2.POOL}), 1, 1),
    "nop": OpSpec(ALL_ENGINES, 0, 0),
    "drain": OpSpec(frozenset({common_pb2.DVE, common_pb2.POOL}), 0, 0),  # a wait that holds no port
    "sem_reset": OpSpec(frozenset({common_pb2.SP}), 0, 0),  # the simulator zeroes every semaphore
}


REDUCE_FUNCS = frozenset({"add", "maximum", "minimum", "multiply"})


def _fail(op: Op, message: str) -> CompileError:
    return CompileError("E603", f"instruction {op.label}: {message}", op.name)


def _float_domain(*accesses: Access) -> bool:
    return any(dtypes.is_float(a.dtype) for a in accesses)


# ---- static checks ---------------------------------------------------------------------------


def _domain(*accesses: Access) -> type:
    """The numpy type an instruction computes in: float32, uint64 for u64, else int64."""
    if _float_domain(*accesses):
        return np.float32
    if any(a.dtype == common_pb2.U64 for a in accesses):
        return np.uint64
    return np.int64


def validate(op: Op, target: Target) -> None:
    """Check `op` against the rules of docs/ir.md; raise E603 naming it if it breaks one."""
    spec = SPECS.get(op.op)
    if spec is None:
        raise _fail(op, f"unknown op {op.op!r}")
    if op.engine not in spec.engines:
        allowed = ", ".join(sorted(engine_name(e) for e in spec.engines))
        raise _fail(op, f"{op.op} cannot run on {engine_name(op.engine)} (allowed: {allowed})")
    if not (
        spec.inputs <= len(op.inputs) <= spec.inputs + spec.optional_inputs
        and spec.outputs <= len(op.outputs) <= spec.outputs + spec.optional_outputs
    ):
        raise _fail(
            op,
            f"{op.op} takes {_arity(spec.inputs, spec.optional_inputs)} inputs and "
            f"{_arity(spec.outputs, spec.optional_outputs)} outputs, "
            f"got {len(op.inputs)} and {len(op.outputs)}",
        )
    operands = [*op.inputs, *op.outputs]
    if op.is_dma:
        if not 0 <= op.queue < target.dma_queues:
            raise _fail(op, f"dma queue {op.queue} does not exist (the target has {target.dma_queues})")
        if op.op != "dma":
            _check_indirect(op)
            return
        src, dst = op.inputs[0], op.outputs[0]
        if dtypes.itemsize(src.dtype) != dtypes.itemsize(dst.dtype):
            raise _fail(op, f"dma cannot convert {dtypes.name(src.dtype)} to {dtypes.name(dst.dtype)}")
        if src.size != dst.size:
            raise _fail(op, f"dma moves {src.size} elements into {dst.size}")
        return
    for access in operands:
        if access.memory == common_pb2.HBM:
            raise _fail(op, f"{op.op} cannot access HBM (only dma can)")
        if access.memory == common_pb2.PSUM and op.engine == common_pb2.POOL:
            raise _fail(op, "POOL cannot access PSUM")
    checker = _CHECKS.get(op.op)
    if checker is not None:
        checker(op, target)


def _arity(required: int, optional: int) -> str:
    return f"{required} to {required + optional}" if optional else str(required)


def _per_partition(access: Access) -> bool:
    """Whether an on-chip operand holds one element per partition, read across the free dims."""
    walks = zip(access.counts, access.byte_strides, strict=True)
    return all(count <= 1 or stride == 0 for count, stride in walks)


def _check_indirect(op: Op) -> None:
    """dma_gather/dma_scatter: an HBM table whose first dimension is indexed, one s32 index per
    partition in SBUF, rows as wide as the table's."""
    gather = op.op == "dma_gather"
    table, rows = (op.inputs[0], op.outputs[0]) if gather else (op.outputs[0], op.inputs[0])
    index = op.inputs[1]
    if table.memory != common_pb2.HBM or rows.memory == common_pb2.HBM or index.memory == common_pb2.HBM:
        raise _fail(op, f"{op.op} moves rows between an HBM table and SBUF, indexed from SBUF")
    if index.dtype != common_pb2.S32 or index.size != index.partitions:
        raise _fail(op, "indices must be one s32 per partition")
    if index.partitions != rows.partitions or table.dtype != rows.dtype:
        raise _fail(op, f"{index.partitions} indices for {rows.partitions} rows, or the dtypes differ")
    row = table.size // max(1, table.shape[0]) if table.shape else table.size
    if rows.size != rows.partitions * row:
        raise _fail(op, f"rows of {rows.size // max(1, rows.partitions)} elements, table rows of {row}")


def _check_elementwise(op: Op, _target: Target) -> None:
    out = op.outputs[0]
    for index, access in enumerate(op.inputs):
        if access.size != out.size:
            raise _fail(op, f"input {index} has {access.size} elements but the output has {out.size}")


def _check_affine_select(op: Op, target: Target) -> None:
    _check_elementwise(op, target)
    if len(op.scalars) < 4:
        raise _fail(op, "affine_select takes 4 scalars (fill, offset, partition step, column step), "
                        f"not {len(op.scalars)}")
    for what, value in zip(("offset", "partition step", "column step"), op.scalars[1:4], strict=True):
        if not (math.isfinite(value) and value == int(value) and abs(value) < 2**31):
            raise _fail(op, f"affine_select's {what} {value!r} is not an integer within 32 bits")
    fill = op.scalars[0]
    if not _float_domain(op.inputs[0], op.outputs[0]) and not (math.isfinite(fill) and abs(fill) < 2**63):
        raise _fail(op, f"affine_select's fill {fill!r} is no value of its integer output")


def _check_matmul(op: Op, target: Target) -> None:
    stationary, moving = op.inputs
    out = op.outputs[0]
    if out.memory != common_pb2.PSUM:
        raise _fail(op, "matmul must write PSUM")
    if out.dtype != common_pb2.F32:
        raise _fail(op, f"matmul writes fp32 PSUM, not {dtypes.name(out.dtype)}")
    k = stationary.partitions
    if moving.partitions != k:
        raise _fail(op, f"stationary has K={k} partitions but moving has {moving.partitions}")
    if k > target.partitions:
        raise _fail(op, f"K={k} exceeds {target.partitions} partitions")
    m = stationary.size // max(k, 1)
    n = moving.size // max(k, 1)
    if m > target.matmul_max_stationary_free:
        raise _fail(op, f"stationary free size M={m} exceeds {target.matmul_max_stationary_free}")
    if n > target.matmul_max_moving_free:
        raise _fail(op, f"moving free size N={n} exceeds {target.matmul_max_moving_free}")
    if out.partitions != m or out.size != m * n:
        raise _fail(op, f"output is {list(out.shape)} but [K={k},M={m}]ᵀ·[K={k},N={n}] is [{m},{n}]")


def _check_transpose(op: Op, target: Target) -> None:
    source, out = op.inputs[0], op.outputs[0]
    if out.memory != common_pb2.PSUM:
        raise _fail(op, "transpose must write PSUM")
    if source.memory not in (common_pb2.SBUF, common_pb2.PSUM):
        raise _fail(op, "transpose reads an on-chip tile")
    if out.dtype != source.dtype:
        raise _fail(op, f"transpose converts {dtypes.name(source.dtype)} to {dtypes.name(out.dtype)}")
    p = source.partitions
    f = source.size // max(p, 1)
    if p > target.partitions or f > target.partitions:
        raise _fail(op, f"a [{p},{f}] tile: both sides must be at most {target.partitions}")
    if out.partitions != f or out.size != p * f:
        raise _fail(op, f"output is {list(out.shape)} but the transpose of [{p},{f}] is [{f},{p}]")


def _check_activation(op: Op, _target: Target) -> None:
    if op.func not in alu.ACT_FUNCTIONS:
        raise _fail(op, f"unknown activation function {op.func!r}")
    out = op.outputs[0]
    problem = alu.act_operand_problem(op.attributes.get(ACT_OPERAND, "bias"), len(op.inputs))
    if problem:
        raise _fail(op, problem)
    if any(not _per_partition(access) for access in op.inputs[1:]):
        raise _fail(op, "a scale or bias operand (input 1, 2) must hold one element per partition (stride 0)")
    total = op.outputs[1] if len(op.outputs) > 1 else None
    if total is not None and (total.size != out.partitions or total.partitions != out.partitions):
        raise _fail(op, f"the sum (output 1) has {total.size} elements for {out.partitions} partitions")
    for index, access in enumerate(op.inputs):
        if access.size != out.size:
            raise _fail(op, f"input {index} has {access.size} elements but the output has {out.size}")


def _check_binary(op: Op, _target: Target) -> None:
    if op.func not in alu.BINARY_FUNCS:
        raise _fail(op, f"unknown {op.op} function {op.func!r}")
    if op.op == "tensor_scalar" and not op.scalars:
        raise _fail(op, "tensor_scalar needs scalars[0]")
    _check_elementwise(op, _target)


def _check_reduce(op: Op, _target: Target) -> None:
    if op.func not in REDUCE_FUNCS:
        raise _fail(op, f"unknown reduce function {op.func!r}")
    src, out = op.inputs[0], op.outputs[0]
    if out.size != src.partitions:
        raise _fail(op, f"output has {out.size} elements but the input has {src.partitions} partitions")
    if src.partitions and src.size // src.partitions == 0:
        raise _fail(op, "reduces over zero free elements")


_CHECKS: dict[str, Callable[[Op, Target], None]] = {
    "matmul": _check_matmul,
    "transpose": _check_transpose,
    "activation": _check_activation,
    "tensor_tensor": _check_binary,
    "tensor_scalar": _check_binary,
    "tensor_reduce": _check_reduce,
    "tensor_copy": _check_elementwise,
    "select": _check_elementwise,
    "affine_select": _check_affine_select,
}


# ---- execution -------------------------------------------------------------------------------


def execute(op: Op) -> None:
    """Apply `op`'s effect on device memory."""
    with np.errstate(all="ignore"):
        apply(op)


def apply(op: Op) -> None:
    """`execute` without setting numpy's floating-point error handling, for a caller that sets it
    (to ignore) once around many instructions."""
    _EXECUTE[op.op](op)


def _nop(_op: Op) -> None:
    return None


def _dma(op: Op) -> None:
    out = op.outputs[0]
    out.write_storage(op.inputs[0].view.view(out.view.dtype))  # numpy copies overlapping bytes safely


def _dma_gather(op: Op) -> None:
    """Row p of the output is row index[p] of the table; an index out of range is clamped."""
    table, index = op.inputs
    out = op.outputs[0]
    rows = np.clip(index.read_compute().reshape(-1), 0, table.shape[0] - 1)
    out.write_storage(table.read()[rows].reshape(out.shape))


def _dma_scatter(op: Op) -> None:
    """Row index[p] of the table becomes row p of the input; an index out of range writes nothing."""
    source, index = op.inputs
    table = op.outputs[0]
    rows = index.read_compute().reshape(-1)
    keep = (rows >= 0) & (rows < table.shape[0])
    values = source.read().reshape((source.partitions, *table.shape[1:]))
    table.view[rows[keep]] = values[keep]


def _matmul(op: Op) -> None:
    stationary, moving = op.inputs
    out = op.outputs[0]
    k = stationary.partitions
    a = stationary.read_compute().astype(np.float32, copy=False).reshape(k, -1)
    b = moving.read_compute().astype(np.float32, copy=False).reshape(k, -1)
    product = a.T @ b
    if op.accumulate:
        product = out.read_compute().astype(np.float32, copy=False).reshape(product.shape) + product
    out.write_compute(product)


def _transpose(op: Op) -> None:
    """out[f, p] = in0[p, f], computed as NeuronCore-v2's PE computes it: the matmul of the tile
    (stationary) against an identity (moving) in fp32. Finite values arrive exactly; a NaN or an
    infinity spreads NaN along its column (inf x 0), and -0.0 may arrive as +0.0 (NKI's
    nc_transpose: not bit-accurate for NaN/Inf on NeuronCore-v2)."""
    source, out = op.inputs[0], op.outputs[0]
    p = source.partitions
    tile = source.read_compute().astype(np.float32, copy=False).reshape(p, -1)
    out.write_compute(tile.T @ np.eye(p, dtype=np.float32))


def _activation(op: Op) -> None:
    """out = func(in0 * scale [* s] + bias [+ b]) with the per-partition operands the attribute
    act_operand names (alu.ACT_OPERAND_ROLES: in1 is b by default); outputs[1], when given, gets
    the sum of each partition's written values, as tensor_reduce(add) of outputs[0] would."""
    scale = np.float32(op.scalars[0]) if len(op.scalars) > 0 else np.float32(1)
    bias = np.float32(op.scalars[1]) if len(op.scalars) > 1 else np.float32(0)
    out = op.outputs[0]
    x = np.multiply(op.inputs[0].values().astype(np.float32, copy=False), scale)  # a new, contiguous array
    roles = alu.ACT_OPERAND_ROLES[op.attributes.get(ACT_OPERAND, "bias")]
    operands = dict(zip(roles, op.inputs[1:], strict=False))
    if "scale" in operands:
        x *= _operand(operands["scale"], np.float32, x.shape)
    x += bias
    if "bias" in operands:
        x += _operand(operands["bias"], np.float32, x.shape)
    out.write_compute(alu.ACT_FUNCTIONS[op.func](x).astype(np.float32, copy=False))
    if len(op.outputs) > 1:
        written = _operand(out, np.float32, out.shape).reshape(out.partitions, -1)
        op.outputs[1].write_compute(written.sum(axis=1, dtype=np.float32).reshape(op.outputs[1].shape))


# Functions whose every element is one correctly rounded IEEE operation: numpy's contiguous (SIMD)
# and strided loops agree on them bit for bit, so they may read operands in place. The others
# (power, atan2, maximum of +0 and -0, ...) read contiguous copies as before: there vectorised and
# scalar loops may differ.
_EXACT_FUNCS = frozenset({"add", "subtract", "multiply", "divide", "eq", "ne", "lt", "le", "gt", "ge"})


def _operand(access: Access, kind: type, shape: tuple[int, ...], in_place: bool = False) -> np.ndarray:
    """An operand's values in `kind` and `shape`; `in_place`: they may alias device memory."""
    values = (access.values() if in_place else access.read_compute()).reshape(shape)
    return values.astype(kind, copy=False)


def _tensor_tensor(op: Op) -> None:
    out = op.outputs[0]
    kind = _domain(*op.inputs, out)
    exact = op.func in _EXACT_FUNCS
    a = _operand(op.inputs[0], kind, out.shape, exact)
    b = _operand(op.inputs[1], kind, out.shape, exact)
    out.write_compute(alu.binary(op.func, a, b, kind, out.dtype))


def _tensor_scalar(op: Op) -> None:
    out = op.outputs[0]
    kind = _domain(op.inputs[0], out)
    exact = kind is np.float32 and op.func in _EXACT_FUNCS
    a = _operand(op.inputs[0], kind, out.shape, exact)
    if exact:  # broadcast: the same f32 value meets every element
        scalar = np.float32(op.scalars[0])
    else:
        scalar = (
            np.full(out.shape, op.scalars[0], dtype=np.float32)
            if kind is np.float32  # an integer scalar wraps into the domain (-1 is all ones in u64)
            else np.full(out.shape, int(round(op.scalars[0])), dtype=np.int64).astype(kind)
        )
    if op.attributes.get("reverse") == "1":
        a, scalar = scalar, a
    out.write_compute(alu.binary(op.func, a, scalar, kind, out.dtype))


def _tensor_reduce(op: Op) -> None:
    src, out = op.inputs[0], op.outputs[0]
    kind = _domain(src, out)
    values = _operand(src, kind, src.shape).reshape(src.partitions, -1)
    if op.func == "add":
        result = values.sum(axis=1, dtype=kind)
    elif op.func == "multiply":
        result = values.prod(axis=1, dtype=kind)
    elif op.func == "maximum":
        result = values.max(axis=1)
    else:
        result = values.min(axis=1)
    out.write_compute(result.reshape(out.shape))


def _tensor_copy(op: Op) -> None:
    out = op.outputs[0]
    out.write_compute(op.inputs[0].values().reshape(out.shape))  # narrowing is exact on any layout


def _iota(op: Op) -> None:
    out = op.outputs[0]
    floating = dtypes.is_float(out.dtype)
    kind = np.float32 if floating else np.int64
    scalars = [float(s) if floating else int(round(s)) for s in op.scalars]
    scalars += [0] * (len(out.shape) + 1 - len(scalars))
    result = np.full(out.shape, scalars[0], dtype=kind)
    for axis, extent in enumerate(out.shape):
        index_shape = [1] * len(out.shape)
        index_shape[axis] = extent
        result = result + np.arange(extent, dtype=kind).reshape(index_shape) * kind(scalars[1 + axis])
    out.write_compute(result)


def _affine_select(op: Op) -> None:
    """out = in0 where offset + p * partition_step + f * column_step >= 0, else fill (p the
    partition, f the element's place in its partition's row): NKI's affine_select."""
    out = op.outputs[0]
    kind = _domain(op.inputs[0], out)
    fill, offset, partition_step, column_step = (int(s) if k else s for k, s in enumerate(op.scalars[:4]))
    partitions = out.partitions
    free = out.size // max(partitions, 1)
    value = (offset + partition_step * np.arange(partitions, dtype=np.int64)[:, None]
             + column_step * np.arange(free, dtype=np.int64)[None, :])
    kept = _operand(op.inputs[0], kind, (partitions, free))
    out.write_compute(np.where(value >= 0, kept, kind(fill)).reshape(out.shape))


def _select(op: Op) -> None:
    out = op.outputs[0]
    kind = _domain(op.inputs[1], op.inputs[2], out)
    condition = op.inputs[0].read_compute().reshape(out.shape) != 0
    on_true = _operand(op.inputs[1], kind, out.shape)
    on_false = _operand(op.inputs[2], kind, out.shape)
    out.write_compute(np.where(condition, on_true, on_false))


_EXECUTE: dict[str, Callable[[Op], None]] = {
    "nop": _nop,
    "drain": _nop,
    "sem_reset": _nop,  # no data: its effect is on the semaphores (simulator.py)
    "dma": _dma,
    "dma_gather": _dma_gather,
    "dma_scatter": _dma_scatter,
    "matmul": _matmul,
    "transpose": _transpose,
    "activation": _activation,
    "tensor_tensor": _tensor_tensor,
    "tensor_scalar": _tensor_scalar,
    "tensor_reduce": _tensor_reduce,
    "tensor_copy": _tensor_copy,
    "iota": _iota,
    "select": _select,
    "affine_select": _affine_select,
}
