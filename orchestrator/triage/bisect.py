"""Miscompile bisection: the first pass after which a compile's result stops matching the golden outputs.

In the manner of LLVM's -opt-bisect-limit, over the passes of a work dir's compile: the Frontend's
Penguin passes (as its recorded command ran them: `--penguin-passes`, or its log at its
--optlevel) followed by the WalrusDriver's pass list (`ncc-walrus-driver --print-pipeline` with
its recorded flags). State k is the program after the first k of these N passes; state 0 is the
Frontend's BIR with no Penguin pass. Each state is checked by running the tools, never by
importing them (docs/architecture.md):

  k <= Frontend passes   ncc-hlo-opt --penguin-passes <first k> (or none) → BIR, then
                         ncc-walrus-driver --walrus-passes bir_sim{golden=...,report=...}
  k >  Frontend passes   ncc-walrus-driver on the full Frontend's BIR with
                         --walrus-passes <first k - F walrus passes>,bir_sim{golden=...,report=...}

bir_sim's golden mode runs the program as it stands (with its semaphores once it has them, else
one instruction at a time in its current order, on its addresses once it has them) on the golden
inputs and compares with the golden outputs under --verify's tolerance. A state *matches* when it
does; it *differs* when an output differs, the simulator finds a race or a deadlock, or a
verifier pass in the prefix (birverifier, E410) rejects the program; any other failure of the
prefix (another E-code, a crash) is an *error*, which counts as not matching too: the pass found
is then where the compile starts to fail. Binary search (states 0 and N first) assumes a miscompile
persists through later passes; `linear=True` checks states 1, 2, ... and stops at the first that
does not match. The report names the pass, what its output does wrong, and the instruction where
the two states first part: the first instruction, in the order results landed after the pass,
whose result differs from the same instruction's (by name) before it, or the instructions of the
first race, or failing both the first instruction whose text the pass changed.

Everything a probe writes stays in WORKDIR/bisect/ (one folder per state: cmd.sh, logs, the
bir_sim report); golden.pb comes from the GoldenEvaluator job, or is computed there when the
compile ran without --verify.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf.message import DecodeError

from ncc.orchestrator.config import FAULT_ENV, settings
from ncc.orchestrator.diagnostics import NccError
from ncc.orchestrator.pipeline.diskspace import scratch_write_error
from ncc.orchestrator.pipeline.jobspec import STATUS_OK
from ncc.orchestrator.pipeline.process_end import classify_abnormal_end
from ncc.orchestrator.pipeline.stages import GOLDEN_SEED
from ncc.orchestrator.pipeline.supervisor import Limits, run_supervised
from ncc.orchestrator.pipeline.workdir import RECORD, WorkDir, job_dir_name, read_job_record
from ncc.orchestrator.triage.explain import is_workdir
from ncc.schemas import diagnostic_pb2
from ncc.tools.common.pipeline_text import split_pipeline

BISECT_DIR = "bisect"
_MARKER = ".ncc-bisect"  # says the folder is ours to clear
CONTEXT = 4  # instructions shown on each side of the one that differs
MATCHES, DIFFERS, ERROR = "matches", "differs", "error"
_PENGUIN_LOG = re.compile(r"^penguin-opt: (\w+): ", re.M)
_FRONTEND_FLAGS = ("--optlevel", "--num-stages", "--loops", "--target")
_WALRUS_FLAGS = ("--optlevel", "--target")
_CHECK_CODES = {"E410", "E411", "E412"}  # a verifier or the simulator judged the program wrong


@dataclass(frozen=True)
class Step:
    """One pass of the compile: the job that runs it and its place in that job's pipeline."""

    job: str  # "Frontend" or "WalrusDriver"
    text: str  # as its pipeline spells it, options included: "pre_sched{tries=4}"
    label: str  # its name, `#N` for its N-th run in the job's pipeline
    position: int  # 1-based within the job's pipeline
    total: int

    def describe(self) -> str:
        return f"{self.label} ({self.job} pass {self.position} of {self.total})"


@dataclass
class Probe:
    """The check of one state: the program after the first `state` passes."""

    state: int
    verdict: str  # MATCHES, DIFFERS or ERROR
    message: str  # why it differs, or the error; "" when it matches
    code: str = ""  # the diagnostic code of a state that does not match
    report: dict | None = None  # bir_sim's report (when bir_sim ran)
    directory: Path | None = None
    command: list[str] = field(default_factory=list)  # the check's command (run in the bisect dir)

    @property
    def matches(self) -> bool:
        return self.verdict == MATCHES


@dataclass
class Difference:
    """Where the states before and after the culprit pass first part."""

    how: str  # "value", "race" or "text"
    instruction: str  # the instruction's printed line after the pass
    before: str  # its printed line before the pass ("" if it did not exist or read the same)
    context: list[str]  # the BIR after the pass around it, the instruction marked with ">"

    def to_json(self) -> dict[str, object]:
        return {
            "how": self.how,
            "instruction": self.instruction,
            "before": self.before,
            "context": self.context,
        }


@dataclass
class Bisection:
    workdir: Path
    golden: Path
    steps: list[Step]
    probes: list[Probe]  # in the order they ran
    culprit: int | None = None  # the state the culprit pass produces (1..N), None if none
    difference: Difference | None = None
    verify_failed: bool = False  # the compile's own NeffVerifier job failed

    def probe(self, state: int) -> Probe | None:
        return next((probe for probe in self.probes if probe.state == state), None)

    @property
    def baseline_differs(self) -> bool:
        """State 0 (no pass at all) already does not match: the lowering, not a pass."""
        first = self.probe(0)
        return first is not None and not first.matches

    @property
    def found(self) -> bool:
        return self.culprit is not None or self.baseline_differs

    def describe_state(self, state: int) -> str:
        return "before any pass" if state == 0 else f"after {self.steps[state - 1].describe()}"

    def to_json(self) -> dict[str, object]:
        culprit = None
        if self.culprit is not None:
            step = self.steps[self.culprit - 1]
            after = self.probe(self.culprit)
            culprit = {
                "job": step.job,
                "pass": step.label,
                "text": step.text,
                "position": step.position,
                "total": step.total,
                "step": self.culprit,
                "verdict": after.verdict if after else None,
                "code": after.code if after else None,
                "message": after.message if after else None,
                "replay": replay_line(self, after) if after else None,
            }
        return {
            "workdir": str(self.workdir),
            "golden": str(self.golden),
            "steps": [{"job": s.job, "pass": s.label, "text": s.text} for s in self.steps],
            "probes": [
                {
                    "state": p.state,
                    "after": self.describe_state(p.state),
                    "verdict": p.verdict,
                    "code": p.code,
                    "message": p.message,
                }
                for p in self.probes
            ],
            "baseline_differs": self.baseline_differs,
            "culprit": culprit,
            "difference": self.difference.to_json() if self.difference else None,
        }


# -- what the work dir holds ----------------------------------------------------------------------


@dataclass
class _Compile:
    root: Path
    jobs: list[str]
    records: dict[str, diagnostic_pb2.JobRecord]

    def path(self, job: str, name: str) -> Path:
        return self.root / job_dir_name(self.jobs.index(job), job) / name


def _load(root: Path) -> _Compile:
    if not root.exists():
        raise NccError.of("U001", f"no such work directory: {root}")
    if not root.is_dir() or not is_workdir(root):
        raise NccError.of(
            "U019", f"{root} is not an ncc work directory (no pipeline.json, no NN_Job/ folders)"
        )
    pipeline = WorkDir(root).read_pipeline()
    jobs = list(pipeline.jobs) if pipeline is not None else []
    records: dict[str, diagnostic_pb2.JobRecord] = {}
    for index, job in enumerate(jobs):
        record = read_job_record(root / job_dir_name(index, job) / RECORD)
        if record is not None:
            records[job] = record
    found = _Compile(root, jobs, records)
    lowered = records.get("HLOToTensorizer")
    if (
        lowered is None
        or lowered.status != STATUS_OK
        or not found.path("HLOToTensorizer", "penguin.pb").is_file()
    ):
        raise NccError.of(
            "U019", f"{root}: the compile has not lowered its model yet (no HLOToTensorizer output)"
        )
    frontend = records.get("Frontend")
    if frontend is None or frontend.status != STATUS_OK:
        raise NccError.of(
            "U019",
            f"{root}: the Frontend job did not succeed, so there is no program to bisect "
            "(ncc triage says why)",
        )
    if not records.get("WalrusDriver") or not records["WalrusDriver"].command:
        raise NccError.of("U019", f"{root}: the compile did not reach the backend (no WalrusDriver job ran)")
    return found


def _flags(command: list[str], names: tuple[str, ...]) -> list[str]:
    """The `--name value` pairs of `command` for `names`, in order."""
    kept = []
    for index, word in enumerate(command[:-1]):
        if word in names:
            kept += [word, command[index + 1]]
    return kept


def _flag(command: list[str], name: str) -> str | None:
    values = _flags(command, (name,))
    return values[1] if values else None


def _pipeline_items(text: str) -> list[str]:
    """The passes of a recorded pipeline (it ran, so its braces balance)."""
    try:
        return [item for item in split_pipeline(text) if item]
    except ValueError:
        return []


def _steps(job: str, texts: list[str]) -> list[Step]:
    seen: dict[str, int] = {}
    steps = []
    for position, text in enumerate(texts, 1):
        name = text.partition("{")[0].strip()
        seen[name] = seen.get(name, 0) + 1
        label = name if seen[name] == 1 else f"{name}#{seen[name]}"
        steps.append(Step(job, text, label, position, len(texts)))
    return steps


# -- running the tools ----------------------------------------------------------------------------


class _Runner:
    """Runs stage tools in the bisect folder, each with its own logs and replay script."""

    def __init__(self, folder: Path, timeout_s: float | None) -> None:
        self.folder = folder
        self.limits = Limits(timeout_s=timeout_s, poll_interval_s=settings().poll_interval_s)

    def rel(self, path: Path) -> str:
        return os.path.relpath(path, self.folder)

    def run(self, tool: str, arguments: list[str], directory: Path, name: str) -> tuple[str, str, list[str]]:
        """Run `tool`; ("", "", argv) when it succeeded, else its diagnostic code and message."""
        directory.mkdir(parents=True, exist_ok=True)
        diagnostic = directory / f"{name}.diagnostic.pb"
        argv = [*settings().tool_command(tool), *arguments, "--diagnostics", self.rel(diagnostic)]
        script = directory / f"{name}.cmd.sh"
        script.write_text(
            f"#!/bin/sh\ncd {shlex.quote(str(self.folder))} && {_fault_prefix()}exec {shlex.join(argv)}\n"
        )
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
        stderr = directory / f"{name}.stderr.log"
        try:
            end = run_supervised(
                argv,
                cwd=self.folder,
                env=dict(settings().tool_env),
                stdout_path=directory / f"{name}.stdout.log",
                stderr_path=stderr,
                limits=self.limits,
            )
        except OSError as err:
            raise NccError.of("F134", f"cannot start {tool}: {err}") from None
        if end.ok:
            return "", "", argv
        found = _diagnostic(diagnostic) if end.returncode == 1 else None
        if found is not None:
            location = f" (at {found.location})" if found.location else ""
            return found.code or "F134", found.message + location, argv
        code, message = classify_abnormal_end(tool, end, mem_limit_hint=False)
        return code, f"{message}; see {stderr}", argv


def _diagnostic(path: Path) -> diagnostic_pb2.Diagnostic | None:
    found = diagnostic_pb2.Diagnostic()
    try:
        found.ParseFromString(path.read_bytes())
    except (OSError, DecodeError):
        return None
    return found


def _fault_prefix() -> str:
    """`NCC_FAULT_INJECT=... ` when it is set: the probes run under it (a replay must too)."""
    env = os.environ.get(FAULT_ENV)
    return f"{FAULT_ENV}={shlex.quote(env)} " if env else ""


def environment_warnings(root: Path) -> list[str]:
    """The probes run under this process's environment: say so when the compile's recorded
    NCC_FAULT_INJECT (run_settings.json) differs from it, since a planted miscompile then is or
    is not planted in the probes as it was in the compile."""
    recorded = WorkDir(Path(os.path.abspath(root))).read_run_settings() or {}
    env = recorded.get("env") if isinstance(recorded.get("env"), dict) else {}
    then, now = str(env.get(FAULT_ENV, "")), os.environ.get(FAULT_ENV, "")
    if then == now or not recorded:
        return []
    said = f"{FAULT_ENV}={then}" if then else f"no {FAULT_ENV}"
    return [
        f"the compile ran with {said}, but ncc bisect runs the tools with its own environment, "
        f"where it is {now or 'unset'}"
    ]


def replay_line(result: Bisection, probe: Probe) -> str:
    """The command that reruns a probe's check, with the fault injection it ran under."""
    return (
        f"cd {shlex.quote(str(result.workdir / BISECT_DIR))} && {_fault_prefix()}{shlex.join(probe.command)}"
    )


# -- the bisection --------------------------------------------------------------------------------


class _Bisector:
    def __init__(
        self,
        found: _Compile,
        folder: Path,
        timeout_s: float | None,
        progress: Callable[[Bisection, Probe], None] | None,
    ) -> None:
        self.compile = found
        self.folder = folder
        self.runner = _Runner(folder, timeout_s)
        self.progress = progress
        frontend = list(found.records["Frontend"].command)
        walrus = list(found.records["WalrusDriver"].command)
        self.frontend_flags = _flags(frontend, _FRONTEND_FLAGS)
        self.walrus_flags = _flags(walrus, _WALRUS_FLAGS)
        self.frontend_command, self.walrus_command = frontend, walrus
        self.penguin = found.path("HLOToTensorizer", "penguin.pb")

    def _must(self, tool: str, arguments: list[str], name: str) -> None:
        code, message, _ = self.runner.run(tool, arguments, self.folder / "setup", name)
        if code:
            raise NccError.of(code, f"ncc bisect: {name}: {message}; work dir {self.compile.root}")

    def golden(self) -> Path:
        evaluated = self.compile.records.get("GoldenEvaluator")
        recorded = (
            self.compile.path("GoldenEvaluator", "golden.pb")
            if "GoldenEvaluator" in self.compile.jobs
            else None
        )
        if (
            evaluated is not None
            and evaluated.status == STATUS_OK
            and recorded is not None
            and recorded.is_file()
        ):
            return recorded
        golden = self.folder / "golden.pb"
        module = self.compile.path("HLOToTensorizer", "module.pb")
        arguments = [
            "--input",
            self.runner.rel(module),
            "--output",
            self.runner.rel(golden),
            "--evaluate",
            "--seed",
            str(GOLDEN_SEED),
        ]
        self._must("hlo_opt", arguments, "golden")
        return golden

    def frontend(self) -> tuple[list[Step], Path]:
        """The Frontend's passes and its full output, from a rerun with its recorded flags."""
        bir = self.folder / "setup" / "frontend.bir.pb"
        passes = _flag(self.frontend_command, "--penguin-passes")
        chosen = ["--penguin-passes", passes] if passes is not None else []
        arguments = [
            "--input",
            self.runner.rel(self.penguin),
            "--output",
            self.runner.rel(bir),
            *chosen,
            *self.frontend_flags,
        ]
        self._must("hlo_opt", arguments, "frontend")
        if passes is not None:
            texts = [] if passes.strip() == "none" else _pipeline_items(passes)
        else:
            log = (self.folder / "setup" / "frontend.stderr.log").read_text(
                encoding="utf-8", errors="replace"
            )
            texts = _PENGUIN_LOG.findall(log)
        return _steps("Frontend", texts), bir

    def walrus(self) -> list[Step]:
        passes = _flag(self.walrus_command, "--walrus-passes")
        chosen = ["--walrus-passes", passes] if passes is not None else []
        self._must("walrus_driver", ["--print-pipeline", *chosen, *self.walrus_flags], "pipeline")
        text = (self.folder / "setup" / "pipeline.stdout.log").read_text(encoding="utf-8").strip()
        return _steps("WalrusDriver", _pipeline_items(text))

    def run(self, linear: bool) -> Bisection:
        golden = self.golden()
        frontend_steps, self.frontend_bir = self.frontend()
        steps = frontend_steps + self.walrus()
        self.result = Bisection(self.compile.root, golden, steps, [])
        self.frontend_count = len(frontend_steps)
        last = len(steps)
        if not self.check(0).matches:
            return self.result
        if linear:
            for state in range(1, last + 1):
                if not self.check(state).matches:
                    return self.finish(state)
            return self.result
        if self.check(last).matches:
            return self.result
        good, bad = 0, last
        while bad - good > 1:
            middle = (good + bad) // 2
            if self.check(middle).matches:
                good = middle
            else:
                bad = middle
        return self.finish(bad)

    def finish(self, state: int) -> Bisection:
        self.result.culprit = state
        before, after = self.result.probe(state - 1), self.result.probe(state)
        if before is not None and after is not None:
            self.result.difference = locate(before.report, after.report)
        return self.result

    def check(self, state: int) -> Probe:
        """Run state `state` (the first `state` passes) and judge it against the golden outputs."""
        directory = self.folder / f"state{state:02d}"
        report = directory / "report.json"
        check = f"bir_sim{{golden={self.runner.rel(self.result.golden)},report={self.runner.rel(report)}}}"
        bir = self.frontend_bir
        walrus_passes = [check]
        if state < self.frontend_count:
            bir = directory / "bir.pb"
            prefix = ",".join(step.text for step in self.result.steps[:state]) or "none"
            arguments = [
                "--input",
                self.runner.rel(self.penguin),
                "--output",
                self.runner.rel(bir),
                "--penguin-passes",
                prefix,
                *self.frontend_flags,
            ]
            code, message, argv = self.runner.run("hlo_opt", arguments, directory, "frontend")
            if code:
                return self._record(Probe(state, ERROR, message, code, None, directory, argv))
        elif state > self.frontend_count:
            walrus_passes = [step.text for step in self.result.steps[self.frontend_count : state]] + [check]
        arguments = [
            "--input",
            self.runner.rel(bir),
            "--output",
            self.runner.rel(directory / "program.pb"),
            "--walrus-passes",
            ",".join(walrus_passes),
            *self.walrus_flags,
        ]
        code, message, argv = self.runner.run("walrus_driver", arguments, directory, "check")
        data = _read_report(report)
        if not code and data is None:  # a check that leaves no report has not judged the state
            verdict, message = ERROR, message or f"bir_sim wrote no report ({report})"
        elif not code:
            verdict = MATCHES if data.get("verdict") == "ok" else DIFFERS
        else:
            verdict = DIFFERS if code in _CHECK_CODES else ERROR
        return self._record(Probe(state, verdict, message, code, data, directory, argv))

    def _record(self, probe: Probe) -> Probe:
        self.result.probes.append(probe)
        if self.progress is not None:
            self.progress(self.result, probe)
        return probe


def _read_report(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _verify_failed(found: _Compile) -> bool:
    record = found.records.get("NeffVerifier")
    return record is not None and record.status != STATUS_OK


def bisect(
    root: Path,
    *,
    linear: bool = False,
    timeout_s: float | None = None,
    progress: Callable[[Bisection, Probe], None] | None = None,
) -> Bisection:
    """Bisect the compile in work dir `root` (holding its lock: no compile may run meanwhile)."""
    root = Path(os.path.abspath(root))
    found = _load(root)
    with WorkDir(root).locked():
        folder = root / BISECT_DIR
        if folder.exists():
            if not (folder / _MARKER).is_file():
                raise NccError.of("U019", f"{folder} exists and was not made by ncc bisect; move it away")
        try:
            if folder.exists():
                shutil.rmtree(folder)
            (folder / "setup").mkdir(parents=True)
            (folder / _MARKER).write_text("made by ncc bisect; cleared by the next one\n")
        except OSError as err:
            raise scratch_write_error(err, root) from None
        result = _Bisector(found, folder, timeout_s, progress).run(linear)
    result.verify_failed = _verify_failed(found)
    return result


# -- where the states part ------------------------------------------------------------------------


def _key(row: list) -> str:
    return str(row[0]) or f"#{row[1]}"


def locate(before: dict | None, after: dict | None) -> Difference | None:
    """The instruction where the state after the culprit pass first parts from the one before it."""
    if after is None:
        return None
    lines = [(int(row[0]), str(row[1]) or f"#{row[0]}", str(row[2])) for row in after.get("ir", [])]
    earlier = {str(row[1]) or f"#{row[0]}": str(row[2]) for row in (before or {}).get("ir", [])}
    target, how = None, ""
    race_ids = [int(i) for i in after.get("race_ids", [])]
    if race_ids:
        positions = [index for index, (ident, _, _) in enumerate(lines) if ident in race_ids]
        if positions:
            target, how = max(positions), "race"
    if target is None and before is not None:
        results = {_key(row): (row[2], row[3]) for row in before.get("trace", [])}
        for row in after.get("trace", []):
            known = results.get(_key(row))
            if known is not None and known[0] == row[2] and known[1] != row[3]:
                target = next((i for i, line in enumerate(lines) if line[1] == _key(row)), None)
                how = "value"
                break
    if target is None:
        target = next((i for i, (_, name, text) in enumerate(lines) if earlier.get(name) != text), None)
        how = "text"
    if target is None:
        return None
    marked = {index for index, (ident, _, _) in enumerate(lines) if ident in race_ids}
    context = [
        f"{'>' if index == target else '*' if index in marked else ' '} {lines[index][2]}"
        for index in range(max(0, target - CONTEXT), min(len(lines), target + CONTEXT + 1))
    ]
    name, text = lines[target][1], lines[target][2]
    previous = earlier.get(name, "")
    return Difference(how, text, previous if previous != text else "", context)
