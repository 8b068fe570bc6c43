"""Damaged bookkeeping and inputs that change under a compile get a named answer, not F134
(issue 8, cases 3 and 6)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from orchestrator_support import Result, assert_one_line_error, find_model, history, ncc


def test_a_bad_byte_in_history_is_reported_and_the_file_repaired(tmp_path: Path) -> None:
    model, output, workdir = find_model("add_mul.hlo.pb"), tmp_path / "m.neff", tmp_path / "m.ncc-work"
    assert ncc("compile", model, "-o", output).returncode == 0
    with open(workdir / "history.jsonl", "ab") as handle:
        handle.write(b'\xff\xfe{"event": "job_start"\n{"cut": \n')
    output.unlink()
    result = ncc("compile", model, "-o", output)
    assert result.returncode == 0, result.stderr
    assert "ncc: warning:" in result.stderr and "2 unreadable line(s)" in result.stderr
    assert "Traceback" not in result.stderr and output.is_file()
    assert (workdir / "history.jsonl.damaged").is_file()
    assert [e["event"] for e in history(workdir)][:2] == ["compile_start", "job_start"]  # readable lines kept
    again = ncc("compile", model, "-o", output)
    assert again.returncode == 0 and "warning" not in again.stderr


def test_a_model_changed_during_the_compile_is_named(tmp_path: Path) -> None:
    model = tmp_path / "model.hlo"
    shutil.copy(find_model("add_mul.hlo"), model)
    workdir = tmp_path / "m.ncc-work"
    env = {
        **{k: v for k, v in os.environ.items() if k != "NCC_FAULT_INJECT"},
        "NCC_FAULT_INJECT": "walrus_driver:slow",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "ncc.orchestrator", "compile", str(model), "-o", str(tmp_path / "m.neff")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (workdir / "03_WalrusDriver" / "cmd.sh").exists():
        assert time.monotonic() < deadline and proc.poll() is None, "the backend never started"
        time.sleep(0.02)
    model.write_text(model.read_text().replace("multiply", "subtract"))  # while the backend sleeps
    out, err = proc.communicate(timeout=120)

    line = assert_one_line_error(Result(proc.returncode, out, err), "U010")
    assert proc.returncode == 3 and "changed while it was being compiled" in line
    assert not (tmp_path / "m.neff").exists()
    rerun = ncc("compile", model, "-o", tmp_path / "m.neff")
    assert rerun.returncode == 0, rerun.stderr


def test_an_internal_error_keeps_its_traceback_in_the_work_dir(tmp_path: Path, monkeypatch, capsys) -> None:
    from ncc.orchestrator import cli
    from ncc.orchestrator.pipeline import driver

    def broken(options: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(driver, "compile_model", broken)
    monkeypatch.setattr(cli, "_crash_log_dir", None)
    workdir = tmp_path / "w"
    workdir.mkdir()
    code = cli.main(
        [
            "compile",
            str(find_model("add_mul.hlo.pb")),
            "-o",
            str(tmp_path / "m.neff"),
            "--workdir",
            str(workdir),
        ]
    )
    err = capsys.readouterr().err
    assert code == 4 and "[F134] internal error in ncc compile (RuntimeError: a bug)" in err
    logs = list(workdir.glob("ncc-internal-error-*.log"))
    assert len(logs) == 1 and str(logs[0]) in err and "RuntimeError: a bug" in logs[0].read_text()


def _with_ulimit(flags: str, command: list[str]) -> list[str]:
    """`command` run under `ulimit FLAGS` (a shell, not preexec_fn: no fork of this process)."""
    return ["sh", "-c", f'ulimit {flags} && exec "$@"', "sh", *command]


def test_too_few_open_files_is_u012_and_a_low_soft_limit_is_raised(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "ncc.orchestrator", "compile", str(find_model("add_mul.hlo.pb")), "-o"]
    env = {k: v for k, v in os.environ.items() if k != "NCC_FAULT_INJECT"}
    hard = subprocess.run(
        _with_ulimit("-n 10", [*command, str(tmp_path / "a.neff")]), env=env, capture_output=True, text=True
    )
    assert hard.returncode == 3 and "Traceback" not in hard.stderr
    assert_one_line_error(Result(hard.returncode, hard.stdout, hard.stderr), "U012")
    soft = subprocess.run(
        _with_ulimit("-S -n 10", [*command, str(tmp_path / "b.neff")]),
        env=env,
        capture_output=True,
        text=True,
    )
    assert soft.returncode == 0, soft.stderr


def test_without_shared_memory_a_compile_is_u013(tmp_path: Path) -> None:
    """/dev/shm read-only in a private mount namespace (root only): Luigi's queue cannot get a lock."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare for a private mount namespace")
    script = 'mount -t tmpfs -o ro,size=4k tmpfs /dev/shm && exec "$@"'
    command = [sys.executable, "-m", "ncc.orchestrator", "compile", str(find_model("add_mul.hlo.pb")), "-o"]
    env = {k: v for k, v in os.environ.items() if k != "NCC_FAULT_INJECT"}
    result = subprocess.run(
        ["unshare", "-m", "sh", "-c", script, "sh", *command, str(tmp_path / "m.neff")],
        env=env,
        capture_output=True,
        text=True,
    )
    if "unshare failed" in result.stderr or "mount:" in result.stderr:
        pytest.skip(f"no private mount namespace here: {result.stderr.strip()}")
    assert result.returncode == 3, result.stderr
    assert_one_line_error(Result(result.returncode, result.stdout, result.stderr), "U013")
