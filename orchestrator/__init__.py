"""The ncc driver: the `ncc` command line and the resumable job pipeline of a compile.

It never imports a stage tool on the compile path: jobs fork the tools (`python -m
ncc.tools.<tool>`) and read the files and digests they leave. Its parts, one package each:

    commands/   one module per `ncc` subcommand (compile, run, inspect, farm, cache, triage,
                reduce, bisect): flags in, the part's library called, a result printed
    pipeline/   one compile: CommandDriver and its child process, CompileCommand (buildPipeline,
                runPipeline), JobRegistry, the stage JobSpecs, the Luigi ToolJob, the work dir,
                process supervision and F-codes, the stage cache, Luigi's setup
    farm/       `ncc farm`: many models' pipelines in one Luigi graph, local or on luigid, and its
                live progress line
    triage/     after a failure: explaining and bucketing it, a reproducer bundle, reducing the
                module (`ncc reduce`), bisecting the pass that miscompiled (`ncc bisect`)

and, at the top, what every part shares:

    cli             `ncc` — registry of subcommands (lazy), one wrapper mapping errors to exit codes
    options         CompileOptions: the flags of one compile, as the pipeline and the farm take them
    diagnostics     every driver code and exit code (docs/diagnostics.md)
    config          the driver's settings from its environment, read once
    outputs         writing user-named outputs (devices and FIFOs written through, links followed)
    inputs          reading the .npz of named inputs `ncc run` and `--verify-inputs` take
    digests         sha256 of files (memoized on identity and change time)
    versions        ncc and per-tool versions (source digests) for cache keys

A new command is a module in commands/ registered in cli.py; a new job is a JobSpec in
pipeline/stages.py that buildPipeline names.
"""

import os as _os
import signal as _signal
import sys as _sys

__version__ = "0.1.0"  # the one place the release is written (pyproject.toml reads it)


def _interrupted_while_starting(signum: int, frame: object) -> None:
    """Ctrl-C while `ncc` imports its modules: one line, exit 130, no KeyboardInterrupt traceback."""
    _os.write(2, b"ncc: error: [U007] interrupted\n")
    _os._exit(130)


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP, turned into what Ctrl-C raises so one cleanup path serves all three."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signame = _signal.Signals(signum).name


def _raise_stopped(signum: int, frame: object) -> None:
    raise Stopped(signum)


def stop_like_ctrl_c() -> dict:
    """From here on SIGTERM and SIGHUP stop this command as Ctrl-C does (its own cleanup: child
    processes stopped, scratch removed, U007), instead of killing it mid-way with its children
    left running. For commands that run child processes (compile, reduce, bisect). Returns the
    handlers it replaced, by signal, for a caller that puts them back."""
    return {signum: _signal.signal(signum, _raise_stopped) for signum in (_signal.SIGTERM, _signal.SIGHUP)}


def restore_interrupt_handler() -> None:
    """The entry points call this once they can turn Ctrl-C into their own diagnostic."""
    if _signal.getsignal(_signal.SIGINT) is _interrupted_while_starting:
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)


# `ncc` (console script) or `python -m ncc.orchestrator...` is starting (argv[0] is "-m" while
# the -m target is imported): cover the ~150 ms of imports before main() has its own handler.
if _sys.argv[:1] == ["-m"] or _os.path.basename(_sys.argv[0] if _sys.argv else "") == "ncc":
    _signal.signal(_signal.SIGINT, _interrupted_while_starting)
