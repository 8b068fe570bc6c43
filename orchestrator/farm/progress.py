"""The live view of a farm: models done / ok / cached / failed, jobs running, elapsed, ETA.

It reads the work dirs' files (history.jsonl and job records), not Luigi's events, so it sees
jobs whichever process runs them: this one, Luigi's forked task processes, or another machine's
worker on a shared farm dir.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TextIO

from ncc.orchestrator.farm.model import FarmModel
from ncc.orchestrator.pipeline.jobspec import STATUS_FAILED, STATUS_OK
from ncc.orchestrator.pipeline.workdir import RECORD, WorkDir, read_job_record


class Progress:
    """Models done / failed / cached, jobs running, elapsed and ETA, from the work dirs' files.

    On a terminal one status line is redrawn in place; otherwise a plain line is printed each time
    a model finishes. Polling files (not Luigi events) works whichever process runs a job.
    """

    def __init__(
        self, models: Sequence[FarmModel], run_id: str, stream: TextIO, interval_s: float = 0.5
    ) -> None:
        self.models = models
        self.run_id = run_id
        self.stream = stream
        self.interval_s = interval_s
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.started = time.monotonic()
        self.finished: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._poll()
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._poll()

    def _state(self, model: FarmModel) -> tuple[str, int]:
        """('ok' | 'cached' | 'failed' | 'pending', jobs running now) of one model."""
        workdir = WorkDir(model.workdir)
        events = [e for e in workdir.read_history() if e.get("event") in ("job_start", "job_end")]
        running: set[str] = set()
        any_ran = False
        for event in events:
            if event.get("event") == "job_start":
                running.add(str(event.get("job")))
            else:
                running.discard(str(event.get("job")))
                any_ran |= event.get("run_id") == self.run_id and not event.get("cached")
        last = len(model.jobs) - 1
        final = read_job_record(workdir.job_dir(last, model.jobs[last]) / RECORD)
        if final is not None and final.status == STATUS_OK:
            return ("ok" if any_ran else "cached"), 0
        for index, name in enumerate(model.jobs):
            record = read_job_record(workdir.job_dir(index, name) / RECORD)
            if record is not None and record.status == STATUS_FAILED and name not in running:
                return "failed", 0
        return "pending", len(running)

    def _poll(self) -> None:
        running = 0
        for number, model in enumerate(self.models):
            if number in self.finished and self.finished[number] != "failed":
                continue
            state, jobs = self._state(model)
            running += jobs
            if state != "pending" and self.finished.get(number) != state:
                self.finished[number] = state
                if not self.tty:
                    elapsed = time.monotonic() - self.started
                    self.stream.write(
                        f"ncc farm: [{len(self.finished)}/{len(self.models)}] {model.inputs[0].path.name}: "
                        f"{state} ({elapsed:.1f} s)\n"
                    )
        if self.tty:
            self.stream.write("\r\033[K" + self.line(running))
        self.stream.flush()

    def line(self, running: int) -> str:
        counts = {
            state: sum(1 for s in self.finished.values() if s == state)
            for state in ("ok", "cached", "failed")
        }
        done = len(self.finished)
        elapsed = time.monotonic() - self.started
        eta = (
            f", ETA {elapsed / done * (len(self.models) - done):.0f} s" if 0 < done < len(self.models) else ""
        )
        return (
            f"ncc farm: {done}/{len(self.models)} models (ok {counts['ok']}, cached {counts['cached']}, "
            f"failed {counts['failed']}), {running} jobs running, {elapsed:.0f} s elapsed{eta}"
        )
