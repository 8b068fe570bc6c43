"""The work directory of one compile: its layout, its records, its lock and its history.

Layout (docs/diagnostics.md shows an example):
    pipeline.json          PipelineRecord: jobs, canonical flags, input digest, versions
    NN_JobName/            one folder per job in pipeline order (01_HLOToTensorizer, ...)
        cmd.sh             replays the job by hand
        stdout.log, stderr.log (none for a job restored from the stage cache: no tool ran)
        record.json        JobRecord, written last and atomically: its presence with status
                           "ok" is what makes a job complete
        <outputs>          the files the tool wrote
    history.jsonl          one line per job run and per compile (what ran when)
    driver.log             the compile child's log (Luigi's log, progress, tracebacks)
    driver.stderr.log      anything else the compile child printed (a crash's stack)
    driver_result.json     the compile child's result for the parent process
    run_settings.json      how the last compile that ran tools ran them: its run id, --timeout and
                           --mem-limit, the allow-listed environment (config.REPLAY_ENV) and the
                           `ncc compile` command that reruns it (read by `ncc triage`)
    .ncc.lock              held while a compile runs, so two compiles never share a work dir
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from google.protobuf import json_format
from google.protobuf.message import Message

from ncc.orchestrator.diagnostics import NccError
from ncc.schemas import diagnostic_pb2
from ncc.tools.common.protoio import write_bytes_atomic

RECORD = "record.json"
CMD = "cmd.sh"
STDOUT = "stdout.log"
STDERR = "stderr.log"
DIAGNOSTIC = "diagnostic.pb"
DRIVER_ERROR = "driver_error.log"  # a traceback of the driver's own failure while running a job
_JOB_DIR = re.compile(r"^\d{2}_[A-Za-z][A-Za-z0-9]*$")


def job_dir_name(index: int, job: str) -> str:
    return f"{index + 1:02d}_{job}"


def write_json_atomic(path: Path, data: object) -> None:
    write_bytes_atomic(path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())


def write_message_json(path: Path, message: Message, durable: bool = True) -> None:
    """A record as JSON, every field spelled out (an exit code of 0 is shown, not omitted)."""
    text = json_format.MessageToJson(
        message,
        preserving_proto_field_name=True,
        indent=1,
        sort_keys=True,
        always_print_fields_with_no_presence=True,
    )
    write_bytes_atomic(path, (text + "\n").encode(), durable)


def read_message_json(path: Path, message: Message) -> bool:
    """Fill `message` from a JSON file; False if it is missing or unreadable in any way."""
    try:
        json_format.Parse(path.read_text(encoding="utf-8"), message)
    except (OSError, ValueError, json_format.ParseError):
        return False
    return True


def read_job_record(path: Path) -> diagnostic_pb2.JobRecord | None:
    record = diagnostic_pb2.JobRecord()
    return record if read_message_json(path, record) else None


@dataclass(frozen=True)
class WorkDir:
    root: Path

    @property
    def pipeline_path(self) -> Path:
        return self.root / "pipeline.json"

    @property
    def history_path(self) -> Path:
        return self.root / "history.jsonl"

    @property
    def driver_log(self) -> Path:
        return self.root / "driver.log"

    @property
    def driver_stderr(self) -> Path:
        return self.root / "driver.stderr.log"

    @property
    def driver_result(self) -> Path:
        return self.root / "driver_result.json"

    @property
    def run_settings_path(self) -> Path:
        return self.root / "run_settings.json"

    def job_dir(self, index: int, job: str) -> Path:
        return self.root / job_dir_name(index, job)

    # -- creation and exclusive use -----------------------------------------------------------

    def ensure_usable(self) -> None:
        """Create the directory and prove it is writable, or raise [U003]."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, probe = tempfile.mkstemp(prefix=".ncc-probe-", dir=self.root)
            os.close(fd)
            os.unlink(probe)
        except OSError as err:
            reason = err.strerror or type(err).__name__
            raise NccError.of("U003", f"cannot use work directory {self.root}: {reason}") from None

    @contextmanager
    def locked(self) -> Iterator[int]:
        """Hold the work directory's lock, or raise [U006] if another ncc holds it.

        Yields the lock's file descriptor: a child process that inherits it holds the lock too
        (flock belongs to the open file), so the lock lasts until the last holder exits."""
        path = self.root / ".ncc.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise NccError.of("U003", f"cannot lock work directory {self.root}: {err.strerror}") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                raise NccError.of(
                    "U006", f"work directory {self.root} is in use by another ncc (pid {holder})"
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            yield fd
        finally:
            os.close(fd)  # closing releases the lock

    # -- records ------------------------------------------------------------------------------

    def read_pipeline(self) -> diagnostic_pb2.PipelineRecord | None:
        record = diagnostic_pb2.PipelineRecord()
        return record if read_message_json(self.pipeline_path, record) else None

    def write_pipeline(self, record: diagnostic_pb2.PipelineRecord) -> None:
        write_message_json(self.pipeline_path, record)

    def write_run_settings(
        self,
        run_id: str,
        *,
        timeout_s: float | None,
        mem_limit_mb: int | None,
        env: dict[str, str],
        command: list[str],
    ) -> None:
        """Record how this run starts its tools (the job records say what they did, not under
        which limits and environment). Written atomically; the last run to start wins, and its
        run id says which jobs it ran (history.jsonl)."""
        write_json_atomic(
            self.run_settings_path,
            {
                "run_id": run_id,
                "time": time.time(),
                "timeout_s": timeout_s,
                "mem_limit_mb": mem_limit_mb,
                "env": dict(sorted(env.items())),
                "command": command,
            },
        )

    def read_run_settings(self) -> dict[str, object] | None:
        try:
            data = json.loads(self.run_settings_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def remove_job_dirs(self, job_names: Iterable[str]) -> list[str]:
        """Delete the job folders of an earlier compile (stale results of other flags or input).

        Only folders ncc made are touched: named `NN_Job` for a job in `job_names`, holding a
        cmd.sh or a record.json. A user's own `01_Notes/` in a --workdir they chose stays. Each
        folder loses its record first, so an interruption half-way leaves incomplete jobs, never
        a complete-looking partial one.
        """
        known = set(job_names)
        removed = []
        for entry in sorted(self.root.iterdir()):
            named_like_a_job = _JOB_DIR.match(entry.name) and entry.name.split("_", 1)[1] in known
            if not (named_like_a_job and entry.is_dir() and not entry.is_symlink()):
                continue
            if not ((entry / CMD).is_file() or (entry / RECORD).is_file()):
                continue  # not made by ncc
            (entry / RECORD).unlink(missing_ok=True)
            shutil.rmtree(entry)
            removed.append(entry.name)
        return removed

    def append_history(self, event: str, **fields: object) -> None:
        """Append one JSON line (a single write, so concurrent appends never interleave)."""
        self.append_history_events([(event, fields)])

    def append_history_events(self, events: Sequence[tuple[str, Mapping[str, object]]]) -> None:
        """Append one JSON line per (event, fields), all in a single write."""
        now = time.time()
        text = "".join(json.dumps({"event": e, "time": now, **f}, sort_keys=True) + "\n" for e, f in events)
        fd = os.open(self.history_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    def _history_lines(self) -> tuple[list[dict[str, object]], int]:
        """The readable events of history.jsonl, and how many lines were not (bad bytes, cut
        lines, anything but a JSON object)."""
        try:
            data = self.history_path.read_bytes()
        except OSError:
            return [], 0
        events: list[dict[str, object]] = []
        damaged = 0
        for line in data.splitlines():
            if not line.strip():
                continue
            try:
                event = json.loads(line.decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                damaged += 1
                continue
            if isinstance(event, dict):
                events.append(event)
            else:
                damaged += 1
        return events, damaged

    def read_history(self) -> list[dict[str, object]]:
        return self._history_lines()[0]

    def repair_history(self) -> int:
        """If history.jsonl has unreadable lines, keep the damaged file beside it as
        history.jsonl.damaged and rewrite it with the readable events; the number of lines lost."""
        events, damaged = self._history_lines()
        if damaged:
            os.replace(self.history_path, self.history_path.with_name("history.jsonl.damaged"))
            text = "".join(json.dumps(event, sort_keys=True) + "\n" for event in events)
            write_bytes_atomic(self.history_path, text.encode())
        return damaged
