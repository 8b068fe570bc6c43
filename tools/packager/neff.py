"""The NEFF file: building one from a codegen'd BIR program, writing it and reading it back.

Layout (all little-endian):

    offset 0   4 bytes   magic b"NEFF"
    offset 4   u32       format_version (FORMAT_VERSION)
    offset 8   32 bytes  sha256 of the payload
    offset 40  ...       payload: a serialized ncc.bir.Neff (deterministic serialization)

The checksum makes corruption and truncation detectable before the payload is parsed. Errors:
E501 the file is missing or unreadable; E502 it is not a valid NEFF (bad magic, unsupported
version, truncated, checksum mismatch, unparsable payload); E503 the program cannot be packaged
(an unallocated buffer, an operand naming an unknown tensor or buffer, a stream problem, a
malformed loop: tools/common/loops.py). The NEFF carries the buffers its streams name: inside
rolled loops on-chip operands name their memory as a whole, so the per-iteration buffers of the
BIR program are left out.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

from google.protobuf.message import DecodeError

from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.common import loops
from ncc.tools.common.errors import CompileError
from ncc.tools.common.protoio import write_bytes_atomic
from ncc.tools.target import ENGINE_NAMES

MAGIC = b"NEFF"
FORMAT_VERSION = 2  # 2: engine streams may hold loops (1 had none, and is still read)
READABLE_VERSIONS = (1, 2)
_HEADER = struct.Struct("<4sI32s")
HEADER_BYTES = _HEADER.size


# ---- encoding --------------------------------------------------------------------------------


def encode_neff(neff: bir_pb2.Neff) -> bytes:
    """The bytes of a NEFF file holding `neff` (magic and version fields are filled in)."""
    message = bir_pb2.Neff()
    message.CopyFrom(neff)
    message.magic = MAGIC.decode()
    message.format_version = FORMAT_VERSION
    payload = message.SerializeToString(deterministic=True)
    return _HEADER.pack(MAGIC, FORMAT_VERSION, hashlib.sha256(payload).digest()) + payload


def decode_neff(data: bytes, where: str = "<memory>") -> bir_pb2.Neff:
    """Parse NEFF file bytes; any defect is E502 naming `where`."""
    if len(data) < HEADER_BYTES:
        raise CompileError(
            "E502",
            f"{where} is not a valid NEFF: truncated ({len(data)} bytes, the header alone is {HEADER_BYTES})",
            where,
        )
    magic, version, digest = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CompileError("E502", f"{where} is not a NEFF file (magic {magic!r}, expected {MAGIC!r})", where)
    if version not in READABLE_VERSIONS:
        raise CompileError(
            "E502",
            f"{where} has NEFF format version {version}; this reader supports "
            f"{', '.join(map(str, READABLE_VERSIONS))}",
            where,
        )
    payload = data[HEADER_BYTES:]
    if hashlib.sha256(payload).digest() != digest:
        raise CompileError(
            "E502",
            f"{where} is corrupted or truncated: payload checksum mismatch ({len(payload)} payload bytes)",
            where,
        )
    neff = bir_pb2.Neff()
    try:
        neff.ParseFromString(payload)
    except (DecodeError, RuntimeWarning, ValueError) as err:
        raise CompileError("E502", f"{where} holds an unparsable NEFF payload: {err}", where) from None
    if neff.magic != MAGIC.decode() or neff.format_version != version:
        raise CompileError(
            "E502",
            f"{where} payload header mismatch (magic {neff.magic!r}, version {neff.format_version})",
            where,
        )
    return neff


def write_neff(path: str | os.PathLike, neff: bir_pb2.Neff) -> None:
    """Write `neff` to `path` atomically (temporary file + rename)."""
    write_bytes_atomic(path, encode_neff(neff))


def read_neff(path: str | os.PathLike) -> bir_pb2.Neff:
    """Read a NEFF file: E501 if it cannot be read, E502 if it is not a valid NEFF."""
    where = str(path)
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise CompileError("E501", f"NEFF file not found: {where}", where) from None
    except IsADirectoryError:
        raise CompileError("E501", f"NEFF path is a directory, not a file: {where}", where) from None
    except OSError as err:
        raise CompileError(
            "E501", f"NEFF file is not readable: {where}: {err.strerror or err}", where
        ) from None
    return decode_neff(data, where)


# ---- building --------------------------------------------------------------------------------


def _streams(program: bir_pb2.Program) -> list[bir_pb2.Stream]:
    """The program's streams, or its instructions grouped by engine in program order."""
    if program.streams:
        return list(program.streams)
    grouped: dict[int, bir_pb2.Stream] = {}
    for instruction in program.instructions:
        if instruction.engine not in ENGINE_NAMES:
            raise CompileError(
                "E503", f"instruction {instruction.name!r} names no valid engine", instruction.name
            )
        grouped.setdefault(instruction.engine, bir_pb2.Stream(engine=instruction.engine))
        grouped[instruction.engine].instructions.append(instruction)
    return [grouped[engine] for engine in sorted(grouped)]


def _validate(program: bir_pb2.Program, streams: list[bir_pb2.Stream]) -> None:
    for buffer in program.buffers:
        if buffer.address < 0:
            raise CompileError(
                "E503",
                f"buffer {buffer.name!r} has no address (run the allocation pass before packaging)",
                buffer.name,
            )
    tensors = {tensor.name for tensor in program.hbm}
    buffers = {buffer.name: buffer.memory for buffer in program.buffers}
    seen_engines: set[int] = set()
    for stream in streams:
        if stream.engine not in ENGINE_NAMES:
            raise CompileError("E503", f"a stream names no valid engine ({stream.engine})")
        if stream.engine in seen_engines:
            raise CompileError("E503", f"two streams for engine {ENGINE_NAMES[stream.engine]}")
        seen_engines.add(stream.engine)
        loops.check_stream(stream, "E503")
        for instruction in stream.instructions:
            for kind, operands in (("input", instruction.inputs), ("output", instruction.outputs)):
                for index, ap in enumerate(operands):
                    memory = ap.memory
                    if (buffers.get(ap.tensor) != memory) if memory in ONCHIP else (
                        memory != common_pb2.HBM or ap.tensor not in tensors
                    ):
                        _operand_error(instruction, f"{kind} {index}", ap, buffers)
            for sync in (instruction.waits, instruction.updates):
                for entry in sync:
                    if not 0 <= entry.semaphore < program.num_semaphores:
                        raise CompileError(
                            "E503",
                            f"instruction {instruction.name!r} uses semaphore {entry.semaphore} but the "
                            f"program has {program.num_semaphores}",
                            instruction.name,
                        )


ONCHIP = (common_pb2.SBUF, common_pb2.PSUM)


def _operand_error(
    instruction: bir_pb2.Instruction, what: str, ap: bir_pb2.AccessPattern, buffers: dict[str, int]
) -> NoReturn:
    """The E503 of an operand that names no memory or a tensor or buffer that is not there (or is
    in another memory). The walk in _validate tests that cheaply; this says what is wrong."""
    where = f"instruction {instruction.name!r} {what}"
    if ap.memory == common_pb2.HBM:
        raise CompileError("E503", f"{where} names unknown HBM tensor {ap.tensor!r}", instruction.name)
    if ap.memory in ONCHIP:
        memory = common_pb2.Memory.Name(ap.memory)
        if ap.tensor not in buffers:
            raise CompileError(
                "E503", f"{where} names unknown {memory} buffer {ap.tensor!r}", instruction.name
            )
        raise CompileError(
            "E503",
            f"{where} uses buffer {ap.tensor!r} as {memory} but it is in "
            f"{common_pb2.Memory.Name(buffers[ap.tensor])}",
            instruction.name,
        )
    raise CompileError("E503", f"{where} names no memory", instruction.name)


def build_neff(program: bir_pb2.Program, metadata: Mapping[str, str] | None = None) -> bir_pb2.Neff:
    """Package a codegen'd BIR program (E503 if it is not ready: unallocated or dangling names)."""
    streams = _streams(program)
    _validate(program, streams)
    neff = bir_pb2.Neff(
        magic=MAGIC.decode(),
        format_version=FORMAT_VERSION,
        name=program.name,
        target=program.target,
        num_semaphores=program.num_semaphores,
    )
    neff.hbm.extend(program.hbm)
    named = {ap.tensor for stream in streams for i in stream.instructions for ap in (*i.outputs, *i.inputs)}
    neff.buffers.extend(buffer for buffer in program.buffers if buffer.name in named)
    neff.streams.extend(streams)
    for key, value in program.attributes.items():  # the backend's own figures, e.g. walrus.lower_bound_ns
        neff.metadata[key] = value
    for key, value in (metadata or {}).items():
        neff.metadata[str(key)] = str(value)
    return neff
