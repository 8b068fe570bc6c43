"""Crash triage: what failed in a work directory or a farm, why, where, and how to replay it.

Everything is read from what a compile leaves on disk, nothing is rerun:
* the job records (`NN_Job/record.json`): the job, its diagnostic (F-code or the tool's E-code),
  exit status or signal, peak RSS, wall time, the exact command;
* the job's log: the last pass a tool with a pass manager logged as started (tools/common/passlog.py:
  the pass that was running), the top frames of the Python stack a crash printed (faulthandler) or
  of a traceback, and the last lines;
* run_settings.json (ncc.orchestrator.pipeline.run_settings): the --timeout and --mem-limit the job ran
  under and the allow-listed environment, for the run whose id history.jsonl gives the job;
* for a compile whose driver died rather than a job: driver_result.json or driver.stderr.log.

A failure's *signature* is (job, code, pass, the top frames of its stack, or for a kill the limit
that caused it): the same bug in two hundred models of a farm is one bucket. Buckets are listed
largest first, each with one representative (`cmd_triage` prints them, `triage_bundle` packs one
into a reproducer).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
from dataclasses import dataclass, field
from pathlib import Path

from ncc.orchestrator.diagnostics import NccDiagnostic, NccError
from ncc.orchestrator.pipeline.jobspec import DRIVER_TOOL, STATUS_OK, diagnostic_from_record
from ncc.orchestrator.pipeline.process_end import (
    KILLED_FOR_MEMORY,
    KILLED_FOR_TIMEOUT,
    MB,
    ProcessEnd,
    killed_for_in,
    signal_name,
)
from ncc.orchestrator.pipeline.workdir import CMD, RECORD, STDERR, WorkDir, job_dir_name, read_job_record
from ncc.schemas import diagnostic_pb2
from ncc.tools.common.passlog import last_pass_start

DRIVER_JOB = "driver"
TAIL_LINES = 15
TOP_FRAMES = 3
_LOG_TAIL_BYTES = 256 << 10  # what is read of a log: its end (a crash's stack is at the end)
_JOB_DIR = re.compile(r"^(\d{2})_([A-Za-z][A-Za-z0-9]*)$")
# A Python traceback frame ("line N, in f") and a faulthandler frame ("line N in f").
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line \d+,? in (?P<func>\S+)')
_FATAL = re.compile(r"^Fatal Python error: (?P<what>.+)$")
_SIGNAL_OF_FATAL = {"Segmentation fault": ("F139", "SIGSEGV"), "Aborted": ("F134", "SIGABRT")}
_MEM_LIMIT = re.compile(r"\(limit (\d+) MB")
_TIMEOUT = re.compile(r"time limit of ([0-9.]+) s")


@dataclass
class Failure:
    """One failed compile: the job that failed and everything known about how."""

    workdir: Path
    model: str
    job: str
    code: str
    message: str
    exit_code: int | None = None
    signal: str | None = None
    pass_label: str | None = None
    pass_position: str | None = None  # "6 of 10"
    peak_rss_mb: float | None = None
    mem_limit_mb: int | None = None
    wall_s: float | None = None
    timeout_s: float | None = None
    limits_known: bool = False  # mem_limit_mb / timeout_s None means "none set", not "unknown"
    killed_for: str = ""  # KILLED_FOR_MEMORY / KILLED_FOR_TIMEOUT: ncc killed it at a limit
    log: Path | None = None
    last_lines: list[str] = field(default_factory=list)
    frames: list[str] = field(default_factory=list)  # innermost first, "folder/file.py:function"
    exception: str = ""  # the exception type of a traceback
    replay: str = ""  # the exact command that reruns the job (or the compile, for the driver)
    env: dict[str, str] = field(default_factory=dict)  # the allow-listed environment it ran with
    record: diagnostic_pb2.JobRecord | None = None
    job_dir: Path | None = None

    @property
    def model_name(self) -> str:
        return Path(self.model).name if self.model else self.workdir.name

    def signature(self) -> str:
        """job | code | pass | what identifies the bug within them."""
        if self.frames:
            detail = " < ".join(self.frames[:TOP_FRAMES])
        elif self.killed_for == KILLED_FOR_MEMORY:
            detail = "killed at --mem-limit"
        elif self.killed_for == KILLED_FOR_TIMEOUT:
            detail = "killed at --timeout"
        else:
            detail = self.signal or "no stack"
        return f"{self.job} | {self.code or '?'} | pass {self.pass_label or '-'} | {detail}"

    def to_json(self) -> dict[str, object]:
        return {
            "workdir": str(self.workdir),
            "model": self.model,
            "job": self.job,
            "code": self.code,
            "message": self.message,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "pass": self.pass_label,
            "pass_position": self.pass_position,
            "peak_rss_mb": None if self.peak_rss_mb is None else round(self.peak_rss_mb, 1),
            "mem_limit_mb": self.mem_limit_mb,
            "wall_s": None if self.wall_s is None else round(self.wall_s, 3),
            "timeout_s": self.timeout_s,
            "limits_known": self.limits_known,
            "killed_for": self.killed_for or None,
            "log": str(self.log) if self.log else None,
            "last_lines": self.last_lines,
            "frames": self.frames,
            "exception": self.exception or None,
            "signature": self.signature(),
            "replay": self.replay,
        }


@dataclass
class Bucket:
    signature: str
    members: list[Failure]

    @property
    def representative(self) -> Failure:
        return self.members[0]

    def to_json(self) -> dict[str, object]:
        return {
            "signature": self.signature,
            "count": len(self.members),
            "members": [str(member.workdir) for member in self.members],
            "models": [member.model_name for member in self.members],
            "representative": str(self.representative.workdir),
        }


@dataclass
class Triage:
    """The outcome of triaging one work dir or a farm."""

    path: Path
    kind: str  # "workdir" or "farm"
    compiles: int
    failures: list[Failure]
    unfinished: list[Path]  # work dirs whose compile neither finished nor left a failure
    damaged: list[Path] = field(default_factory=list)  # job records there that cannot be read

    @property
    def buckets(self) -> list[Bucket]:
        groups: dict[str, list[Failure]] = {}
        for failure in self.failures:
            groups.setdefault(failure.signature(), []).append(failure)
        buckets = [
            Bucket(signature, sorted(members, key=lambda f: (f.model_name, str(f.workdir))))
            for signature, members in groups.items()
        ]
        return sorted(buckets, key=lambda b: (-len(b.members), b.signature))

    def to_json(self) -> dict[str, object]:
        return {
            "path": str(self.path),
            "kind": self.kind,
            "compiles": self.compiles,
            "failed": len(self.failures),
            "unfinished": [str(path) for path in self.unfinished],
            "damaged_records": [str(path) for path in self.damaged],
            "failures": [failure.to_json() for failure in self.failures],
            "buckets": [bucket.to_json() for bucket in self.buckets],
        }


# -- finding work dirs ----------------------------------------------------------------------------


_WORKDIR_FILES = ("pipeline.json", "driver.stderr.log", "driver_result.json", "run_settings.json")


def is_workdir(path: Path) -> bool:
    """A folder an ncc compile made: pipeline.json or the driver's files (a compile whose driver
    died before it wrote its pipeline), or a job folder with a record or cmd.sh."""
    if not path.is_dir():
        return False
    if any((path / name).is_file() for name in _WORKDIR_FILES):
        return True
    try:
        entries = list(path.iterdir())
    except OSError:
        return False
    return any(
        _JOB_DIR.match(entry.name) and ((entry / RECORD).is_file() or (entry / CMD).is_file())
        for entry in entries
    )


def _workdirs_under(folder: Path) -> list[Path]:
    try:
        return sorted(entry for entry in folder.iterdir() if is_workdir(entry))
    except OSError:
        return []


def triage(path: Path) -> Triage:
    """Triage a work dir, a farm dir (its `work/` folder), or any folder of work dirs."""
    path = Path(os.path.abspath(path))
    if not path.exists():
        raise NccError.of("U001", f"no such work directory or farm directory: {path}")
    if not path.is_dir():
        raise NccError.of("U014", f"not a directory, so neither a work directory nor a farm: {path}")
    if is_workdir(path):
        failure, unfinished = triage_workdir(path)
        damaged = damaged_records(path) if unfinished else []
        return Triage(path, "workdir", 1, [failure] if failure else [], [path] if unfinished else [], damaged)
    workdirs = _workdirs_under(path / "work") or _workdirs_under(path)
    if not workdirs:
        raise NccError.of(
            "U014",
            f"{path} is neither an ncc work directory (no pipeline.json, no NN_Job/ folders) nor a farm "
            "directory (no work/ folder of them)",
        )
    failures, unfinished, damaged = [], [], []
    for workdir in workdirs:
        failure, not_done = triage_workdir(workdir)
        if failure is not None:
            failures.append(failure)
        elif not_done:
            unfinished.append(workdir)
            damaged += damaged_records(workdir)
    return Triage(path, "farm", len(workdirs), failures, unfinished, damaged)


# -- one work dir ---------------------------------------------------------------------------------


def _jobs(workdir: WorkDir) -> list[str]:
    pipeline = workdir.read_pipeline()
    if pipeline is not None and pipeline.jobs:
        return list(pipeline.jobs)
    found = sorted(
        (int(match.group(1)), match.group(2))
        for entry in workdir.root.iterdir()
        if (match := _JOB_DIR.match(entry.name)) and entry.is_dir()
    )
    return [name for _, name in found]


def damaged_records(root: Path) -> list[Path]:
    """The job records of the work dir `root` that exist but cannot be read (a disk error, a hand
    edit): the compile may well have finished, and a resume recomputes those jobs."""
    workdir = WorkDir(root)
    paths = [workdir.job_dir(index, name) / RECORD for index, name in enumerate(_jobs(workdir))]
    return [path for path in paths if path.is_file() and read_job_record(path) is None]


def triage_workdir(root: Path) -> tuple[Failure | None, bool]:
    """The failure of the compile in `root`, if it failed, and whether it is unfinished without
    one (running, or stopped without a trace: a SIGKILL to ncc, a machine that went down)."""
    workdir = WorkDir(root)
    pipeline = workdir.read_pipeline()
    model = pipeline.input_path if pipeline is not None else ""
    jobs = _jobs(workdir)
    for index, name in enumerate(jobs):
        record = read_job_record(workdir.job_dir(index, name) / RECORD)
        if record is None:
            break
        if record.status != STATUS_OK:
            return _job_failure(workdir, model, index, name, record), False
    else:
        if jobs:
            return None, False
    driver = _driver_failure(workdir, model)
    return driver, driver is None


def _job_failure(
    workdir: WorkDir, model: str, index: int, name: str, record: diagnostic_pb2.JobRecord
) -> Failure:
    diagnostic = diagnostic_from_record(record, workdir.root)
    job_dir = workdir.job_dir(index, name)
    ran_tool = record.diagnostic.tool != DRIVER_TOOL
    failure = Failure(
        workdir=workdir.root,
        model=model,
        job=name,
        code=diagnostic.code,
        message=diagnostic.line(),
        exit_code=record.exit_code if ran_tool else None,
        peak_rss_mb=record.peak_rss_bytes / MB if ran_tool else None,
        wall_s=record.wall_s if ran_tool else None,
        killed_for=killed_for_in(record.diagnostic.message),
        log=diagnostic.log,
        record=record,
        job_dir=job_dir,
    )
    if ran_tool:
        number = ProcessEnd(record.exit_code).signal_number
        failure.signal = signal_name(number) if number is not None else None
    _limits(failure, workdir, name, record.diagnostic.message)
    text = _read_tail(diagnostic.log)
    stderr = text if diagnostic.log == job_dir / STDERR else _read_tail(job_dir / STDERR)
    started = last_pass_start(stderr)
    if started is not None:
        failure.pass_label, failure.pass_position = started.label, f"{started.index} of {started.total}"
    _stack(failure, text)
    command = list(record.command) or _command_of_replay_script(job_dir / CMD)
    if command:
        prefix = " ".join(f"{key}={shlex.quote(value)}" for key, value in failure.env.items())
        failure.replay = f"cd {shlex.quote(str(workdir.root))} && {prefix + ' ' if prefix else ''}"
        failure.replay += shlex.join(command)
    return failure


def _command_of_replay_script(path: Path) -> list[str]:
    """The command of a job's cmd.sh (`cd DIR && exec COMMAND`), when its record has none."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    for line in lines:
        if "&& exec " in line:
            try:
                return shlex.split(line.split("&& exec ", 1)[1])
            except ValueError:
                return []
    return []


def _limits(failure: Failure, workdir: WorkDir, job: str, message: str) -> None:
    """The limits and environment the job ran under: run_settings.json of the run that ran it
    (its id on the job's last job_end in history.jsonl), else what the diagnostic says."""
    settings = workdir.read_run_settings()
    run_id = ""
    for event in workdir.read_history():
        if event.get("event") == "job_end" and event.get("job") == job:
            run_id = str(event.get("run_id", ""))
    if settings is not None and run_id and settings.get("run_id") == run_id:
        timeout, mem = settings.get("timeout_s"), settings.get("mem_limit_mb")
        failure.timeout_s = float(timeout) if isinstance(timeout, (int, float)) else None
        failure.mem_limit_mb = int(mem) if isinstance(mem, (int, float)) else None
        env = settings.get("env")
        failure.env = {str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}
        failure.limits_known = True
        return
    if match := _MEM_LIMIT.search(message):
        failure.mem_limit_mb = int(match.group(1))
    if match := _TIMEOUT.search(message):
        failure.timeout_s = float(match.group(1))


def _read_tail(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        with open(path, "rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - _LOG_TAIL_BYTES))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def _frame_name(path: str, func: str) -> str:
    parts = Path(path).parts
    return f"{'/'.join(parts[-2:])}:{func}"


def _stack(failure: Failure, text: str) -> None:
    """The last lines of the log, the top frames of the crash's stack and the exception type."""
    lines = text.splitlines()
    failure.last_lines = [line.rstrip() for line in lines[-TAIL_LINES:]]
    # faulthandler (a fatal signal): the current thread's frames, innermost first.
    fatal = [i for i, line in enumerate(lines) if _FATAL.match(line)]
    if fatal:
        frames, current = [], False
        for line in lines[fatal[-1] + 1 :]:
            if line.startswith("Current thread ") or line.startswith("Thread "):
                if frames:
                    break
                current = line.startswith("Current thread ")
                continue
            match = _FRAME.match(line)
            if match and current:
                frames.append(_frame_name(match["path"], match["func"]))
        failure.frames = frames
        return
    # A Python traceback (exit 3, a driver bug): the last one, innermost frame last.
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if not starts:
        return
    frames = []
    for line in lines[starts[-1] + 1 :]:
        match = _FRAME.match(line)
        if match:
            frames.append(_frame_name(match["path"], match["func"]))
        elif line and not line[0].isspace():
            failure.exception = line.split(":", 1)[0].strip()
            break
    failure.frames = frames[::-1]


def _driver_failure(workdir: WorkDir, model: str) -> Failure | None:
    """The compile stopped before its jobs finished, without a failed job: what its driver left
    (driver_result.json's diagnostic, or a fatal error in driver.stderr.log) from this compile."""
    try:
        started = workdir.pipeline_path.stat().st_mtime - 1.0
    except OSError:
        started = 0.0
    settings = workdir.read_run_settings() or {}
    command, env = settings.get("command"), settings.get("env")
    command = [str(word) for word in command] if isinstance(command, list) else []
    replay = shlex.join(command)
    if replay and isinstance(env, dict) and env:
        replay = " ".join(f"{key}={shlex.quote(str(value))}" for key, value in env.items()) + " " + replay
    if not model and command[:2] == ["ncc", "compile"] and len(command) > 2:
        model = command[2]  # the driver died before it wrote pipeline.json
    failure: Failure | None = None
    result = _fresh_json(workdir.driver_result, started)
    if isinstance(result, dict) and isinstance(result.get("diagnostic"), dict):
        diagnostic = NccDiagnostic.from_json(result["diagnostic"])
        failure = Failure(
            workdir.root, model, DRIVER_JOB, diagnostic.code, diagnostic.line(), log=diagnostic.log
        )
        failure.exit_code = result.get("exit_code") if isinstance(result.get("exit_code"), int) else None
    else:
        text = _read_tail(workdir.driver_stderr) if _is_fresh(workdir.driver_stderr, started) else ""
        fatal = [match["what"] for line in text.splitlines() if (match := _FATAL.match(line))]
        if not fatal:
            return None
        code, sig = _SIGNAL_OF_FATAL.get(fatal[-1].strip(), ("F134", None))
        message = NccDiagnostic(
            code,
            f"job driver (the ncc compile child process) died: Fatal Python error: {fatal[-1]}",
            workdir=workdir.root,
            log=workdir.driver_stderr,
        ).line()
        failure = Failure(
            workdir.root, model, DRIVER_JOB, code, message, signal=sig, log=workdir.driver_stderr
        )
        if sig is not None:
            failure.exit_code = -int(signal.Signals[sig])
    failure.replay = replay
    _stack(failure, _read_tail(failure.log))
    return failure


def _is_fresh(path: Path, since: float) -> bool:
    try:
        return path.stat().st_mtime >= since
    except OSError:
        return False


def _fresh_json(path: Path, since: float) -> object:
    if not _is_fresh(path, since):
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def job_folder(failure: Failure) -> str:
    """`NN_Job` of a job failure (for messages)."""
    if failure.record is None:
        return failure.job
    return job_dir_name(failure.record.index, failure.record.job)
