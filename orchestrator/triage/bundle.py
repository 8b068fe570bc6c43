"""`ncc triage WORKDIR --bundle OUT.tar.gz`: a reproducer of one failed job that needs nothing
but itself and the ncc tools on PATH.

    ncc-repro-<model>-<job>/
        replay.sh          reruns the job from the bundle alone and exits as the job did
        supervise.py       the limits ncc killed the job at (only when it ran under --timeout or
                           --mem-limit): stdlib-only, ncc.orchestrator.triage.supervise
        README.txt         what failed and how to replay it
        failure.json       the triage of the failure (code, signal, pass, memory, time, frames)
        environment.json   the allow-listed environment the job ran with (config.REPLAY_ENV):
                           replay.sh sets exactly these, plus PATH, and nothing else
        versions.json      ncc, the tool's version (a digest of its sources), Python, libraries
        record.json, pipeline.json, run_settings.json   the work dir's records, as they were
        logs/              the job's cmd.sh, stdout.log, stderr.log (and driver_error.log)
        work/              the job's inputs at the paths its command names, relative to work/;
                           an input from outside the work dir (the model) under work/inputs/

The command is the job's own, with `python -m ncc.tools.<tool>` replaced by the tool's console
script (`ncc-walrus-driver`) and outside inputs by their copies. The archive is built beside
OUT under a temporary name and renamed into place: there is never a half-written bundle.
"""

from __future__ import annotations

import io
import json
import os
import platform
import shlex
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from ncc.orchestrator import digests
from ncc.orchestrator.diagnostics import NccError
from ncc.orchestrator.outputs import OutputError, check_writable, is_stream, write_output
from ncc.orchestrator.pipeline.workdir import CMD, DIAGNOSTIC, DRIVER_ERROR, RECORD, STDERR, STDOUT, WorkDir
from ncc.orchestrator.triage.explain import Failure, job_folder
from ncc.orchestrator.versions import ncc_version

LIBRARIES = ("ncc", "numpy", "protobuf", "luigi", "psutil")
SUPERVISOR = Path(__file__).with_name("supervise.py")


@dataclass(frozen=True)
class Bundle:
    path: Path
    folder: str  # the top-level folder in the archive
    files: int
    bytes: int
    warnings: list[str]


def console_script(tool: str) -> str:
    """The console script of a tool package: walrus_driver -> ncc-walrus-driver (pyproject.toml)."""
    return f"ncc-{tool.replace('_', '-')}"


def _slug(model_name: str) -> str:
    """softmax.hlo.pb -> softmax: a folder name made of safe characters."""
    stem = model_name.split(".", 1)[0]
    return "".join(char if char.isalnum() or char in "-_" else "_" for char in stem) or "model"


class _Archive:
    """A tar.gz being filled under one top-level folder."""

    def __init__(self, fileobj: io.BufferedWriter, folder: str) -> None:
        self.tar = tarfile.open(fileobj=fileobj, mode="w:gz")
        self.folder = folder
        self.files = 0

    def add_bytes(self, name: str, data: bytes, executable: bool = False) -> None:
        info = tarfile.TarInfo(f"{self.folder}/{name}")
        info.size, info.mtime, info.mode = len(data), int(time.time()), 0o755 if executable else 0o644
        self.tar.addfile(info, io.BytesIO(data))
        self.files += 1

    def add_text(self, name: str, text: str, executable: bool = False) -> None:
        self.add_bytes(name, text.encode("utf-8"), executable)

    def add_json(self, name: str, data: object) -> None:
        self.add_text(name, json.dumps(data, indent=1, sort_keys=True) + "\n")

    def add_file(self, name: str, path: Path) -> None:
        info = self.tar.gettarinfo(str(path), arcname=f"{self.folder}/{name}")
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        with open(path, "rb") as handle:
            self.tar.addfile(info, handle)
        self.files += 1


def _versions(failure: Failure, workdir: WorkDir) -> dict[str, object]:
    pipeline = workdir.read_pipeline()
    libraries = {}
    for name in LIBRARIES:
        try:
            libraries[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            libraries[name] = None
    record = failure.record
    return {
        "ncc": pipeline.ncc_version if pipeline is not None else ncc_version(),
        "tool": record.tool if record is not None else "",
        "tool_version": record.tool_version if record is not None else "",
        "pipeline_versions": dict(pipeline.versions) if pipeline is not None else {},
        "bundled_by": {
            "ncc": ncc_version(),
            "python": sys.version.split()[0],
            "implementation": platform.python_implementation(),
            "platform": platform.platform(),
            "libraries": libraries,
        },
    }


def _rewrite_command(failure: Failure) -> tuple[list[str], dict[str, Path]]:
    """The job's command as the bundle runs it, and bundle name (under work/) -> source file."""
    record = failure.record
    assert record is not None
    argv = list(record.command)
    tool = console_script(record.tool)
    if len(argv) >= 3 and argv[1] == "-m" and argv[2].startswith("ncc.tools."):
        argv = [tool, *argv[3:]]
    files: dict[str, Path] = {}
    for item in record.inputs:
        recorded = Path(item.path)
        if recorded.is_absolute():
            name = f"inputs/{recorded.name}"
            argv = [name if word == item.path else word for word in argv]
        else:
            name = item.path
        files[name] = recorded if recorded.is_absolute() else failure.workdir / recorded
    return argv, files


def _check_inputs(failure: Failure, files: dict[str, Path]) -> list[str]:
    """Every input must exist; one that changed since the job ran is a warning (the bundle
    holds today's bytes, which may no longer fail)."""
    record = failure.record
    assert record is not None
    warnings = []
    for item, (name, path) in zip(record.inputs, files.items(), strict=True):
        if not path.is_file():
            message = f"input {item.path} of job {failure.job} is gone from {failure.workdir}: cannot bundle"
            raise NccError.of("U001", message)
        if digests.sha256_file(path) != item.sha256:
            warnings.append(f"input {name} changed since job {failure.job} ran: the bundle may not reproduce")
    return warnings


def _expected(failure: Failure) -> tuple[int, str]:
    """The exit status a shell reports for the job's end (128+N for signal N), and in words."""
    code = failure.exit_code if failure.exit_code is not None else 1
    if code < 0:
        return 128 - code, f"killed by {failure.signal or f'signal {-code}'} (a shell reports {128 - code})"
    return code, f"exit status {code}"


def replay_script(failure: Failure, argv: list[str], supervised: bool) -> str:
    record = failure.record
    assert record is not None
    tool = argv[0]
    status, words = _expected(failure)
    env = " ".join(f"{key}={shlex.quote(value)}" for key, value in sorted(failure.env.items()))
    run = shlex.join(argv)
    if supervised:
        limits = []
        if failure.timeout_s is not None:
            limits += ["--timeout", f"{failure.timeout_s:g}"]
        if failure.mem_limit_mb is not None:
            limits += ["--mem-limit-mb", str(failure.mem_limit_mb)]
        run = f'"$py" "$here/supervise.py" {shlex.join(limits)} -- {run}'
    out_dirs = sorted({str(Path(item.path).parent) for item in record.outputs} | {job_folder(failure)})
    lines = [
        "#!/bin/sh",
        f"# A reproducer (`ncc triage --bundle`): job {failure.job} of the compile of {failure.model_name}",
        f"# {failure.message}",
        f"# How the job ended: {words}. This script reruns it from this folder alone and ends the same way.",
        f"# Needs the ncc tools on PATH ({tool}); the environment is exactly environment.json plus PATH.",
        'here=$(cd "$(dirname "$0")" && pwd) || exit 1',
        f"tool={shlex.quote(tool)}",
        'if ! command -v "$tool" >/dev/null 2>&1; then',
        '  echo "replay.sh: $tool is not on PATH: put the folder of the ncc tools on PATH'
        ' (e.g. the bin/ of the virtualenv ncc is installed in)" >&2',
        "  exit 127",
        "fi",
    ]
    if supervised:
        lines += [
            "py=$(command -v python3 || command -v python) || {",
            '  echo "replay.sh: no python3 on PATH for supervise.py (the limits ncc applied)" >&2',
            "  exit 127",
            "}",
        ]
    lines += [
        'cd "$here/work" || exit 1',
        f"mkdir -p {' '.join(shlex.quote(d) for d in out_dirs)}",
        f'env -i PATH="$PATH" {env} {run}',
        "status=$?",
        f"expected={status}",
        'verdict="as the job did"',
        '[ "$status" -eq "$expected" ] || verdict="the job ended with $expected"',
        'echo "replay.sh: $tool ended with status $status ($verdict)" >&2',
        '# End as the tool did: by the same signal, or with the same exit status.',
        'if [ "$status" -gt 128 ] && [ "$status" -lt 193 ]; then kill -$((status - 128)) $$; fi',
        'exit "$status"',
        "",
    ]
    return "\n".join(lines)


def _readme(failure: Failure, folder: str, argv: list[str], supervised: bool, warnings: list[str]) -> str:
    _, words = _expected(failure)
    limits = []
    if failure.timeout_s is not None:
        limits.append(f"--timeout {failure.timeout_s:g} s")
    if failure.mem_limit_mb is not None:
        limits.append(f"--mem-limit {failure.mem_limit_mb} MB")
    position = f" ({failure.pass_position})" if failure.pass_position else ""
    text = [
        f"Reproducer of a failed ncc job ({folder})",
        "",
        f"model      {failure.model}",
        f"job        {failure.job} ({failure.record.tool if failure.record else '?'}"
        f" {failure.record.tool_version if failure.record else ''})",
        f"failure    {failure.message}",
        f"ended      {words}",
        f"pass       {failure.pass_label or '-'}{position}",
        f"signature  {failure.signature()}",
        f"limits     {', '.join(limits) if limits else 'none'}"
        + (" (replay.sh applies them through supervise.py)" if supervised else ""),
        "",
        "Replay (from any folder; the ncc tools on PATH):",
        f"    sh {folder}/replay.sh",
        "",
        "It runs, in work/:",
        f"    {shlex.join(argv)}",
        "with only PATH and the variables of environment.json set.",
    ]
    if warnings:
        text += ["", "Warnings:", *(f"    {warning}" for warning in warnings)]
    if failure.last_lines:
        text += ["", "Last lines of the job's log:", *(f"    {line}" for line in failure.last_lines)]
    return "\n".join(text) + "\n"


def write_bundle(failure: Failure, out: Path) -> Bundle:
    """Pack `failure`'s job into the archive `out`, atomically."""
    if failure.record is None or failure.job_dir is None or not failure.record.command:
        where = "driver" if failure.record is None else f"driver, before job {failure.job} ran its tool"
        message = f"nothing to replay in {failure.workdir}: the failure ([{failure.code}]) is in the {where}"
        raise NccError.of("U015", message)
    out = Path(os.path.abspath(out))
    if not out.parent.is_dir():
        raise NccError.of("U004", f"the directory of the bundle does not exist: {out.parent}")
    try:
        check_writable(out)
    except OutputError as err:
        raise NccError.of("U005", f"cannot write bundle {out}: {err}") from None
    workdir = WorkDir(failure.workdir)
    argv, files = _rewrite_command(failure)
    warnings = _check_inputs(failure, files)
    supervised = failure.timeout_s is not None or failure.mem_limit_mb is not None
    folder = f"ncc-repro-{_slug(failure.model_name)}-{failure.job}"
    # Built under a temporary name of the kind write_output cleans up if a writer was killed.
    real = Path(os.path.realpath(out))
    scratch_dir = None if is_stream(out) else real.parent
    fd, scratch = tempfile.mkstemp(prefix=f".{real.name}.", suffix=".tmp", dir=scratch_dir)
    try:
        with os.fdopen(fd, "wb") as handle:
            archive = _Archive(handle, folder)
            archive.add_text("replay.sh", replay_script(failure, argv, supervised), executable=True)
            if supervised:
                archive.add_file("supervise.py", SUPERVISOR)
            archive.add_text("README.txt", _readme(failure, folder, argv, supervised, warnings))
            archive.add_json("failure.json", {**failure.to_json(), "bundle_command": argv})
            archive.add_json("environment.json", dict(sorted(failure.env.items())))
            archive.add_json("versions.json", _versions(failure, workdir))
            for name, path in (
                ("record.json", failure.job_dir / RECORD),
                ("pipeline.json", workdir.pipeline_path),
                ("run_settings.json", workdir.run_settings_path),
            ):
                if path.is_file():
                    archive.add_file(name, path)
            for name in (CMD, STDOUT, STDERR, DRIVER_ERROR, DIAGNOSTIC):
                if (failure.job_dir / name).is_file():
                    archive.add_file(f"logs/{name}", failure.job_dir / name)
            for name, path in files.items():
                archive.add_file(f"work/{name}", path)
            archive.tar.close()
        size = os.path.getsize(scratch)
        write_output(out, source=Path(scratch))
    except OutputError as err:
        raise NccError.of("U005", f"cannot write bundle {out}: {err}") from None
    except OSError as err:
        raise NccError.of("U005", f"cannot write bundle {out}: {err.strerror or err}") from None
    finally:
        Path(scratch).unlink(missing_ok=True)
    return Bundle(out, folder, archive.files, size, warnings)
