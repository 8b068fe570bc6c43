"""Signals to a running `ncc compile`: the whole process tree ends, the lock outlives nothing it
protects, and a rerun resumes (issue 8, case 2).

A real compile is started with its backend tool hanging (NCC_FAULT_INJECT=walrus_driver:hang), so
the signal arrives while the compile child and a tool are running; afterwards no process may be
left whose working directory is the work dir.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from orchestrator_support import find_model, history, ncc

HANG = {"NCC_FAULT_INJECT": "walrus_driver:hang"}


def _processes_in(workdir: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cwd"]):
        try:
            if proc.info["cwd"] and Path(proc.info["cwd"]) == workdir:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _wait_until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _start_hanging_compile(tmp_path: Path) -> tuple[subprocess.Popen[str], Path]:
    workdir = tmp_path / "m.ncc-work"
    env = {**{k: v for k, v in os.environ.items() if k != "NCC_FAULT_INJECT"}, **HANG}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ncc.orchestrator",
            "compile",
            str(find_model("add_mul.hlo.pb")),
            "-o",
            str(tmp_path / "m.neff"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    walrus = workdir / "03_WalrusDriver" / "cmd.sh"
    _wait_until(
        lambda: walrus.exists() and len(_processes_in(workdir)) >= 2, 120, "the backend never started"
    )
    return proc, workdir


def _resumes(tmp_path: Path, workdir: Path) -> None:
    rerun = ncc("compile", find_model("add_mul.hlo.pb"), "-o", tmp_path / "m.neff")
    assert rerun.returncode == 0, rerun.stderr
    starts = [e for e in history(workdir) if e["event"] == "compile_start"]
    last = [
        e["job"]
        for e in history(workdir)
        if e["event"] == "job_start" and e["run_id"] == starts[-1]["run_id"]
    ]
    assert last == ["WalrusDriver", "Packager"]  # the front end's jobs were kept


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_ends_the_whole_tree_with_one_line(tmp_path: Path, sig: signal.Signals) -> None:
    proc, workdir = _start_hanging_compile(tmp_path)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ncc: error: [U007] compile "), err
    assert "Traceback" not in out + err
    _wait_until(lambda: not _processes_in(workdir), 10, f"left running: {_processes_in(workdir)}")
    assert not (tmp_path / "m.neff").exists()
    _resumes(tmp_path, workdir)


def test_sigkill_of_ncc_takes_the_compile_child_and_its_tool_along(tmp_path: Path) -> None:
    proc, workdir = _start_hanging_compile(tmp_path)
    proc.kill()
    proc.communicate(timeout=30)
    _wait_until(lambda: not _processes_in(workdir), 10, f"orphans: {_processes_in(workdir)}")
    assert not (tmp_path / "m.neff").exists()
    _resumes(tmp_path, workdir)


def _default_ctrl_c() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_while_ncc_is_still_importing_is_one_line(tmp_path: Path) -> None:
    """Ctrl-C from 50 ms on: ncc's own start-up (its imports) ends with U007, never a traceback
    through ncc's code. Earlier than that the interpreter itself is still starting (site, the
    editable-install finder); what it prints then has no ncc frame and is Python's, not ours."""
    clean = 0
    env = {k: v for k, v in os.environ.items() if k != "NCC_FAULT_INJECT"}
    for index, delay in enumerate((0.05, 0.08, 0.12, 0.2)):
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ncc.orchestrator",
                "compile",
                str(find_model("add_mul.hlo.pb")),
                "-o",
                str(tmp_path / f"m{index}.neff"),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # As a terminal starts it: a runner that was itself started in the background (nohup,
            # `cmd &` without job control) passes SIGINT on ignored, and a Ctrl-C that lands before
            # ncc installs its handler would then be lost, not reported.
            preexec_fn=_default_ctrl_c,
        )
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert "/orchestrator/" not in err, err  # no traceback through ncc's code
        if proc.returncode == 130 and err.strip().startswith("ncc: error: [U007]"):
            clean += 1
        else:
            assert "Traceback" in err or proc.returncode == -signal.SIGINT, (proc.returncode, err)
    assert clean >= 2
