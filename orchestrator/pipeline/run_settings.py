"""run_settings.json: how a compile ran its tools, for `ncc triage` to explain and replay a job.

A job record says what a tool did (command, exit status, peak RSS, wall time, digests); this
file says under which conditions the compile that ran it started its tools: the per-job limits
(--timeout, --mem-limit), the environment variables that can change a tool's behaviour (an
allow-list, config.REPLAY_ENV: nothing else is written, so no secrets), and the `ncc compile`
command that reruns the whole compile. Written by the compile child and by `ncc farm` for each
model, before any tool runs; its run id matches the `job_end` events of history.jsonl of the
jobs that run started.
"""

from __future__ import annotations

from ncc.orchestrator.config import settings
from ncc.orchestrator.options import CompileOptions
from ncc.orchestrator.pipeline.workdir import WorkDir


def compile_argv(options: CompileOptions) -> list[str]:
    """The `ncc compile` command line that runs the compile `options` describe."""
    argv = [
        "ncc",
        "compile",
        str(options.model),
        "--output",
        str(options.output),
        "--workdir",
        str(options.workdir),
        *options.canonical_flags(),
    ]
    if options.timeout_s is not None:
        argv += ["--timeout", f"{options.timeout_s:g}"]
    if options.mem_limit_mb is not None:
        argv += ["--mem-limit", str(options.mem_limit_mb)]
    if options.cache_dir is not None:
        argv += ["--cache-dir", str(options.cache_dir)]
    return argv


def record_run_settings(options: CompileOptions, run_id: str) -> None:
    WorkDir(options.workdir).write_run_settings(
        run_id,
        timeout_s=options.timeout_s,
        mem_limit_mb=options.mem_limit_mb,
        env=settings().replay_env(),
        command=compile_argv(options),
    )
