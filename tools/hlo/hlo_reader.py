"""Load an HLO module from a file: a serialized HloModuleProto (.hlo.pb, .pb) or HLO text (.hlo, .txt).

Whatever the input, the result is an `xla.HloModuleProto` or a CompileError: E101 the file cannot
be read, E102 bytes that are not a usable HloModuleProto, E103 (and E204/E205/E206) from the text
parser. The proto path only checks what the bytes must hold to be a module at all (computations, an
entry); everything deeper — including garbage that mutated bytes decode into — is verify_module's.
"""

from __future__ import annotations

from pathlib import Path

from ncc.schemas import hlo_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.hlo.hlo_text import parse_hlo_text
from ncc.tools.hlo.hlo_types import entry_computation

_PROTO_SUFFIXES = (".hlo.pb", ".pb")
_TEXT_SUFFIXES = (".hlo", ".txt")


def load_module(path: str) -> hlo_pb2.HloModuleProto:
    """Read `path` as a proto or text by its suffix; an unknown suffix tries proto, then text."""
    data = _read(path)
    name = Path(path).name.lower()
    if name.endswith(_PROTO_SUFFIXES):
        return parse_module_proto(data, path)
    if name.endswith(_TEXT_SUFFIXES):
        return parse_module_text(data, path)
    try:
        return parse_module_proto(data, path)
    except CompileError as proto_error:
        if b"\0" in data or not data.strip():
            raise proto_error from None
        return parse_module_text(data, path)


def parse_module_proto(data: bytes, path: str = "<bytes>") -> hlo_pb2.HloModuleProto:
    """Decode serialized HloModuleProto bytes and check they describe a module with an entry."""
    module = hlo_pb2.HloModuleProto()
    try:
        module.ParseFromString(data)
    except Exception as err:  # DecodeError, or any other complaint of the protobuf runtime
        raise CompileError("E102", f"{path} is not a valid HloModuleProto: {err}", path) from None
    if not module.computations:
        raise CompileError("E102", f"{path} is not a valid HloModuleProto: it has no computations", path)
    if entry_computation(module) is None:
        name, number = module.entry_computation_name[:60], module.entry_computation_id
        raise CompileError("E102", f"{path} is not a valid HloModuleProto: its entry computation '{name}' "
                                   f"(id {number}) is missing", path)
    return module


def parse_module_text(data: bytes, path: str = "<bytes>") -> hlo_pb2.HloModuleProto:
    """Decode UTF-8 HLO text and parse it."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise CompileError("E103", f"HLO text syntax error: {path} is not UTF-8 text (byte {err.start}) at "
                                   f"line {line}", f"line {line}") from None
    return parse_hlo_text(text)


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise CompileError("E101", f"HLO module not found: {path}", path) from None
    except IsADirectoryError:
        raise CompileError("E101", f"HLO module is a directory, not a file: {path}", path) from None
    except OSError as err:
        reason = err.strerror or str(err)
        raise CompileError("E101", f"HLO module cannot be read: {path}: {reason}", path) from None
