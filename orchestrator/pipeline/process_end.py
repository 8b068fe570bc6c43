"""How a supervised process ended, and what that means for the user (F134 / F137 / F139).

Used for both kinds of processes the driver starts: a stage tool inside a job, and the compile
child of `CommandDriver`. Python reports a death by signal N as returncode −N; a shell wrapper
reports 128+N. Both are understood, so the mapping is the same however the process was started.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

MB = 1 << 20  # memory is reported in MB of 2^20 bytes, like --mem-limit

# What the supervisor did to the process, if anything.
KILLED_FOR_TIMEOUT = "timeout"
KILLED_FOR_MEMORY = "memory"

# How the messages below say it (`killed_for_in` reads it back from a recorded diagnostic).
_MEMORY_PHRASE = "by ncc for exceeding its memory limit"
_TIMEOUT_PHRASE = "by ncc after exceeding the time limit"


@dataclass(frozen=True)
class ProcessEnd:
    """Exit status and resource use of one finished process tree."""

    returncode: int  # −N: killed by signal N
    wall_s: float = 0.0
    user_s: float = 0.0
    sys_s: float = 0.0
    peak_rss_bytes: int = 0
    killed_for: str = ""  # KILLED_FOR_TIMEOUT / KILLED_FOR_MEMORY when the supervisor killed it
    timeout_s: float | None = None
    mem_limit_bytes: int | None = None

    @property
    def signal_number(self) -> int | None:
        """The signal that ended the process, from −N or from a shell's 128+N."""
        if self.returncode < 0:
            return -self.returncode
        if 128 < self.returncode <= 128 + 64:
            return self.returncode - 128
        return None

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _mb(n_bytes: int) -> str:
    return f"{n_bytes / MB:.0f} MB"


def _seconds(value: float) -> str:
    return f"{value:g} s"


def classify_abnormal_end(who: str, end: ProcessEnd, *, mem_limit_hint: bool = True) -> tuple[str, str]:
    """The F-code and one-line message for a process that did not end well.

    `who` names it ("job WalrusDriver"). `mem_limit_hint` adds the memory limit (or that none
    was set) to a SIGKILL's message: useful for a job, whose limit --mem-limit sets.
    """
    sig = end.signal_number
    peak = f"peak RSS {_mb(end.peak_rss_bytes)}"
    if sig == signal.SIGKILL:
        if end.killed_for == KILLED_FOR_MEMORY and end.mem_limit_bytes is not None:
            return "F137", (
                f"{who} was forcibly killed (SIGKILL) {_MEMORY_PHRASE}; "
                f"{peak} (limit {_mb(end.mem_limit_bytes)}, --mem-limit)"
            )
        if end.killed_for == KILLED_FOR_TIMEOUT and end.timeout_s is not None:
            return "F137", (
                f"{who} was forcibly killed (SIGKILL) {_TIMEOUT_PHRASE} of "
                f"{_seconds(end.timeout_s)} (--timeout); ran {end.wall_s:.1f} s, {peak}"
            )
        limit = (
            f"limit {_mb(end.mem_limit_bytes)}" if end.mem_limit_bytes is not None else "no --mem-limit set"
        )
        hint = f" ({limit})" if mem_limit_hint else ""
        return (
            "F137",
            f"{who} was forcibly killed (SIGKILL), most often for running out of memory; {peak}{hint}",
        )
    if sig == signal.SIGSEGV:
        return "F139", f"{who} crashed with a segmentation fault (SIGSEGV); {peak}"
    if sig == signal.SIGABRT:
        return "F134", f"{who} terminated abnormally (SIGABRT, aborted)"
    if sig is not None:
        return "F134", f"{who} terminated abnormally (killed by {signal_name(sig)})"
    if end.returncode == 1:
        return "F134", f"{who} terminated abnormally (exit status 1 without writing a diagnostic)"
    if end.returncode == 2:
        return "F134", f"{who} terminated abnormally (exit status 2: the tool rejected its command line)"
    if end.returncode == 3:
        return "F134", f"{who} terminated abnormally (exit status 3: an internal error in the tool)"
    return "F134", f"{who} terminated abnormally (exit status {end.returncode})"


def killed_for_in(message: str) -> str:
    """KILLED_FOR_MEMORY / KILLED_FOR_TIMEOUT if `message` (made by classify_abnormal_end) says
    ncc killed the process for a limit, else ''."""
    if _MEMORY_PHRASE in message:
        return KILLED_FOR_MEMORY
    if _TIMEOUT_PHRASE in message:
        return KILLED_FOR_TIMEOUT
    return ""
