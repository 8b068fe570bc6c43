"""Delta debugging of an HLO module (`ncc reduce`), in the manner of C-Reduce and llvm-reduce.

A reduction keeps the smallest module found so far that is still *interesting* and tries to make
it smaller with the edits of `reduce_edits` (instructions, outputs, merge, shapes), each kind in
turn, over and over until a whole round of them changes nothing:

* a chunked kind (instructions, outputs) is delta debugging: its targets cut into halves,
  quarters, ... down to single targets, each chunk tried in order; a chunk whose removal keeps
  the module interesting is removed and the sweep goes on at the same chunk size from there;
* the others try one target at a time.

Every candidate is normalized, must be smaller than the current module (fewer instructions, or
as many with fewer array elements), and must pass ncc's own verifier (`tools/hlo/hlo_verify.py`,
imported as a library: reduce is no compile path, and a verifier process per candidate would cost
more than most tests) before it is tried; an invalid one is counted and never run.

Interestingness is a test (`ScriptTest`: the user's script exits 0 on the candidate's file;
`CompileTest`: `ncc compile` of the candidate, with the flags and allow-listed environment of a
failed compile, fails in the same job with the same triage signature). Candidates run in parallel,
up to `jobs` at once, each in its own folder under a scratch directory and its own process group;
results are committed in candidate order (the first interesting one wins, later ones still running
are stopped), so a reduction gives the same module whatever the parallelism. A module already
judged is not run again.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ncc.orchestrator.pipeline.diskspace import scratch_write_error
from ncc.orchestrator.triage.reduce_edits import (
    EDITS,
    Candidate,
    Edit,
    cleanup,
    element_total,
    instruction_count,
)
from ncc.schemas import hlo_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.hlo.hlo_printer import print_module
from ncc.tools.hlo.hlo_verify import verify_module

Module = hlo_pb2.HloModuleProto
STOP_GRACE_S = 5.0  # a stopped test gets SIGTERM, then SIGKILL after this long


@dataclass(frozen=True)
class Verdict:
    interesting: bool
    detail: str  # what the test saw, in words (for the first test's diagnostic)
    timed_out: bool = False


class Process:
    """One test run's process group, started by the reducer and stoppable from another thread.

    Only the thread running it signals the group, and only before it has reaped the group's
    leader, so a signal never reaches a process that merely reused the number."""

    POLL_S = 0.2

    def __init__(self) -> None:
        self._stop = threading.Event()
        self.timed_out = False

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def run(self, argv: list[str], cwd: Path, env: dict[str, str] | None, timeout: float) -> int | None:
        """Run `argv` to its end; its exit status (negative: a signal), or None when it ran out of
        time or was stopped (SIGTERM to its process group, SIGKILL after STOP_GRACE_S)."""
        if self.stopped:
            return None
        with open(cwd / "test.stdout.log", "wb") as out, open(cwd / "test.stderr.log", "wb") as err:
            proc = subprocess.Popen(
                argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        terminated_at: float | None = None
        try:
            while True:
                try:
                    status = proc.wait(timeout=self.POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                now = time.monotonic()
                if now >= deadline:
                    self.timed_out = True
                    _signal_group(proc, signal.SIGKILL)
                elif self.stopped and terminated_at is None:
                    terminated_at = now
                    _signal_group(proc, signal.SIGTERM)
                elif terminated_at is not None and now - terminated_at >= STOP_GRACE_S:
                    _signal_group(proc, signal.SIGKILL)
        except BaseException:  # Ctrl-C in the thread running it: the test must not outlive ncc
            _signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
            raise
        return None if self.stopped or self.timed_out else status


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the group the test started in (start_new_session), leader not reaped
    except (ProcessLookupError, PermissionError):
        pass


class Test(Protocol):
    """What makes a candidate interesting."""

    def describe(self) -> str: ...

    def file_name(self) -> str: ...

    def write(self, module: Module, path: Path) -> None: ...

    def check(self, path: Path, process: Process, timeout: float) -> Verdict: ...


@dataclass
class Step:
    description: str
    edit: str
    before: int
    after: int
    seconds: float  # since the reduction started


@dataclass
class Stats:
    tried: int = 0  # candidates run through the test
    interesting: int = 0
    invalid: int = 0  # refused by the verifier, never run
    duplicates: int = 0  # judged before, not run again
    stopped: int = 0  # run, then stopped because an earlier candidate was interesting
    timed_out: int = 0
    steps: list[Step] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "tried": self.tried,
            "interesting": self.interesting,
            "invalid": self.invalid,
            "duplicates": self.duplicates,
            "stopped": self.stopped,
            "timed_out": self.timed_out,
            "steps": [
                {"edit": s.edit, "description": s.description, "before": s.before, "after": s.after,
                 "seconds": round(s.seconds, 3)}
                for s in self.steps
            ],
        }


def _fingerprint(module: Module) -> str:
    return hashlib.sha256(module.SerializeToString(deterministic=True)).hexdigest()


def _chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


class Reducer:
    """Shrinks `best` (read it when done, or after an interruption) while `test` holds."""

    def __init__(
        self,
        test: Test,
        module: Module,
        scratch: Path,
        jobs: int,
        timeout: float,
        log: Callable[[str], None] = print,
    ) -> None:
        self.test = test
        self.best = module
        self.best_size = instruction_count(module)
        self.best_elements = element_total(module)
        self.scratch = scratch
        self.jobs = max(1, jobs)
        self.timeout = timeout
        self.log = log
        self.stats = Stats()
        self.started = time.monotonic()
        self._judged: dict[str, bool] = {}
        self._serials = itertools.count(1)
        self._pool = ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="ncc-reduce")
        self._running: dict[int, tuple[Future, Process, Candidate]] = {}

    # -- the reduction ----------------------------------------------------------------------------

    def reduce(self) -> Module:
        made = cleanup(self.best)
        if made is not None and self._smaller(made):
            self._search([made])
        changed = True
        while changed:
            changed = False
            for edit in EDITS:
                changed |= self._sweep(edit)
        return self.best

    def _sweep(self, edit: Edit) -> bool:
        """Delta debugging over the edit's targets (chunked), or one target at a time."""
        targets = edit.targets(self.best)
        if not targets:
            return False
        size = math.ceil(len(targets) / 2) if edit.chunked else 1
        changed = False
        while True:
            progressed = False
            start = 0
            chunks = _chunks(targets, size)
            while start < len(chunks):
                found = self._search(edit.make(self.best, chunk) for chunk in chunks[start:])
                if found is None:
                    break
                progressed = changed = True
                targets = edit.targets(self.best)
                chunks = _chunks(targets, size)
                start += found
            targets = edit.targets(self.best)
            if not targets or (size == 1 and (not progressed or not edit.chunked)):
                return changed
            size = max(1, math.ceil(size / 2))

    def _smaller(self, made: Candidate) -> bool:
        return (made.size, made.elements) < (self.best_size, self.best_elements)

    def _accept(self, made: Candidate) -> None:
        before = self.best_size
        self.best, self.best_size, self.best_elements = made.module, made.size, made.elements
        seconds = time.monotonic() - self.started
        self.stats.steps.append(Step(made.description, made.edit, before, made.size, seconds))
        self.log(
            f"step {len(self.stats.steps)}: {made.description}: {before} -> {made.size} instructions "
            f"[{seconds:.1f} s, {self.stats.tried} tried]"
        )

    # -- running candidates -----------------------------------------------------------------------

    def _valid(self, made: Candidate) -> bool:
        try:
            verify_module(made.module)
            print_module(made.module)
        except (CompileError, ValueError):
            self.stats.invalid += 1
            return False
        return True

    def _search(self, made: Iterable[Candidate | None]) -> int | None:
        """Try the candidates, up to `jobs` at once, and accept the first interesting one in
        their order; its index among `made`, or None when none is."""
        source = enumerate(made)
        pending: list[tuple[int, Candidate, str]] = []  # submitted or judged, in order
        verdicts: dict[int, bool] = {}
        exhausted = False
        try:
            while True:
                while not exhausted and len(self._running) < self.jobs:
                    item = next(source, None)
                    if item is None:
                        exhausted = True
                        break
                    index, candidate = item
                    if candidate is None or not self._smaller(candidate):
                        continue
                    key = _fingerprint(candidate.module)
                    if key in self._judged:
                        self.stats.duplicates += 1
                        if self._judged[key]:
                            pending.append((index, candidate, key))
                            verdicts[index] = True
                            break
                        continue
                    if not self._valid(candidate):
                        continue
                    pending.append((index, candidate, key))
                    process = Process()
                    future = self._pool.submit(self._check, candidate, process)
                    self._running[index] = (future, process, candidate)
                while pending and pending[0][0] in verdicts:
                    index, candidate, _ = pending.pop(0)
                    if verdicts[index]:
                        self._accept(candidate)
                        return index
                if not self._running:
                    if exhausted:
                        return None
                    continue
                wait([future for future, _, _ in self._running.values()], return_when=FIRST_COMPLETED)
                for index, (future, _, _) in list(self._running.items()):
                    if future.done():
                        del self._running[index]
                        verdict = future.result()
                        key = next(k for i, _, k in pending if i == index)
                        self._judged[key] = verdict.interesting
                        self.stats.tried += 1
                        self.stats.interesting += verdict.interesting
                        self.stats.timed_out += verdict.timed_out
                        verdicts[index] = verdict.interesting
        finally:
            self.stop()

    def stop(self) -> None:
        """Stop every test still running and wait for them (their results are not kept)."""
        running = list(self._running.values())
        self._running.clear()
        for _, process, _ in running:
            process.stop()
        for future, _, _ in running:
            try:
                future.result()
            except Exception:  # noqa: BLE001 - a stopped test's error says nothing about the candidate
                pass
            self.stats.stopped += 1

    def close(self) -> None:
        self.stop()
        self._pool.shutdown(wait=True)

    def _check(self, made: Candidate, process: Process) -> Verdict:
        folder = self.scratch / f"c{next(self._serials):05d}"
        try:
            folder.mkdir()
            path = folder / self.test.file_name()
            self.test.write(made.module, path)
            return self.test.check(path, process, self.timeout)
        except OSError as err:  # the scratch folder, not the candidate: stop with its diagnostic
            raise scratch_write_error(err, self.scratch) from None
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def check_file(self, write: Callable[[Path], None]) -> tuple[Verdict, float]:
        """Run the test once, in the foreground, on a file `write` makes (the original module)."""
        folder = self.scratch / f"c{next(self._serials):05d}"
        folder.mkdir()
        started = time.monotonic()
        try:
            path = folder / self.test.file_name()
            write(path)
            verdict = self.test.check(path, Process(), self.timeout)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return verdict, time.monotonic() - started
