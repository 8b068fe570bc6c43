"""Real crashes, kills, hangs and memory blow-ups (NCC_FAULT_INJECT) map to the right F-code.

Each test compiles a real model with one stage tool (or the driver's own compile process)
made to misbehave for real, and checks what the user gets: exit 4, exactly one line naming the
code, the job, the work directory and the log to read, no traceback; and what is left behind:
the failed job's record, the earlier jobs' outputs intact, no output file, no stray process.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import psutil
import pytest
from orchestrator_support import assert_one_line_error, find_model, job_record, ncc

# tool → (job, its folder); the folders assume the default pipeline (no --verify)
TOOLS = {
    "hlo2penguin": ("HLOToTensorizer", "01_HLOToTensorizer"),
    "hlo_opt": ("Frontend", "02_Frontend"),
    "walrus_driver": ("WalrusDriver", "03_WalrusDriver"),
    "packager": ("Packager", "04_Packager"),
}

# kind → (code, extra flags, words the message must contain)
KINDS = {
    "abort": ("F134", [], ["terminated abnormally", "SIGABRT"]),
    "segv": ("F139", [], ["segmentation fault"]),
    "kill": ("F137", [], ["forcibly killed", "out of memory", "peak RSS"]),
    "exit": ("F134", [], ["terminated abnormally", "exit status 3"]),
    "oom": ("F137", ["--mem-limit", "300"], ["forcibly killed", "memory limit", "peak RSS", "limit 300 MB"]),
    "hang": ("F137", ["--timeout", "2"], ["forcibly killed", "time limit of 2 s", "--timeout"]),
}


@pytest.fixture
def model() -> Path:
    return find_model("add_mul.hlo")


def _processes_in(workdir: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cwd"]):
        try:
            if proc.info["cwd"] and Path(proc.info["cwd"]) == workdir:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _check_failure(tmp_path: Path, result, code: str, job: str, folder: str, words: list[str]) -> str:
    workdir = tmp_path / "m.ncc-work"
    line = assert_one_line_error(result, code)
    assert result.returncode == 4
    assert f"job {job} " in line
    assert f"; work dir {workdir};" in line
    log = workdir / folder / "stderr.log"
    assert line.endswith(f"; see {log}") and log.is_file()
    for word in words:
        assert word in line, (word, line)
    record = job_record(workdir, folder)
    assert record["status"] == "failed" and record["diagnostic"]["code"] == code
    assert not (tmp_path / "m.neff").exists()
    index = int(folder[:2])
    for earlier in sorted(
        p for p in workdir.iterdir() if re.match(r"\d\d_", p.name) and int(p.name[:2]) < index
    ):
        done = job_record(workdir, earlier.name)
        assert done["status"] == "ok"
        assert all((workdir / output["path"]).is_file() for output in done["outputs"])
    deadline = time.monotonic() + 5
    while _processes_in(workdir):
        assert time.monotonic() < deadline, f"processes left behind: {_processes_in(workdir)}"
        time.sleep(0.1)
    return line


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("tool", ["hlo2penguin", "walrus_driver"])
def test_tool_fault_gives_the_right_code(tmp_path: Path, model: Path, tool: str, kind: str) -> None:
    code, flags, words = KINDS[kind]
    job, folder = TOOLS[tool]
    started = time.monotonic()
    result = ncc(
        "compile", model, "--output", tmp_path / "m.neff", *flags, env={"NCC_FAULT_INJECT": f"{tool}:{kind}"}
    )
    line = _check_failure(tmp_path, result, code, job, folder, words)
    if kind == "oom":
        peak = int(re.search(r"peak RSS (\d+) MB", line).group(1))
        assert peak >= 300
    if kind == "hang":
        assert time.monotonic() - started < 180  # a hang catcher: the job's --timeout kills it


@pytest.mark.parametrize("tool", ["hlo_opt", "packager"])
def test_fault_in_later_tools(tmp_path: Path, model: Path, tool: str) -> None:
    job, folder = TOOLS[tool]
    result = ncc("compile", model, "--output", tmp_path / "m.neff", env={"NCC_FAULT_INJECT": f"{tool}:segv"})
    _check_failure(tmp_path, result, "F139", job, folder, ["segmentation fault"])


@pytest.mark.slow
def test_fault_in_the_neff_verifier(tmp_path: Path, model: Path) -> None:
    result = ncc(
        "compile", model, "--output", tmp_path / "m.neff", "--verify", env={"NCC_FAULT_INJECT": "sim:kill"}
    )
    _check_failure(tmp_path, result, "F137", "NeffVerifier", "06_NeffVerifier", ["forcibly killed"])


@pytest.mark.parametrize(
    ("kind", "code", "words", "log"),
    [
        ("segv", "F139", ["segmentation fault"], "driver.stderr.log"),
        ("kill", "F137", ["forcibly killed"], "driver.stderr.log"),
        ("abort", "F134", ["SIGABRT"], "driver.stderr.log"),
        ("exit", "F134", ["exit status 4"], "driver.stderr.log"),
        ("raise", "F134", ["internal error", "RuntimeError"], "driver.log"),
    ],
)
def test_driver_fault_is_named_by_the_parent(
    tmp_path: Path, model: Path, kind: str, code: str, words, log
) -> None:
    result = ncc(
        "compile", model, "--output", tmp_path / "m.neff", env={"NCC_FAULT_INJECT": f"driver:{kind}"}
    )
    workdir = tmp_path / "m.ncc-work"
    line = assert_one_line_error(result, code)
    assert result.returncode == 4
    assert "job driver" in line and f"work dir {workdir}" in line and line.endswith(f"see {workdir / log}")
    for word in words:
        assert word in line
    assert (workdir / log).is_file()
    assert not (tmp_path / "m.neff").exists()
    if kind == "raise":
        assert "Traceback" in (workdir / log).read_text()  # kept for triage, never shown


def test_fault_injection_for_another_tool_does_not_fire(tmp_path: Path, model: Path) -> None:
    """Only the named tool misbehaves: a fault in a tool the pipeline reaches later stays unused."""
    result = ncc("compile", model, "--output", tmp_path / "m.neff", env={"NCC_FAULT_INJECT": "sim:segv"})
    assert result.returncode == 0, result.stderr
    pipeline = json.loads((tmp_path / "m.ncc-work" / "pipeline.json").read_text())
    assert "NeffVerifier" not in pipeline["jobs"]
