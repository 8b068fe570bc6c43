"""sha256 digests of files, memoized per process on the file's identity and change time.

Why memoize: job completeness is recursive (every job checks its inputs, outputs and all upstream
jobs), so one compile asks for the same digests many times. The memo key includes inode, size,
mtime and ctime in nanoseconds, so a rewrite (tools rename a new file into place) or an in-place
byte flip (which updates mtime/ctime) is always seen.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ncc.schemas import diagnostic_pb2

_CHUNK = 1 << 20
_memo: dict[tuple[str, int, int, int, int, int], str] = {}


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes. Raises OSError if it cannot be read."""
    st = os.stat(path)
    key = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    cached = _memo.get(key)
    if cached is not None:
        return cached
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    _memo[key] = digest.hexdigest()
    return _memo[key]


def relative_to_workdir(path: Path, workdir: Path) -> str:
    """How a path is recorded: relative inside the work directory, absolute outside it."""
    try:
        return str(path.relative_to(workdir))
    except ValueError:
        return str(path)


def file_digest(path: Path, workdir: Path) -> diagnostic_pb2.FileDigest:
    return diagnostic_pb2.FileDigest(
        path=relative_to_workdir(path, workdir), sha256=sha256_file(path), size=path.stat().st_size
    )


def matches(recorded: diagnostic_pb2.FileDigest, path: Path, workdir: Path) -> bool:
    """True if `path` is the file the record names and still has the recorded content."""
    if recorded.path != relative_to_workdir(path, workdir):
        return False
    try:
        return path.stat().st_size == recorded.size and sha256_file(path) == recorded.sha256
    except OSError:
        return False
