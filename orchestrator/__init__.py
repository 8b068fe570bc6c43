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
    registry        JobRegistry: job name → Luigi task class
    stages          the jobs, one per stage tool (files in, files out, flags)
    job             ToolJob: the Luigi task behind every stage tool (run, record, completeness)
    supervisor      one tool as a supervised process tree (limits, rusage, peak RSS, no stragglers)
    process_end     how a process ended → F134 / F137 / F139
    diagnostics     every driver code and exit code (docs/diagnostics.md)
    workdir         work directory layout, records, lock, history
    digests         sha256 of files (memoized on identity and change time)
    versions        ncc and per-tool versions (source digests) for cache keys
    luigi_setup     Luigi configuration isolation and logging
    config          the driver's settings from its environment, read once
"""
