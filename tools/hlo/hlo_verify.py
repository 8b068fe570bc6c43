"""HLO module verification: refuse, naming the instruction, anything ncc cannot compile or evaluate.

A module that passes may be trusted by the evaluator and the lowering without re-checking: ids
resolve, operands precede their users, the call graph is acyclic and shallow, every shape is
static and of a supported element type, and each supported opcode obeys XLA's shape rules.
Protos mutated into garbage that still parse end here. One pass, O(instructions).

Codes: E201 unsupported opcode, E202 wrong operand count, E203 shape or attribute inconsistency,
E204 dangling or duplicate id / missing entry / bad call graph, E205 dynamic shape,
E206 unsupported element type.
"""

from __future__ import annotations

import math

from ncc.schemas import hlo_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.hlo.elementwise import (
    ARITHMETIC_BINARY,
    BINARY_OPCODES,
    BITWISE_BINARY,
    FLOAT_BINARY,
    FLOAT_UNARY,
    INTEGER_UNARY,
    NUMERIC_UNARY,
    SHIFTS,
    UNARY_OPCODES,
)
from ncc.tools.hlo.hlo_types import (
    FLOAT_TYPES,
    SIGNED_TYPES,
    SUPPORTED_ELEMENT_TYPES,
    UNSIGNED_TYPES,
    T,
    dims,
    element_count,
    entry_computation,
    is_tuple,
    same_shape,
    shape_str,
    type_name,
)
from ncc.tools.hlo.index_math import gather_batch_shape, gather_output_order, window_output_size
from ncc.tools.hlo.rng_bits import ALGORITHM_NAMES, state_sizes

BATCH_NORMS = ("batch-norm-inference", "batch-norm-training", "batch-norm-grad")
SUPPORTED_OPCODES = frozenset({
    "parameter", "constant", "broadcast", "reshape", "transpose", "dot", "reduce", "compare", "select",
    "iota", "call", "convert", "slice", "concatenate", "tuple", "get-tuple-element", "clamp", "copy",
    "is-finite", "fusion", "bitcast", "reverse", "pad", "while", "conditional", "dynamic-slice",
    "dynamic-update-slice", "convolution", "reduce-window", "gather", "scatter", "sort", "topk",
    "bitcast-convert", "select-and-scatter", "rng-bit-generator", "opt-barrier",
    "reduce-precision", *BATCH_NORMS,
}) | UNARY_OPCODES | BINARY_OPCODES
COMPARISON_DIRECTIONS = frozenset({"EQ", "NE", "LT", "LE", "GT", "GE"})
INTEGER_TYPES = SIGNED_TYPES | UNSIGNED_TYPES

MAX_RANK = 32
MAX_ARRAY_BYTES = 16 << 30  # one core's HBM: no single array can be larger
MAX_CALL_DEPTH = 64
MAX_TUPLE_NESTING = 32
_INT64_MIN = -(1 << 63)
_BYTES = {T.PRED: 1, T.S8: 1, T.U8: 1, T.S16: 2, T.U16: 2, T.F16: 2, T.BF16: 2, T.S32: 4, T.U32: 4, T.F32: 4,
          T.S64: 8, T.U64: 8}
# LiteralProto field holding each supported type, and its bytes per element when it is a bytes field.
_LITERAL_FIELDS = {T.PRED: ("preds", 0), T.S8: ("s8s", 1), T.U8: ("u8s", 1), T.S16: ("s16s", 2),
                   T.U16: ("u16s", 2), T.S32: ("s32s", 0), T.S64: ("s64s", 0), T.U32: ("u32s", 0),
                   T.U64: ("u64s", 0), T.F16: ("f16s", 2), T.BF16: ("bf16s", 2), T.F32: ("f32s", 0)}

Instr = hlo_pb2.HloInstructionProto


def _label(instr: Instr) -> str:
    name = instr.name or f"#{instr.id}"
    return name if len(name) <= 80 else name[:77] + "..."


def _shown(text: str) -> str:
    return text if len(text) <= 40 and text.isprintable() else repr(text[:37]) + "..."


def verify_module(module: hlo_pb2.HloModuleProto) -> None:
    """Raise a CompileError (location: the instruction's name) for the first problem found."""
    _Verifier(module).run()


class _Verifier:
    def __init__(self, module: hlo_pb2.HloModuleProto) -> None:
        self.module = module
        self.comps: dict[int, hlo_pb2.HloComputationProto] = {}
        self.instrs: dict[int, Instr] = {}
        self.place: dict[int, tuple[int, int]] = {}  # instruction id → (computation id, position)
        self.roots: dict[int, Instr] = {}
        self.params: dict[int, list[Instr]] = {}
        self.scalar_only: dict[int, bool] = {}

    def run(self) -> None:
        if not self.module.computations:
            raise CompileError("E204", "the module has no computations", self.module.name)
        self._index()
        if entry_computation(self.module) is None:
            name, number = _shown(self.module.entry_computation_name), self.module.entry_computation_id
            raise CompileError("E204", f"the entry computation '{name}' (id {number}) is not in the module",
                               self.module.name)
        self._call_graph()
        for comp in self.module.computations:
            for position, instr in enumerate(comp.instructions):
                self._instruction(comp, position, instr)

    # ---- structure: ids, roots, parameters, the call graph ------------------------------------
    def _index(self) -> None:
        names: set[str] = set()
        for comp in self.module.computations:
            if comp.id in self.comps:
                raise CompileError("E204", f"two computations have id {comp.id}", comp.name)
            if comp.name in names:
                raise CompileError("E204", f"two computations are named '{_shown(comp.name)}'", comp.name)
            names.add(comp.name)
            self.comps[comp.id] = comp
            if not comp.instructions:
                raise CompileError("E204", f"computation '{_shown(comp.name)}' has no instructions",
                                   comp.name)
            for position, instr in enumerate(comp.instructions):
                if instr.id in self.instrs:
                    other = _label(self.instrs[instr.id])
                    raise CompileError("E204", f"instruction '{_label(instr)}' has id {instr.id}, which "
                                               f"'{other}' already has", _label(instr))
                self.instrs[instr.id] = instr
                self.place[instr.id] = (comp.id, position)
            root = self.instrs.get(comp.root_id)
            if root is None or self.place[comp.root_id][0] != comp.id:
                raise CompileError("E204", f"the root id {comp.root_id} of computation "
                                           f"'{_shown(comp.name)}' is not one of its instructions", comp.name)
            self.roots[comp.id] = root
            params = sorted((i for i in comp.instructions if i.opcode == "parameter"),
                            key=lambda i: i.parameter_number)
            for number, param in enumerate(params):
                if param.parameter_number != number:
                    raise CompileError("E203", f"parameter '{_label(param)}' has number "
                                               f"{param.parameter_number}; the parameters of computation "
                                               f"'{_shown(comp.name)}' must be numbered 0..{len(params) - 1} "
                                               "once each", _label(param))
            self.params[comp.id] = params

    def _call_graph(self) -> None:
        """Called ids exist; no recursion; depth bounded; which computations compute only on scalars."""
        callees: dict[int, list[int]] = {}
        for comp in self.module.computations:
            edges = callees.setdefault(comp.id, [])
            for instr in comp.instructions:
                for callee in instr.called_computation_ids:
                    if callee not in self.comps:
                        raise CompileError("E204", f"instruction '{_label(instr)}' calls computation id "
                                                   f"{callee}, which is not in the module", _label(instr))
                    edges.append(callee)
        state: dict[int, int] = {}  # 1 on the stack, 2 done
        depth: dict[int, int] = {}
        for start in callees:
            if start in state:
                continue
            stack = [(start, 0)]
            state[start] = 1
            while stack:
                node, child = stack[-1]
                if child < len(callees[node]):
                    stack[-1] = (node, child + 1)
                    callee = callees[node][child]
                    if state.get(callee) == 1:
                        name = self.comps[callee].name
                        raise CompileError("E204", f"computation '{_shown(name)}' calls itself (recursion is "
                                                   "not supported)", name)
                    if callee not in state:
                        state[callee] = 1
                        stack.append((callee, 0))
                    continue
                stack.pop()
                state[node] = 2
                depth[node] = 1 + max((depth[c] for c in callees[node]), default=0)
                if depth[node] > MAX_CALL_DEPTH:
                    raise CompileError("E204", f"calls nest deeper than {MAX_CALL_DEPTH} computations",
                                       self.comps[node].name)
                comp = self.comps[node]
                self.scalar_only[node] = all(_scalar_shape(i.shape) for i in comp.instructions) and all(
                    self.scalar_only[c] for c in callees[node])

    # ---- instructions ---------------------------------------------------------------------------
    def _instruction(self, comp: hlo_pb2.HloComputationProto, position: int, instr: Instr) -> None:
        opcode = instr.opcode
        if opcode == "custom-call":
            target = instr.custom_call_target.decode("utf-8", errors="replace") or "(none)"
            raise CompileError("E201", f"custom-call '{_label(instr)}' to target '{_shown(target)}' is not "
                                       "supported: ncc compiles only standard HLO ops", _label(instr))
        if opcode not in SUPPORTED_OPCODES:
            raise CompileError("E201", f"unsupported opcode '{_shown(opcode)}' in instruction "
                                       f"'{_label(instr)}'", _label(instr))
        self._shape(instr.shape, instr, 0)
        operands: list[Instr] = []
        for operand_id in instr.operand_ids:
            where = self.place.get(operand_id)
            if where is None or where[0] != comp.id or where[1] >= position:
                if where is None:
                    problem = "is not an instruction of the module"
                elif where[0] != comp.id:
                    problem = "belongs to another computation"
                else:
                    problem = "is not defined before its use"
                raise CompileError("E204", f"operand id {operand_id} of instruction '{_label(instr)}' "
                                           f"{problem}", _label(instr))
            operands.append(self.instrs[operand_id])
        _CHECKS[opcode](self, instr, operands)

    def _shape(self, shape: hlo_pb2.ShapeProto, instr: Instr, nesting: int) -> None:
        if is_tuple(shape):
            if nesting > MAX_TUPLE_NESTING:
                raise _bad(instr, f"tuple shapes nest deeper than {MAX_TUPLE_NESTING}")
            if shape.dimensions:
                raise _bad(instr, "a tuple shape has dimensions")
            for sub in shape.tuple_shapes:
                self._shape(sub, instr, nesting + 1)
            return
        if shape.element_type not in SUPPORTED_ELEMENT_TYPES:
            raise CompileError("E206", f"unsupported element type {type_name(shape.element_type)} in "
                                       f"instruction '{_label(instr)}'", _label(instr))
        if any(shape.is_dynamic_dimension) or _INT64_MIN in shape.dimensions:
            raise CompileError("E205", f"instruction '{_label(instr)}' has a dynamic shape; only static "
                                       "shapes are supported", _label(instr))
        if len(shape.dimensions) > MAX_RANK:
            raise _bad(instr, f"rank {len(shape.dimensions)} exceeds the maximum of {MAX_RANK}")
        size = _BYTES[shape.element_type]
        for extent in shape.dimensions:
            if extent < 0:
                raise _bad(instr, f"negative dimension {extent}")
            size *= extent
        if size > MAX_ARRAY_BYTES:
            raise _bad(instr, f"shape {shape_str(shape)} needs {size} bytes, more than the {MAX_ARRAY_BYTES} "
                              "one array may have")
        order = list(shape.layout.minor_to_major)
        if order and sorted(order) != list(range(len(shape.dimensions))):
            raise _bad(instr, f"layout {{{_ints(order)}}} is not a permutation of the dimensions")

    # ---- opcode rules (XLA's shape inference, restricted to what ncc takes) -------------------
    def _binary(self, instr: Instr, ops: list[Instr]) -> None:
        _count(instr, ops, 2)
        a, b = _arrays(instr, ops)
        _same_dims(instr, [a, b], instr.shape)
        _same_types(instr, [a, b, instr.shape])
        _element_type_fits(instr, instr.shape.element_type)

    def _unary(self, instr: Instr, ops: list[Instr]) -> None:
        _count(instr, ops, 1)
        (a,) = _arrays(instr, ops)
        _same_dims(instr, [a], instr.shape)
        _same_types(instr, [a, instr.shape])
        _element_type_fits(instr, instr.shape.element_type)

    def _is_finite(self, instr: Instr, ops: list[Instr]) -> None:
        _count(instr, ops, 1)
        (a,) = _arrays(instr, ops)
        _same_dims(instr, [a], instr.shape)
        if a.element_type not in FLOAT_TYPES or instr.shape.element_type != T.PRED:
            raise _bad(instr, f"is-finite maps a floating-point array to pred, not {shape_str(a)} to "
                              f"{shape_str(instr.shape)}")

    def _reduce_precision(self, instr: Instr, ops: list[Instr]) -> None:
        self._unary(instr, ops)
        if instr.shape.element_type not in FLOAT_TYPES:
            raise _bad(instr, f"reduce-precision rounds floating-point values, not "
                              f"{type_name(instr.shape.element_type)}")
        if instr.exponent_bits < 1 or instr.mantissa_bits < 0:
            raise _bad(instr, f"reduce-precision needs exponent_bits >= 1 and mantissa_bits >= 0, has "
                              f"{instr.exponent_bits} and {instr.mantissa_bits}")

    def _batch_norm(self, instr: Instr, ops: list[Instr]) -> None:
        """batch-norm-inference (x, scale, offset, mean, variance) -> y; batch-norm-training (x, scale,
        offset) -> (y, mean, variance); batch-norm-grad (x, scale, mean, variance, dy) -> (dx, dscale,
        doffset): vectors of x's feature dimension, all of x's floating-point type."""
        training, inference = instr.opcode == "batch-norm-training", instr.opcode == "batch-norm-inference"
        _count(instr, ops, 3 if training else 5)
        shapes = _arrays(instr, ops, result_too=inference)
        x = shapes[0]
        if x.element_type not in FLOAT_TYPES:
            raise _bad(instr, f"batch norm takes a floating-point operand, not {shape_str(x)}")
        if not 0 <= instr.feature_index < len(x.dimensions):
            raise _bad(instr, f"feature_index {instr.feature_index} is not a dimension of {shape_str(x)}")
        if not math.isfinite(instr.epsilon):
            raise _bad(instr, f"epsilon {instr.epsilon} is not finite")
        features = x.dimensions[instr.feature_index]
        vector = hlo_pb2.ShapeProto(element_type=x.element_type, dimensions=[features])
        vectors = shapes[1:4] if instr.opcode == "batch-norm-grad" else shapes[1:]
        for shape in vectors:
            if not same_shape(shape, vector):
                raise _bad(instr, f"operand {shape_str(shape)} must be {shape_str(vector)}, one value per "
                                  f"feature of {shape_str(x)}")
        if instr.opcode == "batch-norm-grad" and not same_shape(shapes[4], x):
            raise _bad(instr, f"the output gradient {shape_str(shapes[4])} must be {shape_str(x)}")
        results = [x] if inference else [x, vector, vector]
        produced = [instr.shape] if inference else list(instr.shape.tuple_shapes)
        if len(produced) != len(results) or not all(map(same_shape, produced, results)):
            wanted = shape_str(x) if inference else f"({', '.join(shape_str(r) for r in results)})"
            raise _bad(instr, f"{instr.opcode} of {shape_str(x)} produces {wanted}, not "
                              f"{shape_str(instr.shape)}")

    def _clamp(self, instr: Instr, ops: list[Instr]) -> None:
        _count(instr, ops, 3)
        low, x, high = _arrays(instr, ops)
        _same_dims(instr, [x], instr.shape)
        for bound in (low, high):
            if bound.dimensions and dims(bound) != dims(x):
                raise _bad(instr, f"bound {shape_str(bound)} must be a scalar or match {shape_str(x)}")
        _same_types(instr, [low, x, high, instr.shape])
        if x.element_type == T.PRED:
            raise _bad(instr, "clamp is not defined on pred")

    def _compare(self, instr: Instr, ops: list[Instr]) -> None:
        _count(instr, ops, 2)
        a, b = _arrays(instr, ops)
        _same_dims(instr, [a, b], instr.shape)
        _same_types(instr, [a, b])
        if instr.shape.element_type != T.PRED:
            raise _bad(instr, f"compare must produce pred, not {type_name(instr.shape.element_type)}")
        if instr.comparison_direction not in COMPARISON_DIRECTIONS:
            raise _bad(instr, f"comparison direction '{_shown(instr.comparison_direction)}' is not one of "
                              f"{', '.join(sorted(COMPARISON_DIRECTIONS))}")

    def _select(self, instr: Instr, ops: list[Instr]) -> None:
        _count(instr, ops, 3)
        pred, on_true, on_false = _arrays(instr, ops)
        if pred.element_type != T.PRED:
            raise _bad(instr, f"the selector must be pred, not {type_name(pred.element_type)}")
        if pred.dimensions and dims(pred) != dims(instr.shape):
            raise _bad(instr, f"selector {shape_str(pred)} does not match the result "
                              f"{shape_str(instr.shape)}")
        _same_dims(instr, [on_true, on_false], instr.shape)
        _same_types(instr, [on_true, on_false, instr.shape])

    def _convert(self, instr: Instr, ops: list[Instr]) -> None:
        _count(instr, ops, 1)
        (a,) = _arrays(instr, ops)
        _same_dims(instr, [a], instr.shape)

    def _broadcast(self, instr: Instr, ops: list[Instr]) -> None:
        _count(instr, ops, 1)
        (a,) = _arrays(instr, ops)
        _same_types(instr, [a, instr.shape])
        mapping, out = list(instr.dimensions), dims(instr.shape)
        if len(mapping) != len(a.dimensions):
            raise _bad(instr, f"dimensions={{{_ints(mapping)}}} must name one result dimension for each "
                              f"of the {len(a.dimensions)} operand dimensions")
        _distinct_in_range(instr, mapping, len(out), "dimensions")
        for operand_dim, out_dim in enumerate(mapping):
            if a.dimensions[operand_dim] != out[out_dim]:
                raise _bad(instr, f"operand dimension {operand_dim} (size {a.dimensions[operand_dim]}) "
                                  f"cannot be broadcast to result dimension {out_dim} (size {out[out_dim]})")

    def _reshape(self, instr: Instr, ops: list[Instr]) -> None:
        _count(instr, ops, 1)
        (a,) = _arrays(instr, ops)
        _same_types(instr, [a, instr.shape])
        if element_count(a) != element_count(instr.shape):
            raise _bad(instr, f"cannot reshape {shape_str(a)} ({element_count(a)} elements) to "
                              f"{shape_str(instr.shape)} ({element_count(instr.shape)} elements)")

    def _transpose(self, instr: Instr, ops: list[Instr]) -> None:
        _count(instr, ops, 1)
        (a,) = _arrays(instr, ops)
        _same_types(instr, [a, instr.shape])
        perm = list(instr.dimensions)
        if sorted(perm) != list(range(len(a.dimensions))):
            raise _bad(instr, f"dimensions={{{_ints(perm)}}} is not a permutation of {len(a.dimensions)} "
                              "dimensions")
        expected = [a.dimensions[p] for p in perm]
        if expected != list(instr.shape.dimensions):
            raise _bad(instr, f"transposing {shape_str(a)} by {{{_ints(perm)}}} gives [{_ints(expected)}], "
                              f"not {shape_str(instr.shape)}")

    def _dot(self, instr: Instr, ops: list[Instr]) -> None:
        _count(instr, ops, 2)
        lhs, rhs = _arrays(instr, ops)
        for shape in (lhs, rhs, instr.shape):
            if shape.element_type == T.PRED:
                raise _bad(instr, "dot is not defined on pred")
        dn = instr.dot_dimension_numbers
        lb, lc = list(dn.lhs_batch_dimensions), list(dn.lhs_contracting_dimensions)
        rb, rc = list(dn.rhs_batch_dimensions), list(dn.rhs_contracting_dimensions)
        if len(lb) != len(rb) or len(lc) != len(rc):
            raise _bad(instr, "lhs and rhs must have as many batch and as many contracting dimensions")
        _distinct_in_range(instr, lb + lc, len(lhs.dimensions), "lhs batch and contracting dimensions")
        _distinct_in_range(instr, rb + rc, len(rhs.dimensions), "rhs batch and contracting dimensions")
        for kind, left, right in (("batch", lb, rb), ("contracting", lc, rc)):
            for ld, rd in zip(left, right, strict=True):
                if lhs.dimensions[ld] != rhs.dimensions[rd]:
                    raise _bad(instr, f"{kind} dimension sizes differ: lhs dimension {ld} is "
                                      f"{lhs.dimensions[ld]}, rhs dimension {rd} is {rhs.dimensions[rd]}")
        lhs_free = [d for d in range(len(lhs.dimensions)) if d not in lb and d not in lc]
        rhs_free = [d for d in range(len(rhs.dimensions)) if d not in rb and d not in rc]
        expected = ([lhs.dimensions[d] for d in lb] + [lhs.dimensions[d] for d in lhs_free]
                    + [rhs.dimensions[d] for d in rhs_free])
        if expected != list(instr.shape.dimensions):
            raise _bad(instr, f"dot of {shape_str(lhs)} and {shape_str(rhs)} gives [{_ints(expected)}], not "
                              f"{shape_str(instr.shape)}")

    def _reduce(self, instr: Instr, ops: list[Instr]) -> None:
        if len(ops) < 2 or len(ops) % 2:
            raise CompileError("E202", f"reduce '{_label(instr)}' takes inputs and as many init values (an "
                                       f"even number of operands), has {len(ops)}", _label(instr))
        shapes = _arrays(instr, ops, result_too=False)
        k = len(ops) // 2
        inputs, inits = shapes[:k], shapes[k:]
        for shape in inputs[1:]:
            if dims(shape) != dims(inputs[0]):
                raise _bad(instr, f"reduce inputs {shape_str(inputs[0])} and {shape_str(shape)} differ")
        for data, init in zip(inputs, inits, strict=True):
            if init.dimensions:
                raise _bad(instr, f"init value {shape_str(init)} must be a scalar")
            if init.element_type != data.element_type:
                raise _bad(instr, f"init value {shape_str(init)} does not match input {shape_str(data)}")
        reduced = list(instr.dimensions)
        _distinct_in_range(instr, reduced, len(inputs[0].dimensions), "dimensions")
        kept = [size for d, size in enumerate(inputs[0].dimensions) if d not in reduced]
        results = list(instr.shape.tuple_shapes) if k > 1 else [instr.shape]
        if (k > 1 and not is_tuple(instr.shape)) or len(results) != k:
            raise _bad(instr, f"a reduce of {k} input(s) gives {k} result(s), not {shape_str(instr.shape)}")
        for result, init in zip(results, inits, strict=True):
            kind = init.element_type
            if is_tuple(result) or list(result.dimensions) != kept or result.element_type != kind:
                raise _bad(instr, f"reducing dimensions {{{_ints(reduced)}}} of {shape_str(inputs[0])} gives "
                                  f"{type_name(init.element_type)}[{_ints(kept)}], not {shape_str(result)}")
        reducer = self._callee(instr)
        params = self.params[reducer.id]
        if len(params) != 2 * k:
            raise _bad(instr, f"reducer '{_shown(reducer.name)}' must take {2 * k} parameters, takes "
                              f"{len(params)}")
        for index, param in enumerate(params):
            init = inits[index % k]
            shape = param.shape
            if is_tuple(shape) or shape.dimensions or shape.element_type != init.element_type:
                raise _bad(instr, f"reducer parameter '{_label(param)}' is {shape_str(param.shape)}, "
                                  f"expected {type_name(init.element_type)}[]")
        root = self.roots[reducer.id].shape
        outs = list(root.tuple_shapes) if k > 1 and is_tuple(root) else [root]
        if len(outs) != k or any(is_tuple(o) or o.dimensions or o.element_type != i.element_type
                                 for o, i in zip(outs, inits, strict=True)):
            raise _bad(instr, f"reducer '{_shown(reducer.name)}' returns {shape_str(root)}, which does not "
                              "match its init values")
        if not self.scalar_only[reducer.id]:
            raise _bad(instr, f"reducer '{_shown(reducer.name)}' must compute on scalars only")

    def _iota(self, instr: Instr, ops: list[Instr]) -> None:
        _count(instr, ops, 0)
        shape = instr.shape
        if is_tuple(shape) or not shape.dimensions or shape.element_type == T.PRED:
            raise _bad(instr, f"iota must produce a numeric array of rank ≥ 1, not {shape_str(shape)}")
        if len(instr.dimensions) != 1:
            raise _bad(instr, "iota needs exactly one iota_dimension")
        _distinct_in_range(instr, list(instr.dimensions), len(shape.dimensions), "iota_dimension")

    def _slice(self, instr: Instr, ops: list[Instr]) -> None:
        _count(instr, ops, 1)
        (a,) = _arrays(instr, ops)
        _same_types(instr, [a, instr.shape])
        bounds = instr.slice_dimensions
        if len(bounds) != len(a.dimensions):
            raise _bad(instr, f"slice gives {len(bounds)} bounds for {len(a.dimensions)} dimensions")
        expected = []
        for d, (bound, size) in enumerate(zip(bounds, a.dimensions, strict=True)):
            if not (0 <= bound.start <= bound.limit <= size and bound.stride >= 1):
                raise _bad(instr, f"slice bound [{bound.start}:{bound.limit}:{bound.stride}] is invalid for "
                                  f"dimension {d} of size {size}")
            expected.append((bound.limit - bound.start + bound.stride - 1) // bound.stride)
        if expected != list(instr.shape.dimensions):
            raise _bad(instr, f"slice of {shape_str(a)} gives [{_ints(expected)}], not "
                              f"{shape_str(instr.shape)}")

    def _concatenate(self, instr: Instr, ops: list[Instr]) -> None:
        if not ops:
            raise CompileError("E202", f"concatenate '{_label(instr)}' needs at least one operand",
                               _label(instr))
        shapes = _arrays(instr, ops)
        _same_types(instr, [*shapes, instr.shape])
        if len(instr.dimensions) != 1:
            raise _bad(instr, "concatenate needs exactly one dimension")
        axis = instr.dimensions[0]
        out = list(instr.shape.dimensions)
        _distinct_in_range(instr, [axis], len(out), "dimensions")
        total = 0
        for shape in shapes:
            if len(shape.dimensions) != len(out) or any(
                    shape.dimensions[d] != out[d] for d in range(len(out)) if d != axis):
                raise _bad(instr, f"operand {shape_str(shape)} does not fit result {shape_str(instr.shape)} "
                                  f"along dimension {axis}")
            total += shape.dimensions[axis]
        if total != out[axis]:
            raise _bad(instr, f"operands add up to {total} along dimension {axis}, the result has "
                              f"{out[axis]}")

    def _tuple(self, instr: Instr, ops: list[Instr]) -> None:
        subs = instr.shape.tuple_shapes
        if not is_tuple(instr.shape) or len(subs) != len(ops) or not all(
                same_shape(sub, op.shape) for sub, op in zip(subs, ops, strict=True)):
            raise _bad(instr, f"tuple of {len(ops)} operands cannot have shape {shape_str(instr.shape)}")

    def _opt_barrier(self, instr: Instr, ops: list[Instr]) -> None:
        """XLA's optimization barrier (jax.checkpoint's remat): its operand, array or tuple, unchanged."""
        _count(instr, ops, 1)
        if not same_shape(ops[0].shape, instr.shape):
            raise _bad(instr, f"opt-barrier of {shape_str(ops[0].shape)} cannot have shape "
                              f"{shape_str(instr.shape)}")

    def _get_tuple_element(self, instr: Instr, ops: list[Instr]) -> None:
        _count(instr, ops, 1)
        source = ops[0].shape
        if not is_tuple(source) or not 0 <= instr.tuple_index < len(source.tuple_shapes):
            raise _bad(instr, f"index {instr.tuple_index} does not select an element of {shape_str(source)}")
        if not same_shape(source.tuple_shapes[instr.tuple_index], instr.shape):
            raise _bad(instr, f"element {instr.tuple_index} of {shape_str(source)} is not "
                              f"{shape_str(instr.shape)}")

    def _call(self, instr: Instr, ops: list[Instr]) -> None:
        callee = self._callee(instr)
        params = self.params[callee.id]
        if len(params) != len(ops):
            raise CompileError("E202", f"call '{_label(instr)}' passes {len(ops)} operands to "
                                       f"'{_shown(callee.name)}', which takes {len(params)}", _label(instr))
        for param, op in zip(params, ops, strict=True):
            if not same_shape(param.shape, op.shape):
                raise _bad(instr, f"operand {shape_str(op.shape)} does not match parameter '{_label(param)}' "
                                  f"{shape_str(param.shape)}")
        root = self.roots[callee.id].shape
        if not same_shape(root, instr.shape):
            raise _bad(instr, f"'{_shown(callee.name)}' returns {shape_str(root)}, not "
                              f"{shape_str(instr.shape)}")

    def _bitcast(self, instr: Instr, ops: list[Instr]) -> None:
        _count(instr, ops, 1)
        (a,) = _arrays(instr, ops)
        _same_types(instr, [a, instr.shape])
        if element_count(a) != element_count(instr.shape):
            raise _bad(instr, f"cannot bitcast {shape_str(a)} to {shape_str(instr.shape)}: the element "
                              "counts differ")

    def _bitcast_convert(self, instr: Instr, ops: list[Instr]) -> None:
        """Same bits, another type: equal widths keep the shape; a narrower result gains a last
        dimension of width ratio; a wider one drops the operand's last dimension, of that size."""
        _count(instr, ops, 1)
        (a,) = _arrays(instr, ops)
        if T.PRED in (a.element_type, instr.shape.element_type):
            raise _bad(instr, "bitcast-convert is not defined on pred")
        have, want = _BYTES[a.element_type], _BYTES[instr.shape.element_type]
        if have == want:
            expected = dims(a)
        elif have > want:
            expected = dims(a) + (have // want,)
        else:
            expected = dims(a)[:-1] if dims(a)[-1:] == (want // have,) else None
        if expected != dims(instr.shape):
            raise _bad(instr, f"cannot bitcast-convert {shape_str(a)} to {shape_str(instr.shape)}")

    def _rng_bit_generator(self, instr: Instr, ops: list[Instr]) -> None:
        """A u64 state (u64[2]; Philox, which XLA:CPU also runs for rng_default, takes u64[3] too)
        gives (the new state, an integer array of bits): the shapes XLA:CPU's expansion accepts."""
        _count(instr, ops, 1)
        (state,) = _arrays(instr, ops, result_too=False)
        algorithm = instr.rng_algorithm
        if algorithm not in ALGORITHM_NAMES:
            raise _bad(instr, f"unknown algorithm {algorithm}")
        sizes = state_sizes(algorithm)
        if state.element_type != T.U64 or len(state.dimensions) != 1 or state.dimensions[0] not in sizes:
            allowed = " or ".join(f"u64[{n}]" for n in sizes)
            raise _bad(instr, f"the state of {ALGORITHM_NAMES[algorithm]} must be {allowed}, not "
                              f"{shape_str(state)}")
        results = list(instr.shape.tuple_shapes)
        if not is_tuple(instr.shape) or len(results) != 2 or is_tuple(results[1]) \
                or not same_shape(results[0], state) or results[1].element_type not in INTEGER_TYPES:
            raise _bad(instr, f"the result must be ({shape_str(state)}, an integer array), not "
                              f"{shape_str(instr.shape)}")

    def _reverse(self, instr: Instr, ops: list[Instr]) -> None:
        _count(instr, ops, 1)
        (a,) = _arrays(instr, ops)
        _same_dims(instr, [a], instr.shape)
        _same_types(instr, [a, instr.shape])
        _distinct_in_range(instr, list(instr.dimensions), len(a.dimensions), "dimensions")

    def _pad(self, instr: Instr, ops: list[Instr]) -> None:
        _count(instr, ops, 2)
        a, value = _arrays(instr, ops)
        _same_types(instr, [a, value, instr.shape])
        if value.dimensions:
            raise _bad(instr, f"the padding value must be a scalar, not {shape_str(value)}")
        config = instr.padding_config.dimensions
        if len(config) != len(a.dimensions):
            raise _bad(instr, f"padding has {len(config)} dimensions, the operand {len(a.dimensions)}")
        expected = []
        for d, (edge, size) in enumerate(zip(config, a.dimensions, strict=True)):
            if edge.interior_padding < 0:
                raise _bad(instr, f"interior padding {edge.interior_padding} of dimension {d} is negative")
            expected.append(edge.edge_padding_low + edge.edge_padding_high + size
                            + max(size - 1, 0) * edge.interior_padding)
        if expected != list(instr.shape.dimensions) or any(e < 0 for e in expected):
            raise _bad(instr, f"padding {shape_str(a)} gives [{_ints(expected)}], not "
                              f"{shape_str(instr.shape)}")

    def _while(self, instr: Instr, ops: list[Instr]) -> None:
        _count(instr, ops, 1)
        if len(instr.called_computation_ids) != 2:
            raise CompileError("E204", f"while '{_label(instr)}' must name a body and a condition",
                               _label(instr))
        body, condition = (self.comps[c] for c in instr.called_computation_ids)
        state = ops[0].shape
        for comp in (body, condition):
            params = self.params[comp.id]
            if len(params) != 1 or not same_shape(params[0].shape, state):
                raise _bad(instr, f"'{_shown(comp.name)}' must take one parameter of the loop state "
                                  f"{shape_str(state)}")
        if not same_shape(self.roots[body.id].shape, state) or not same_shape(instr.shape, state):
            raise _bad(instr, f"body '{_shown(body.name)}' and the loop must give the loop state "
                              f"{shape_str(state)}")
        predicate = self.roots[condition.id].shape
        if is_tuple(predicate) or predicate.dimensions or predicate.element_type != T.PRED:
            raise _bad(instr, f"condition '{_shown(condition.name)}' must return pred[], not "
                              f"{shape_str(predicate)}")

    def _conditional(self, instr: Instr, ops: list[Instr]) -> None:
        branches = [self.comps[c] for c in instr.called_computation_ids]
        if not ops or len(branches) < 1 or len(ops) != len(branches) + 1:
            raise CompileError("E202", f"conditional '{_label(instr)}' takes a selector and one operand per "
                                       f"branch ({len(branches)}), has {len(ops)} operands", _label(instr))
        selector = ops[0].shape
        kind = selector.element_type
        if is_tuple(selector) or selector.dimensions or kind not in (T.PRED, T.S32) or (
                kind == T.PRED and len(branches) != 2):
            raise _bad(instr, "the selector must be pred[] (two branches) or s32[], not "
                              f"{shape_str(selector)}")
        for branch, operand in zip(branches, ops[1:], strict=True):
            params = self.params[branch.id]
            if len(params) != 1 or not same_shape(params[0].shape, operand.shape):
                raise _bad(instr, f"branch '{_shown(branch.name)}' must take one parameter "
                                  f"{shape_str(operand.shape)}")
            if not same_shape(self.roots[branch.id].shape, instr.shape):
                raise _bad(instr, f"branch '{_shown(branch.name)}' returns "
                                  f"{shape_str(self.roots[branch.id].shape)}, not {shape_str(instr.shape)}")

    def _dynamic_slice(self, instr: Instr, ops: list[Instr]) -> None:
        shapes = _arrays(instr, ops)
        if not shapes:
            raise CompileError("E202", f"dynamic-slice '{_label(instr)}' needs an operand", _label(instr))
        a, starts = shapes[0], shapes[1:]
        _same_types(instr, [a, instr.shape])
        _check_start_indices(instr, a, starts)
        sizes = list(instr.dynamic_slice_sizes)
        if len(sizes) != len(a.dimensions) or any(not 0 <= n <= d for n, d in zip(sizes, a.dimensions,
                                                                                     strict=True)):
            raise _bad(instr, f"dynamic_slice_sizes={{{_ints(sizes)}}} do not fit {shape_str(a)}")
        if sizes != list(instr.shape.dimensions):
            raise _bad(instr, f"slice sizes {{{_ints(sizes)}}} differ from the result "
                              f"{shape_str(instr.shape)}")

    def _dynamic_update_slice(self, instr: Instr, ops: list[Instr]) -> None:
        shapes = _arrays(instr, ops)
        if len(shapes) < 2:
            raise CompileError("E202", f"dynamic-update-slice '{_label(instr)}' needs an operand and an "
                                       "update", _label(instr))
        a, update, starts = shapes[0], shapes[1], shapes[2:]
        _same_dims(instr, [a], instr.shape)
        _same_types(instr, [a, update, instr.shape])
        _check_start_indices(instr, a, starts)
        if len(update.dimensions) != len(a.dimensions) or any(
                u > d for u, d in zip(update.dimensions, a.dimensions, strict=True)):
            raise _bad(instr, f"update {shape_str(update)} does not fit in {shape_str(a)}")

    def _convolution(self, instr: Instr, ops: list[Instr]) -> None:
        _count(instr, ops, 2)
        lhs, rhs = _arrays(instr, ops)
        kinds = {lhs.element_type, rhs.element_type, instr.shape.element_type}
        if T.PRED in kinds:
            raise _bad(instr, "convolution is not defined on pred")
        if not (kinds <= FLOAT_TYPES or kinds <= INTEGER_TYPES):  # a mixed precision one (JAX's
            # preferred_element_type: bf16 operands, an f32 result) is a float convolution still
            _same_types(instr, [lhs, rhs, instr.shape])
        dn = instr.convolution_dimension_numbers
        labelled = ((lhs, [dn.input_batch_dimension, dn.input_feature_dimension,
                           *dn.input_spatial_dimensions]),
                    (rhs, [dn.kernel_input_feature_dimension, dn.kernel_output_feature_dimension,
                           *dn.kernel_spatial_dimensions]),
                    (instr.shape, [dn.output_batch_dimension, dn.output_feature_dimension,
                                   *dn.output_spatial_dimensions]))
        for shape, used in labelled:
            _distinct_in_range(instr, used, len(shape.dimensions), "convolution dimension numbers")
            if len(used) != len(shape.dimensions) or len(shape.dimensions) != len(lhs.dimensions):
                raise _bad(instr, f"dim_labels do not describe {shape_str(shape)}")
        groups = max(1, instr.feature_group_count)
        features, out_features = lhs.dimensions[dn.input_feature_dimension], rhs.dimensions[
            dn.kernel_output_feature_dimension]
        if features % groups or out_features % groups or \
                rhs.dimensions[dn.kernel_input_feature_dimension] * groups != features:
            raise _bad(instr, f"{features} input features, {out_features} output features and kernel "
                              f"{shape_str(rhs)} do not split into {groups} feature groups")
        batch_groups = max(1, instr.batch_group_count)
        batch = lhs.dimensions[dn.input_batch_dimension]
        if batch_groups > 1 and (groups > 1 or batch % batch_groups or out_features % batch_groups):
            raise _bad(instr, f"batch_group_count={batch_groups} needs feature_group_count=1 and divides "
                              f"the batch ({batch}) and the output features ({out_features})")
        window = instr.window.dimensions
        if len(window) != len(dn.input_spatial_dimensions):
            raise _bad(instr, f"the window has {len(window)} dimensions, the input "
                              f"{len(dn.input_spatial_dimensions)} spatial ones")
        expected = [0] * len(lhs.dimensions)
        expected[dn.output_batch_dimension] = batch // batch_groups
        expected[dn.output_feature_dimension] = out_features
        for i, w in enumerate(window):
            if w.size != rhs.dimensions[dn.kernel_spatial_dimensions[i]] or min(
                    w.stride, w.window_dilation, w.base_dilation) < 1:
                raise _bad(instr, f"window dimension {i} does not match kernel {shape_str(rhs)}")
            size = lhs.dimensions[dn.input_spatial_dimensions[i]]
            expected[dn.output_spatial_dimensions[i]] = window_output_size(
                size, w.size, w.stride, w.padding_low, w.padding_high, w.window_dilation, w.base_dilation)
        if expected != list(instr.shape.dimensions):
            raise _bad(instr, f"convolving {shape_str(lhs)} with {shape_str(rhs)} gives [{_ints(expected)}], "
                              f"not {shape_str(instr.shape)}")

    def _gather(self, instr: Instr, ops: list[Instr]) -> None:
        _count(instr, ops, 2)
        operand, indices = _arrays(instr, ops)
        _same_types(instr, [operand, instr.shape])
        if indices.element_type not in INTEGER_TYPES:
            raise _bad(instr, f"indices must be integers, not {shape_str(indices)}")
        dn = instr.gather_dimension_numbers
        rank, sizes = len(operand.dimensions), list(instr.gather_slice_sizes)
        if len(sizes) != rank or any(not 0 <= n <= d for n, d in zip(sizes, operand.dimensions, strict=True)):
            raise _bad(instr, f"slice_sizes={{{_ints(sizes)}}} do not fit {shape_str(operand)}")
        _distinct_in_range(instr, list(dn.start_index_map), rank, "start_index_map")
        _distinct_in_range(instr, list(dn.collapsed_slice_dims), rank, "collapsed_slice_dims")
        if any(sizes[d] != 1 for d in dn.collapsed_slice_dims):
            raise _bad(instr, "a collapsed slice dimension must have slice size 1")
        vector = dn.index_vector_dim
        if not 0 <= vector <= len(indices.dimensions):
            raise _bad(instr, f"index_vector_dim {vector} is out of range for {shape_str(indices)}")
        _batching_dims(instr, operand, indices, list(dn.operand_batching_dims),
                       list(dn.start_indices_batching_dims), vector,
                       set(dn.collapsed_slice_dims) | set(dn.start_index_map))
        if any(sizes[d] != 1 for d in dn.operand_batching_dims):
            raise _bad(instr, "an operand batching dimension must have slice size 1")
        width = indices.dimensions[vector] if vector < len(indices.dimensions) else 1
        if width != len(dn.start_index_map):
            raise _bad(instr, f"indices give {width} coordinates, start_index_map names "
                              f"{len(dn.start_index_map)}")
        batch = gather_batch_shape(indices.dimensions, vector)
        dropped = set(dn.collapsed_slice_dims) | set(dn.operand_batching_dims)
        kept = [n for d, n in enumerate(sizes) if d not in dropped]
        out_rank = len(batch) + len(kept)
        _distinct_in_range(instr, list(dn.offset_dims), out_rank, "offset_dims")
        if len(dn.offset_dims) != len(kept):
            raise _bad(instr, f"offset_dims name {len(dn.offset_dims)} dimensions, the slice keeps "
                              f"{len(kept)}")
        natural = batch + kept
        expected = [natural[d] for d in gather_output_order(dn.offset_dims, len(batch), out_rank)]
        if expected != list(instr.shape.dimensions):
            raise _bad(instr, f"gathering from {shape_str(operand)} gives [{_ints(expected)}], not "
                              f"{shape_str(instr.shape)}")

    def _scatter(self, instr: Instr, ops: list[Instr]) -> None:
        if len(ops) != 3:
            raise CompileError("E207", f"scatter '{_label(instr)}' of {len(ops)} operands is not supported "
                                       "(one operand, its indices and its updates)", _label(instr))
        operand, indices, updates = _arrays(instr, ops)
        _same_dims(instr, [operand], instr.shape)
        _same_types(instr, [operand, updates, instr.shape])
        if indices.element_type not in INTEGER_TYPES:
            raise _bad(instr, f"indices must be integers, not {shape_str(indices)}")
        dn = instr.scatter_dimension_numbers
        rank = len(operand.dimensions)
        _distinct_in_range(instr, list(dn.scatter_dims_to_operand_dims), rank, "scatter_dims_to_operand_dims")
        _distinct_in_range(instr, list(dn.inserted_window_dims), rank, "inserted_window_dims")
        _distinct_in_range(instr, list(dn.update_window_dims), len(updates.dimensions), "update_window_dims")
        vector = dn.index_vector_dim
        width = indices.dimensions[vector] if vector < len(indices.dimensions) else 1
        if not 0 <= vector <= len(indices.dimensions) or width != len(dn.scatter_dims_to_operand_dims):
            raise _bad(instr, f"indices {shape_str(indices)} do not give one coordinate per "
                              "scatter_dims_to_operand_dims entry")
        _batching_dims(instr, operand, indices, list(dn.input_batching_dims),
                       list(dn.scatter_indices_batching_dims), vector,
                       set(dn.inserted_window_dims) | set(dn.scatter_dims_to_operand_dims))
        batch = gather_batch_shape(indices.dimensions, vector)
        scatter_dims = [d for d in range(len(updates.dimensions)) if d not in dn.update_window_dims]
        placed = len(dn.update_window_dims) + len(dn.inserted_window_dims) + len(dn.input_batching_dims)
        if [updates.dimensions[d] for d in scatter_dims] != batch or placed != rank:
            raise _bad(instr, f"updates {shape_str(updates)} do not match indices {shape_str(indices)} and "
                              f"operand {shape_str(operand)}")
        reducer = self._callee(instr)
        if len(self.params[reducer.id]) != 2 or not self.scalar_only[reducer.id]:
            raise _bad(instr, f"update computation '{_shown(reducer.name)}' must take 2 scalars")

    def _sort(self, instr: Instr, ops: list[Instr]) -> None:
        if not ops:
            raise CompileError("E202", f"sort '{_label(instr)}' needs at least one operand", _label(instr))
        shapes = _arrays(instr, ops, result_too=False)
        for shape in shapes[1:]:
            if dims(shape) != dims(shapes[0]):
                raise _bad(instr, f"sort operands {shape_str(shapes[0])} and {shape_str(shape)} differ")
        if len(instr.dimensions) != 1:
            raise _bad(instr, "sort needs exactly one dimension")
        _distinct_in_range(instr, list(instr.dimensions), len(shapes[0].dimensions), "dimensions")
        results = list(instr.shape.tuple_shapes) if len(ops) > 1 else [instr.shape]
        pairs = zip(results, shapes, strict=False)
        if len(results) != len(ops) or not all(same_shape(result, shape) for result, shape in pairs):
            raise _bad(instr, f"sorting gives the operands' shapes, not {shape_str(instr.shape)}")
        comparator = self._callee(instr)
        params = self.params[comparator.id]
        root = self.roots[comparator.id].shape
        if len(params) != 2 * len(ops) or is_tuple(root) or root.dimensions or root.element_type != T.PRED:
            raise _bad(instr, f"comparator '{_shown(comparator.name)}' must take {2 * len(ops)} scalars and "
                              "return pred[]")

    def _topk(self, instr: Instr, ops: list[Instr]) -> None:
        _count(instr, ops, 1)
        (operand,) = _arrays(instr, ops, result_too=False)
        if not operand.dimensions or operand.element_type == T.PRED:
            raise _bad(instr, f"topk needs a numeric array of rank >= 1, not {shape_str(operand)}")
        k = instr.k
        expected = [*operand.dimensions[:-1], k]
        results = list(instr.shape.tuple_shapes)
        kinds = [operand.element_type, T.S32]
        if not 0 <= k <= operand.dimensions[-1] or len(results) != 2 or any(
                list(result.dimensions) != expected or result.element_type != kind
                for result, kind in zip(results, kinds, strict=True)):
            raise _bad(instr, f"topk k={k} of {shape_str(operand)} gives ({type_name(operand.element_type)}"
                              f"[{_ints(expected)}], s32[{_ints(expected)}]), not {shape_str(instr.shape)}")

    def _reduce_window(self, instr: Instr, ops: list[Instr]) -> None:
        if len(ops) < 2 or len(ops) % 2:
            raise CompileError("E202", f"reduce-window '{_label(instr)}' takes inputs and as many init "
                                       "values", _label(instr))
        shapes = _arrays(instr, ops, result_too=False)
        k = len(ops) // 2
        inputs, inits = shapes[:k], shapes[k:]
        window = instr.window.dimensions
        data = inputs[0]
        if len(window) != len(data.dimensions):
            raise _bad(instr, f"the window has {len(window)} dimensions, the input {len(data.dimensions)}")
        expected = []
        for d, w in enumerate(window):
            if min(w.size, w.stride, w.window_dilation, w.base_dilation) < 1:
                raise _bad(instr, f"window dimension {d} has a size, stride or dilation below 1")
            expected.append(window_output_size(data.dimensions[d], w.size, w.stride, w.padding_low,
                                               w.padding_high, w.window_dilation, w.base_dilation))
        results = list(instr.shape.tuple_shapes) if k > 1 else [instr.shape]
        for shape, init in zip(results, inits, strict=True):
            kind = init.element_type
            if is_tuple(shape) or list(shape.dimensions) != expected or shape.element_type != kind:
                raise _bad(instr, f"reduce-window of {shape_str(data)} gives {type_name(init.element_type)}"
                                  f"[{_ints(expected)}], not {shape_str(shape)}")
        reducer = self._callee(instr)
        if len(self.params[reducer.id]) != 2 * k or not self.scalar_only[reducer.id]:
            raise _bad(instr, f"reducer '{_shown(reducer.name)}' must take {2 * k} scalars")

    def _select_and_scatter(self, instr: Instr, ops: list[Instr]) -> None:
        """operand, source (the shape of the operand's windows) and a scalar init; `select` picks one
        element of each window, `scatter` combines the source into it."""
        _count(instr, ops, 3)
        operand, source, init = _arrays(instr, ops)
        window = instr.window.dimensions
        if len(window) != len(operand.dimensions):
            raise _bad(instr, f"the window has {len(window)} dimensions, the operand "
                              f"{len(operand.dimensions)}")
        expected = []
        for d, w in enumerate(window):
            if min(w.size, w.stride) < 1 or w.window_dilation > 1 or w.base_dilation > 1 \
                    or min(w.padding_low, w.padding_high) < 0:
                raise _bad(instr, f"window dimension {d} needs a size and stride of at least 1, no dilation "
                                  "and no negative padding")
            expected.append(window_output_size(operand.dimensions[d], w.size, w.stride, w.padding_low,
                                               w.padding_high, 1, 1))
        if list(source.dimensions) != expected:
            raise _bad(instr, f"the source {shape_str(source)} must have the operand's window shape "
                              f"[{_ints(expected)}]")
        if init.dimensions:
            raise _bad(instr, f"the init value must be a scalar, not {shape_str(init)}")
        _same_dims(instr, [operand], instr.shape)
        _same_types(instr, [operand, source, init, instr.shape])
        if len(instr.called_computation_ids) != 2:
            raise CompileError("E204", f"select-and-scatter '{_label(instr)}' must name a select and a "
                                       "scatter computation", _label(instr))
        select, scatter = (self.comps[c] for c in instr.called_computation_ids)
        for comp in (select, scatter):
            if len(self.params[comp.id]) != 2 or not self.scalar_only[comp.id]:
                raise _bad(instr, f"computation '{_shown(comp.name)}' must take 2 scalars")

    def _parameter(self, instr: Instr, ops: list[Instr]) -> None:
        _count(instr, ops, 0)

    def _constant(self, instr: Instr, ops: list[Instr]) -> None:
        _count(instr, ops, 0)
        _check_literal(instr, instr.literal, instr.shape)

    def _callee(self, instr: Instr) -> hlo_pb2.HloComputationProto:
        if len(instr.called_computation_ids) != 1:
            count = len(instr.called_computation_ids)
            raise CompileError("E204", f"{instr.opcode} '{_label(instr)}' must name exactly one computation "
                                       f"(to_apply), names {count}", _label(instr))
        return self.comps[instr.called_computation_ids[0]]


def _scalar_shape(shape: hlo_pb2.ShapeProto) -> bool:
    if is_tuple(shape):
        return all(not is_tuple(sub) and not sub.dimensions for sub in shape.tuple_shapes)
    return not shape.dimensions


def _bad(instr: Instr, detail: str) -> CompileError:
    return CompileError("E203", f"{_shown(instr.opcode)} '{_label(instr)}': {detail}", _label(instr))


def _ints(values: list[int]) -> str:
    return ",".join(str(v) for v in values)


def _count(instr: Instr, ops: list[Instr], expected: int) -> None:
    if len(ops) != expected:
        raise CompileError("E202", f"{instr.opcode} '{_label(instr)}' takes {expected} operand"
                                   f"{'' if expected == 1 else 's'}, has {len(ops)}", _label(instr))


def _arrays(instr: Instr, ops: list[Instr], result_too: bool = True) -> list[hlo_pb2.ShapeProto]:
    """The operands' shapes, which must be arrays; so must the result unless `result_too` is False."""
    for shape in ([instr.shape] if result_too else []) + [op.shape for op in ops]:
        if is_tuple(shape):
            raise _bad(instr, f"expects arrays, got the tuple {shape_str(shape)}")
    return [op.shape for op in ops]


def _same_dims(instr: Instr, shapes: list[hlo_pb2.ShapeProto], result: hlo_pb2.ShapeProto) -> None:
    for shape in shapes:
        if dims(shape) != dims(result):
            shown = " and ".join(shape_str(s) for s in shapes)
            raise _bad(instr, f"operand shapes {shown} do not match the result {shape_str(result)}")


def _check_start_indices(instr: Instr, operand: hlo_pb2.ShapeProto, starts: list[hlo_pb2.ShapeProto]) -> None:
    """One integer scalar start index per operand dimension, all of one type."""
    if len(starts) != len(operand.dimensions):
        raise CompileError("E202", f"{instr.opcode} '{_label(instr)}' needs {len(operand.dimensions)} start "
                                   f"indices, has {len(starts)}", _label(instr))
    for start in starts:
        if start.dimensions or start.element_type not in INTEGER_TYPES:
            raise _bad(instr, f"a start index must be an integer scalar, not {shape_str(start)}")
    _same_types(instr, starts)


def _batching_dims(instr: Instr, operand: hlo_pb2.ShapeProto, indices: hlo_pb2.ShapeProto,
                   operand_dims: list[int], indices_dims: list[int], vector: int, taken: set[int]) -> None:
    """Batching dimensions pair an operand dimension with an indices dimension of the same size."""
    _distinct_in_range(instr, operand_dims, len(operand.dimensions), "operand batching dims")
    _distinct_in_range(instr, indices_dims, len(indices.dimensions), "indices batching dims")
    if len(operand_dims) != len(indices_dims) or vector in indices_dims or taken & set(operand_dims):
        raise _bad(instr, "batching dimensions must pair distinct operand and indices dimensions (not the "
                          "index vector, not indexed or collapsed)")
    for a, b in zip(operand_dims, indices_dims, strict=True):
        if operand.dimensions[a] != indices.dimensions[b]:
            raise _bad(instr, f"batching dimension {a} of {shape_str(operand)} and {b} of "
                              f"{shape_str(indices)} differ in size")


def _element_type_fits(instr: Instr, kind: int) -> None:
    """The op is defined on its element type: float-only, integer-only, bitwise and arithmetic ops."""
    opcode = instr.opcode
    if opcode in FLOAT_UNARY or opcode in FLOAT_BINARY:
        allowed, what = FLOAT_TYPES, "a floating-point"
    elif opcode in SHIFTS or opcode in INTEGER_UNARY:
        allowed, what = INTEGER_TYPES, "an integer"
    elif opcode in BITWISE_BINARY or opcode == "not":
        allowed, what = INTEGER_TYPES | {T.PRED}, "an integer or pred"
    elif opcode in ARITHMETIC_BINARY or opcode in NUMERIC_UNARY:
        allowed, what = FLOAT_TYPES | INTEGER_TYPES, "a numeric (not pred)"
    else:
        return
    if kind not in allowed:
        raise _bad(instr, f"{opcode} needs {what} element type, not {type_name(kind)}")


def _same_types(instr: Instr, shapes: list[hlo_pb2.ShapeProto]) -> None:
    kinds = {shape.element_type for shape in shapes}
    if len(kinds) > 1:
        raise _bad(instr, f"element types differ: {', '.join(shape_str(s) for s in shapes)}")


def _distinct_in_range(instr: Instr, values: list[int], rank: int, what: str) -> None:
    if len(set(values)) != len(values) or any(not 0 <= v < rank for v in values):
        raise _bad(instr, f"{what} {{{_ints(values)}}} must be distinct dimensions in [0, {rank})")


def _check_literal(instr: Instr, literal: hlo_pb2.LiteralProto, shape: hlo_pb2.ShapeProto) -> None:
    if is_tuple(shape):
        if len(literal.tuple_literals) != len(shape.tuple_shapes):
            raise _bad(instr, f"constant holds {len(literal.tuple_literals)} tuple elements, its shape "
                              f"{shape_str(shape)} needs {len(shape.tuple_shapes)}")
        for sub_literal, sub_shape in zip(literal.tuple_literals, shape.tuple_shapes, strict=True):
            _check_literal(instr, sub_literal, sub_shape)
        return
    field, width = _LITERAL_FIELDS[shape.element_type]
    stored = len(getattr(literal, field))
    if width and stored % width:
        raise _bad(instr, f"constant's {field} holds {stored} bytes, not a multiple of {width}")
    have, need = (stored // width if width else stored), element_count(shape)
    if have != need:
        raise _bad(instr, f"constant holds {have} values, its shape {shape_str(shape)} needs {need}")


_CHECKS = {
    **{op: _Verifier._binary for op in BINARY_OPCODES},
    **{op: _Verifier._unary for op in UNARY_OPCODES | {"copy"}},
    "is-finite": _Verifier._is_finite, "clamp": _Verifier._clamp, "fusion": _Verifier._call,
    "bitcast": _Verifier._bitcast, "bitcast-convert": _Verifier._bitcast_convert,
    "rng-bit-generator": _Verifier._rng_bit_generator,
    "reverse": _Verifier._reverse, "pad": _Verifier._pad,
    "while": _Verifier._while, "conditional": _Verifier._conditional,
    "dynamic-slice": _Verifier._dynamic_slice, "convolution": _Verifier._convolution,
    "reduce-window": _Verifier._reduce_window, "gather": _Verifier._gather, "scatter": _Verifier._scatter,
    "sort": _Verifier._sort, "topk": _Verifier._topk, "select-and-scatter": _Verifier._select_and_scatter,
    "dynamic-update-slice": _Verifier._dynamic_update_slice,
    "compare": _Verifier._compare, "select": _Verifier._select, "convert": _Verifier._convert,
    "broadcast": _Verifier._broadcast, "reshape": _Verifier._reshape, "transpose": _Verifier._transpose,
    "dot": _Verifier._dot, "reduce": _Verifier._reduce, "iota": _Verifier._iota, "slice": _Verifier._slice,
    "concatenate": _Verifier._concatenate, "tuple": _Verifier._tuple,
    "get-tuple-element": _Verifier._get_tuple_element, "call": _Verifier._call,
    "opt-barrier": _Verifier._opt_barrier, "reduce-precision": _Verifier._reduce_precision,
    **{op: _Verifier._batch_norm for op in BATCH_NORMS},
    "parameter": _Verifier._parameter, "constant": _Verifier._constant,
}
assert set(_CHECKS) == SUPPORTED_OPCODES
