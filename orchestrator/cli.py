"""The `ncc` command line: a registry of subcommands, each in its own module, loaded lazily.

`ncc --help` imports nothing but this module and the diagnostics table, so it is instant; a
subcommand's module (and Luigi, numpy, the simulator) is imported only when that subcommand
runs. A mistyped command gets a "did you mean". This is the one wrapper that turns every
exception into a one-line diagnostic and an exit code (ncc.orchestrator.diagnostics): a bug ends
as [F134] with the path of the file holding its traceback, never as a traceback.

A subcommand module provides `add_arguments(parser)` and `run(args) -> int`.
"""

from __future__ import annotations

import argparse
import difflib
import errno
import importlib
import os
import sys
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from ncc.orchestrator import Stopped, restore_interrupt_handler
from ncc.orchestrator.diagnostics import ExitCode, NccDiagnostic, NccError


@dataclass(frozen=True)
class CommandInfo:
    module: str
    summary: str


COMMANDS: dict[str, CommandInfo] = {
    "compile": CommandInfo(
        "ncc.orchestrator.commands.compile", "Compile an HLO module (.hlo.pb or .hlo) into a NEFF"
    ),
    "run": CommandInfo(
        "ncc.orchestrator.commands.run", "Execute a NEFF on the simulator: outputs, time, race check"
    ),
    "farm": CommandInfo(
        "ncc.orchestrator.commands.farm", "Compile many models with Luigi workers (local scheduler or luigid)"
    ),
    "cache": CommandInfo(
        "ncc.orchestrator.commands.cache", "Stage cache statistics (stats) and eviction (gc --max-size)"
    ),
    "inspect": CommandInfo(
        "ncc.orchestrator.commands.inspect", "Show a NEFF's engine streams, tensors and metadata"
    ),
    "triage": CommandInfo(
        "ncc.orchestrator.commands.triage",
        "Explain failed compiles of a work dir or farm: bucket them, bundle a reproducer",
    ),
    "reduce": CommandInfo(
        "ncc.orchestrator.commands.reduce",
        "Shrink an HLO module while a test or a work dir's failure still holds",
    ),
    "bisect": CommandInfo(
        "ncc.orchestrator.commands.bisect", "Find the pass after which a compile's result goes wrong"
    ),
}


class NccArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is a one-line [U002] diagnostic instead of usage + exit 2."""

    def error(self, message: str) -> NoReturn:
        raise NccError.of("U002", f"{self.prog}: {message} (see '{self.prog} --help')")


def top_level_help() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = [
        "usage: ncc <command> [options]",
        "",
        "A compiler driver for XLA HLO modules targeting a NeuronCore-style accelerator.",
        "",
        "commands:",
        *(f"  {name:<{width}}  {info.summary}" for name, info in COMMANDS.items()),
        "",
        "'ncc <command> --help' describes a command. Exit codes: 0 ok, 1 compile error in the input,",
        "2 usage, 3 environment, 4 internal failure, 5 run check failed (docs/diagnostics.md).",
    ]
    return "\n".join(lines)


def _version() -> str:
    from ncc.orchestrator.versions import ncc_version

    return f"ncc {ncc_version()}"


def _unknown_command(name: str) -> NccError:
    close = difflib.get_close_matches(name, COMMANDS, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else f"; commands: {', '.join(COMMANDS)}"
    return NccError.of("U002", f"unknown command '{name}'{hint}")


MIN_OPEN_FILES = 64  # a compile holds logs, records, the lock, pipes and Luigi's files at once


def ensure_open_files() -> None:
    """Raise the soft limit on open files toward the hard one, or refuse with [U012] when even
    the hard limit is too low: an exhausted descriptor table mid-compile would be an F134."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < 1024:
        wanted = 1024 if hard == resource.RLIM_INFINITY else min(1024, hard)
        if wanted > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
    if soft != resource.RLIM_INFINITY and soft < MIN_OPEN_FILES:
        raise NccError.of(
            "U012",
            f"ncc needs at least {MIN_OPEN_FILES} open files but this process may open {soft} (ulimit -n)",
        )


def dispatch(argv: list[str]) -> int:
    if not argv:
        raise NccError.of("U002", f"no command given; commands: {', '.join(COMMANDS)} (see 'ncc --help')")
    name, rest = argv[0], argv[1:]
    if name in ("-h", "--help", "help"):
        print(top_level_help())
        return int(ExitCode.OK)
    if name == "--version":
        print(_version())
        return int(ExitCode.OK)
    info = COMMANDS.get(name)
    if info is None:
        raise _unknown_command(name)
    ensure_open_files()
    module = importlib.import_module(info.module)
    parser = NccArgumentParser(prog=f"ncc {name}", description=info.summary)
    module.add_arguments(parser)
    return int(module.run(parser.parse_args(rest)))


_crash_log_dir: Path | None = None


def keep_crash_logs_in(directory: Path) -> None:
    """A subcommand that has a work directory names it: an internal error's traceback goes there
    (beside the compile it concerns) instead of the system temporary directory."""
    global _crash_log_dir
    _crash_log_dir = directory


def _save_traceback() -> Path | None:
    """Write the current traceback to a fresh file of our own (never a predictable, followable path)."""
    directory = _crash_log_dir if _crash_log_dir is not None and _crash_log_dir.is_dir() else None
    try:
        fd, name = tempfile.mkstemp(prefix="ncc-internal-error-", suffix=".log", dir=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(traceback.format_exc())
    except OSError:
        return None
    return Path(name)


def _reexec_in_utf8_mode(args: list[str]) -> None:
    """Under a strict C/POSIX locale Python decodes non-ASCII paths to lone surrogates, which
    fail the moment they are written as UTF-8 (a record, cmd.sh). Run the same command again in
    Python's UTF-8 mode, which the compile child and the tools then inherit."""
    if sys.getfilesystemencoding().replace("-", "").lower() == "utf8" or os.environ.get("PYTHONUTF8") == "1":
        return
    os.environ["PYTHONUTF8"] = "1"
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", "ncc.orchestrator", *args])


def _drop_stdout() -> None:
    """Point standard output at /dev/null, so the interpreter's final flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `ncc` console script; returns the exit code."""
    args = sys.argv[1:] if argv is None else argv
    try:
        # inside the try: a Ctrl-C that lands as the start-up handler is swapped out is a U007 too
        restore_interrupt_handler()
        if argv is None:
            _reexec_in_utf8_mode(args)
        return dispatch(args)
    except NccError as err:
        diagnostic = err.diagnostic
    except KeyboardInterrupt as stop:
        how = f"stopped by {stop.signame}" if isinstance(stop, Stopped) else "interrupted"
        diagnostic = NccDiagnostic("U007", how)
    except BrokenPipeError:  # `ncc inspect x.neff | head`: the reader has what it wanted
        _drop_stdout()
        return int(ExitCode.OK)
    except Exception as err:
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT) and err.filename is None:
            _drop_stdout()  # no file named: standard output itself (`ncc inspect x.neff > /dev/full`)
            diagnostic = NccDiagnostic("U011", f"cannot write standard output: {err.strerror}")
        else:
            command = args[0] if args else "ncc"
            message = f"internal error in ncc {command} ({type(err).__name__}: {err})"
            diagnostic = NccDiagnostic("F134", message, log=_save_traceback())
    print(diagnostic.line(), file=sys.stderr)
    return int(diagnostic.exit_code)


if __name__ == "__main__":
    sys.exit(main())
