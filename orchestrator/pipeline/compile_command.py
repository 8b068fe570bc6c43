"""CompileCommand: one `ncc compile` as a pipeline of jobs run by Luigi in a work directory.

    buildPipeline() = collectFrontendPipeline() + collectWalrusPipeline() + collectBackendPipeline()

is a flat list of job names (data, printed in logs and recorded in pipeline.json); JobRegistry
turns the last one into a Luigi task whose requirements chain back to the first, and
runPipeline() lets Luigi run whatever is not complete yet. A work directory left by a compile
of another input or job list is stale and is cleared first; otherwise it is resumed, and each
job's cache key (which holds its flags) decides whether it reruns. On success the NEFF is copied
from the Packager's folder to --output atomically.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass, field

from ncc.orchestrator import digests
from ncc.orchestrator.config import settings
from ncc.orchestrator.diagnostics import NccDiagnostic, NccError
from ncc.orchestrator.options import CompileOptions
from ncc.orchestrator.outputs import OutputError, write_output
from ncc.orchestrator.pipeline.diskspace import looks_full, no_space_message
from ncc.orchestrator.pipeline.jobspec import STATUS_FAILED, diagnostic_from_record
from ncc.orchestrator.pipeline.registry import JobRegistry
from ncc.orchestrator.pipeline.stages import NEFF_NAME
from ncc.orchestrator.pipeline.workdir import RECORD, WorkDir, read_job_record
from ncc.orchestrator.versions import ncc_version, tool_version
from ncc.schemas import diagnostic_pb2

log = logging.getLogger("ncc")

_SUCCESS = ("SUCCESS", "SUCCESS_WITH_RETRY")


@dataclass
class CompileSummary:
    """What a finished compile reports to the parent process (and `--verbose`)."""

    output: str
    workdir: str
    jobs: list[str]
    jobs_run: list[str] = field(default_factory=list)
    jobs_cached: list[str] = field(default_factory=list)  # of jobs_run: restored from the stage cache
    cache_not_stored: list[tuple[str, str]] = field(default_factory=list)  # (job, why the cache refused it)
    stale_removed: list[str] = field(default_factory=list)
    wall_s: float = 0.0

    def to_json(self) -> dict[str, object]:
        return asdict(self)


class CompileCommand:
    def __init__(self, options: CompileOptions) -> None:
        self.options = options
        self.workdir = WorkDir(options.workdir)
        self.run_id = os.urandom(6).hex()

    # -- the pipeline -------------------------------------------------------------------------

    def collectFrontendPipeline(self) -> list[str]:  # noqa: N802 (the production driver's names)
        """Lower first (F0), evaluate the golden outputs (F1, --verify), then optimize (F2)."""
        return ["HLOToTensorizer", *(["GoldenEvaluator"] if self.options.verify else []), "Frontend"]

    def collectWalrusPipeline(self) -> list[str]:  # noqa: N802
        """One job; its pass list travels as --walrus-passes."""
        return ["WalrusDriver"]

    def collectBackendPipeline(self) -> list[str]:  # noqa: N802
        """Package the NEFF, then execute it against the golden outputs (--verify)."""
        return ["Packager", *(["NeffVerifier"] if self.options.verify else [])]

    def buildPipeline(self) -> list[str]:  # noqa: N802
        return self.collectFrontendPipeline() + self.collectWalrusPipeline() + self.collectBackendPipeline()

    # -- the work directory -------------------------------------------------------------------

    def pipelineRecord(self, jobs: list[str]) -> diagnostic_pb2.PipelineRecord:  # noqa: N802
        tools = sorted({JobRegistry.spec(job).tool for job in jobs})
        return diagnostic_pb2.PipelineRecord(
            jobs=jobs,
            flags=self.options.canonical_flags(),
            ncc_version=ncc_version(),
            input_path=str(self.options.model),
            input_sha256=digests.sha256_file(self.options.model),
            versions={"ncc": ncc_version(), **{tool: tool_version(tool) for tool in tools}},
        )

    def prepareWorkDir(self, wanted: diagnostic_pb2.PipelineRecord) -> list[str]:  # noqa: N802
        """Clear the work directory if its content was made for another job list or input.

        Tool versions are not compared here: a changed tool changes its jobs' cache keys, so
        exactly those jobs and the ones after them rerun.
        """
        recorded = self.workdir.read_pipeline()
        # Other flags alone do not make the folder stale: each job's cache key holds the flags it
        # depends on, so exactly the jobs a flag changes (and those after them) rerun.
        same = (
            recorded is not None
            and list(recorded.jobs) == list(wanted.jobs)
            and recorded.input_sha256 == wanted.input_sha256
        )
        removed: list[str] = []
        if not same:
            removed = self.workdir.remove_job_dirs(JobRegistry.names())
            if removed:
                log.info("work dir %s was made for another compile; removed %s", self.workdir.root, removed)
        self.workdir.write_pipeline(wanted)
        return removed

    # -- running ------------------------------------------------------------------------------

    def jobParameters(self, jobs: list[str]) -> dict[str, object]:  # noqa: N802
        return {
            "workdir": str(self.workdir.root),
            "model": str(self.options.model),
            "pipeline": jobs,
            "compile_flags": self.options.canonical_flags(),
            "optlevel": self.options.optlevel,
            "walrus_passes": ",".join(self.options.walrus_passes),
            "penguin_passes": ",".join(self.options.penguin_passes),
            "num_stages": self.options.num_stages,
            "loops": self.options.loops,
            "verify_inputs": str(self.options.verify_inputs or ""),
            "run_id": self.run_id,
            "timeout_s": self.options.timeout_s,
            "mem_limit_mb": self.options.mem_limit_mb,
            "cache_dir": str(self.options.cache_dir or ""),
        }

    def runPipeline(self, jobs: list[str]) -> None:  # noqa: N802
        """Run every incomplete job with Luigi; raise NccError with the failed job's diagnostic."""
        import luigi

        from ncc.orchestrator.pipeline.job import task_class_of

        started = time.time()
        final = task_class_of(jobs[-1])(**self.jobParameters(jobs))
        result = luigi.build([final], local_scheduler=True, detailed_summary=True, workers=1)
        log.debug("luigi status %s: %s", result.status.name, result.one_line_summary)
        if result.status.name in _SUCCESS and final.complete():
            return
        raise NccError(self._failure(jobs, started, result.status.name))

    def _failure(self, jobs: list[str], started: float, status: str) -> NccDiagnostic:
        """The diagnostic of the first job that failed in this run, from its record on disk; or,
        when none did, that the model changed under the compile (Luigi then finds a finished job
        incomplete again and refuses to run the next: "unfulfilled dependency")."""
        changed = self._model_changed()
        if changed:
            return NccDiagnostic("U010", changed, workdir=self.workdir.root, log=self.workdir.driver_log)
        if looks_full(self.workdir.root):
            return NccDiagnostic("U011", no_space_message(self.workdir.root), workdir=self.workdir.root)
        for index, name in enumerate(jobs):
            path = self.workdir.job_dir(index, name) / RECORD
            record = read_job_record(path)
            # File times come from a coarse clock: allow a second of slack around the start.
            if (
                record is not None
                and record.status == STATUS_FAILED
                and path.stat().st_mtime >= started - 1.0
            ):
                return diagnostic_from_record(record, self.workdir.root)
        return NccDiagnostic(
            "F134",
            f"job driver: the compile pipeline ended with Luigi status {status} but no job recorded "
            "a failure (a driver bug)",
            job="driver",
            workdir=self.workdir.root,
            log=self.workdir.driver_log,
        )

    def _model_changed(self) -> str:
        """Why the model is no longer the one this compile started from ('' if it still is)."""
        recorded = self.workdir.read_pipeline()
        if recorded is None:
            return ""
        try:
            now = digests.sha256_file(self.options.model)
        except OSError:
            return f"the model {self.options.model} disappeared while it was being compiled"
        if now != recorded.input_sha256:
            return f"the model {self.options.model} changed while it was being compiled; compile it again"
        return ""

    def installOutput(self, jobs: list[str]) -> None:  # noqa: N802
        """Copy the NEFF to --output, all or nothing (ncc.orchestrator.outputs: a device is written
        through, a symlink followed)."""
        source = self.workdir.job_dir(jobs.index("Packager"), "Packager") / NEFF_NAME
        target = self.options.output
        try:
            write_output(target, source=source)
        except (OutputError, OSError) as err:
            message = f"cannot write output {target}: {err}"
            raise NccError.of("U005", message, workdir=self.workdir.root) from None

    def restoreWithoutTools(self) -> CompileSummary | None:  # noqa: N802
        """Finish the compile without Luigi and without running any tool, when every job is
        complete in the work dir or restorable from the stage cache; else None.

        Why: a farm of thousands of small modules, most of them cached, should spend its time
        compiling, not starting interpreters and importing Luigi. Jobs restored before a miss stay
        restored (the real run then finds them complete). Never used while faults are injected.
        """
        if settings().fault_injection:
            return None
        started = time.monotonic()
        jobs = self.buildPipeline()
        removed = self.prepareWorkDir(self.pipelineRecord(jobs))
        parameters = self.jobParameters(jobs)
        restored: list[diagnostic_pb2.JobRecord] = []
        finished = False
        try:
            for name in jobs:
                spec = JobRegistry.spec(name).standalone(**parameters)
                if spec.recorded_complete():
                    continue
                record = spec.restore_without_tool()
                if record is None:
                    return None
                restored.append(record)
            self.installOutput(jobs)
            finished = True
        finally:
            if restored or finished:
                self._record_restored(jobs, restored)
        names = [record.job for record in restored]
        return CompileSummary(
            output=str(self.options.output),
            workdir=str(self.workdir.root),
            jobs=jobs,
            jobs_run=names,
            jobs_cached=names,
            stale_removed=removed,
            wall_s=time.monotonic() - started,
        )

    def _record_restored(self, jobs: list[str], restored: list[diagnostic_pb2.JobRecord]) -> None:
        """History of what restoreWithoutTools did, as one compile (also when it stopped early)."""
        events: list[tuple[str, dict[str, object]]] = [
            ("compile_start", {"run_id": self.run_id, "jobs": jobs, "without_tools": True})
        ]
        for record in restored:
            fields = {
                "job": record.job,
                "run_id": self.run_id,
                "status": record.status,
                "wall_s": record.wall_s,
                "cached": True,
            }
            events += [("job_start", fields), ("job_end", fields)]
        events.append(("compile_end", {"run_id": self.run_id}))
        self.workdir.append_history_events(events)

    def execute(self) -> CompileSummary:
        """Prepare the work directory, run the pipeline, install the NEFF."""
        started = time.monotonic()
        jobs = self.buildPipeline()
        log.info(
            "ncc %s compile %s: pipeline %s, flags %s, work dir %s",
            ncc_version(),
            self.options.model,
            jobs,
            self.options.canonical_flags(),
            self.workdir.root,
        )
        removed = self.prepareWorkDir(self.pipelineRecord(jobs))
        self.workdir.append_history("compile_start", run_id=self.run_id, jobs=jobs)
        try:
            self.runPipeline(jobs)
            self.installOutput(jobs)
        finally:
            self.workdir.append_history("compile_end", run_id=self.run_id)
        ended = [
            event
            for event in self.workdir.read_history()
            if event.get("event") == "job_end" and event.get("run_id") == self.run_id
        ]
        ran = [str(event["job"]) for event in ended]
        return CompileSummary(
            output=str(self.options.output),
            workdir=str(self.workdir.root),
            jobs=jobs,
            jobs_run=ran,
            jobs_cached=[str(event["job"]) for event in ended if event.get("cached")],
            cache_not_stored=[
                (str(event["job"]), str(event["cache_not_stored"]))
                for event in ended
                if event.get("cache_not_stored")
            ],
            stale_removed=removed,
            wall_s=time.monotonic() - started,
        )
