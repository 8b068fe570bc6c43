"""A compile farm: many models' pipelines as one Luigi task graph, run by one or many workers.

Each model becomes the job chain `ncc compile` would run (CompileCommand builds it), in a work
directory under the farm dir that is named by content: the digest of the model's bytes and of its
canonical flags. So the same model listed twice, or compiled by two workers on two machines that
share the farm dir, is one set of Luigi tasks with one set of task ids: the scheduler runs each job
once. Inputs are copied into the farm dir (`inputs/<digest>/<name>`), so every worker names them
by the same path.

Layout of a farm dir:
    inputs/<digest>/<name>      the models, content-addressed
    work/<digest>-<flags>/      one compile work directory per (model, flags)
    neff/<name>.neff            the NEFF of every model that compiled

Scheduling is Luigi's: the embedded local scheduler by default, or a `luigid` given by URL that
any number of `ncc farm` processes join. Retries are Luigi's (a task's `retry_count`, the
scheduler's `retry_delay`), memory caps are Luigi resources (`mem_mb@<host>`, so they bind per
machine), and workers keep alive while any task of the farm is pending anywhere.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ncc.orchestrator import digests
from ncc.orchestrator.diagnostics import NccDiagnostic, NccError
from ncc.orchestrator.farm.model import FarmInput, FarmModel
from ncc.orchestrator.options import CompileOptions
from ncc.orchestrator.pipeline.compile_command import CompileCommand
from ncc.orchestrator.pipeline.jobspec import STATUS_FAILED, STATUS_OK, diagnostic_from_record, host_resource
from ncc.orchestrator.pipeline.registry import JobRegistry
from ncc.orchestrator.pipeline.run_settings import record_run_settings
from ncc.orchestrator.pipeline.stage_cache import CORRUPT, StageCache
from ncc.orchestrator.pipeline.workdir import RECORD, WorkDir, read_job_record
from ncc.tools.common.protoio import write_bytes_atomic

if TYPE_CHECKING:
    from ncc.orchestrator.farm.progress import Progress

log = logging.getLogger("ncc")

MODEL_SUFFIXES = (".hlo.pb", ".hlo")


def model_suffix(path: Path) -> str | None:
    return next((s for s in MODEL_SUFFIXES if path.name.endswith(s)), None)


def _manifest_lines(manifest: Path) -> list[FarmInput]:
    """`path [flags...]` per line; blank lines and `#` comments skipped; paths relative to the manifest."""
    found = []
    try:
        text = manifest.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise NccError.of("U001", f"cannot read manifest {manifest}: {err}") from None
    for number, line in enumerate(text.splitlines(), 1):
        try:
            words = shlex.split(line, comments=True)
        except ValueError as err:
            raise NccError.of("U002", f"manifest {manifest} line {number}: {err}") from None
        if not words:
            continue
        path = Path(
            os.path.abspath(Path(words[0]) if Path(words[0]).is_absolute() else manifest.parent / words[0])
        )
        if not path.is_file():
            raise NccError.of(
                "U001",
                f"manifest {manifest} line {number}: model file not found: {path} (an input that is not "
                "a .hlo.pb or .hlo file is read as a manifest: a model path and its flags per line)",
            )
        found.append(FarmInput(path, tuple(words[1:])))
    return found


def collect_inputs(arguments: Iterable[Path]) -> list[FarmInput]:
    """Model files, folders of them (`*.hlo.pb`, and `*.hlo` without a `.hlo.pb` twin) and manifests."""
    found: list[FarmInput] = []
    for argument in arguments:
        path = Path(os.path.abspath(argument))
        if path.is_dir():
            models = sorted(p for p in path.iterdir() if p.is_file() and model_suffix(p))
            names = {p.name for p in models}
            found.extend(
                FarmInput(p) for p in models if not (p.name.endswith(".hlo") and f"{p.name}.pb" in names)
            )
        elif path.is_file() and model_suffix(path):
            found.append(FarmInput(path))
        elif path.is_file():
            found.extend(_manifest_lines(path))
        else:
            raise NccError.of("U001", f"farm input not found: {path}")
    for item in found:
        if not item.path.is_file():
            raise NccError.of("U001", f"model file not found: {item.path}")
    if not found:
        raise NccError.of("U001", "no models to compile (no .hlo.pb or .hlo file in the inputs)")
    return found


def _flags_digest(flags: Sequence[str]) -> str:
    return hashlib.sha256(json.dumps(list(flags)).encode()).hexdigest()[:8]


def _content_copy(path: Path, inputs_dir: Path) -> Path:
    """The model's content-addressed copy in the farm dir (made once, atomically; other workers
    may be writing the same copy at the same moment, so their temporaries are not copies)."""
    digest = digests.sha256_file(path)
    folder = inputs_dir / digest[:16]
    existing = sorted(p for p in folder.iterdir() if not p.name.startswith(".")) if folder.is_dir() else []
    if existing:
        return existing[0]
    target = folder / path.name
    folder.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(target, path.read_bytes())
    return target


@dataclass(frozen=True)
class FarmSettings:
    farm_dir: Path
    workers: int = 1
    scheduler_url: str = ""
    cache_dir: Path | None = None
    mem_per_job_mb: int | None = None
    retries: int = 0
    retry_delay_s: float = 1.0
    base: CompileOptions | None = None  # flags every model gets unless its manifest line says otherwise


def plan(
    inputs: Sequence[FarmInput], settings: FarmSettings, parse_flags: Callable[[Sequence[str]], dict]
) -> list[FarmModel]:
    """One FarmModel per distinct (content, flags); duplicates join the first."""
    inputs_dir = settings.farm_dir / "inputs"
    models: dict[tuple[str, str], FarmModel] = {}
    base = settings.base
    assert base is not None
    for item in inputs:
        overrides = parse_flags(item.flags) if item.flags else {}
        copy = _content_copy(item.path, inputs_dir)
        options = replace(base, model=copy, **overrides)
        flags = options.canonical_flags()
        key = (copy.parent.name, _flags_digest(flags))
        if key in models:
            models[key].inputs.append(item)
            continue
        workdir = settings.farm_dir / "work" / f"{key[0]}-{key[1]}"
        options = replace(options, workdir=workdir, cache_dir=settings.cache_dir)
        command = CompileCommand(options)
        models[key] = FarmModel([item], options, command, command.buildPipeline())
    planned = list(models.values())
    stems = [_stem(model.inputs[0].path) for model in planned]
    for model, stem in zip(planned, stems, strict=True):
        unique = stems.count(stem) == 1
        model.neff_name = f"{stem}.neff" if unique else f"{stem}-{model.workdir.name}.neff"
        # The NEFF goes straight to the farm's neff/ (the work dir keeps the Packager's copy).
        model.options = replace(model.options, output=settings.farm_dir / "neff" / model.neff_name)
        model.command.options = model.options
    return planned


def _stem(path: Path) -> str:
    return path.name[: -len(model_suffix(path) or "")]


# -- outcome ------------------------------------------------------------------------------------


@dataclass
class JobOutcome:
    name: str
    wall_s: float
    peak_rss_mb: float
    cached: bool
    ran_here: bool  # run (or restored) by this farm process, not found complete
    cache_lookup: str  # "hit", "miss", "corrupt" or "" (no cache)
    cache_not_stored: str = ""  # why its outputs could not be stored in the stage cache, if so


@dataclass
class ModelOutcome:
    model: FarmModel
    status: str
    jobs: list[JobOutcome] = field(default_factory=list)
    diagnostic: NccDiagnostic | None = None
    neff: Path | None = None

    @property
    def wall_s(self) -> float:
        return sum(job.wall_s for job in self.jobs if job.ran_here)

    def report_entries(self) -> list[dict[str, object]]:
        """One report entry per input line that asked for this model."""
        jobs = [
            {
                "name": job.name,
                "wall_s": round(job.wall_s, 4),
                "peak_rss_mb": round(job.peak_rss_mb, 1),
                "cached": job.cached or not job.ran_here,
                "cache_lookup": job.cache_lookup if job.ran_here else "",
            }
            for job in self.jobs
        ]
        entries = []
        for item in self.model.inputs:
            entry: dict[str, object] = {
                "input": str(item.path),
                "flags": self.model.options.canonical_flags(),
                "status": self.status,
                "wall_s": round(self.wall_s, 4),
                "workdir": str(self.model.workdir),
                "jobs": jobs,
            }
            if self.neff is not None:
                entry["neff"] = str(self.neff)
            if self.diagnostic is not None:
                entry["code"] = self.diagnostic.code
                entry["message"] = self.diagnostic.line()
            entries.append(entry)
        return entries


def pipeline_complete(model: FarmModel) -> bool:
    """Every job of the model is complete by its record (what ToolJob.complete() checks, without Luigi)."""
    parameters = model.command.jobParameters(model.jobs)
    return all(JobRegistry.spec(name).standalone(**parameters).recorded_complete() for name in model.jobs)


def outcomes(
    models: Sequence[FarmModel], settings: FarmSettings, run_id: str, cache_mark: int
) -> list[ModelOutcome]:
    """Every model's outcome; NEFFs of the models that compiled installed under the farm's neff/."""
    corrupt = StageCache(settings.cache_dir).corrupt_keys(cache_mark) if settings.cache_dir else set()
    return [model_outcome(model, run_id, corrupt) for model in models]


def restore_without_tools(models: Sequence[FarmModel], run_id: str, threads: int = 2) -> list[FarmModel]:
    """Finish every model whose jobs are all complete or cached without Luigi or a tool (as
    `ncc compile` does); the models left for Luigi. Models are independent (each its own work
    dir), and restoring is mostly waiting for the disk, so two threads overlap it (measured:
    more threads only queue on the GIL and the file system's locks, 4 were 30 % slower than 2)."""

    def restore(model: FarmModel) -> None:
        model.workdir.mkdir(parents=True, exist_ok=True)
        model.command.run_id = run_id
        try:
            model.restored = model.command.restoreWithoutTools() is not None
        except (OSError, NccError):
            model.restored = False

    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        list(pool.map(restore, models))
    return [model for model in models if not model.restored]


def _ended_by(workdir: WorkDir, run_id: str) -> dict[str, dict]:
    """The job_end event of each job this farm process ran (or restored), by job name."""
    return {
        str(event.get("job")): event
        for event in workdir.read_history()
        if event.get("event") == "job_end" and event.get("run_id") == run_id
    }


def model_outcome(model: FarmModel, run_id: str, corrupt_keys: set[str]) -> ModelOutcome:
    """Read what happened to one model from its job records (`corrupt_keys`: cache entries found
    corrupt during the farm, whichever process found them)."""
    workdir = WorkDir(model.workdir)
    ended = _ended_by(workdir, run_id)
    outcome = ModelOutcome(model, STATUS_OK)
    for index, name in enumerate(model.jobs):
        record = read_job_record(workdir.job_dir(index, name) / RECORD)
        if record is None:
            outcome.status = STATUS_FAILED
            break
        outcome.jobs.append(
            JobOutcome(
                name,
                record.wall_s,
                record.peak_rss_bytes / (1 << 20),
                record.cached,
                name in ended,
                CORRUPT if record.cache_key in corrupt_keys else record.cache_lookup,
                str(ended.get(name, {}).get("cache_not_stored", "")),
            )
        )
        if record.status != STATUS_OK:
            outcome.status = STATUS_FAILED
            outcome.diagnostic = diagnostic_from_record(record, model.workdir)
            break
    if outcome.status == STATUS_OK and not model.restored and not pipeline_complete(model):
        outcome.status = STATUS_FAILED
    if outcome.status == STATUS_FAILED and outcome.diagnostic is None:
        outcome.diagnostic = NccDiagnostic(
            "F134",
            "the farm ended before this model's pipeline completed (a job was never run: "
            "a worker died or the scheduler gave up on it)",
            workdir=model.workdir,
            log=workdir.driver_log,
        )
    if outcome.status == STATUS_OK:
        outcome.neff = model.options.output
        try:
            if not model.restored:
                model.command.installOutput(model.jobs)
        except NccError as err:
            outcome.status, outcome.diagnostic, outcome.neff = STATUS_FAILED, err.diagnostic, None
    return outcome


# -- running ------------------------------------------------------------------------------------


def host_memory_mb() -> int:
    """This machine's memory: the capacity of its `mem_mb@<host>` resource."""
    import psutil

    return int(psutil.virtual_memory().total / (1 << 20))


def configure_luigi(settings: FarmSettings) -> None:
    """Worker and scheduler settings a farm relies on (after luigi_setup.isolate_config)."""
    from luigi.configuration import get_config
    from luigi.parameter import UnconsumedParameterWarning

    # rpc-retry-* are read by Luigi's RPC client, not by its [core] task: Luigi would warn.
    warnings.filterwarnings("ignore", category=UnconsumedParameterWarning)
    config = get_config()
    values = {
        # Ride out a luigid restart of up to a minute instead of Luigi's default 3 tries 30 s apart.
        "core": {"rpc-retry-attempts": "60", "rpc-retry-wait": "1"},
        "worker": {
            "keep_alive": "true",
            "ping_interval": "1.0",
            "wait_interval": "0.2",
            "wait_jitter": "0.2",
        },
        "scheduler": {"retry_delay": str(settings.retry_delay_s), "retry_count": str(settings.retries + 1)},
    }
    if settings.mem_per_job_mb:
        values["resources"] = {host_resource(): str(host_memory_mb())}
    for section, items in values.items():
        if not config.has_section(section):
            config.add_section(section)
        for key, value in items.items():
            config.set(section, key, value)


def run_farm(
    models: Sequence[FarmModel], settings: FarmSettings, run_id: str, progress: Progress | None
) -> None:
    """Prepare every work dir and let Luigi run every incomplete job of every model."""
    import luigi

    from ncc.orchestrator.pipeline.job import task_class_of

    tasks = []
    for model in models:
        model.workdir.mkdir(parents=True, exist_ok=True)
        model.command.run_id = run_id
        model.command.prepareWorkDir(model.command.pipelineRecord(model.jobs))
        record_run_settings(model.options, run_id)  # limits and environment, for `ncc triage`
        parameters = model.command.jobParameters(model.jobs)
        parameters["retries"] = settings.retries
        parameters["resources_mb"] = settings.mem_per_job_mb or 0
        parameters["model_priority"] = model.input_bytes
        tasks.append(task_class_of(model.jobs[-1])(**parameters))
    if settings.scheduler_url and settings.mem_per_job_mb:
        from luigi.rpc import RemoteScheduler

        RemoteScheduler(settings.scheduler_url).update_resource(host_resource(), host_memory_mb())
    if progress is not None:
        progress.start()
    try:
        kwargs: dict[str, object] = {"workers": settings.workers, "detailed_summary": True}
        if settings.scheduler_url:
            kwargs["scheduler_url"] = settings.scheduler_url
        else:
            kwargs["local_scheduler"] = True
        result = luigi.build(tasks, **kwargs)
        log.info("luigi: %s", result.one_line_summary)
        if settings.scheduler_url:
            _wait_for_other_workers(tasks, settings.scheduler_url, kwargs)
    finally:
        if progress is not None:
            progress.stop()


def _chain(task: object) -> list[object]:
    """A model's final job and every job it requires."""
    found, pending = [], [task]
    while pending:
        job = pending.pop()
        found.append(job)
        pending.extend(job.requires())  # type: ignore[attr-defined]
    return found


_UNFINISHED = ("RUNNING", "PENDING", "FAILED")  # FAILED with retries left; out of retries is DISABLED


def _wait_for_other_workers(
    tasks: Sequence[object], scheduler_url: str, build_kwargs: dict[str, object]
) -> None:
    """Stay until no job of our models is running, pending or awaiting a retry anywhere.

    A Luigi worker leaves once nothing is pending, even while another worker still runs a job our
    models need, and a job of a worker that died becomes pending again only after luigid notices
    (worker_disconnect_delay) and its retry_delay passes. So: while luigid lists such a job, wait,
    and build again, which runs whatever became pending (a dead worker's job) here.
    """
    import luigi
    from luigi.rpc import RemoteScheduler

    scheduler = RemoteScheduler(scheduler_url)
    while True:
        incomplete = [task for task in tasks if not task.complete()]  # type: ignore[attr-defined]
        if not incomplete:
            return
        ours = {job.task_id for task in incomplete for job in _chain(task)}  # type: ignore[attr-defined]
        unfinished: set[str] = set()
        for status in _UNFINISHED:
            unfinished.update(scheduler.task_list(status, "") or {})
        if not ours & unfinished:
            return
        time.sleep(1.0)
        luigi.build(incomplete, **build_kwargs)
