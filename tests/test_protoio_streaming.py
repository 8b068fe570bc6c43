"""write_proto streams a large message (chunks of a repeated field, a large element field by field)
and must write exactly the bytes SerializeToString(deterministic=True) gives; forced here on small
messages by lowering its thresholds."""

from __future__ import annotations

from pathlib import Path

import pytest
from walrus_builders import chain_program, run_passes

from ncc.schemas import bir_pb2
from ncc.tools.common import protoio
from ncc.tools.walrus_driver.pass_manager import default_pipeline


@pytest.fixture
def tiny_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(protoio, "STREAM_ABOVE_BYTES", 0)
    monkeypatch.setattr(protoio, "_CHUNK_BYTES", 200)


def test_streamed_program_is_byte_identical(tmp_path: Path, tiny_thresholds: None) -> None:
    program = chain_program(tiles=6)
    run_passes(program, ",".join(default_pipeline(2)), verify_each=False)  # streams, maps, waits
    assert program.streams and program.attributes
    path = tmp_path / "program.pb"
    protoio.write_proto(path, program)
    assert path.read_bytes() == program.SerializeToString(deterministic=True)
    assert protoio.read_proto(path, bir_pb2.Program, "program") == program


def test_unknown_fields_are_kept(tmp_path: Path, tiny_thresholds: None) -> None:
    program = chain_program(tiles=3)
    data = program.SerializeToString() + b"\xf8\x07\x2a"  # field 127, varint 42: unknown to Program
    parsed = bir_pb2.Program.FromString(data)
    path = tmp_path / "unknown.pb"
    protoio.write_proto(path, parsed)
    assert path.read_bytes() == parsed.SerializeToString(deterministic=True)
    assert path.read_bytes().endswith(b"\xf8\x07\x2a")
