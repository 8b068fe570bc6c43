"""The committed *_pb2.py modules are exactly what schemas/generate.py produces from the .proto files."""

from __future__ import annotations

from pathlib import Path

import pytest

SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"


def test_generated_code_matches_the_protos(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="grpcio-tools is part of the dev extra")
    import importlib.util

    spec = importlib.util.spec_from_file_location("generate", SCHEMAS / "generate.py")
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    generate.generate(tmp_path)
    produced = sorted(p.name for p in tmp_path.glob("*_pb2.py"))
    assert produced == sorted(p.name for p in SCHEMAS.glob("*_pb2.py"))
    for name in produced:
        assert (tmp_path / name).read_text() == (SCHEMAS / name).read_text(), (
            f"{name} is stale: run `make schemas`"
        )


def test_hlo_subset_reads_a_real_jax_module() -> None:
    from ncc.schemas import hlo_pb2

    models = Path(__file__).resolve().parents[1] / "models"
    module = hlo_pb2.HloModuleProto()
    module.ParseFromString((models / "matmul.hlo.pb").read_bytes())
    entry = module.computations[-1]
    dot = next(i for i in entry.instructions if i.opcode == "dot")
    assert list(dot.shape.dimensions) == [128, 512]
    assert list(dot.dot_dimension_numbers.lhs_contracting_dimensions) == [1]
    assert [i.parameter_number for i in entry.instructions if i.opcode == "parameter"] == [0, 1]
