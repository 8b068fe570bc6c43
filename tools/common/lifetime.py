"""Die with the parent: a process the kernel kills when the process that started it dies.

Why: a stage tool (or a Luigi worker's forked task process) whose driver is SIGKILLed — an OOM
kill, a farm worker killed by its operator — would otherwise keep computing for nobody, holding
memory and cores. On Linux, PR_SET_PDEATHSIG asks the kernel to send SIGKILL when the parent
ends; checking the parent's pid right after closes the window in which it died before the
request. Elsewhere this is a no-op.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PARENT_ENV = "NCC_PARENT_PID"  # the pid a stage tool expects as its parent
_PR_SET_PDEATHSIG = 1


def die_with_parent(expected_parent: int | None) -> None:
    """Be SIGKILLed when the parent dies; die now if it already has (we were re-parented)."""
    if expected_parent is None or not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != expected_parent:
        os.kill(os.getpid(), signal.SIGKILL)


def die_with_parent_from_env() -> None:
    """For a tool: die with the parent named in NCC_PARENT_PID, if the driver set it."""
    value = os.environ.get(PARENT_ENV, "")
    die_with_parent(int(value) if value.isdigit() else None)
