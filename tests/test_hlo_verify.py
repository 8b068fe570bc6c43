"""The HLO verifier and reader: every diagnostic code from a small module, and garbage protos caught."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from ncc.schemas import hlo_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.hlo.hlo_reader import load_module, parse_module_proto
from ncc.tools.hlo.hlo_text import parse_hlo_text
from ncc.tools.hlo.hlo_types import T, element_count
from ncc.tools.hlo.hlo_verify import verify_module
from ncc.tools.hlo_opt.golden.evaluator import evaluate, make_inputs

REGION = """
add_r {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}
"""


def entry(body: str) -> hlo_pb2.HloModuleProto:
    return parse_hlo_text(f"HloModule t\n{REGION}\nENTRY e {{\n{body}\n}}\n")


def error_of(module: hlo_pb2.HloModuleProto) -> CompileError:
    with pytest.raises(CompileError) as info:
        verify_module(module)
    return info.value


def instr(module: hlo_pb2.HloModuleProto, name: str) -> hlo_pb2.HloInstructionProto:
    return next(i for c in module.computations for i in c.instructions if i.name == name)


def test_valid_module_passes() -> None:
    verify_module(entry("""
      x = f32[4,6] parameter(0)
      i = s32[4,6] iota(), iota_dimension=1
      c = f32[4,6] convert(i)
      z = f32[] constant(0)
      r = f32[4] reduce(x, z), dimensions={1}, to_apply=add_r
      b = f32[6,4] broadcast(r), dimensions={1}
      t = f32[4,6] transpose(b), dimensions={1,0}
      p = pred[4,6] compare(t, c), direction=LT
      s = f32[4,6] select(p, t, c)
      l = f32[2,6] slice(s), slice={[0:4:2], [0:6]}
      k = f32[6,6] concatenate(l, s), dimensions={0}
      d = f32[6,4] dot(k, x), lhs_contracting_dims={1}, rhs_contracting_dims={1}
      y = f32[24] reshape(d)
      ROOT u = (f32[24], f32[4]) tuple(y, r)
    """))


def test_unsupported_opcode_names_the_instruction() -> None:
    err = error_of(entry("x = f32[4] parameter(0)\nROOT y = f32[4] cholesky(x)"))
    assert err.code == "E201" and err.location == "y"
    assert err.message == "unsupported opcode 'cholesky' in instruction 'y'"


@pytest.mark.parametrize("body", [
    "x = f32[4] parameter(0)\nROOT y = f32[4] add(x)",
    "x = f32[4] parameter(0)\nROOT y = f32[4] negate(x, x)",
    "x = pred[4] parameter(0)\ny = f32[4] parameter(1)\nROOT s = f32[4] select(x, y)",
    "x = f32[4] parameter(0)\nz = f32[] constant(0)\n"
    "ROOT r = f32[] reduce(x, z, z), dimensions={0}, to_apply=add_r",
    "x = f32[] parameter(0)\nROOT c = f32[] call(x), to_apply=add_r",
    "ROOT c = f32[0] concatenate(), dimensions={0}",
    "x = f32[4] parameter(0)\nROOT i = s32[4] iota(x), iota_dimension=0",
])
def test_operand_count(body: str) -> None:
    err = error_of(entry(body))
    assert err.code == "E202", err.message
    assert err.location in body


E203_CASES = [
    "x = f32[4] parameter(0)\ny = f32[5] parameter(1)\nROOT a = f32[4] add(x, y)",
    "x = f32[4] parameter(0)\ny = s32[4] parameter(1)\nROOT a = f32[4] add(x, y)",
    "x = pred[4] parameter(0)\nROOT a = pred[4] add(x, x)",
    "x = s32[4] parameter(0)\nROOT a = s32[4] exponential(x)",
    "x = f32[4] parameter(0)\nROOT a = f32[5] negate(x)",
    "x = f32[4,3] parameter(0)\ny = f32[4,5] parameter(1)\n"
    "ROOT d = f32[3,5] dot(x, y), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
    "x = f32[4,3] parameter(0)\ny = f32[3,5] parameter(1)\n"
    "ROOT d = f32[4,5] dot(x, y), lhs_contracting_dims={2}, rhs_contracting_dims={0}",
    "x = f32[4,3] parameter(0)\ny = f32[3,5] parameter(1)\n"
    "ROOT d = f32[5,4] dot(x, y), lhs_contracting_dims={1}, rhs_contracting_dims={0}",
    "x = f32[2,4,3] parameter(0)\ny = f32[3,3,5] parameter(1)\n"
    "ROOT d = f32[2,4,5] dot(x, y), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, "
    "rhs_contracting_dims={1}",
    "x = f32[4] parameter(0)\nROOT b = f32[4,3] broadcast(x), dimensions={}",
    "x = f32[4] parameter(0)\nROOT b = f32[4,3] broadcast(x), dimensions={2}",
    "x = f32[4] parameter(0)\nROOT b = f32[4,3] broadcast(x), dimensions={1}",
    "x = f32[4,3] parameter(0)\nROOT r = f32[13] reshape(x)",
    "x = f32[4,3] parameter(0)\nROOT t = f32[3,4] transpose(x), dimensions={0,0}",
    "x = f32[4,3] parameter(0)\nROOT t = f32[4,3] transpose(x), dimensions={1,0}",
    "x = f32[4,3] parameter(0)\nz = f32[] constant(0)\n"
    "ROOT r = f32[4] reduce(x, z), dimensions={2}, to_apply=add_r",
    "x = f32[4,3] parameter(0)\nz = f32[] constant(0)\n"
    "ROOT r = f32[3] reduce(x, z), dimensions={1}, to_apply=add_r",
    "x = s32[4,3] parameter(0)\nz = s32[] constant(0)\n"
    "ROOT r = s32[4] reduce(x, z), dimensions={1}, to_apply=add_r",
    "x = f32[4] parameter(0)\nROOT s = f32[2] slice(x), slice={[2:6]}",
    "x = f32[4] parameter(0)\nROOT s = f32[3] slice(x), slice={[0:4:2]}",
    "x = f32[4] parameter(0)\nROOT s = f32[2] slice(x), slice={[0:2], [0:1]}",
    "x = f32[4,2] parameter(0)\ny = f32[4,3] parameter(1)\n"
    "ROOT c = f32[8,2] concatenate(x, y), dimensions={0}",
    "x = f32[4,2] parameter(0)\nROOT c = f32[8,2] concatenate(x, x), dimensions={2}",
    "x = f32[4] parameter(0)\nROOT c = pred[4] compare(x, x), direction=XX",
    "x = f32[4] parameter(0)\nROOT c = f32[4] compare(x, x), direction=LT",
    "x = f32[4] parameter(0)\ny = f32[4] parameter(0)\nROOT a = f32[4] add(x, y)",
    "x = f32[4] parameter(0)\ny = f32[4] parameter(2)\nROOT a = f32[4] add(x, y)",
    "x = f32[4] parameter(0)\ny = f32[4] parameter(1)\nROOT s = f32[4] select(x, y, y)",
    "ROOT i = s32[4] iota(), iota_dimension=1",
    "x = f32[4] parameter(0)\nt = (f32[4], f32[4]) tuple(x, x)\n"
    "ROOT g = f32[4] get-tuple-element(t), index=2",
    "x = f32[4] parameter(0)\nROOT t = (f32[4], f32[5]) tuple(x, x)",
    "x = f32[4] parameter(0)\ny = f32[] parameter(1)\nROOT c = f32[4] call(x, y), to_apply=add_r",
    "x = f32[4] parameter(0)\nROOT g = f32[4] get-tuple-element(x), index=0",
]


@pytest.mark.parametrize("body", E203_CASES)
def test_shape_inconsistency(body: str) -> None:
    err = error_of(entry(body))
    assert err.code == "E203", err.message
    assert err.location in body


def test_proto_edits_caught() -> None:
    def edited(change: Callable[[hlo_pb2.HloModuleProto], None]) -> CompileError:
        module = entry("x = f32[4] parameter(0)\nz = f32[] constant(0)\n"
                       "r = f32[] reduce(x, z), dimensions={0}, to_apply=add_r\nROOT n = f32[] negate(r)")
        change(module)
        return error_of(module)

    cases: list[tuple[str, Callable[[hlo_pb2.HloModuleProto], None]]] = [
        ("E204", lambda m: instr(m, "n").operand_ids.__setitem__(0, 999)),
        ("E204", lambda m: instr(m, "n").operand_ids.__setitem__(0, instr(m, "s").id)),  # other computation
        ("E204", lambda m: instr(m, "r").called_computation_ids.__setitem__(0, 77)),
        ("E204", lambda m: setattr(m, "entry_computation_name", "nope")),
        ("E204", lambda m: setattr(instr(m, "z"), "id", instr(m, "x").id)),
        ("E204", lambda m: setattr(m.computations[1], "root_id", 12345)),
        ("E204", lambda m: setattr(m.computations[0], "id", m.computations[1].id)),
        ("E204", lambda m: instr(m, "s").called_computation_ids.append(m.computations[0].id)),  # recursion
        ("E204", lambda m: instr(m, "r").called_computation_ids.append(m.computations[0].id)),  # two reducers
        ("E204", lambda m: m.computations[1].instructions.reverse()),  # operands after users
        ("E205", lambda m: instr(m, "x").shape.is_dynamic_dimension.__setitem__(0, True)),
        ("E206", lambda m: setattr(instr(m, "x").shape, "element_type", T.F64)),
        ("E206", lambda m: setattr(instr(m, "x").shape, "element_type", 99)),
        ("E203", lambda m: instr(m, "z").literal.f32s.append(1.0)),
        ("E203", lambda m: instr(m, "x").shape.layout.minor_to_major.append(3)),
        ("E203", lambda m: instr(m, "x").shape.dimensions.__setitem__(0, -4)),
        ("E203", lambda m: instr(m, "x").shape.dimensions.extend([1] * 40)),
        ("E203", lambda m: instr(m, "x").shape.dimensions.extend([1 << 20, 1 << 20])),
    ]
    for code, change in cases:
        err = edited(change)
        assert err.code == code, (code, err.message)


@pytest.mark.parametrize(("decl", "name"), [("f64[4]", "x"), ("c64[]", "x"), ("f8e4m3fn[2]", "x")])
def test_unsupported_element_type_names_the_instruction(decl: str, name: str) -> None:
    err = error_of(entry(f"ROOT {name} = {decl} parameter(0)"))
    assert err.code == "E206" and err.location == name and name in err.message


def test_models_verify(models_dir: Path) -> None:
    for path in sorted(models_dir.glob("*.hlo*")):
        verify_module(load_module(str(path)))


def test_reader_errors(tmp_path: Path, models_dir: Path) -> None:
    def code_of(path: Path) -> str:
        with pytest.raises(CompileError) as info:
            load_module(str(path))
        return info.value.code

    assert code_of(tmp_path / "missing.hlo.pb") == "E101"
    assert code_of(tmp_path) == "E101"
    data = (models_dir / "softmax.hlo.pb").read_bytes()
    (tmp_path / "trunc.hlo.pb").write_bytes(data[: len(data) // 2])
    assert code_of(tmp_path / "trunc.hlo.pb") == "E102"
    (tmp_path / "junk.pb").write_bytes(b"\xff\xff\xff\xff garbage")
    assert code_of(tmp_path / "junk.pb") == "E102"
    (tmp_path / "empty.hlo.pb").write_bytes(b"")
    assert code_of(tmp_path / "empty.hlo.pb") == "E102"
    (tmp_path / "text.hlo.pb").write_bytes((models_dir / "softmax.hlo").read_bytes())
    assert code_of(tmp_path / "text.hlo.pb") == "E102"
    # unknown suffixes: proto first, then text
    (tmp_path / "m.bin").write_bytes(data)
    (tmp_path / "m.data").write_bytes((models_dir / "softmax.hlo").read_bytes())
    assert str(load_module(str(tmp_path / "m.bin"))) == str(load_module(str(models_dir / "softmax.hlo.pb")))
    assert load_module(str(tmp_path / "m.data")).entry_computation_name == "main.3"
    (tmp_path / "m.other").write_bytes(b"\x00\x01 not anything")
    assert code_of(tmp_path / "m.other") == "E102"


@pytest.mark.parametrize("model", ["softmax", "attention", "rmsnorm"])
def test_fuzzed_proto_bytes_never_crash(models_dir: Path, model: str) -> None:
    """Mutated .hlo.pb bytes: a module that verifies and evaluates, or a CompileError — nothing else."""
    data = (models_dir / f"{model}.hlo.pb").read_bytes()
    rng = random.Random(f"pb-{model}")
    outcomes: dict[str, int] = {}
    for _ in range(400):
        mutated = bytearray(data)
        for _ in range(rng.randint(1, 6)):
            pos = rng.randrange(len(mutated))
            action = rng.random()
            if action < 0.6:
                mutated[pos] = rng.randrange(256)
            elif action < 0.8:
                del mutated[pos: pos + rng.randint(1, 16)]
            else:
                mutated[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        try:
            module = parse_module_proto(bytes(mutated))
            verify_module(module)
            if sum(element_count(i.shape) for c in module.computations for i in c.instructions) <= 1 << 21:
                evaluate(module, make_inputs(module, 1), verify=False)
            outcome = "ok"
        except CompileError as err:
            outcome = err.code
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert "E102" in outcomes and len(outcomes) > 2, outcomes
