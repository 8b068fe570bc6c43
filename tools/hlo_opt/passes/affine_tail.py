"""A norm's affine tail moved onto ACT where `forward` transposes the norm's output.

A layer norm ends x̂ · γ + β with γ and β vectors along the features, which row-major tiles hold
along the free dimension: two DVE passes that stream γ and β beside x̂ (ViT's block: 2.9 of the
5.8 µs of DVE a 128-token tile of its norm takes, on the path to the next dot, which waits for
every token). When `forward` hands that output to a dot transposed (tokens along the free
dimension, features across the partitions), γ and β are per-partition columns there, which ACT's
copy out of the transpose's PSUM tile can apply for nothing: `identity(x̂ᵀ · 1 · γ + (−0) + β)`,
act_operand = scale_bias (docs/ir.md). The transpose then reads x̂, and the tail's two DVE
passes, left without readers, go with `dce`.

When: the forwarded tile L (any float type) is written only by a `tensor_tensor` multiply(X, G)
(an RMSNorm's · weight: act_operand = scale), add(X, B) (= bias), or add(M, B) with M fp32 and
written only by multiply(X, G) (= scale_bias), either operand order and no per-partition
operands, in the producer's nest; X is a float SBUF tile of L's shape and blocks written by one
statement, of that nest only, at L's box under L's predicates; G and B are loaded there by plain
dmas from views of module inputs or constants that repeat along the rows (stride 0 across the
tile's partition dimension). The values are the DVE's bit for bit: x̂ · 1 is x̂, times γ rounds
as the multiply did (in fp32, then to L's type where no add follows), adding −0 changes no
value, and adding β rounds as the add did; the PE's transpose carries x̂ as it carried L (exact
for finite values, and x̂ is checked for non-finite values as L was).
"""

from __future__ import annotations

from dataclasses import dataclass

from ncc.schemas import common_pb2, penguin_pb2
from ncc.tools.common.access_keys import box_key
from ncc.tools.common.dtypes import is_float
from ncc.tools.hlo_opt.passes import same_box, writers_and_readers
from ncc.tools.hlo_opt.passes.broadcast_operands import BROADCAST


@dataclass(frozen=True)
class AffineTail:
    """L = X · G + B (or X · G, or X + B) in the producer's nest: X's tile, and the HBM views G
    and B are loaded from (None where the tail has no such step)."""

    data: str
    scale: penguin_pb2.TensorDecl | None
    bias: penguin_pb2.TensorDecl | None

    @property
    def role(self) -> str:
        """The activation's act_operand: the column operands it takes, in order (alu.py)."""
        roles = (("scale", self.scale), ("bias", self.bias))
        return "_".join(name for name, view in roles if view is not None)


def affine_tail(nest: penguin_pb2.LoopNest, tile: str, tensors: dict[str, penguin_pb2.TensorDecl],
                nests_of: dict[str, set[int]], index: int) -> AffineTail | None:
    """The affine tail that writes `tile` in `nest` (the program's nest `index`), if it has one
    the module docstring allows."""
    writers, _ = writers_and_readers(nest)
    statements = nest.statements
    last = _only(statements, writers, tile, ("add", "multiply"))
    if last is None or not is_float(tensors[tile].dtype):
        return None
    operands = _operands(last, statements, writers, tensors)
    if operands is None:
        return None
    data, scale, bias = (*operands, None) if last.func == "multiply" else (operands[0], None, operands[1])
    multiply = _only(statements, writers, data.tensor, ("multiply",)) if bias is not None else None
    if multiply is not None and tensors[data.tensor].dtype == common_pb2.F32 \
            and (head := _operands(multiply, statements, writers, tensors)) is not None:
        data, scale = head  # x̂ · γ + β, the product in fp32 as ACT keeps it
    decl, result = tensors[data.tensor], tensors[tile]
    if not (decl.memory == common_pb2.SBUF and is_float(decl.dtype) and not decl.replicated_dims
            and decl.num_buffers <= 1 and list(decl.shape) == list(result.shape)
            and list(decl.block_shape) == list(result.block_shape) and nests_of[data.tensor] == {index}):
        return None
    if len(writers[data.tensor]) != 1 or not same_box(data, last.outputs[0]):
        return None  # one writer, at the tail's box: what the tail read is what X holds after
    writer = statements[writers[data.tensor][0]]
    if box_key(writer.outputs[0]) != box_key(last.outputs[0]) \
            or list(writer.predicates) != list(last.predicates):
        return None
    return AffineTail(data.tensor, scale, bias)


def _only(statements, writers: dict[str, list[int]], tensor: str, funcs: tuple[str, ...]
          ) -> penguin_pb2.Statement | None:
    """The one statement writing `tensor`, if it is a two-operand `tensor_tensor` of one of
    `funcs` on streamed operands."""
    if len(writers[tensor]) != 1:
        return None
    st = statements[writers[tensor][0]]
    if st.op != "tensor_tensor" or st.func not in funcs or len(st.inputs) != 2 or len(st.outputs) != 1 \
            or st.attributes.get(BROADCAST) or st.attributes.get("reverse"):
        return None
    return st


def _operands(st: penguin_pb2.Statement, statements, writers: dict[str, list[int]],
              tensors: dict[str, penguin_pb2.TensorDecl]
              ) -> tuple[penguin_pb2.Access, penguin_pb2.TensorDecl] | None:
    """(the data operand, the HBM view the other one is loaded from) when exactly one of `st`'s
    operands is a tile loaded from a view of a module input or constant repeated along the rows."""
    found = [(k, view) for k, access in enumerate(st.inputs)
             if (view := _row_vector(access, statements, writers, tensors)) is not None]
    if len(found) != 1 or not same_box(st.inputs[found[0][0]], st.outputs[0]):
        return None
    k, view = found[0]
    return st.inputs[1 - k], view


def _row_vector(access: penguin_pb2.Access, statements, writers: dict[str, list[int]],
                tensors: dict[str, penguin_pb2.TensorDecl]) -> penguin_pb2.TensorDecl | None:
    """The HBM view `access`'s tile is loaded from, when one plain dma loads it at its own
    coordinates from a view of a module input or constant that repeats along the rows."""
    if len(writers[access.tensor]) != 1:
        return None
    load = statements[writers[access.tensor][0]]
    if load.op != "dma" or len(load.inputs) != 1 or len(load.outputs) != 1:
        return None
    view = tensors[load.inputs[0].tensor]
    if view.memory != common_pb2.HBM or not view.view_of or len(view.view_strides) < 2 \
            or tensors[view.view_of].role not in (penguin_pb2.INPUT, penguin_pb2.CONSTANT):
        return None
    if view.view_strides[-2] != 0 or list(load.inputs[0].starts) != list(load.outputs[0].starts):
        return None
    return view


def column_loads(load: penguin_pb2.Statement, tail: AffineTail, dim_of: list[int], ratio: list[int],
                 program: penguin_pb2.Program, tensors: dict[str, penguin_pb2.TensorDecl]
                 ) -> tuple[list[penguin_pb2.Statement], list[penguin_pb2.Access]] | None:
    """For the consumer's `load` (its box of L, transposed: L's free dimension across its
    partitions), dmas of γ's and β's [P, 1] columns over that box, and the accesses of the two
    column tiles; None when the vectors do not become columns there."""
    statements, columns = [], []
    target = tensors[load.outputs[0].tensor]
    read = load.inputs[0]
    for role, view in (("scale", tail.scale), ("bias", tail.bias)):
        if view is None:
            continue
        strides = [view.view_strides[a] * r if a >= 0 else 0 for a, r in zip(dim_of, ratio, strict=True)]
        if strides[-1] != 0 or strides[-2] == 0:
            return None
        name = f"{view.name}.{target.name}.{role}"
        if name not in tensors:
            column_view = program.tensors.add()
            column_view.CopyFrom(view)
            column_view.name = name
            del column_view.shape[:]
            column_view.shape.extend(tensors[read.tensor].shape)
            del column_view.view_strides[:]
            column_view.view_strides.extend(strides)
            tensors[name] = column_view
            column = program.tensors.add()
            column.CopyFrom(target)
            column.name, column.dtype = f"{target.name}.{role}", view.dtype
            column.shape[-1] = column.block_shape[-1] = 1
            del column.replicated_dims[:]
            tensors[column.name] = column
        into = penguin_pb2.Access(tensor=f"{target.name}.{role}", starts=load.outputs[0].starts,
                                  extents=load.outputs[0].extents)
        source = penguin_pb2.Access(tensor=name, starts=read.starts, extents=read.extents)
        for access in (into, source):
            access.starts[-1].Clear()
            access.extents[-1] = 1
        st = penguin_pb2.Statement(name=f"{load.name}.{role}", op="dma", engine=load.engine,
                                   source=load.source)
        st.outputs.append(into)
        st.inputs.append(source)
        st.predicates.extend(load.predicates)
        for key, value in load.attributes.items():  # a pipelined nest's stage, as the load had it
            st.attributes[key] = value
        statements.append(st)
        columns.append(into)
    return statements, columns
