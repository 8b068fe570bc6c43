"""Run one stage tool as a supervised process tree: limits, resource record, no stragglers.

Why not `subprocess.run(timeout=...)`: a tool may start helpers, and a timeout or memory limit
must hold for the whole tree. Each tool therefore gets its own session (process group); the
supervisor samples the tree's resident memory every `poll_interval_s` with psutil, and on a
limit kills the group — and every descendant it has seen, in case one left the group — with
SIGKILL. User/system time and the leader's peak RSS come from the kernel (wait4 rusage), so they
are exact even for a tool that ends between two samples.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from ncc.orchestrator.pipeline.process_end import KILLED_FOR_MEMORY, KILLED_FOR_TIMEOUT, ProcessEnd
from ncc.tools.common.lifetime import PARENT_ENV


@dataclass(frozen=True)
class Limits:
    """What a supervised process may use; None means unlimited."""

    timeout_s: float | None = None
    mem_limit_bytes: int | None = None
    poll_interval_s: float = 0.02


def _child_pids(pid: int) -> list[int] | None:
    """The children of `pid` from /proc/PID/task/TID/children (Linux), or None where that file
    does not exist. Why not psutil's children(): it reads /proc/*/stat of every process on the
    machine, about 3 ms per sample on a quiet one, which at 50 samples a second was a tenth of a
    farm's CPU."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return [] if not os.path.exists("/proc/self/task") else None
    children: list[int] = []
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/children", "rb") as handle:
                children.extend(int(word) for word in handle.read().split())
        except FileNotFoundError:
            if os.path.isdir(f"/proc/{pid}/task/{thread}"):
                return None  # the kernel does not provide the file
        except OSError:
            continue
    return children


def _tree(leader: psutil.Process, known: dict[int, psutil.Process] | None = None) -> list[psutil.Process]:
    """The leader and every descendant, reusing the psutil handles of processes seen before."""
    known = {} if known is None else known
    pending, descendants = [leader.pid], []
    while pending:
        children = _child_pids(pending.pop())
        if children is None:  # no /proc children files: ask psutil for the whole tree
            try:
                return [leader, *leader.children(recursive=True)]
            except psutil.Error:
                return [leader]
        for pid in children:
            if pid not in known:
                try:
                    known[pid] = psutil.Process(pid)
                except psutil.Error:
                    continue
            descendants.append(known[pid])
            pending.append(pid)
    return [leader, *descendants]


USS_REFRESH_S = 0.25  # how stale a descendant's own-memory figure may be


class _TreeMemory:
    """The tree's resident memory: the leader's RSS plus what each descendant holds of its own
    (USS). A tool that forks a helper for half of a pass (tools/common/forked.py) shares its
    pages with it copy-on-write; adding the helper's RSS would count them twice (a 600 MB walrus
    job read as 1.2 GB while its verifier's child ran, and a memory limit would kill it for
    nothing). USS walks the whole page map (8 ms for 500 MB), so a descendant's is read again at
    most every USS_REFRESH_S."""

    def __init__(self) -> None:
        self._own: dict[int, tuple[float, int]] = {}  # descendant pid -> (when read, USS)

    def total(self, processes: Sequence[psutil.Process]) -> int:
        total = 0
        now = time.monotonic()
        for position, proc in enumerate(processes):
            try:
                if position == 0:
                    total += proc.memory_info().rss
                    continue
                when, own = self._own.get(proc.pid, (-USS_REFRESH_S, 0))
                if now - when >= USS_REFRESH_S:
                    own = proc.memory_full_info().uss
                    self._own[proc.pid] = (now, own)
                total += own
            except psutil.Error:  # gone, zombie or not ours: it holds no memory we can count
                continue
        return total


def _kill_tree(pgid: int, seen: Sequence[psutil.Process]) -> None:
    """SIGKILL the process group and every descendant seen (even if it moved to another group)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for proc in seen:
        try:
            proc.kill()
        except psutil.Error:
            continue


def _exited(pid: int) -> bool:
    """True once `pid` has ended; the zombie is left in place so its group id stays reserved."""
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    return info is not None and info.si_pid != 0


def _open_pidfd(pid: int) -> int | None:
    """A file descriptor that becomes readable when `pid` exits (Linux ≥ 5.3), else None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _wait_for_exit(pidfd: int | None, timeout_s: float) -> None:
    """Sleep one sampling period, but wake up as soon as the process exits (no lost latency)."""
    if pidfd is None:
        time.sleep(timeout_s)
    else:
        select.select([pidfd], [], [], timeout_s)


def run_supervised(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    stdout_path: Path,
    stderr_path: Path,
    limits: Limits,
) -> ProcessEnd:
    """Run `argv` to its end under `limits`, logging to the two files; never leaves a process behind.

    Raises OSError if the program cannot be started at all.
    """
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
        start = time.monotonic()
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env={**env, PARENT_ENV: str(os.getpid())},  # the tool dies with us (tools/common/lifetime)
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,  # its own process group: one killpg reaches every helper
        )
    pid = pgid = proc.pid
    leader = psutil.Process(pid)
    seen: list[psutil.Process] = [leader]
    peak = 0
    killed_for = ""
    reaped = False
    pidfd = _open_pidfd(pid)
    known: dict[int, psutil.Process] = {}
    memory = _TreeMemory()
    try:
        while not _exited(pid):
            seen = _tree(leader, known)
            rss = memory.total(seen)
            peak = max(peak, rss)
            elapsed = time.monotonic() - start
            if not killed_for:
                if limits.mem_limit_bytes is not None and rss > limits.mem_limit_bytes:
                    killed_for = KILLED_FOR_MEMORY
                elif limits.timeout_s is not None and elapsed > limits.timeout_s:
                    killed_for = KILLED_FOR_TIMEOUT
                if killed_for:
                    _kill_tree(pgid, seen)
            _wait_for_exit(pidfd, limits.poll_interval_s)
        # The leader has ended; helpers it left in its group go with it.
        _kill_tree(pgid, seen[1:])
        _, status, usage = os.wait4(pid, 0)
        reaped = True
        wall = time.monotonic() - start
        proc.returncode = os.waitstatus_to_exitcode(status)  # Popen must not wait for it again
    finally:
        if pidfd is not None:
            os.close(pidfd)
        if not reaped:  # interrupted (Ctrl-C) or a bug above: take the whole tree down with us
            _kill_tree(pgid, _tree(leader))
            try:
                os.wait4(pid, 0)
                proc.returncode = -signal.SIGKILL
            except ChildProcessError:
                pass
    return ProcessEnd(
        returncode=proc.returncode,
        wall_s=wall,
        user_s=usage.ru_utime,
        sys_s=usage.ru_stime,
        peak_rss_bytes=max(peak, usage.ru_maxrss * 1024),  # ru_maxrss is in KiB on Linux
        killed_for=killed_for,
        timeout_s=limits.timeout_s,
        mem_limit_bytes=limits.mem_limit_bytes,
    )
