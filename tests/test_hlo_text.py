"""The HLO text parser: real JAX text parses to what XLA serialized, syntax it must take, errors it must give.

Also a seeded fuzz: thousands of mutated texts must end in a module or a CompileError, never a
traceback or a hang.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from ncc.schemas import hlo_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.hlo.hlo_reader import load_module
from ncc.tools.hlo.hlo_text import parse_hlo_text
from ncc.tools.hlo.hlo_types import T, element_count
from ncc.tools.hlo.hlo_verify import verify_module
from ncc.tools.hlo_opt.golden.evaluator import evaluate, make_inputs

MODELS = ["add_mul", "gelu", "matmul", "mlp", "rmsnorm", "softmax", "layernorm", "attention", "matmul_bf16",
          "block"]


def by_name(comp: hlo_pb2.HloComputationProto) -> dict[str, hlo_pb2.HloInstructionProto]:
    return {instr.name: instr for instr in comp.instructions}


def instruction_summary(instr: hlo_pb2.HloInstructionProto, names: dict[int, str],
                        comps: dict[int, str]) -> dict:
    """Everything about an instruction that must survive text ↔ proto, ids replaced by names."""
    literal = hlo_pb2.LiteralProto()
    literal.CopyFrom(instr.literal)
    literal.ClearField("shape")
    return {
        "opcode": instr.opcode,
        "shape": str(instr.shape),
        "operands": [names[i] for i in instr.operand_ids],
        "called": [comps[i] for i in instr.called_computation_ids],
        "dimensions": list(instr.dimensions),
        "dot": str(instr.dot_dimension_numbers),
        "direction": instr.comparison_direction,
        "slice": str(list(instr.slice_dimensions)),
        "parameter_number": instr.parameter_number,
        "tuple_index": instr.tuple_index,
        "literal": str(literal),
    }


def module_summary(module: hlo_pb2.HloModuleProto) -> list:
    names = {i.id: i.name for c in module.computations for i in c.instructions}
    comps = {c.id: c.name for c in module.computations}
    return [
        (comp.name, names[comp.root_id], str(comp.program_shape),
         [(i.name, instruction_summary(i, names, comps)) for i in comp.instructions])
        for comp in module.computations
    ]


@pytest.mark.parametrize("model", MODELS)
def test_text_matches_serialized_proto(models_dir: Path, model: str) -> None:
    text = parse_hlo_text((models_dir / f"{model}.hlo").read_text())
    proto = load_module(str(models_dir / f"{model}.hlo.pb"))
    assert text.entry_computation_name == proto.entry_computation_name
    assert text.computations[-1].name == proto.entry_computation_name
    assert str(text.host_program_shape) == str(proto.host_program_shape)
    assert module_summary(text) == module_summary(proto)
    ids = [i.id for c in text.computations for i in c.instructions]
    assert len(ids) == len(set(ids))
    assert text.entry_computation_id == text.computations[-1].id
    verify_module(text)


def test_syntax_variants() -> None:
    text = """
    HloModule m, entry_computation_layout={(f32[4,6]{1,0}, /*index=1*/s32[])->f32[2,3]{1,0}},
      is_scheduled=true

    // callers may come before callees: the parser orders callees first
    ENTRY %main.9 (p0: f32[4,6], p1: s32[]) -> f32[2,3] {
      %p0 = f32[4,6]{1,0:T(8,128)} parameter(0), sharding={replicated}
      %p1 = s32[] parameter(1)
      %s = f32[2,3]{1,0} slice(f32[4,6]{1,0} %p0), slice={[0:4:2], [1:4]},
        metadata={op_type="slice" op_name="jit(f)/slice" source_file="f.py" source_line=7}
      %c = f32[2,3] call(%s), to_apply=%double, frontend_attributes={_pipeline="2",b="x"}
      %k = pred[2]{0} constant({true, false})
      %t = (f32[2,3]{1,0}, pred[2]{0}) tuple(%c, %k), backend_config="{\\"a\\": 1}"
      ROOT %g = f32[2,3]{1,0} get-tuple-element((f32[2,3], pred[2]) %t), index=0
      %i = s32[3,2] iota(), iota_dimension=1
      %q = f32[] constant(-inf)
    }

    %double (x: f32[2,3]) -> f32[2,3] {
      x = f32[2,3] parameter(0)
      two = f32[] constant(2)
      b = f32[2,3] broadcast(two), dimensions={}
      m = f32[2,3] multiply(x, b)
    }
    """
    module = parse_hlo_text(text)
    assert [c.name for c in module.computations] == ["double", "main.9"]
    assert module.name == "m" and module.entry_computation_name == "main.9"
    double, main = module.computations
    assert by_name(double)["m"].id == double.root_id  # no ROOT: the last instruction
    instrs = by_name(main)
    assert instrs["g"].id == main.root_id
    assert list(instrs["p0"].shape.layout.minor_to_major) == [1, 0]
    assert [(d.start, d.limit, d.stride) for d in instrs["s"].slice_dimensions] == [(0, 4, 2), (1, 4, 1)]
    assert instrs["s"].metadata.source_line == 7 and instrs["s"].metadata.op_type == "slice"
    assert list(instrs["c"].called_computation_ids) == [double.id]
    assert dict(instrs["c"].frontend_attributes.map) == {"_pipeline": "2", "b": "x"}
    assert list(instrs["k"].literal.preds) == [True, False]
    assert instrs["t"].shape.element_type == T.TUPLE and len(instrs["t"].shape.tuple_shapes) == 2
    assert instrs["t"].backend_config == b'{"a": 1}'
    assert instrs["g"].tuple_index == 0
    assert list(instrs["i"].dimensions) == [1]
    assert list(instrs["q"].literal.f32s) == [float("-inf")]
    assert list(instrs["i"].shape.layout.minor_to_major) == [1, 0]  # default layout
    assert list(main.program_shape.parameter_names) == ["p0", "p1"]
    verify_module(module)


def test_a_shape_written_again_reads_as_written_each_time() -> None:
    """The parser keeps the shapes it has read by their text: the same characters with a layout
    after them, a tiled layout, or a space inside are other shapes, and an error is an error again."""
    text = """
    ENTRY e {
      a = f32[2,3]{0,1} parameter(0)
      b = f32[2,3] parameter(1)
      c = f32[2,3]{0,1} add(a, a)
      d = f32[2,3]{1,0:T(8,128)} add(b, b)
      e = f32[2, 3] add(b, b)
      ROOT f = (f32[2,3], f32[2,3]{0,1}) tuple(b, c)
    }
    """
    instrs = by_name(parse_hlo_text(text).computations[0])
    layouts = {name: list(instrs[name].shape.layout.minor_to_major) for name in "abcde"}
    assert layouts == {"a": [0, 1], "b": [1, 0], "c": [0, 1], "d": [1, 0], "e": [1, 0]}
    assert [list(s.layout.minor_to_major) for s in instrs["f"].shape.tuple_shapes] == [[1, 0], [0, 1]]
    for bad in ("f32[2,3]{0,2}", "f32[2,,3]"):
        twice = f"ENTRY e {{\n  a = {bad} parameter(0)\n  ROOT b = {bad} negate(a)\n}}\n"
        with pytest.raises(CompileError):
            verify_module(parse_hlo_text(twice))


def test_what_jax_prints_parses() -> None:
    """finfo(f32).min as JAX prints it (-3.40282347e+38, past the largest f32 before rounding) and
    bf16's; the stack-frame sections of `.compile().as_text()`; `}, execution_thread=` after a body."""
    text = """HloModule m, is_scheduled=true

FileNames
1 "/tmp/f.py"

FunctionNames
1 "<lambda>"

FileLocations
1 {file_name_id=1 function_name_id=1 line=6 end_line=6 column=20 end_column=37}

StackFrames
1 {file_location_id=1 parent_frame_id=1}

add_c {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}, execution_thread="host"

ENTRY main {
  x = f32[4] parameter(0), metadata={op_name="x" stack_frame_id=1}
  lo = f32[] constant(-3.40282347e+38)
  hi = bf16[] constant(3.38953139e+38)
  z = f32[] constant(0)
  ROOT r = f32[] reduce(x, z), dimensions={0}, to_apply=add_c
}
"""
    module = parse_hlo_text(text)
    add_c, main = module.computations
    assert add_c.execution_thread == "host" and main.name == "main"
    instrs = by_name(main)
    assert list(instrs["lo"].literal.f32s) == [float(np.finfo(np.float32).min)]
    assert np.frombuffer(instrs["hi"].literal.bf16s, "<u2")[0] == 0x7F7F  # bf16's largest finite
    for past in ("f32[] constant(3.5e+38)", "bf16[] constant(3.4e+38)", "f16[] constant(65520)"):
        with pytest.raises(CompileError, match="out of range"):
            parse_hlo_text(f"ENTRY e {{\n  ROOT c = {past}\n}}\n")


def test_no_entry_no_root_and_literals() -> None:
    module = parse_hlo_text("""
    first {
      a = s32[2,2] constant({ {1, -2}, {3, 2147483647} })
      b = bf16[3] constant({0.5, -inf, 1.00390625})
      c = f16[] constant(nan)
      d = u8[2] constant({0, 255})
      e = s8[2] constant({-128, 127})
      f = f32[2] constant({1e-06, 3.5})
      g = (s32[], pred[]) constant((7, true))
      h = pred[] constant(false)
    }
    second {
      ROOT x = f32[] constant(1)
      y = f32[] constant(2)
    }
    """)
    first, second = module.computations
    assert module.entry_computation_name == "second"
    assert second.root_id == by_name(second)["x"].id
    assert first.root_id == by_name(first)["h"].id
    lit = {name: instr.literal for name, instr in by_name(first).items()}
    assert list(lit["a"].s32s) == [1, -2, 3, 2147483647]
    # 1.00390625 is halfway between two bf16 values: it rounds to the even one
    assert np.frombuffer(lit["b"].bf16s, "<u2").tolist() == [0x3F00, 0xFF80, 0x3F80]
    assert np.isnan(np.frombuffer(lit["c"].f16s, "<f2")[0])
    assert lit["d"].u8s == b"\x00\xff" and lit["e"].s8s == b"\x80\x7f"
    assert list(lit["f"].f32s) == [np.float32(1e-06), 3.5]
    assert list(lit["g"].tuple_literals[0].s32s) == [7] and list(lit["g"].tuple_literals[1].preds) == [True]


def test_dot_compare_padding_attributes() -> None:
    module = parse_hlo_text("""
    HloModule m
    ENTRY e {
      a = f32[4,2,3] parameter(0)
      b = f32[3,4,5] parameter(1)
      d = f32[4,2,5] dot(a, b), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={1},
        rhs_contracting_dims={0}, operand_precision={default,default}
      z = f32[] constant(0)
      c = pred[4,2,5] compare(d, d), direction=GE, type=TOTALORDER
      p = f32[6,3,5] pad(d, z), padding=1_1x0_1_0x0_0
      ROOT r = f32[4,2,5] select(c, d, d), control-predecessors={p}
    }
    """)
    instrs = by_name(module.computations[0])
    dn = instrs["d"].dot_dimension_numbers
    assert (list(dn.lhs_batch_dimensions), list(dn.lhs_contracting_dimensions)) == ([0], [2])
    assert (list(dn.rhs_batch_dimensions), list(dn.rhs_contracting_dimensions)) == ([1], [0])
    assert instrs["c"].comparison_direction == "GE" and instrs["c"].comparison_type == "TOTALORDER"
    pads = [(d.edge_padding_low, d.edge_padding_high, d.interior_padding)
            for d in instrs["p"].padding_config.dimensions]
    assert pads == [(1, 1, 0), (0, 1, 0), (0, 0, 0)]
    assert list(instrs["r"].control_predecessor_ids) == [instrs["p"].id]


def test_rng_bit_generator_algorithm() -> None:
    """`algorithm=` sets rng_algorithm (XLA's field 70) on rng-bit-generator; dot's algorithm= is skipped."""
    module = parse_hlo_text("""
    HloModule m
    ENTRY e {
      s = u64[2] parameter(0)
      d = (u64[2], u32[3]) rng-bit-generator(s), algorithm=rng_default
      t = (u64[2], u32[3]) rng-bit-generator(s), algorithm=rng_three_fry
      p = (u64[2], u64[3]) rng-bit-generator(s), algorithm=rng_philox
      x = f32[2,2] parameter(1)
      ROOT m = f32[2,2] dot(x, x), lhs_contracting_dims={1}, rhs_contracting_dims={0},
        algorithm=dot_any_f32_f32_f32
    }
    """)
    instrs = by_name(module.computations[0])
    assert [instrs[n].rng_algorithm for n in "dtp"] == [hlo_pb2.RNG_DEFAULT, hlo_pb2.RNG_THREE_FRY,
                                                        hlo_pb2.RNG_PHILOX]
    assert hlo_pb2.HloInstructionProto.DESCRIPTOR.fields_by_name["rng_algorithm"].number == 70
    verify_module(module)
    with pytest.raises(CompileError) as info:
        parse_hlo_text("ENTRY e {\n  s = u64[2] parameter(0)\n"
                       "  r = (u64[2], u32[3]) rng-bit-generator(s), algorithm=rng_mersenne\n}")
    assert info.value.code == "E103" and "rng_mersenne" in info.value.message


E103_CASES = [
    ("ENTRY e {\n  a = f32[2] parameter(0)\n", 3),                       # no closing brace
    ("ENTRY e {\n  a = f32[2 parameter(0)\n}", 2),                         # unclosed dims
    ("ENTRY e {\n  a = f33[2] parameter(0)\n}", 2),                        # unknown type
    ("ENTRY e {\n  a = f32[2] parameter(x)\n}", 2),
    ("ENTRY e {\n  a f32[2] parameter(0)\n}", 2),                          # missing '='
    ("ENTRY e {\n  a = f32[2] constant({1, 2, 3})\n}", 2),                 # count mismatch
    ("ENTRY e {\n  a = f32[2,2] constant({1, 2, 3, 4})\n}", 2),            # missing nesting
    ("ENTRY e {\n  a = s32[] constant(1.5)\n}", 2),
    ("ENTRY e {\n  a = s8[] constant(300)\n}", 2),
    ("ENTRY e {\n  a = f32[] constant(1e39)\n}", 2),
    ("ENTRY e {\n  a = f32[2] constant({...})\n}", 2),                     # elided constant
    ("ENTRY e {\n  a = f32[] parameter(0)\n  a = f32[] parameter(1)\n}", 3),  # duplicate name
    ("ENTRY e {\n  a = f32[] parameter(0), dimensions={0}, dimensions={1}\n}", 2),
    ("ENTRY e {\n  a = f32[] parameter(0) /* unterminated\n}", 2),
    ('ENTRY e {\n  a = f32[] parameter(0), backend_config="open\n}', 2),
    ("ENTRY e {\n  a = f32[] parameter(0) @\n}", 2),
    ("ENTRY e {\n}", 1),
    ("", 1),
    ("ENTRY a {\n  x = f32[] parameter(0)\n}\nENTRY b {\n  y = f32[] parameter(0)\n}", 4),
    ("ENTRY e {\n  a = f32[99999999999999999999999] parameter(0)\n}", 2),
    ("ENTRY e {\n  a = f32[] parameter(0), slice={[0:1:}\n}", 2),
    ("ENTRY e {\n  a = f32[] parameter(0), padding=1_2_3_4\n}", 2),
    ("ENTRY e {\n  a = f32[] parameter(0), sharding={replicated]\n}", 2),
    ("ENTRY e {\n  " + "(" * 100 + "\n}", 2),
    ("f {\n  p = f32[] parameter(0)\n}\nENTRY e {\n  x = f32[] parameter(0)\n"
     "  y = f32[] fusion(x), kind=kWeird, calls=f\n}", 6),                  # not one of XLA's kinds
]


@pytest.mark.parametrize(("text", "line"), E103_CASES)
def test_syntax_errors(text: str, line: int) -> None:
    with pytest.raises(CompileError) as info:
        parse_hlo_text(text)
    assert info.value.code == "E103", info.value.message
    assert "internal" not in info.value.message
    assert info.value.location == f"line {line}", info.value.message
    assert f"at line {line} col " in info.value.message


@pytest.mark.parametrize(("text", "code"), [
    ("ENTRY e {\n  a = f32[<=10] parameter(0)\n}", "E205"),
    ("ENTRY e {\n  a = f32[?] parameter(0)\n}", "E205"),
    ("ENTRY e {\n  a = s4[2] parameter(0)\n}", "E206"),
    ("ENTRY e {\n  a = c64[] constant((1, 2))\n}", "E206"),
    ("ENTRY e {\n  a = f32[] add(b, b)\n}", "E204"),
    ("ENTRY e {\n  a = f32[] parameter(0)\n  b = f32[] call(a), to_apply=nowhere\n}", "E204"),
    ("c {\n  a = f32[] parameter(0)\n  b = f32[] call(a), to_apply=c\n}\n"
     "ENTRY e {\n  x = f32[] parameter(0)\n}", "E204"),
    ("ENTRY e {\n  a = f32[] parameter(0), control-predecessors={zz}\n}", "E204"),
    ("ENTRY e () -> f32[2] {\n  a = f32[] constant(1)\n}", "E203"),  # the result is not the root's
])
def test_semantic_errors_found_while_parsing(text: str, code: str) -> None:
    with pytest.raises(CompileError) as info:
        parse_hlo_text(text)
    assert info.value.code == code, info.value.message


def test_errors_from_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.hlo"
    bad.write_bytes(b"ENTRY e {\n  a = f32[] parameter(0)\xff\n}")
    with pytest.raises(CompileError) as info:
        load_module(str(bad))
    assert info.value.code == "E103" and info.value.location == "line 2"


_FRAGMENTS = ["{", "}", "(", ")", "[", "]", ",", "=", ":", "%", "-", "0", "9", "1e5", "f32", "pred", "s32[]",
              "<=", "/*", "*/", "\"", "ROOT ", "ENTRY ", "\n", " ", ".", "...", "->", "inf", "nan", "?", "\\",
              "{...}", "dimensions={", "to_apply=", "ä", "\x00", "x" * 70, "9" * 5000]


def mutate(text: str, rng: random.Random) -> str:
    for _ in range(rng.randint(1, 4)):
        pos = rng.randrange(len(text) + 1)
        choice = rng.random()
        if choice < 0.35:
            text = text[:pos] + text[pos + rng.randint(1, 8):]
        elif choice < 0.7:
            text = text[:pos] + rng.choice(_FRAGMENTS) + text[pos:]
        elif choice < 0.8:
            text = text[:pos]
        elif choice < 0.9:
            lines = text.split("\n")
            i = rng.randrange(len(lines))
            lines.insert(rng.randrange(len(lines) + 1), lines[i])
            text = "\n".join(lines)
        else:
            other = rng.randrange(len(text) + 1)
            a, b = sorted((pos, other))
            text = text[:a] + text[b:] + text[a:b]
    return text


@pytest.mark.parametrize("model", ["add_mul", "softmax", "attention", "matmul_bf16"])
def test_fuzzed_text_never_crashes(models_dir: Path, model: str) -> None:
    """Mutated texts parse, verify and (when small) evaluate, or fail with a CompileError — nothing else."""
    source = (models_dir / f"{model}.hlo").read_text()
    rng = random.Random(f"fuzz-{model}")
    outcomes: dict[str, int] = {}
    for _ in range(400):
        text = mutate(source, rng)
        try:
            module = parse_hlo_text(text)
            verify_module(module)
            sizes = [element_count(i.shape) for c in module.computations for i in c.instructions]
            if sum(sizes) <= 1 << 21:
                evaluate(module, make_inputs(module, 0), verify=False)
            outcome = "ok"
        except CompileError as err:
            assert "internal" not in err.message, err.message
            outcome = err.code
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert "E103" in outcomes and len(outcomes) > 2, outcomes
