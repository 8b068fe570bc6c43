"""Run one command under a wall-clock and a resident-memory limit, and end exactly as it ended.

A reproducer bundle (`ncc triage --bundle`) carries this file as `supervise.py`, so that its
replay.sh kills a job at the limits ncc killed it at (--timeout, --mem-limit) and exits as the
job did, on a machine that has the ncc tools but need not have ncc's own supervisor. Standard
library only, like the shell script that runs it:

    python3 supervise.py [--timeout S] [--mem-limit-mb MB] -- COMMAND ARGS...

The command runs in its own process group; every 20 ms the resident memory of the group (from
/proc) is compared with the limit and the elapsed time with the timeout, and on either the whole
group is SIGKILLed, as ncc's supervisor does. Then this process ends the way the command did: the
same exit status, or death by the same signal.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

MB = 1 << 20
POLL_S = 0.02


def group_rss(pgid: int) -> int:
    """Resident bytes of every process in group `pgid` (Linux /proc; 0 where it is missing)."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
            if int(fields[2]) != pgid:  # fields after the command name: state, ppid, pgrp, ...
                continue
            with open(f"/proc/{pid}/statm", "rb") as handle:
                total += int(handle.read().split()[1]) * page
        except (OSError, ValueError, IndexError):
            continue
    return total


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def end_like(returncode: int) -> None:
    """Exit with `returncode`, or die by the signal a negative one names."""
    if returncode < 0:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            signal.signal(-returncode, signal.SIG_DFL)
        except (OSError, ValueError):  # SIGKILL and SIGSTOP keep their default: they cannot be caught
            pass
        os.kill(os.getpid(), -returncode)
        time.sleep(1)  # a signal that does not end a process by default
        sys.exit(128 - returncode)
    sys.exit(returncode)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="supervise.py", description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, metavar="S", help="wall-clock limit, seconds")
    parser.add_argument("--mem-limit-mb", type=float, metavar="MB", help="resident memory limit of the group")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    start = time.monotonic()
    proc = subprocess.Popen(command, start_new_session=True)
    peak, why = 0, ""
    try:
        while proc.poll() is None:
            rss = group_rss(proc.pid) if args.mem_limit_mb is not None else 0
            peak = max(peak, rss)
            if args.mem_limit_mb is not None and rss > args.mem_limit_mb * MB:
                why = f"exceeding the memory limit of {args.mem_limit_mb:g} MB (peak RSS {peak / MB:.0f} MB)"
            elif args.timeout is not None and time.monotonic() - start > args.timeout:
                why = f"exceeding the time limit of {args.timeout:g} s"
            if why:
                kill_group(proc.pid)
                proc.wait()
                break
            time.sleep(POLL_S)
    finally:
        if proc.poll() is None:  # interrupted: take the command down with us
            kill_group(proc.pid)
            proc.wait()
    if why:
        print(f"supervise.py: killed {command[0]} (SIGKILL) for {why}, as ncc did", file=sys.stderr)
    end_like(proc.returncode)


if __name__ == "__main__":
    main()
