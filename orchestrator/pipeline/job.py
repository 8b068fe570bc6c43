"""ToolJob: the Luigi task that runs one stage tool of a compile (its JobSpec says which).

A job forks its stage tool (`python -m ncc.tools.<tool>`, never an import), supervises it
(ncc.orchestrator.pipeline.supervisor), and leaves in its folder `NN_JobName/` everything needed to
understand and replay it: cmd.sh, stdout.log, stderr.log, the tool's outputs and record.json.

Contract with Luigi:
* output() is the job record; complete() is stricter than "the record exists": the record says
  ok, the outputs on disk and the current inputs still have the recorded digests, the cache key
  (tool, tool version, flags, input digests) is unchanged, and every upstream job is complete.
  Luigi does not look at the requirements of a task it finds complete, so the recursion is what
  makes a corrupted intermediate rerun its producer and everything after it.
* run() never lets a tool failure look like a driver bug: it writes a record with status
  "failed" and the diagnostic, then raises JobFailed so Luigi stops the pipeline there.
Instances are cached by Luigi per parameters, so a job keeps no state besides its parameters.
The Luigi class of each stage is made from its spec by `task_class_of()`: the spec (stages.py) says
what the job is, ToolJob how it runs under Luigi.
"""

from __future__ import annotations

import logging
import multiprocessing
import shlex
import traceback

import luigi
from google.protobuf.message import DecodeError

from ncc.orchestrator import digests
from ncc.orchestrator.config import settings
from ncc.orchestrator.diagnostics import NccDiagnostic, one_line
from ncc.orchestrator.options import DEFAULT_LOOPS
from ncc.orchestrator.pipeline.diskspace import is_no_space, looks_full, no_space_message
from ncc.orchestrator.pipeline.jobspec import (
    DRIVER_TOOL,
    STATUS_FAILED,
    STATUS_OK,
    JobSpec,
    diagnostic_from_record,
    host_resource,
)
from ncc.orchestrator.pipeline.process_end import MB, classify_abnormal_end
from ncc.orchestrator.pipeline.registry import JobRegistry
from ncc.orchestrator.pipeline.supervisor import Limits, run_supervised
from ncc.orchestrator.pipeline.workdir import (
    DIAGNOSTIC,
    DRIVER_ERROR,
    STDERR,
    STDOUT,
    WorkDir,
    write_message_json,
)
from ncc.orchestrator.versions import tool_version
from ncc.schemas import diagnostic_pb2
from ncc.tools.common.lifetime import die_with_parent
from ncc.tools.common.toolmain import EXIT_NO_SPACE

log = logging.getLogger("ncc")


class JobFailed(Exception):
    """A job ended without its outputs; the record in its folder holds the diagnostic."""

    def __init__(self, diagnostic: NccDiagnostic) -> None:
        super().__init__(diagnostic.line())
        self.diagnostic = diagnostic


class ToolJob(JobSpec, luigi.Task):
    """A stage's spec as a Luigi task: parameters, completeness, running the tool, the record."""

    # Identity: these define what the job computes.
    workdir = luigi.Parameter(description="absolute path of the compile's work directory")
    model = luigi.Parameter(description="absolute path of the HLO module being compiled")
    pipeline = luigi.ListParameter(description="the job names of the whole compile, in order")
    compile_flags = luigi.ListParameter(description="the compile's canonical flags (for the NEFF metadata)")
    optlevel = luigi.IntParameter(default=2, description="optimization level 0-3")
    walrus_passes = luigi.Parameter(default="", description="comma-separated backend pass list, '' = default")
    penguin_passes = luigi.Parameter(
        default="", description="comma-separated Penguin pass list, '' = default"
    )
    num_stages = luigi.IntParameter(
        default=0, description="software-pipeline stages for every eligible loop, 0 = none"
    )
    loops = luigi.Parameter(default=DEFAULT_LOOPS, description="rolled: loops stay loops in BIR, or unrolled")
    verify_inputs = luigi.Parameter(default="", description="--verify's .npz of inputs ('' = seeded ones)")
    # How it is run: never part of a job's identity.
    run_id = luigi.Parameter(default="", significant=False, description="id of this ncc invocation")
    timeout_s = luigi.OptionalFloatParameter(
        default=None, significant=False, description="wall limit per job"
    )
    mem_limit_mb = luigi.OptionalIntParameter(
        default=None, significant=False, description="RSS limit per job"
    )
    cache_dir = luigi.Parameter(
        default="", significant=False, description="stage cache shared across work dirs ('' = none)"
    )
    retries = luigi.IntParameter(default=0, significant=False, description="reruns after a failure (farms)")
    resources_mb = luigi.IntParameter(
        default=0, significant=False, description="memory the job reserves on its host, MB (0 = none)"
    )
    model_priority = luigi.IntParameter(
        default=0, significant=False, description="larger runs first among ready jobs (farms: model size)"
    )
    cache_store_error = ""  # why this run's outputs could not be stored in the stage cache, if so

    # -- Luigi contract -----------------------------------------------------------------------

    @property
    def retry_count(self) -> int:  # type: ignore[override]  # Luigi: failures before it gives up
        return self.retries + 1

    @property
    def priority(self) -> int:  # type: ignore[override]  # Luigi: ready jobs with more run first
        return self.model_priority

    @property
    def resources(self) -> dict[str, int]:  # type: ignore[override]  # Luigi: capped per scheduler
        return {host_resource(): self.resources_mb} if self.resources_mb else {}

    def requires(self) -> list[ToolJob]:
        if self.index == 0:
            return []
        return [task_class_of(self.pipeline[self.index - 1])(**self.param_kwargs)]

    def output(self) -> luigi.LocalTarget:
        return luigi.LocalTarget(str(self.record_path))

    def complete(self) -> bool:
        return self.recorded_complete() and all(upstream.complete() for upstream in self.requires())

    def run(self) -> None:
        forked = multiprocessing.parent_process()
        if forked is not None:  # a Luigi worker's task process: do not outlive the worker
            die_with_parent(forked.pid)
        workdir = WorkDir(self.root)
        self._history(workdir, "job_start")
        try:
            record = self._deterministic_failure()
            if record is not None:  # written again, so it is dated this run: the driver reports the
                write_message_json(self.record_path, record)  # failures of this run, by file time
            else:
                record = self._execute()
        except Exception as err:
            if is_no_space(err) or looks_full(self.root):
                record = self._record_no_space()
            else:
                record = self._record_driver_failure(traceback.format_exc())
        not_stored = {"cache_not_stored": self.cache_store_error} if self.cache_store_error else {}
        self._history(
            workdir, "job_end", status=record.status, wall_s=record.wall_s, cached=record.cached, **not_stored
        )
        if record.status != STATUS_OK:
            diagnostic = diagnostic_from_record(record, self.root)
            log.info("job %s failed: %s", self.name, diagnostic.line())
            raise JobFailed(diagnostic)
        log.info(
            "job %s: ok in %.2f s (user %.2f s, sys %.2f s, peak RSS %.0f MB)",
            self.name,
            record.wall_s,
            record.user_s,
            record.sys_s,
            record.peak_rss_bytes / MB,
        )

    # -- running the tool ---------------------------------------------------------------------

    def _limits(self) -> Limits:
        return Limits(
            timeout_s=self.timeout_s,
            mem_limit_bytes=self.mem_limit_mb * MB if self.mem_limit_mb is not None else None,
            poll_interval_s=settings().poll_interval_s,
        )

    def _execute(self) -> diagnostic_pb2.JobRecord:
        inputs, argv, key = self._begin()
        cache = self._stage_cache()
        lookup = ""
        if cache is not None:
            lookup, restored = self._restore_from_cache(cache, argv, inputs, key)
            if restored is not None:
                log.info("job %s: restored from the stage cache", self.name)
                return restored
        log.info("job %s: running %s", self.name, shlex.join(argv))
        self._write_replay_script(argv)
        end = run_supervised(
            argv,
            cwd=self.root,
            env=dict(settings().tool_env),
            stdout_path=self.out(STDOUT),
            stderr_path=self.out(STDERR),
            limits=self._limits(),
        )
        record = diagnostic_pb2.JobRecord(
            job=self.name,
            index=self.index,
            command=argv,
            tool=self.tool,
            tool_version=tool_version(self.tool),
            exit_code=end.returncode,
            wall_s=end.wall_s,
            user_s=end.user_s,
            sys_s=end.sys_s,
            peak_rss_bytes=end.peak_rss_bytes,
            inputs=inputs,
            cache_key=key,
            cache_lookup=lookup,
        )
        tool_diagnostic = self._read_tool_diagnostic() if end.returncode == 1 else None
        missing = [name for name in self.output_names if not self.out(name).is_file()]
        if end.ok and not missing:
            record.outputs.extend(digests.file_digest(path, self.root) for path in self.output_paths())
            record.status = STATUS_OK
            if cache is not None:
                self.cache_store_error = self._store_in_cache(cache, key)
        elif end.ok:
            record.status = STATUS_FAILED
            record.diagnostic.CopyFrom(
                self._driver_diagnostic(
                    "F134", f"job {self.name} exited 0 but did not write {', '.join(missing)}", self.tool
                )
            )
        elif tool_diagnostic is not None:
            record.status = STATUS_FAILED
            record.diagnostic.CopyFrom(tool_diagnostic)
        else:
            record.status = STATUS_FAILED
            code, message = classify_abnormal_end(f"job {self.name}", end)
            if end.returncode == EXIT_NO_SPACE or looks_full(self.root):
                code, message = "U011", f"job {self.name}: {no_space_message(self.root)}"
            record.diagnostic.CopyFrom(self._driver_diagnostic(code, message, self.tool))
        write_message_json(self.record_path, record)
        return record

    def _read_tool_diagnostic(self) -> diagnostic_pb2.Diagnostic | None:
        """The tool's Diagnostic proto, if it wrote a readable one with a code."""
        diagnostic = diagnostic_pb2.Diagnostic()
        try:
            diagnostic.ParseFromString(self.out(DIAGNOSTIC).read_bytes())
        except (OSError, DecodeError):
            return None
        if not diagnostic.code:
            return None
        diagnostic.message = one_line(diagnostic.message)
        diagnostic.tool = diagnostic.tool or self.tool
        return diagnostic

    @staticmethod
    def _driver_diagnostic(code: str, message: str, tool: str) -> diagnostic_pb2.Diagnostic:
        return diagnostic_pb2.Diagnostic(code=code, severity=diagnostic_pb2.ERROR, message=message, tool=tool)

    def _history(self, workdir: WorkDir, event: str, **fields: object) -> None:
        """Append to history.jsonl; on a full disk the line is lost, not the job's diagnostic."""
        try:
            workdir.append_history(event, job=self.name, run_id=self.run_id, **fields)
        except OSError as err:
            if not is_no_space(err):
                raise

    def _record_no_space(self) -> diagnostic_pb2.JobRecord:
        """The disk filled while the driver ran this job: U011 (the record may not fit either;
        then the compile's failure path finds the disk full and says the same)."""
        record = diagnostic_pb2.JobRecord(
            job=self.name, index=self.index, tool=self.tool, status=STATUS_FAILED
        )
        message = f"job {self.name}: {no_space_message(self.root)}"
        record.diagnostic.CopyFrom(self._driver_diagnostic("U011", message, DRIVER_TOOL))
        try:
            write_message_json(self.record_path, record)
        except OSError:
            pass
        return record

    def _record_driver_failure(self, trace: str) -> diagnostic_pb2.JobRecord:
        """A bug in the driver while running this job: keep the traceback, record F134."""
        error_log = self.out(DRIVER_ERROR)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            error_log.write_text(trace, encoding="utf-8")
        except OSError:
            log.error("job %s: driver failure, and its traceback could not be saved:\n%s", self.name, trace)
        log.debug("job %s: driver failure:\n%s", self.name, trace)
        last = one_line(trace.strip().splitlines()[-1]) if trace.strip() else "unknown error"
        record = diagnostic_pb2.JobRecord(
            job=self.name, index=self.index, tool=self.tool, status=STATUS_FAILED
        )
        record.diagnostic.CopyFrom(
            self._driver_diagnostic(
                "F134", f"job {self.name} failed inside the ncc driver ({last})", DRIVER_TOOL
            )
        )
        write_message_json(self.record_path, record)
        return record


_TASKS: dict[str, type[ToolJob]] = {}


def task_class_of(name: str) -> type[ToolJob]:
    """The Luigi task class of job `name`, made from its JobSpec the first time it is asked for:
    named like its spec (Luigi's task family, the job's name)."""
    if name not in _TASKS:
        spec = JobRegistry.spec(name)
        namespace = {"__module__": __name__, "__doc__": spec.__doc__}
        _TASKS[name] = type(ToolJob)(spec.__name__, (spec, ToolJob), namespace)
    return _TASKS[name]
