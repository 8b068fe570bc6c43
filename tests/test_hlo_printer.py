"""The HLO text printer: parse(print(m)) is m for every bundled and shared model, from its text and
from its serialized proto, and for the attributes and literals the models do not happen to use."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from orchestrator_support import model_dirs

from ncc.schemas import hlo_pb2
from ncc.tools.hlo.hlo_printer import print_module
from ncc.tools.hlo.hlo_reader import load_module
from ncc.tools.hlo.hlo_text import parse_hlo_text
from ncc.tools.hlo.hlo_verify import verify_module


def _model_files() -> list[Path]:
    seen: dict[str, Path] = {}
    for folder in model_dirs():
        for path in sorted(folder.glob("*.hlo")) + sorted(folder.glob("*.hlo.pb")):
            seen.setdefault(f"{folder.name}/{path.name}", path)
    return list(seen.values())


def _strip_empty(message) -> None:
    """Clear sub-messages that hold nothing: a present-but-empty layout is an absent one."""
    for field, value in list(message.ListFields()):
        if field.message_type is None or field.message_type.GetOptions().map_entry:
            continue
        if field.is_repeated:
            for item in value:
                _strip_empty(item)
        else:
            _strip_empty(value)
            if value.ByteSize() == 0:
                message.ClearField(field.name)


def canonical(module: hlo_pb2.HloModuleProto) -> str:
    """The module with ids renumbered by position, fields outside the subset schema and the
    module's own id dropped: what text can carry."""
    copy = hlo_pb2.HloModuleProto()
    copy.CopyFrom(module)
    copy.DiscardUnknownFields()
    copy.ClearField("id")
    ids = {i.id: (c + 1) * 100000 + n for c, comp in enumerate(copy.computations)
           for n, i in enumerate(comp.instructions)}
    comps = {comp.id: c + 1 for c, comp in enumerate(copy.computations)}
    for comp in copy.computations:
        comp.id, comp.root_id = comps[comp.id], ids[comp.root_id]
        for instr in comp.instructions:
            instr.id = ids[instr.id]
            for field, table in (("operand_ids", ids), ("control_predecessor_ids", ids),
                                 ("called_computation_ids", comps)):
                values = [table[v] for v in getattr(instr, field)]
                del getattr(instr, field)[:]
                getattr(instr, field).extend(values)
    copy.entry_computation_id = comps[copy.entry_computation_id]
    _strip_empty(copy)
    return text_format.MessageToString(copy)


MODEL_FILES = _model_files()


def test_models_are_found() -> None:
    names = {path.name for path in MODEL_FILES}
    assert {"block.hlo", "block.hlo.pb", "softmax.hlo", "gelu.hlo.pb"} <= names


@pytest.mark.parametrize("path", MODEL_FILES, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_parse_of_print_is_the_module(path: Path) -> None:
    module = load_module(str(path))
    text = print_module(module)
    again = parse_hlo_text(text)
    assert canonical(again) == canonical(module)
    assert print_module(again) == text  # printing is a fixed point
    verify_module(again)
    if path.suffix == ".hlo":  # from text, even the ids come back as they were
        assert again == module


def test_literals_of_every_type_round_trip() -> None:
    text = """HloModule literals

ENTRY main {
  a = pred[3] constant({true, false, true})
  b = s8[2] constant({-128, 127})
  c = u8[2] constant({0, 255})
  d = s16[2] constant({-32768, 32767})
  e = u16[2] constant({0, 65535})
  f = s32[2,2] constant({ {-2147483648, 2147483647}, {0, -1} })
  g = u32[1] constant({4294967295})
  h = s64[1] constant({-9223372036854775808})
  i = u64[2] constant({18446744073709551615, 9007199254740993})
  j = f32[6] constant({-inf, inf, 3.4028234663852886e38, 1e-45, -0, 0.1})
  k = bf16[3] constant({3.3895313892515355e38, 0.1, -2.5})
  l = f16[3] constant({65504, 6e-08, 0.1})
  m = f32[0] constant({})
  n = f32[2,0] constant({ {}, {} })
  o = f32[] constant(nan)
  ROOT t = tuple(a, b, c, d, e, f, g, h, i, j, k, l, m, n, o)
}
"""
    module = parse_hlo_text(text)
    again = parse_hlo_text(print_module(module))
    pairs = zip(module.computations[0].instructions, again.computations[0].instructions, strict=True)
    for before, after in pairs:
        if before.name == "o":
            assert math.isnan(after.literal.f32s[0])
            continue
        assert before.literal.SerializeToString() == after.literal.SerializeToString(), before.name
    floats = np.array(again.computations[0].instructions[9].literal.f32s, dtype=np.float32)
    assert np.signbit(floats[4]) and floats[5] == np.float32(0.1)


def test_attributes_the_models_do_not_use_round_trip() -> None:
    text = """HloModule attrs, frontend_attributes={ncc_note="a \\"quoted\\" value\\n"}

cond {
  p = pred[] parameter(0)
  ROOT n = pred[] not(p)
}

on_true {
  x = f32[4] parameter(0)
  ROOT y = f32[4] negate(x)
}

on_false {
  x = f32[4] parameter(0)
  ROOT y = f32[4] abs(x)
}

ENTRY main, execution_thread="main" {
  x = f32[4,8] parameter(0)
  s = f32[2,3] slice(x), slice={[0:4:2], [1:7:2]}
  p = f32[6,9] pad(x, f32[] constant(0)), padding=1_1x0_1_0
  r = f32[4,8] reverse(x), dimensions={1}
  i = s32[4,8] iota(), iota_dimension=1
  c = pred[4,8] compare(x, x), direction=LT, type=TOTALORDER
  q = pred[] constant(true)
  v = f32[4] parameter(1), metadata={op_type="arg" op_name="v\\\\w" source_file="m.py" source_line=7}
  k = f32[4] conditional(q, v, v), true_computation=on_true, false_computation=on_false
  b = s32[] parameter(2)
  k2 = f32[4] conditional(b, v, v, v), branch_computations={on_true, on_false, on_true}
  d = f32[4,4] dynamic-slice(x, b, b), dynamic_slice_sizes={4,4}
  w = f32[4,8] copy(x), control-predecessors={d}, frontend_attributes={ncc_num_stages="3"}
  rp = f32[4,8] reduce-precision(x), exponent_bits=5, mantissa_bits=10
  ROOT t = tuple(s, p, r, i, c, k, k2, d, w, rp)
}
"""
    module = parse_hlo_text(text)
    printed = print_module(module)
    assert canonical(parse_hlo_text(printed)) == canonical(module)
    assert "true_computation=on_true, false_computation=on_false" in printed
    assert "branch_computations={on_true, on_false, on_true}" in printed
    assert 'execution_thread="main"' in printed and "control-predecessors={d}" in printed


def test_unprintable_names_are_rewritten_into_ones_the_parser_reads() -> None:
    module = parse_hlo_text("ENTRY main {\n  a = f32[2] parameter(0)\n  ROOT b = f32[2] negate(a)\n}\n")
    comp = module.computations[0]
    comp.instructions[0].name = "has space"
    comp.instructions[1].name = "has space"
    comp.name = "ROOT"
    again = parse_hlo_text(print_module(module))
    names = [i.name for i in again.computations[0].instructions]
    assert len(set(names)) == 2 and all(" " not in name for name in names)
    verify_module(again)
