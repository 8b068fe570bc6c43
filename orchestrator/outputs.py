"""Writing the files a user names (`--output`, `--report`, `--trace`): all or nothing, and never
replacing what is not a regular file.

* A regular file, or a path that does not exist yet: the data goes to a temporary file beside it,
  fsynced, with the permissions a new file gets under the umask, and is renamed into place; a
  reader sees the old file or the new one, never half of one.
* A symlink is followed: the file it names is replaced as above, and the link stays a link.
* A character device or a FIFO (/dev/null, /dev/stdout on a terminal or pipe, a named pipe) is
  written through, without a rename: `--output /dev/null` must never turn /dev/null into a file.
* Anything else (a directory, a socket, a block device) is refused: OutputError.

A writer killed between creating its temporary and the rename leaves `.NAME.XXXX.tmp` behind;
the next write of the same output removes such temporaries of ours that are older than
STALE_TEMPORARY_S (no live write takes that long).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

STALE_TEMPORARY_S = 600.0


class OutputError(Exception):
    """The named output cannot be written; `str()` says why in a few words."""


def _existing_mode(path: Path) -> int | None:
    try:
        return os.stat(path).st_mode
    except FileNotFoundError:
        return None


def is_stream(path: Path) -> bool:
    """True if `path` (after symlinks) is a character device or a FIFO: written through."""
    mode = _existing_mode(path)
    return mode is not None and (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode))


def check_writable(path: Path) -> None:
    """Raise OutputError unless `path` can be written as an output (nothing is created on disk
    for a stream; for a file, a probe proves its directory writable)."""
    mode = _existing_mode(path)  # stat follows links; /dev/stdout's target is no path to resolve
    if mode is not None and (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
        if not os.access(path, os.W_OK):
            raise OutputError("permission denied")
        return
    real = Path(os.path.realpath(path))
    if mode is not None and not stat.S_ISREG(mode):
        raise OutputError("not a regular file, a character device or a FIFO")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{real.name}.probe-", dir=real.parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise OutputError(err.strerror or str(err)) from None


def write_output(path: Path, data: bytes | None = None, source: Path | None = None) -> None:
    """Write `data` (or a copy of the file `source`) to the output `path`; OutputError on failure."""
    mode = _existing_mode(path)
    try:
        if mode is not None and (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
            with open(path, "wb") as handle:
                _fill(handle, data, source)
            return
        real = Path(os.path.realpath(path))
        if mode is not None and not stat.S_ISREG(mode):
            raise OutputError("not a regular file, a character device or a FIFO")
        _remove_stale_temporaries(real)
        fd, tmp = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".tmp", dir=real.parent)
    except OSError as err:
        raise OutputError(err.strerror or str(err)) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            _fill(handle, data, source)
            handle.flush()
            os.fsync(handle.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 is not what a user expects of an output
        os.replace(tmp, real)
    except OSError as err:
        Path(tmp).unlink(missing_ok=True)
        raise OutputError(err.strerror or str(err)) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _remove_stale_temporaries(real: Path) -> None:
    """Delete `.NAME.*.tmp` beside the output that we own and that no live writer can still use."""
    cutoff = time.time() - STALE_TEMPORARY_S
    for leftover in real.parent.glob(f".{real.name}.*.tmp"):
        try:
            info = leftover.lstat()
            if stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid() and info.st_mtime < cutoff:
                leftover.unlink()
        except OSError:
            continue


def _fill(handle, data: bytes | None, source: Path | None) -> None:
    if source is not None:
        with open(source, "rb") as src:
            shutil.copyfileobj(src, handle)
    else:
        handle.write(data or b"")
