"""Protobuf files: atomic writes (temp name + rename, never a half-written file) and checked reads."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, TypeVar

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.unknown_fields import UnknownFieldSet

from ncc.tools.common.errors import CompileError

M = TypeVar("M", bound=Message)


def write_bytes_atomic(path: str | os.PathLike, data: bytes, durable: bool = True) -> None:
    """Write `data` to a temporary file beside `path`, fsync it (unless not `durable`: for a file
    whose loss in a crash costs less than the fsync, because it is checked and rebuilt), and
    rename it into place."""
    _write_atomic(path, lambda handle: handle.write(data), durable)


def _write_atomic(path: str | os.PathLike, write: Callable[[BinaryIO], object], durable: bool = True) -> None:
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb", buffering=1 << 20) as handle:
            write(handle)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_proto(path: str | os.PathLike, message: Message) -> None:
    """Write `message` atomically, in the bytes SerializeToString(deterministic=True) gives. Past
    STREAM_ABOVE_BYTES the bytes are streamed (a large repeated field a chunk at a time, a large
    element field by field), so a million-instruction program never exists twice in memory:
    serialized whole, it took 1.4 GB more. Streaming costs time, so smaller messages go whole."""
    size = message.ByteSize()
    if size <= STREAM_ABOVE_BYTES:
        write_bytes_atomic(path, message.SerializeToString(deterministic=True))
    else:
        _write_atomic(path, lambda handle: _write_fields(handle, message, size))


def _write_fields(handle: BinaryIO, message: Message, size: int | None = None) -> None:
    size = message.ByteSize() if size is None else size
    if size <= _CHUNK_BYTES or len(UnknownFieldSet(message)):
        handle.write(message.SerializeToString(deterministic=True))  # small, or fields we cannot name
        return
    for field, value in message.ListFields():  # in field-number order, as the serializer writes
        if field.type == FieldDescriptor.TYPE_MESSAGE and _is_repeated(field) and not _is_map(field):
            tag = _varint(field.number << 3 | 2)  # wire type 2: length-delimited
            if len(value) * _CHUNK_BYTES > size:  # many small elements: a chunk at a time
                step = max(1, len(value) * _CHUNK_BYTES // size)
                for first in range(0, len(value), step):
                    part = type(message)()
                    getattr(part, field.name).extend(value[first : first + step])
                    handle.write(part.SerializeToString(deterministic=True))
                continue
            for element in value:  # few large elements (streams): each streamed in turn
                element_size = element.ByteSize()
                handle.write(tag)
                handle.write(_varint(element_size))
                _write_fields(handle, element, element_size)
            continue
        part = type(message)()
        if _is_map(field):
            for key, item in value.items():
                entry = getattr(part, field.name)
                if field.message_type.fields_by_name["value"].type == FieldDescriptor.TYPE_MESSAGE:
                    entry[key].CopyFrom(item)
                else:
                    entry[key] = item
        elif _is_repeated(field):
            getattr(part, field.name).extend(value)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            getattr(part, field.name).CopyFrom(value)
        else:
            setattr(part, field.name, value)
        handle.write(part.SerializeToString(deterministic=True))


STREAM_ABOVE_BYTES = 256 << 20
_CHUNK_BYTES = 16 << 20  # streamed: about this much serialized at once


def _is_repeated(field: FieldDescriptor) -> bool:
    return field.is_repeated


def _is_map(field: FieldDescriptor) -> bool:
    return field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def read_proto(path: str | os.PathLike, message_type: type[M], what: str, code: str = "E102") -> M:
    """Read and parse a protobuf file; a missing or malformed file is a CompileError naming it."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise CompileError("E101", f"{what} not found: {path}", str(path)) from None
    except IsADirectoryError:
        raise CompileError("E101", f"{what} is a directory, not a file: {path}", str(path)) from None
    except PermissionError:
        raise CompileError("E101", f"{what} is not readable: {path}", str(path)) from None
    message = message_type()
    try:
        message.ParseFromString(data)
    except (DecodeError, RuntimeWarning, ValueError) as err:
        raise CompileError(
            code, f"{what} is not a valid {message_type.DESCRIPTOR.name}: {err}", str(path)
        ) from None
    return message
