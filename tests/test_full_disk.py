"""A work dir on a full file system is one environment diagnostic, [U011], naming the file system,
whichever process hit the wall; after space is freed the same command resumes (issue 8, case 4).

Needs a real small tmpfs, so it runs as root (as CI and farm containers do) and is skipped
elsewhere.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from orchestrator_support import assert_one_line_error, find_model, ncc


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=100k", "tmpfs", str(mount)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)])


def _resize(mount: Path, size: str) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(mount)], check=True)


@pytest.mark.parametrize("size", ["20k", "60k", "150k", "250k"])
def test_a_full_work_dir_disk_is_u011_and_a_rerun_resumes(
    small_disk: Path, tmp_path: Path, size: str
) -> None:
    _resize(small_disk, size)
    model, output, workdir = find_model("block.hlo.pb"), tmp_path / "m.neff", small_disk / "w"
    result = ncc("compile", model, "-o", output, "--workdir", workdir)
    line = assert_one_line_error(result, "U011")
    assert result.returncode == 3
    assert f"mounted at {small_disk}" in line
    assert not output.exists()
    _resize(small_disk, "20m")
    rerun = ncc("compile", model, "-o", output, "--workdir", workdir)
    assert rerun.returncode == 0, rerun.stderr
    assert output.is_file()
