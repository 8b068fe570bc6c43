"""Outputs a user names are written all or nothing, and what is not a regular file is never
replaced: devices and FIFOs are written through, symlinks followed (issue 8, case 1)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from orchestrator_support import find_model, ncc


def _is_char_device(path: str) -> bool:
    return stat.S_ISCHR(os.stat(path, follow_symlinks=False).st_mode)


@pytest.fixture
def neff(tmp_path: Path) -> Path:
    result = ncc("compile", find_model("add_mul.hlo.pb"), "-o", tmp_path / "m.neff")
    assert result.returncode == 0, result.stderr
    return tmp_path / "m.neff"


def test_compile_to_dev_null_leaves_it_a_device_and_its_work_dir_out_of_dev(tmp_path: Path) -> None:
    result = ncc("compile", find_model("add_mul.hlo.pb"), "-o", "/dev/null", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert _is_char_device("/dev/null")
    assert (tmp_path / "null.ncc-work" / "04_Packager" / "model.neff").is_file()
    assert not Path("/dev/null.ncc-work").exists()
    assert not [p for p in Path("/dev").iterdir() if p.name.startswith(".null")]


def test_run_writes_through_dev_null_and_dev_stdout(neff: Path) -> None:
    stdout_link = os.readlink("/dev/stdout") if os.path.islink("/dev/stdout") else None
    result = ncc(
        "run",
        neff,
        "--inputs",
        find_model("add_mul.io.npz"),
        "--output",
        "/dev/null",
        "--report",
        "/dev/stdout",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout[: result.stdout.rindex("}") + 1])
    assert report["races"] == []
    assert _is_char_device("/dev/null")
    if stdout_link is not None:
        assert os.path.islink("/dev/stdout") and os.readlink("/dev/stdout") == stdout_link


def test_a_symlinked_output_is_followed_not_replaced(tmp_path: Path) -> None:
    link = tmp_path / "link.neff"
    link.symlink_to("real.neff")
    result = ncc("compile", find_model("add_mul.hlo.pb"), "-o", link)
    assert result.returncode == 0, result.stderr
    assert link.is_symlink() and (tmp_path / "real.neff").stat().st_size > 0


def test_a_fifo_output_is_written_through(tmp_path: Path, neff: Path) -> None:
    fifo = tmp_path / "report.fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    result = ncc(
        "run",
        neff,
        "--inputs",
        find_model("add_mul.io.npz"),
        "--output",
        tmp_path / "o.npz",
        "--report",
        fifo,
    )
    reader.join(timeout=60)
    assert result.returncode == 0, result.stderr
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    assert json.loads(received[0])["races"] == []


def test_stale_temporaries_of_a_killed_install_are_removed(tmp_path: Path) -> None:
    stale, fresh = tmp_path / ".m.neff.abc123.tmp", tmp_path / ".m.neff.def456.tmp"
    stale.write_bytes(b"half a neff")
    fresh.write_bytes(b"a live writer's")
    os.utime(stale, (1, 1))  # written long ago: its writer is gone
    result = ncc("compile", find_model("add_mul.hlo.pb"), "-o", tmp_path / "m.neff")
    assert result.returncode == 0, result.stderr
    assert not stale.exists() and fresh.exists()


def test_non_ascii_paths_under_a_strict_c_locale(tmp_path: Path) -> None:
    folder = tmp_path / "é dir"
    folder.mkdir()
    model = folder / "modèle.hlo.pb"
    model.write_bytes(find_model("add_mul.hlo.pb").read_bytes())
    env = {k: v for k, v in os.environ.items() if k not in ("NCC_FAULT_INJECT", "PYTHONUTF8", "LANGUAGE")}
    env.update(LC_ALL="C", LANG="C", PYTHONCOERCECLOCALE="0")
    result = subprocess.run(
        [sys.executable, "-m", "ncc.orchestrator", "compile", str(model), "-o", str(folder / "sortie.neff")],
        env=env,
        capture_output=True,
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    assert (folder / "sortie.neff").is_file()
