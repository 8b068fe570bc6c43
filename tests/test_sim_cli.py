"""`ncc-sim` end to end: NEFF + golden TensorSets → report, outputs and verdict codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from sim_builders import ACT, DVE, ProgramBuilder, find, update, wait
from test_sim import elementwise_inputs, elementwise_program

from ncc.schemas import bir_pb2, common_pb2, diagnostic_pb2
from ncc.tools.common import dtypes
from ncc.tools.common.protoio import read_proto, write_proto
from ncc.tools.packager.neff import build_neff, write_neff


def tensor_set(arrays: dict[str, np.ndarray]) -> common_pb2.TensorSet:
    result = common_pb2.TensorSet()
    for name, array in arrays.items():
        result.tensors.append(dtypes.numpy_to_tensor(name, array, common_pb2.F32))
    return result


def golden(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    z = np.exp((inputs["arg0"] + inputs["arg1"]) * np.float32(0.5) + np.float32(0.1))
    return {"out0": z, "out1": z.sum(axis=1, keepdims=True)}


def run_sim(
    tmp_path: Path, program: bir_pb2.Program, expect: dict[str, np.ndarray] | None
) -> tuple[subprocess.CompletedProcess, Path]:
    """Run ncc-sim with one TensorSet holding the inputs and the expected outputs (golden by default)."""
    neff_path, inputs_path, diag = tmp_path / "m.neff", tmp_path / "golden.pb", tmp_path / "d.pb"
    write_neff(neff_path, build_neff(program, {}))
    inputs = elementwise_inputs()
    write_proto(inputs_path, tensor_set({**inputs, **(expect if expect is not None else golden(inputs))}))
    args = [
        "--neff",
        str(neff_path),
        "--inputs",
        str(inputs_path),
        "--report",
        str(tmp_path / "report.json"),
        "--output",
        str(tmp_path / "out.pb"),
        "--diagnostics",
        str(diag),
        "--expect",
        str(inputs_path),
    ]
    done = subprocess.run(
        [sys.executable, "-m", "ncc.tools.sim", *args], capture_output=True, text=True, timeout=120
    )
    return done, diag


def diagnostic(path: Path) -> diagnostic_pb2.Diagnostic:
    return read_proto(path, diagnostic_pb2.Diagnostic, "diagnostic")


def test_matching_outputs_pass_and_write_report_and_outputs(tmp_path: Path) -> None:
    done, diag = run_sim(tmp_path, elementwise_program(), None)
    assert done.returncode == 0, done.stderr
    assert not diag.exists()
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["simulated_ns"] > 0 and report["races"] == [] and report["deadlock"] is None
    assert report["instruction_count"] == 8
    assert [c["name"] for c in report["comparison"]] == ["out0", "out1"] and all(
        c["ok"] for c in report["comparison"]
    )
    outputs = read_proto(tmp_path / "out.pb", common_pb2.TensorSet, "outputs")
    assert [t.name for t in outputs.tensors] == ["out0", "out1"]
    assert list(outputs.tensors[0].shape) == [128, 64]


def test_mismatch_is_e610_with_the_max_error(tmp_path: Path) -> None:
    inputs = elementwise_inputs()
    wrong = golden(inputs)
    wrong["out0"] = wrong["out0"].copy()
    wrong["out0"][3, 5] += 0.5
    done, diag = run_sim(tmp_path, elementwise_program(), wrong)
    assert done.returncode == 1
    found = diagnostic(diag)
    assert found.code == "E610" and "out0" in found.message and "0.5" in found.message
    assert "atol=0.0001" in found.message and "(3, 5)" in found.message
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["comparison"][0]["ok"] is False  # the report is written before the verdict


def test_race_is_e611(tmp_path: Path) -> None:
    program = elementwise_program()
    del find(program, "add").waits[1]
    done, diag = run_sim(tmp_path, program, None)
    assert done.returncode == 1
    found = diagnostic(diag)
    assert found.code == "E611" and "1 race" in found.message and "'load_y'" in found.message


def test_deadlock_is_e612(tmp_path: Path) -> None:
    program = elementwise_program()
    b = ProgramBuilder()
    program.instructions.add().CopyFrom(b.add("nop", ACT, name="a", waits=[wait(6, 1)], updates=[update(7)]))
    program.instructions.add().CopyFrom(b.add("nop", DVE, name="d", waits=[wait(7, 1)], updates=[update(6)]))
    done, diag = run_sim(tmp_path, program, None)
    assert done.returncode == 1
    found = diagnostic(diag)
    assert found.code == "E612" and "cycle" in found.message


def test_missing_input_is_e602(tmp_path: Path) -> None:
    neff_path, inputs_path, diag = tmp_path / "m.neff", tmp_path / "in.pb", tmp_path / "d.pb"
    write_neff(neff_path, build_neff(elementwise_program(), {}))
    write_proto(inputs_path, tensor_set({"arg0": elementwise_inputs()["arg0"]}))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ncc.tools.sim",
            "--neff",
            str(neff_path),
            "--inputs",
            str(inputs_path),
            "--diagnostics",
            str(diag),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert diagnostic(diag).code == "E602"


def test_corrupt_neff_is_e502(tmp_path: Path) -> None:
    neff_path, inputs_path, diag = tmp_path / "m.neff", tmp_path / "in.pb", tmp_path / "d.pb"
    neff_path.write_bytes(b"NEFF\x01\x00\x00\x00" + b"\x00" * 40)
    write_proto(inputs_path, common_pb2.TensorSet())
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ncc.tools.sim",
            "--neff",
            str(neff_path),
            "--inputs",
            str(inputs_path),
            "--diagnostics",
            str(diag),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    found = diagnostic(diag)
    assert found.code == "E502" and found.tool == "sim"


def test_wrong_shape_expectation_is_e610(tmp_path: Path) -> None:
    expect = golden(elementwise_inputs())
    expect["out1"] = expect["out1"].reshape(1, 128)
    done, diag = run_sim(tmp_path, elementwise_program(), expect)
    assert done.returncode == 1
    found = diagnostic(diag)
    assert found.code == "E610" and found.message == "output out1: shape [128, 1] but expected [1, 128]"


def test_bf16_only_on_chip_gets_the_bf16_tolerance(tmp_path: Path) -> None:
    """--verify's tolerance fits the narrowest float the program computes in, on chip too: f32
    inputs and outputs whose matmul runs on bf16 casts (mixed precision, as JAX writes it) are
    held to bf16's 2^-7, an all-f32 program to 2e-4."""
    from conftest import run_ncc

    from ncc.tools.packager.neff import read_neff
    from ncc.tools.sim.check import default_rtol

    def rtol_of(body: str) -> float:
        model, neff = tmp_path / "m.hlo", tmp_path / "m.neff"
        model.write_text(f"""HloModule m
ENTRY main {{
  x = f32[128,256] parameter(0)
  w = f32[256,64] parameter(1)
{body}
}}
""")
        compiled = run_ncc("compile", str(model), "--output", str(neff), "--workdir", str(tmp_path / "w"))
        assert compiled.returncode == 0, compiled.stderr
        return default_rtol(read_neff(neff))

    mixed = rtol_of("""  xb = bf16[128,256] convert(x)
  wb = bf16[256,64] convert(w)
  ROOT y = f32[128,64] dot(xb, wb), lhs_contracting_dims={1}, rhs_contracting_dims={0}""")
    plain = rtol_of("  ROOT y = f32[128,64] dot(x, w), lhs_contracting_dims={1}, rhs_contracting_dims={0}")
    assert (mixed, plain) == (2.0**-7, 2e-4)
