"""Naming a full file system: [U011] instead of whatever error the process that hit it showed.

A full disk reaches ncc in many shapes — a tool's ENOSPC (exit 4, tools/common/toolmain), an
OSError in the driver while it writes a record, a tool that could not even write its diagnostic.
Whichever it is, the user needs one answer: which file system is full and how much is left.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from ncc.orchestrator.diagnostics import NccError

NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
NEARLY_FULL_BYTES = 64 * 1024  # less free than this after a failure: the failure was the disk


def mount_point(path: Path) -> Path:
    """The mount point of the file system holding `path` (or its nearest existing parent)."""
    current = Path(os.path.abspath(path))
    while not current.exists():
        current = current.parent
    while not os.path.ismount(current):
        current = current.parent
    return current


def free_bytes(path: Path) -> int:
    stats = os.statvfs(mount_point(path))
    return stats.f_bavail * stats.f_frsize


def no_space_message(path: Path) -> str:
    mount = mount_point(path)
    return (
        f"no space left on the file system of {path} (mounted at {mount}, {free_bytes(path):,} bytes free); "
        "free some space and run the same command again to resume"
    )


def is_no_space(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in NO_SPACE_ERRNOS


def looks_full(path: Path) -> bool:
    """True if the file system of `path` has almost nothing left (after a failure: the cause)."""
    try:
        return free_bytes(path) < NEARLY_FULL_BYTES
    except OSError:
        return False


def scratch_write_error(error: OSError, path: Path) -> NccError:
    """The diagnostic for a folder of scratch files (reduce's candidates, bisect's states) that
    cannot be written: U011 when the disk is full, else U003 naming the folder."""
    if is_no_space(error) or looks_full(path):
        return NccError.of("U011", no_space_message(path))
    return NccError.of("U003", f"cannot write in {path}: {error.strerror or error}")
