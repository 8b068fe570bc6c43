"""Result shapes the HLO text may leave out (`t = transpose(x), dimensions={1,0}`), inferred from
the operands and attributes as XLA's shape inference does. Only ops whose result follows from
them; a broadcast, reshape, convert, iota, parameter or constant must spell its shape. The
verifier still checks whatever is inferred here like any written shape."""

from __future__ import annotations

from ncc.schemas import hlo_pb2
from ncc.tools.hlo.elementwise import BINARY_OPCODES, UNARY_OPCODES
from ncc.tools.hlo.hlo_types import T, is_tuple

Shape = hlo_pb2.ShapeProto
_SAME_AS_FIRST = UNARY_OPCODES | BINARY_OPCODES | {"copy", "reverse", "dynamic-update-slice"}


def infer_shape(instr: hlo_pb2.HloInstructionProto, operands: list[Shape]) -> Shape | None:
    """The result shape of `instr` given its operands' shapes, or None when it cannot be inferred."""
    opcode = instr.opcode
    arrays = [shape for shape in operands if not is_tuple(shape)]
    if opcode == "tuple":
        shape = Shape(element_type=T.TUPLE)
        shape.tuple_shapes.extend(operands)
        return shape
    if opcode == "opt-barrier" and len(operands) == 1:
        same = Shape()
        same.CopyFrom(operands[0])
        return same
    if opcode == "get-tuple-element" and operands and is_tuple(operands[0]):
        if 0 <= instr.tuple_index < len(operands[0].tuple_shapes):
            element = Shape()
            element.CopyFrom(operands[0].tuple_shapes[instr.tuple_index])
            return element
        return None
    if len(arrays) != len(operands) or not arrays:
        return None
    first = arrays[0]
    if opcode in _SAME_AS_FIRST:
        return array_shape(first.element_type, list(first.dimensions))
    if opcode in ("select", "clamp") and len(arrays) == 3:
        return array_shape(arrays[1].element_type, list(arrays[1].dimensions))
    if opcode in ("compare", "is-finite"):
        return array_shape(T.PRED, list(first.dimensions))
    if opcode == "transpose" and sorted(instr.dimensions) == list(range(len(first.dimensions))):
        return array_shape(first.element_type, [first.dimensions[d] for d in instr.dimensions])
    if opcode == "slice" and len(instr.slice_dimensions) == len(first.dimensions):
        sizes = [max(0, -(-(b.limit - b.start) // max(b.stride, 1))) for b in instr.slice_dimensions]
        return array_shape(first.element_type, sizes)
    if opcode == "dynamic-slice":
        return array_shape(first.element_type, list(instr.dynamic_slice_sizes))
    if opcode == "concatenate" and len(instr.dimensions) == 1 and instr.dimensions[0] < len(first.dimensions):
        sizes = list(first.dimensions)
        sizes[instr.dimensions[0]] = sum(shape.dimensions[instr.dimensions[0]] for shape in arrays
                                         if len(shape.dimensions) == len(sizes))
        return array_shape(first.element_type, sizes)
    if opcode == "pad" and len(instr.padding_config.dimensions) == len(first.dimensions):
        sizes = [e.edge_padding_low + e.edge_padding_high + n + max(n - 1, 0) * e.interior_padding
                 for e, n in zip(instr.padding_config.dimensions, first.dimensions, strict=True)]
        return array_shape(first.element_type, sizes)
    if opcode == "dot" and len(arrays) == 2:
        return _dot(instr.dot_dimension_numbers, arrays[0], arrays[1])
    if opcode == "reduce" and len(arrays) % 2 == 0:
        k = len(arrays) // 2
        kept = [n for d, n in enumerate(first.dimensions) if d not in instr.dimensions]
        results = [array_shape(init.element_type, kept) for init in arrays[k:]]
        if k == 1:
            return results[0]
        shape = Shape(element_type=T.TUPLE)
        shape.tuple_shapes.extend(results)
        return shape
    return None


def _dot(dn: hlo_pb2.DotDimensionNumbers, lhs: Shape, rhs: Shape) -> Shape:
    lb, lc = list(dn.lhs_batch_dimensions), list(dn.lhs_contracting_dimensions)
    rb, rc = list(dn.rhs_batch_dimensions), list(dn.rhs_contracting_dimensions)
    sizes = [lhs.dimensions[d] for d in lb if d < len(lhs.dimensions)]
    sizes += [n for d, n in enumerate(lhs.dimensions) if d not in lb and d not in lc]
    sizes += [n for d, n in enumerate(rhs.dimensions) if d not in rb and d not in rc]
    return array_shape(lhs.element_type, sizes)


def array_shape(kind: int, sizes: list[int] | tuple[int, ...]) -> Shape:
    """An array shape of element type `kind` and `sizes`, static, in the default row-major layout."""
    shape = Shape(element_type=kind, dimensions=list(sizes))
    shape.is_dynamic_dimension.extend([False] * len(sizes))
    shape.layout.minor_to_major.extend(range(len(sizes) - 1, -1, -1))
    return shape
