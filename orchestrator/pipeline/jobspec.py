"""JobSpec: what one job of a compile is, independent of how it is scheduled.

A spec knows its tool, its input and output files, its flags, its folder in the work directory,
its cache key, whether the record on disk says it is done, and how to restore its outputs from
the stage cache. It imports no Luigi: `ncc compile` uses specs directly to finish a compile whose
every job is complete or cached without starting Luigi or a child process (CompileCommand.
restoreWithoutTools), and ToolJob (job.py) is the Luigi task that adds running the tool.

The stages (stages.py) are JobSpec subclasses; their attributes (workdir, model, pipeline,
compile_flags, optlevel, walrus_passes, penguin_passes, num_stages, run_id, cache_dir) are Luigi
parameters on a ToolJob and plain attributes on a spec made by `JobSpec.standalone(**parameters)`.
"""

from __future__ import annotations

import abc
import hashlib
import json
import logging
import shlex
import socket
import stat
import time
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import ClassVar

from ncc.orchestrator import digests
from ncc.orchestrator.config import settings
from ncc.orchestrator.diagnostics import NccDiagnostic
from ncc.orchestrator.options import DEFAULT_LOOPS
from ncc.orchestrator.pipeline.stage_cache import HIT, StageCache
from ncc.orchestrator.pipeline.workdir import (
    CMD,
    DIAGNOSTIC,
    DRIVER_ERROR,
    RECORD,
    STDERR,
    STDOUT,
    job_dir_name,
    read_job_record,
    write_message_json,
)
from ncc.orchestrator.versions import tool_version
from ncc.schemas import diagnostic_pb2

log = logging.getLogger("ncc")

STATUS_OK = "ok"
STATUS_FAILED = "failed"
DRIVER_TOOL = "ncc"  # Diagnostic.tool of a failure of the driver itself while running a job


def host_resource() -> str:
    """The Luigi resource that caps the memory of concurrent jobs on this machine (in MB)."""
    return f"mem_mb@{socket.gethostname()}"


def diagnostic_from_record(record: diagnostic_pb2.JobRecord, workdir: Path) -> NccDiagnostic:
    """The user-facing diagnostic of a failed job, rebuilt from its record on disk."""
    job_dir = workdir / job_dir_name(record.index, record.job)
    log_name = DRIVER_ERROR if record.diagnostic.tool == DRIVER_TOOL else STDERR
    return NccDiagnostic(
        code=record.diagnostic.code or "F134",
        message=record.diagnostic.message or f"job {record.job} failed without a message",
        job=record.job,
        workdir=workdir,
        log=job_dir / log_name,
        location=record.diagnostic.location,
    )


class JobSpec(abc.ABC):
    """One stage of the pipeline; subclasses say which tool, which files and which flags."""

    tool: ClassVar[str]  # package under ncc.tools
    output_names: ClassVar[tuple[str, ...]]

    # Set as Luigi parameters (ToolJob) or by standalone().
    workdir: str
    model: str
    pipeline: Sequence[str]
    compile_flags: Sequence[str]
    optlevel: int
    walrus_passes: str
    penguin_passes: str
    num_stages: int
    loops: str
    verify_inputs: str
    run_id: str
    cache_dir: str

    _DEFAULTS: ClassVar[dict[str, object]] = {
        "optlevel": 2,
        "walrus_passes": "",
        "penguin_passes": "",
        "num_stages": 0,
        "loops": DEFAULT_LOOPS,
        "verify_inputs": "",
        "run_id": "",
        "cache_dir": "",
    }

    @classmethod
    def standalone(cls, **parameters: object) -> JobSpec:
        """A spec outside Luigi, from the same parameters a ToolJob takes (others are ignored)."""
        spec = object.__new__(cls)
        values = {**cls._DEFAULTS, **parameters}
        for key in ("workdir", "model", "pipeline", "compile_flags", *cls._DEFAULTS):
            setattr(spec, key, values[key])
        return spec

    # -- what subclasses define ---------------------------------------------------------------

    @abc.abstractmethod
    def input_paths(self) -> list[Path]:
        """The files the tool reads (the model, or outputs of earlier jobs)."""

    @abc.abstractmethod
    def flags(self) -> list[str]:
        """The tool's flags other than file paths; they enter the cache key."""

    @abc.abstractmethod
    def tool_arguments(self) -> list[str]:
        """The tool's full argument list, except --diagnostics which every job adds."""

    # -- layout -------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return type(self).__name__

    # Cached: a job's parameters never change once it exists, and these are asked for on
    # every file the job touches (a fully cached farm spends its time here and in the kernel).
    @cached_property
    def root(self) -> Path:
        return Path(self.workdir)

    @cached_property
    def index(self) -> int:
        return list(self.pipeline).index(self.name)

    @cached_property
    def directory(self) -> Path:
        return self.root / job_dir_name(self.index, self.name)

    @property
    def record_path(self) -> Path:
        return self.directory / RECORD

    def out(self, name: str) -> Path:
        return self.directory / name

    def output_paths(self) -> list[Path]:
        return [self.out(name) for name in self.output_names]

    def artifact(self, job: str, name: str) -> Path:
        """A file written by an earlier job of this pipeline."""
        pipeline = list(self.pipeline)
        if job not in pipeline:
            raise KeyError(f"job {self.name} needs {name} from job {job}, which is not in the pipeline")
        return self.root / job_dir_name(pipeline.index(job), job) / name

    def rel(self, path: Path) -> str:
        """How a path appears on the tool's command line (the tool runs in the work directory)."""
        return digests.relative_to_workdir(path, self.root)

    def command(self) -> list[str]:
        return [
            *settings().tool_command(self.tool),
            *self.tool_arguments(),
            "--diagnostics",
            self.rel(self.out(DIAGNOSTIC)),
        ]

    def cache_key(self, inputs: Sequence[diagnostic_pb2.FileDigest]) -> str:
        identity = {
            "tool": self.tool,
            "version": tool_version(self.tool),
            "flags": self.flags(),
            "inputs": [item.sha256 for item in inputs],
        }
        return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()

    # -- what the disk says ---------------------------------------------------------------------

    def recorded_complete(self) -> bool:
        """This job's own record says ok and its inputs, outputs and cache key still hold
        (the upstream jobs are the caller's to check)."""
        record = read_job_record(self.record_path)
        if (
            record is None
            or record.status != STATUS_OK
            or record.job != self.name
            or record.index != self.index
        ):
            return False
        if not self._all_match(record.outputs, self.output_paths()):
            return False
        if not self._all_match(record.inputs, self.input_paths()):
            return False
        return record.cache_key == self.cache_key(record.inputs)

    def _all_match(self, recorded: Sequence[diagnostic_pb2.FileDigest], paths: list[Path]) -> bool:
        return len(recorded) == len(paths) and all(
            digests.matches(item, path, self.root) for item, path in zip(recorded, paths, strict=True)
        )

    # -- starting a run ---------------------------------------------------------------------------

    def _begin(
        self, inputs: list[diagnostic_pb2.FileDigest] | None = None
    ) -> tuple[list[diagnostic_pb2.FileDigest], list[str], str]:
        """Clear what an earlier attempt left: the input digests (`inputs` if already taken), the
        command and the cache key of this attempt (a tool run and a cache restore start alike)."""
        self._prepare()
        if inputs is None:
            inputs = [digests.file_digest(path, self.root) for path in self.input_paths()]
        return inputs, self.command(), self.cache_key(inputs)

    def _prepare(self) -> None:
        """Make the folder and remove what an earlier attempt left (the record first)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for name in (RECORD, DIAGNOSTIC, DRIVER_ERROR, STDOUT, STDERR, *self.output_names):
            self.out(name).unlink(missing_ok=True)

    def _write_replay_script(self, argv: Sequence[str]) -> None:
        script = self.out(CMD)
        script.write_text(
            "#!/bin/sh\n"
            f"# Replays job {self.name} of an ncc compile: the exact command the driver ran.\n"
            f"cd {shlex.quote(str(self.root))} && exec {shlex.join(argv)}\n",
            encoding="utf-8",
        )
        script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)

    # -- the stage cache ------------------------------------------------------------------------

    def _stage_cache(self) -> StageCache | None:
        """The stage cache, unless none was given or a test injects faults into the tools (a
        faulty tool's output must never be shared)."""
        if not self.cache_dir or settings().fault_injection:
            return None
        return StageCache(Path(self.cache_dir))

    def _restore_from_cache(
        self, cache: StageCache, argv: list[str], inputs: list[diagnostic_pb2.FileDigest], key: str
    ) -> tuple[str, diagnostic_pb2.JobRecord | None]:
        """The lookup's outcome, and on a hit the record of this job with its outputs restored."""
        started = time.monotonic()
        lookup = cache.restore(key, self.name, self.output_names, self.directory)
        if lookup != HIT:
            return lookup, None
        # No stdout.log or stderr.log: the tool did not run, and the record says where the outputs
        # came from (creating files is most of a restore's cost).
        self._write_replay_script(argv)
        record = diagnostic_pb2.JobRecord(
            job=self.name,
            index=self.index,
            command=argv,
            tool=self.tool,
            tool_version=tool_version(self.tool),
            wall_s=time.monotonic() - started,
            inputs=inputs,
            outputs=[digests.file_digest(path, self.root) for path in self.output_paths()],
            status=STATUS_OK,
            cache_key=key,
            cached=True,
            cache_lookup=HIT,
        )
        # Not fsynced, like the restored outputs: a record lost in a crash only means restoring
        # again, and one whose outputs were lost no longer matches their digests.
        write_message_json(self.record_path, record, durable=False)
        return lookup, record

    def _store_in_cache(self, cache: StageCache, key: str) -> str:
        """Store this job's outputs; why they could not be stored, or "" (a full or read-only
        cache costs reuse, never the compile: the summary warns instead)."""
        try:
            cache.store(key, self.name, self.tool, tool_version(self.tool), self.output_paths())
        except OSError as err:
            log.warning("job %s: not stored in the stage cache %s: %s", self.name, cache.root, err)
            return err.strerror or str(err)
        return ""

    def restore_without_tool(self) -> diagnostic_pb2.JobRecord | None:
        """Outside Luigi: make this job complete from the stage cache if its entry is there, with
        the folder and record a ToolJob run leaves; its record, or None when there is no cache,
        no entry for its key or a corrupt one (then the job is left for a real run)."""
        cache = self._stage_cache()
        if cache is None:
            return None
        inputs = [digests.file_digest(path, self.root) for path in self.input_paths()]
        key = self.cache_key(inputs)
        if not cache.entry_dir(key).is_dir():
            return None
        inputs, argv, key = self._begin(inputs)
        return self._restore_from_cache(cache, argv, inputs, key)[1]

    def _deterministic_failure(self) -> diagnostic_pb2.JobRecord | None:
        """The record of an earlier run that rejected these very inputs with a compile error (an
        E-code from the tool), if there is one: same tool version, flags and inputs give the same
        error, so a retry or a rerun reports it again without running the tool."""
        record = read_job_record(self.record_path)
        if record is None or record.status != STATUS_FAILED or record.diagnostic.tool == DRIVER_TOOL:
            return None
        if not record.diagnostic.code.startswith("E"):
            return None
        if not self._all_match(record.inputs, self.input_paths()):
            return None
        return record if record.cache_key == self.cache_key(record.inputs) else None
