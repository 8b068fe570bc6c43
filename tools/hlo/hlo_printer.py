"""An xla.HloModuleProto → HLO text that ncc's parser (hlo_text.py) reads back into the same module.

`print_module(module)` writes every field of the subset schema (schemas/hlo.proto) that the
parser reads: shapes with layouts, constants with every value (floats in their shortest form
that converts back to the same bits), parameter numbers, dimensions, dot / gather / scatter /
convolution dimension numbers, windows, padding, slices, comparison direction and type, called
computations, frontend attributes, metadata and control predecessors, in XLA's spelling so that
XLA's own parser takes the common cases too. Computations are written in the module's order
(callees before callers, the entry last) and instructions in their computation's order (operands
before users), which the module already has once ncc's verifier (hlo_verify.py) accepts it; the
parser then gives every instruction and computation back in the same order. Ids are not text:
the parser numbers them again (instructions 1..N in text order, computations 1..C).

What the text cannot carry: ids, a NaN's payload (written `nan`), and fields outside the subset
schema. Names that the grammar cannot hold, or that repeat within a computation, are rewritten
into ones it can (`_` for other characters, `.N` to make them unique).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from ncc.schemas import hlo_pb2
from ncc.tools.hlo.hlo_types import T, entry_computation, is_tuple, root_of, type_name

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_KEYWORDS = frozenset({"ROOT", "ENTRY", "HloModule"})
_FLOAT_MAX = {T.F16: 65504.0, T.BF16: 3.3895313892515355e38, T.F32: 3.4028234663852886e38}
_RNG_NAMES = {hlo_pb2.RNG_DEFAULT: "rng_default", hlo_pb2.RNG_THREE_FRY: "rng_three_fry",
              hlo_pb2.RNG_PHILOX: "rng_philox"}
_ESCAPED = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}
_BYTE_FIELDS = {T.S8: ("s8s", "i1"), T.U8: ("u8s", "u1"), T.S16: ("s16s", "<i2"), T.U16: ("u16s", "<u2")}
_INT_FIELDS = {T.S32: "s32s", T.S64: "s64s", T.U32: "u32s", T.U64: "u64s"}

Instr = hlo_pb2.HloInstructionProto


@dataclass(frozen=True)
class _Scope:
    """What an instruction's text refers to: its computation's instructions by id (their printed
    names and shapes) and the module's computations by id (their printed names)."""

    names: dict[int, str]
    shapes: dict[int, hlo_pb2.ShapeProto]
    comps: dict[int, str]


def print_module(module: hlo_pb2.HloModuleProto) -> str:
    """The module as HLO text (ends with a newline). ValueError for an operand or a called
    computation id that the module does not hold (a module the verifier would refuse)."""
    comp_names = _unique_names([comp.name for comp in module.computations], "computation")
    comp_by_id = {comp.id: comp_names[i] for i, comp in enumerate(module.computations)}
    entry = entry_computation(module)
    header = f"HloModule {_name(module.name, 'module')}"
    if entry is not None:
        header += f", entry_computation_layout={{{_program_layout(entry)}}}"
    if module.frontend_attributes.map:
        header += f", frontend_attributes={_frontend_attributes(module.frontend_attributes)}"
    blocks = [header]
    for index, comp in enumerate(module.computations):
        blocks.append(_computation(comp, comp_names[index], comp is entry, comp_by_id))
    return "\n\n".join(blocks) + "\n"


def shape_text(shape: hlo_pb2.ShapeProto) -> str:
    """`f32[128,256]{1,0}`, `(f32[2]{0}, s32[])`, `token[]`: the shape with its layout."""
    if is_tuple(shape):
        return "(" + ", ".join(shape_text(sub) for sub in shape.tuple_shapes) + ")"
    text = f"{type_name(shape.element_type)}[{','.join(str(d) for d in shape.dimensions)}]"
    if shape.element_type in (T.TOKEN, T.OPAQUE_TYPE):
        return text
    if shape.dimensions and shape.HasField("layout"):
        text += "{" + ",".join(str(d) for d in shape.layout.minor_to_major) + "}"
    return text


# -- module and computations ----------------------------------------------------------------------


def _program_layout(comp: hlo_pb2.HloComputationProto) -> str:
    params = sorted(
        (i for i in comp.instructions if i.opcode == "parameter"), key=lambda i: i.parameter_number
    )
    root = root_of(comp)
    result = shape_text(root.shape) if root is not None else "()"
    return "(" + ", ".join(shape_text(p.shape) for p in params) + ")->" + result


def _computation(
    comp: hlo_pb2.HloComputationProto, name: str, is_entry: bool, comp_by_id: dict[int, str]
) -> str:
    names = _unique_names([instr.name for instr in comp.instructions], "v")
    scope = _Scope(
        {instr.id: names[i] for i, instr in enumerate(comp.instructions)},
        {instr.id: instr.shape for instr in comp.instructions},
        comp_by_id,
    )
    head = f"{'ENTRY ' if is_entry else ''}{name}"
    if comp.execution_thread:
        head += f", execution_thread={_string(comp.execution_thread)}"
    lines = [head + " {"]
    for index, instr in enumerate(comp.instructions):
        root = "ROOT " if instr.id == comp.root_id else ""
        lines.append(f"  {root}{names[index]} = {_instruction(instr, scope)}")
    lines.append("}")
    return "\n".join(lines)


def _instruction(instr: Instr, scope: _Scope) -> str:
    opcode = instr.opcode
    if opcode == "constant":
        body = _literal(instr.literal, instr.shape)
    elif opcode == "parameter":
        body = str(instr.parameter_number)
    else:
        body = ", ".join(_ref(scope.names, operand, "operand", instr) for operand in instr.operand_ids)
    attrs = _attributes(instr, scope)
    return f"{shape_text(instr.shape)} {opcode}({body})" + "".join(f", {attr}" for attr in attrs)


def _ref(names: dict[int, str], ident: int, what: str, instr: Instr) -> str:
    try:
        return names[ident]
    except KeyError:
        raise ValueError(f"instruction '{instr.name}' names {what} id {ident}, which is not there") from None


# -- attributes -----------------------------------------------------------------------------------


def _ints(values) -> str:
    return "{" + ",".join(str(v) for v in values) + "}"


def _attributes(instr: Instr, scope: _Scope) -> list[str]:
    opcode = instr.opcode
    attrs: list[str] = []
    if opcode == "iota" and len(instr.dimensions) == 1:
        attrs.append(f"iota_dimension={instr.dimensions[0]}")
    elif instr.dimensions or opcode == "broadcast":
        attrs.append(f"dimensions={_ints(instr.dimensions)}")
    if opcode == "get-tuple-element" or instr.tuple_index:
        attrs.append(f"index={instr.tuple_index}")
    if instr.HasField("dot_dimension_numbers"):
        numbers = instr.dot_dimension_numbers
        for key, values in (
            ("lhs_batch_dims", numbers.lhs_batch_dimensions),
            ("lhs_contracting_dims", numbers.lhs_contracting_dimensions),
            ("rhs_batch_dims", numbers.rhs_batch_dimensions),
            ("rhs_contracting_dims", numbers.rhs_contracting_dimensions),
        ):
            if values:
                attrs.append(f"{key}={_ints(values)}")
    if instr.comparison_direction:
        attrs.append(f"direction={instr.comparison_direction}")
    if instr.comparison_type:
        attrs.append(f"type={instr.comparison_type}")
    if instr.slice_dimensions:
        bounds = ", ".join(
            f"[{d.start}:{d.limit}]" if d.stride == 1 else f"[{d.start}:{d.limit}:{d.stride}]"
            for d in instr.slice_dimensions
        )
        attrs.append(f"slice={{{bounds}}}")
    if instr.padding_config.dimensions:
        parts = []
        for d in instr.padding_config.dimensions:
            part = f"{d.edge_padding_low}_{d.edge_padding_high}"
            parts.append(part + (f"_{d.interior_padding}" if d.interior_padding else ""))
        attrs.append(f"padding={'x'.join(parts)}")
    if instr.HasField("window"):
        attrs.append(f"window={_window(instr.window)}")
    if instr.HasField("convolution_dimension_numbers"):
        attrs.append(f"dim_labels={_dim_labels(instr)}")
    if instr.feature_group_count:
        attrs.append(f"feature_group_count={instr.feature_group_count}")
    if instr.batch_group_count:
        attrs.append(f"batch_group_count={instr.batch_group_count}")
    if instr.HasField("gather_dimension_numbers"):
        g = instr.gather_dimension_numbers
        for key in ("offset_dims", "collapsed_slice_dims", "start_index_map", "operand_batching_dims",
                    "start_indices_batching_dims"):
            if getattr(g, key):
                attrs.append(f"{key}={_ints(getattr(g, key))}")
        attrs.append(f"index_vector_dim={g.index_vector_dim}")
    if instr.gather_slice_sizes:
        attrs.append(f"slice_sizes={_ints(instr.gather_slice_sizes)}")
    if instr.HasField("scatter_dimension_numbers"):
        s = instr.scatter_dimension_numbers
        for key in ("update_window_dims", "inserted_window_dims", "scatter_dims_to_operand_dims",
                    "input_batching_dims", "scatter_indices_batching_dims"):
            if getattr(s, key):
                attrs.append(f"{key}={_ints(getattr(s, key))}")
        attrs.append(f"index_vector_dim={s.index_vector_dim}")
    if instr.dynamic_slice_sizes:
        attrs.append(f"dynamic_slice_sizes={_ints(instr.dynamic_slice_sizes)}")
    if instr.indices_are_sorted:
        attrs.append("indices_are_sorted=true")
    if instr.unique_indices:
        attrs.append("unique_indices=true")
    if instr.is_stable:
        attrs.append("is_stable=true")
    if opcode == "topk" or instr.k:
        attrs.append(f"k={instr.k}")
    if opcode == "topk" or instr.largest:
        attrs.append(f"largest={'true' if instr.largest else 'false'}")
    if instr.exponent_bits or instr.mantissa_bits:
        attrs.append(f"exponent_bits={instr.exponent_bits}")
        attrs.append(f"mantissa_bits={instr.mantissa_bits}")
    if opcode.startswith("batch-norm-"):
        attrs.append(f"epsilon={instr.epsilon!r}")
        attrs.append(f"feature_index={instr.feature_index}")
    if opcode == "rng-bit-generator":
        attrs.append(f"algorithm={_RNG_NAMES.get(instr.rng_algorithm, 'rng_default')}")
    if instr.fusion_kind:
        attrs.append(f"kind={instr.fusion_kind}")
    attrs += _called(instr, scope)
    if instr.custom_call_target:
        attrs.append(f"custom_call_target={_string(_decoded(instr.custom_call_target))}")
    if instr.backend_config:
        attrs.append(f"backend_config={_string(_decoded(instr.backend_config))}")
    if instr.control_predecessor_ids:
        preds = ", ".join(
            _ref(scope.names, i, "control predecessor", instr) for i in instr.control_predecessor_ids
        )
        attrs.append(f"control-predecessors={{{preds}}}")
    if instr.frontend_attributes.map:
        attrs.append(f"frontend_attributes={_frontend_attributes(instr.frontend_attributes)}")
    if instr.HasField("metadata") and instr.metadata.ByteSize():
        attrs.append(f"metadata={_metadata(instr.metadata)}")
    return attrs


def _called(instr: Instr, scope: _Scope) -> list[str]:
    """The called computations under the attribute names XLA prints; the parser stores them in
    the order of those names (hlo_text._CALLED_ATTRS), which is the order they have here."""
    ids = list(instr.called_computation_ids)
    if not ids:
        return []
    names = [_ref(scope.comps, i, "called computation", instr) for i in ids]
    opcode = instr.opcode
    if opcode == "while" and len(names) == 2:
        return [f"condition={names[1]}", f"body={names[0]}"]
    if opcode == "select-and-scatter" and len(names) == 2:
        return [f"select={names[0]}", f"scatter={names[1]}"]
    if opcode == "conditional":
        if len(names) == 2 and len(instr.operand_ids) == 3 and _is_pred_selector(instr, scope):
            return [f"true_computation={names[0]}", f"false_computation={names[1]}"]
        return [f"branch_computations={{{', '.join(names)}}}"]
    if opcode == "fusion":
        return [f"calls={names[0]}"] if len(names) == 1 else [f"calls={{{', '.join(names)}}}"]
    if len(names) == 1:
        return [f"to_apply={names[0]}"]
    return [f"calls={{{', '.join(names)}}}"]


def _is_pred_selector(instr: Instr, scope: _Scope) -> bool:
    """Whether a two-branch conditional's selector is a pred (XLA's true/false form)."""
    shape = scope.shapes.get(instr.operand_ids[0])
    return shape is not None and shape.element_type == T.PRED and not shape.dimensions


def _window(window: hlo_pb2.Window) -> str:
    dims = list(window.dimensions)
    if not dims:
        return "{}"
    parts = [f"size={'x'.join(str(d.size) for d in dims)}"]
    if any(d.stride != 1 for d in dims):
        parts.append(f"stride={'x'.join(str(d.stride) for d in dims)}")
    if any(d.padding_low or d.padding_high for d in dims):
        parts.append(f"pad={'x'.join(f'{d.padding_low}_{d.padding_high}' for d in dims)}")
    if any(d.base_dilation != 1 for d in dims):
        parts.append(f"lhs_dilate={'x'.join(str(d.base_dilation) for d in dims)}")
    if any(d.window_dilation != 1 for d in dims):
        parts.append(f"rhs_dilate={'x'.join(str(d.window_dilation) for d in dims)}")
    if any(d.window_reversal for d in dims):
        parts.append(f"rhs_reversal={'x'.join(str(int(d.window_reversal)) for d in dims)}")
    return "{" + " ".join(parts) + "}"


def _labels(rank: int, named: dict[int, str], spatial) -> str:
    chars = ["?"] * rank
    for position, char in named.items():
        if 0 <= position < rank:
            chars[position] = char
    for k, position in enumerate(spatial):
        if 0 <= position < rank:
            chars[position] = str(k)
    return "".join(chars)


def _dim_labels(instr: Instr) -> str:
    """`b01f_01io->b01f` from the convolution's dimension numbers (ranks from the spatial counts)."""
    n = instr.convolution_dimension_numbers
    rank = 2 + len(n.input_spatial_dimensions)
    lhs = _labels(
        rank, {n.input_batch_dimension: "b", n.input_feature_dimension: "f"}, n.input_spatial_dimensions
    )
    rhs = _labels(
        2 + len(n.kernel_spatial_dimensions),
        {n.kernel_input_feature_dimension: "i", n.kernel_output_feature_dimension: "o"},
        n.kernel_spatial_dimensions,
    )
    out = _labels(
        2 + len(n.output_spatial_dimensions),
        {n.output_batch_dimension: "b", n.output_feature_dimension: "f"},
        n.output_spatial_dimensions,
    )
    return f"{lhs}_{rhs}->{out}"


def _metadata(metadata: hlo_pb2.OpMetadata) -> str:
    parts = []
    for key in ("op_type", "op_name", "source_file"):
        if getattr(metadata, key):
            parts.append(f"{key}={_string(getattr(metadata, key))}")
    if metadata.source_line:
        parts.append(f"source_line={metadata.source_line}")
    return "{" + " ".join(parts) + "}"


def _frontend_attributes(attrs: hlo_pb2.FrontendAttributes) -> str:
    items = sorted(attrs.map.items())
    return "{" + ",".join(f"{_string(key)}={_string(value)}" for key, value in items) + "}"


def _string(text: str) -> str:
    out = []
    for char in text:
        if char in _ESCAPED:
            out.append(_ESCAPED[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\{ord(char):03o}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _decoded(data: bytes) -> str:
    return data.decode("utf-8", errors="backslashreplace")


# -- literals -------------------------------------------------------------------------------------


def _literal(literal: hlo_pb2.LiteralProto, shape: hlo_pb2.ShapeProto) -> str:
    if is_tuple(shape):
        subs = literal.tuple_literals
        return "(" + ", ".join(
            _literal(subs[i] if i < len(subs) else hlo_pb2.LiteralProto(), sub)
            for i, sub in enumerate(shape.tuple_shapes)
        ) + ")"
    values = _values(literal, shape.element_type)
    sizes = list(shape.dimensions)
    if not sizes:
        return values[0] if values else "0"
    count = 1
    for size in sizes:
        count *= size
    if len(values) != count:
        raise ValueError(
            f"constant holds {len(values)} values but its shape {shape_text(shape)} needs {count}"
        )
    return _nested(values, sizes)


def _nested(values: list[str], sizes: list[int]) -> str:
    if len(sizes) == 1:
        return "{" + ", ".join(values) + "}"
    step = len(values) // sizes[0] if sizes[0] else 0
    rows = (_nested(values[i * step : (i + 1) * step], sizes[1:]) for i in range(sizes[0]))
    return "{ " + ", ".join(rows) + " }"


def _values(literal: hlo_pb2.LiteralProto, kind: int) -> list[str]:
    """Every element as the parser's scalar syntax, row-major."""
    if kind == T.PRED:
        return ["true" if v else "false" for v in literal.preds]
    if kind in _INT_FIELDS:
        return [str(int(v)) for v in getattr(literal, _INT_FIELDS[kind])]
    if kind in _BYTE_FIELDS:
        field, storage = _BYTE_FIELDS[kind]
        return [str(int(v)) for v in np.frombuffer(getattr(literal, field), dtype=storage)]
    if kind == T.F32:
        return [_float(float(v), np.float32, T.F32) for v in literal.f32s]
    if kind == T.BF16:
        words = np.frombuffer(literal.bf16s, dtype="<u2").astype(np.uint32) << 16
        return [_float(float(v), np.float32, T.BF16) for v in words.view(np.float32)]
    if kind == T.F16:
        return [_float(float(v), np.float16, T.F16) for v in np.frombuffer(literal.f16s, dtype="<f2")]
    if kind == T.F64:
        return [_float(float(v), np.float64, T.F64) for v in literal.f64s]
    raise ValueError(f"constant of element type {type_name(kind)} cannot be written as text")


def _float(value: float, dtype: type, kind: int) -> str:
    """The shortest text that converts (through a double, as the parser does) to the same value."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    short = str(dtype(value))
    if short.endswith(".0"):
        short = short[:-2]  # XLA's spelling of a whole number: `constant(1)`
    try:
        back = float(short)
    except ValueError:
        return repr(value)
    limit = _FLOAT_MAX.get(kind, math.inf)
    same_sign = math.copysign(1, back) == math.copysign(1, value)
    if abs(back) <= limit and float(dtype(back)) == value and same_sign:
        return short
    return repr(value)


# -- names ----------------------------------------------------------------------------------------


def _name(text: str, fallback: str) -> str:
    text = text.lstrip("%")
    if _NAME.fullmatch(text) and text not in _KEYWORDS:
        return text
    cleaned = re.sub(r"[^A-Za-z0-9_.\-]", "_", text)
    if not cleaned or not (cleaned[0].isalpha() or cleaned[0] == "_") or cleaned in _KEYWORDS:
        cleaned = f"{fallback}_{cleaned}" if cleaned else fallback
    return cleaned


def _unique_names(texts: list[str], fallback: str) -> list[str]:
    names, seen = [], set()
    for text in texts:
        name = _name(text, fallback)
        base, n = name, 1
        while name in seen:
            name = f"{base}.{n}"
            n += 1
        seen.add(name)
        names.append(name)
    return names
