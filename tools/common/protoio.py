"""Protobuf files: atomic writes (temp name + rename, never a half-written file) and checked reads."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TypeVar

from google.protobuf.message import DecodeError, Message

from ncc.tools.common.errors import CompileError

M = TypeVar("M", bound=Message)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, fsync it, and rename it into place."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_proto(path: str | os.PathLike, message: Message) -> None:
    write_bytes_atomic(path, message.SerializeToString(deterministic=True))


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
