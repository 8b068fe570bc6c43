"""NEFF format and packager: build, round trip, corruption detection, CLI."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sim_builders import DVE, SP, find
from test_sim import elementwise_inputs, elementwise_program

from ncc.schemas import diagnostic_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.common.protoio import read_proto, write_proto
from ncc.tools.packager.neff import (
    FORMAT_VERSION,
    HEADER_BYTES,
    build_neff,
    decode_neff,
    encode_neff,
    read_neff,
    write_neff,
)
from ncc.tools.sim import simulate_neff, simulate_program


def test_build_groups_instructions_by_engine_in_order() -> None:
    program = elementwise_program()
    neff = build_neff(program, {"compiler": "ncc 0.1", "flags": "-O2"})
    assert neff.magic == "NEFF" and neff.format_version == FORMAT_VERSION
    assert neff.name == "elementwise" and neff.target == "trn1" and neff.num_semaphores == 8
    assert dict(neff.metadata) == {"compiler": "ncc 0.1", "flags": "-O2"}
    by_engine = {stream.engine: [i.name for i in stream.instructions] for stream in neff.streams}
    assert by_engine[SP] == ["load_x", "store_z", "store_r", "reset"]  # in program order
    assert by_engine[DVE] == ["add", "rowsum"]
    assert [s.engine for s in neff.streams] == sorted(by_engine)
    assert len(neff.hbm) == 4 and len(neff.buffers) == 5


def test_round_trip_and_simulation_of_a_neff(tmp_path: Path) -> None:
    program = elementwise_program()
    neff = build_neff(program, {"k": "v"})
    path = tmp_path / "model.neff"
    write_neff(path, neff)
    data = path.read_bytes()
    assert data[:4] == b"NEFF"
    assert int.from_bytes(data[4:8], "little") == FORMAT_VERSION
    assert data[8:40] == hashlib.sha256(data[HEADER_BYTES:]).digest()
    back = read_neff(path)
    assert back == neff
    assert [p.name for p in tmp_path.iterdir()] == ["model.neff"]  # no temporary left behind
    inputs = elementwise_inputs()
    from_neff = simulate_neff(back, inputs)
    from_program = simulate_program(program, inputs)
    np.testing.assert_array_equal(from_neff.outputs["out0"], from_program.outputs["out0"])
    assert from_neff.simulated_ns == from_program.simulated_ns


@pytest.mark.parametrize("position", [0, 5, 20, HEADER_BYTES + 3, -1])
def test_a_flipped_byte_is_e502(tmp_path: Path, position: int) -> None:
    data = bytearray(encode_neff(build_neff(elementwise_program(), {})))
    data[position] ^= 0x40
    path = tmp_path / "bad.neff"
    path.write_bytes(bytes(data))
    with pytest.raises(CompileError) as err:
        read_neff(path)
    assert err.value.code == "E502" and str(path) in err.value.message


@pytest.mark.parametrize("keep", [0, 10, HEADER_BYTES, 100])
def test_a_truncated_neff_is_e502(tmp_path: Path, keep: int) -> None:
    data = encode_neff(build_neff(elementwise_program(), {}))
    path = tmp_path / "short.neff"
    path.write_bytes(data[:keep])
    with pytest.raises(CompileError) as err:
        read_neff(path)
    assert err.value.code == "E502" and "short.neff" in err.value.message


def test_unparsable_payload_with_a_valid_checksum_is_e502() -> None:
    payload = b"\xff\xff\xff\xff"
    data = b"NEFF" + FORMAT_VERSION.to_bytes(4, "little") + hashlib.sha256(payload).digest() + payload
    with pytest.raises(CompileError) as err:
        decode_neff(data, "x.neff")
    assert err.value.code == "E502" and "x.neff" in err.value.message


def test_missing_neff_is_e501(tmp_path: Path) -> None:
    with pytest.raises(CompileError) as err:
        read_neff(tmp_path / "absent.neff")
    assert err.value.code == "E501" and "absent.neff" in err.value.message
    with pytest.raises(CompileError) as err:
        read_neff(tmp_path)
    assert err.value.code == "E501"


def test_unallocated_buffer_is_e503() -> None:
    program = elementwise_program()
    program.buffers[2].address = -1
    with pytest.raises(CompileError) as err:
        build_neff(program, {})
    assert err.value.code == "E503" and "'ssum'" in err.value.message


def test_unknown_operand_is_e503() -> None:
    program = elementwise_program()
    find(program, "rowsum").inputs[0].tensor = "ghost"
    with pytest.raises(CompileError) as err:
        build_neff(program, {})
    assert err.value.code == "E503" and "'rowsum'" in err.value.message and "'ghost'" in err.value.message
    program = elementwise_program()
    find(program, "store_z").outputs[0].tensor = "phantom"
    with pytest.raises(CompileError) as err:
        build_neff(program, {})
    assert err.value.code == "E503" and "'phantom'" in err.value.message


def run_packager(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ncc.tools.packager", *args], capture_output=True, text=True, timeout=120
    )


def test_packager_cli(tmp_path: Path) -> None:
    program_path, neff_path, diag = tmp_path / "program.pb", tmp_path / "model.neff", tmp_path / "d.pb"
    write_proto(program_path, elementwise_program())
    done = run_packager(
        "--input",
        str(program_path),
        "--output",
        str(neff_path),
        "--metadata",
        "a=1",
        "b=x=y",
        "--metadata",
        "c=",
        "--diagnostics",
        str(diag),
    )
    assert done.returncode == 0, done.stderr
    neff = read_neff(neff_path)
    assert dict(neff.metadata) == {"a": "1", "b": "x=y", "c": ""}
    assert not diag.exists()


def test_packager_cli_reports_e503(tmp_path: Path) -> None:
    program = elementwise_program()
    program.buffers[0].address = -1
    program_path, neff_path, diag = tmp_path / "program.pb", tmp_path / "model.neff", tmp_path / "d.pb"
    write_proto(program_path, program)
    done = run_packager("--input", str(program_path), "--output", str(neff_path), "--diagnostics", str(diag))
    assert done.returncode == 1
    diagnostic = read_proto(diag, diagnostic_pb2.Diagnostic, "diagnostic")
    assert diagnostic.code == "E503" and diagnostic.tool == "packager"
    assert not neff_path.exists()


def test_packager_cli_rejects_bad_metadata(tmp_path: Path) -> None:
    done = run_packager("--input", "p.pb", "--output", "m.neff", "--metadata", "novalue")
    assert done.returncode == 2 and "KEY=VALUE" in done.stderr
