"""What keeps a candidate of `ncc reduce` interesting: the user's test script, or the failure of a
compile's work dir reproduced.

* `ScriptTest`: `SCRIPT FILE.hlo` exits 0 (C-Reduce's interestingness test). The script runs in
  the candidate's own folder with the reducer's environment; the file is HLO text.
* `CompileTest`, made by `compile_test(WORKDIR)`: `ncc compile` of the candidate fails in the same
  job with the same signature as the work dir's failure (`ncc triage`'s signature: job, code,
  pass, top frames or the limit that killed it; ncc.orchestrator.triage.explain computes both sides). The
  candidate compiles with the flags of the failed compile (run_settings.json's command, without
  its output, work dir and stage cache) and its allow-listed environment (config.REPLAY_ENV, as
  recorded: NCC_FAULT_INJECT travels, so a planted crash reproduces), into a work dir of its own;
  the candidate keeps the model's file name, since a fault condition may name the model.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ncc.orchestrator import digests
from ncc.orchestrator.config import REPLAY_ENV
from ncc.orchestrator.diagnostics import NccError
from ncc.orchestrator.pipeline.workdir import WorkDir
from ncc.orchestrator.triage.explain import Failure, triage, triage_workdir
from ncc.orchestrator.triage.reduce import Process, Verdict
from ncc.schemas import hlo_pb2
from ncc.tools.hlo.hlo_printer import print_module

_PROTO_SUFFIXES = (".hlo.pb", ".pb")
_TEXT_SUFFIXES = (".hlo", ".txt")
_NOT_REPLAYED = ("--output", "-o", "--workdir", "--cache-dir")  # a candidate has its own


def _ended(status: int | None, process: Process, what: str) -> Verdict:
    if process.timed_out:
        return Verdict(False, f"{what} ran out of time", timed_out=True)
    if status is None:
        return Verdict(False, f"{what} was stopped")
    return Verdict(False, f"{what} exited {status}")


def text_name(model: Path) -> str:
    """`block.hlo.pb` -> `block.hlo`: the name of the text a test script is given."""
    name = model.name
    for suffix in (*_PROTO_SUFFIXES, *_TEXT_SUFFIXES):
        if name.lower().endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)] + ".hlo"
    return name + ".hlo"


@dataclass(frozen=True)
class ScriptTest:
    script: Path
    name: str  # the candidate's file name

    def describe(self) -> str:
        return f"{shlex.quote(str(self.script))} FILE.hlo exits 0"

    def file_name(self) -> str:
        return self.name

    def write(self, module: hlo_pb2.HloModuleProto, path: Path) -> None:
        path.write_text(print_module(module), encoding="utf-8")

    def check(self, path: Path, process: Process, timeout: float) -> Verdict:
        try:
            status = process.run([str(self.script), str(path)], path.parent, None, timeout)
        except OSError as err:
            return Verdict(False, f"cannot run {self.script}: {err.strerror or err}")
        if status == 0:
            return Verdict(True, f"{self.script.name} exited 0")
        return _ended(status, process, self.script.name)


def script_test(script: Path, model: Path) -> ScriptTest:
    path = Path(os.path.abspath(script))
    if not path.exists():
        raise NccError.of("U001", f"test script not found: {path}")
    if not path.is_file() or not os.access(path, os.X_OK):
        raise NccError.of("U002", f"--test {path} is not an executable file (chmod +x it, with a #! line)")
    return ScriptTest(path, text_name(model))


@dataclass(frozen=True)
class CompileTest:
    failure: Failure
    name: str  # the candidate's file name: the model's
    binary: bool  # candidates are serialized HloModuleProto (the model was), else HLO text
    flags: tuple[str, ...]
    env: dict[str, str] = field(repr=False)
    replay_env: dict[str, str] = field(default_factory=dict)  # the allow-listed part, to show

    @property
    def job(self) -> str:
        return self.failure.job

    @property
    def signature(self) -> str:
        return self.failure.signature()

    def describe(self) -> str:
        env = " ".join(f"{key}={shlex.quote(value)}" for key, value in sorted(self.replay_env.items()))
        return (
            f"ncc compile {shlex.join(self.flags)} fails in job {self.job} with signature "
            f"'{self.signature}'" + (f" (environment: {env})" if env else "")
        )

    def file_name(self) -> str:
        return self.name

    def write(self, module: hlo_pb2.HloModuleProto, path: Path) -> None:
        if self.binary:
            path.write_bytes(module.SerializeToString())
        else:
            path.write_text(print_module(module), encoding="utf-8")

    def check(self, path: Path, process: Process, timeout: float) -> Verdict:
        folder = path.parent
        argv = [
            sys.executable, "-m", "ncc.orchestrator", "compile", str(path),
            "--output", str(folder / "candidate.neff"), "--workdir", str(folder / "work"), *self.flags,
        ]
        status = process.run(argv, folder, self.env, timeout)
        if status is None:
            return _ended(status, process, "ncc compile")
        failure, _ = triage_workdir(folder / "work")
        if failure is None:
            return Verdict(False, "the compile succeeded" if status == 0 else f"ncc compile exited {status}")
        seen = failure.signature()
        return Verdict(failure.job == self.job and seen == self.signature, f"the compile failed: '{seen}'")


def _replayed_flags(command: list[str]) -> tuple[str, ...]:
    """The flags of a recorded `ncc compile MODEL ...` command, less its output, work dir and cache."""
    flags, words = [], iter(command[3:])
    for word in words:
        name = word.split("=", 1)[0]
        if name in _NOT_REPLAYED:
            if "=" not in word:
                next(words, None)
            continue
        flags.append(word)
    return tuple(flags)


def compile_test(workdir: Path, model: Path, job: str | None) -> tuple[CompileTest, list[str]]:
    """The test "compiling a candidate fails like `workdir`'s compile did", and warnings."""
    result = triage(workdir)
    if result.kind != "workdir":
        examples = ", ".join(str(bucket.representative.workdir) for bucket in result.buckets[:3])
        hint = f"; representatives: {examples}" if examples else ""
        raise NccError.of("U002", f"--workdir takes one work dir, not a farm ({result.path}){hint}")
    if not result.failures:
        raise NccError.of("U016", f"{result.path} has no failed job whose failure a reduction could keep")
    failure = result.failures[0]
    if job is not None and failure.job != job:
        message = f"job {job} did not fail in {result.path}: the job that failed is {failure.job}"
        raise NccError.of("U016", message)
    warnings = []
    folder = WorkDir(result.path)
    settings = folder.read_run_settings() or {}
    command = settings.get("command")
    recorded = settings.get("env")
    if isinstance(command, list) and command[:2] == ["ncc", "compile"]:
        flags = _replayed_flags([str(word) for word in command])
    else:
        pipeline = folder.read_pipeline()
        flags = tuple(pipeline.flags) if pipeline is not None else ()
        if failure.timeout_s is not None:
            flags += ("--timeout", f"{failure.timeout_s:g}")
        if failure.mem_limit_mb is not None:
            flags += ("--mem-limit", str(failure.mem_limit_mb))
        where = folder.run_settings_path
        warnings.append(f"{where} holds no compile command: candidates compile with {shlex.join(flags)}")
    if isinstance(recorded, dict):
        replay_env = {str(key): str(value) for key, value in recorded.items() if key in REPLAY_ENV}
    else:
        replay_env = {key: value for key, value in os.environ.items() if key in REPLAY_ENV}
        warnings.append(f"{folder.run_settings_path} holds no environment: candidates compile in this one")
    env = {key: value for key, value in os.environ.items() if key not in REPLAY_ENV} | replay_env
    pipeline = folder.read_pipeline()
    if pipeline is not None and pipeline.input_sha256 and digests.sha256_file(model) != pipeline.input_sha256:
        warnings.append(f"{model} is not the module {result.path} compiled (its digest differs)")
    name = model.name
    lowered = name.lower()
    binary = lowered.endswith(_PROTO_SUFFIXES)
    if not binary and not lowered.endswith(_TEXT_SUFFIXES):
        name += ".hlo"
    return CompileTest(failure, name, binary, flags, env, replay_env), warnings
