"""The ncc driver: the `ncc` command line and the resumable job pipeline of a compile.

It never imports a stage tool on the compile path: jobs fork the tools (`python -m
ncc.tools.<tool>`) and read the files and digests they leave. Modules, outside in:

    cli             `ncc` — registry of subcommands (lazy), one wrapper mapping errors to exit codes
    cmd_compile     `ncc compile` flags → CompileOptions (options) → CommandDriver
    cmd_run         `ncc run`: execute a NEFF on the simulator's public API
    cmd_inspect     `ncc inspect`: describe a NEFF read with the packager's public reader
    driver          CommandDriver: checks, runs the compile in a child process, handleError
    compile_child   the child process: one CompileCommand, result to driver_result.json
    compile_command CompileCommand: buildPipeline, work dir staleness, runPipeline (Luigi), output
    registry        JobRegistry: job name → its JobSpec class and its Luigi task class
    stages          the jobs, one JobSpec per stage tool (files in, files out, flags)
    jobspec         JobSpec: a job without Luigi (folder, record, completeness, cache key, restore)
    job             ToolJob: a JobSpec as a Luigi task (runs and supervises the tool, the record)
    stage_cache     the content-addressed stage cache shared across work dirs (cmd_cache: `ncc cache`)
    farm, cmd_farm  `ncc farm`: many models' pipelines in one Luigi graph, local or on luigid
    farm_progress   the farm's live status line, read from the work dirs
    triage, cmd_triage  `ncc triage`: explain and bucket failed compiles from their work dirs
    triage_bundle   a failed job as a self-contained reproducer (replay.sh; triage_supervise.py
                    is the stdlib-only watchdog it replays under)
    run_settings    run_settings.json: each compile's limits and allow-listed environment
    reduce, cmd_reduce  `ncc reduce`: delta debugging of an HLO module (reduce_edits: the candidate
                    edits; interestingness: a test script, or a work dir's failure replayed)
    bisect, cmd_bisect  `ncc bisect`: the first pass after which a compile's result stops matching
                    its golden outputs (reruns hlo_opt / walrus_driver on prefixes of its pass list)
    outputs         writing user-named outputs (devices and FIFOs written through, links followed)
    diskspace       naming a full file system ([U011])
    supervisor      one tool as a supervised process tree (limits, rusage, peak RSS, no stragglers)
    process_end     how a process ended → F134 / F137 / F139
    diagnostics     every driver code and exit code (docs/diagnostics.md)
    workdir         work directory layout, records, lock, history
    digests         sha256 of files (memoized on identity and change time)
    versions        ncc and per-tool versions (source digests) for cache keys
    luigi_setup     Luigi configuration isolation and logging
    config          the driver's settings from its environment, read once
"""

import os as _os
import signal as _signal
import sys as _sys

__version__ = "0.1.0"  # the one place the release is written (pyproject.toml reads it)


def _interrupted_while_starting(signum: int, frame: object) -> None:
    """Ctrl-C while `ncc` imports its modules: one line, exit 130, no KeyboardInterrupt traceback."""
    _os.write(2, b"ncc: error: [U007] interrupted\n")
    _os._exit(130)


def restore_interrupt_handler() -> None:
    """The entry points call this once they can turn Ctrl-C into their own diagnostic."""
    if _signal.getsignal(_signal.SIGINT) is _interrupted_while_starting:
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)


# `ncc` (console script) or `python -m ncc.orchestrator...` is starting (argv[0] is "-m" while
# the -m target is imported): cover the ~150 ms of imports before main() has its own handler.
if _sys.argv[:1] == ["-m"] or _os.path.basename(_sys.argv[0] if _sys.argv else "") == "ncc":
    _signal.signal(_signal.SIGINT, _interrupted_while_starting)
