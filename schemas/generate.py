"""Regenerate the committed Python protobuf modules from schemas/*.proto.

The generated *_pb2.py files are committed so that installing ncc needs only the protobuf runtime;
tests/test_schemas.py regenerates them into a temporary folder and fails if they differ.
Run: python schemas/generate.py [OUT_DIR]   (needs grpcio-tools, the `dev` extra)
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

SCHEMA_DIR = Path(__file__).resolve().parent
PROTOS = ["common.proto", "diagnostic.proto", "hlo.proto", "penguin.proto", "bir.proto"]


def generate(out_dir: Path) -> None:
    """Run protoc so that generated imports read `from ncc.schemas import x_pb2`."""
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "ncc" / "schemas").mkdir(parents=True)
        for name in PROTOS:
            shutil.copy(SCHEMA_DIR / name, root / "ncc" / "schemas" / name)
        gen = root / "gen"
        gen.mkdir()
        args = ["protoc", f"-I{root}", f"--python_out={gen}"]
        args += [f"ncc/schemas/{name}" for name in PROTOS]
        if protoc.main(args) != 0:
            raise SystemExit("protoc failed")
        out_dir.mkdir(parents=True, exist_ok=True)
        for produced in sorted((gen / "ncc" / "schemas").glob("*_pb2.py")):
            shutil.copy(produced, out_dir / produced.name)


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else SCHEMA_DIR)
