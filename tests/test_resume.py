"""Resuming from a work directory: what reruns after a complete compile, a killed job, a corrupted
or deleted intermediate, other flags or another input. Which jobs ran is read from the work
directory's history.jsonl (one job_start line per job run) and from record mtimes.

These compile the real add_mul model end to end, so they need every stage tool.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from orchestrator_support import (
    DEFAULT_JOB_DIRS,
    assert_one_line_error,
    find_model,
    ncc,
    runs_per_compile,
)

pytestmark = pytest.mark.slow

ALL_JOBS = ["HLOToTensorizer", "Frontend", "WalrusDriver", "Packager"]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A private copy, so a test may change it."""
    copy = tmp_path / "add_mul.hlo"
    shutil.copy(find_model("add_mul.hlo"), copy)
    return copy


def compile_ok(model: Path, output: Path, *flags: str, env: dict[str, str] | None = None) -> None:
    result = ncc("compile", model, "--output", output, *flags, env=env)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr


def record_mtimes(workdir: Path) -> dict[str, int]:
    return {folder: (workdir / folder / "record.json").stat().st_mtime_ns for folder in DEFAULT_JOB_DIRS}


def flip_byte(path: Path, offset: int = 7) -> None:
    data = bytearray(path.read_bytes())
    data[offset % len(data)] ^= 0xFF
    path.write_bytes(bytes(data))


def test_second_identical_compile_runs_no_job(tmp_path: Path, model: Path) -> None:
    output, workdir = tmp_path / "m.neff", tmp_path / "m.ncc-work"
    compile_ok(model, output)
    first_neff = output.read_bytes()
    mtimes = record_mtimes(workdir)
    output.unlink()  # the NEFF is installed again from the work directory
    compile_ok(model, output)
    assert runs_per_compile(workdir) == [ALL_JOBS, []]
    assert record_mtimes(workdir) == mtimes
    assert output.read_bytes() == first_neff


def test_after_a_killed_job_only_it_and_later_jobs_rerun(tmp_path: Path, model: Path) -> None:
    output, workdir = tmp_path / "m.neff", tmp_path / "m.ncc-work"
    result = ncc("compile", model, "--output", output, env={"NCC_FAULT_INJECT": "walrus_driver:kill"})
    assert_one_line_error(result, "F137")
    assert not output.exists()
    kept = {folder: (workdir / folder / "record.json").stat().st_mtime_ns for folder in DEFAULT_JOB_DIRS[:2]}
    compile_ok(model, output)
    assert runs_per_compile(workdir) == [ALL_JOBS[:3], ["WalrusDriver", "Packager"]]
    assert {folder: (workdir / folder / "record.json").stat().st_mtime_ns for folder in kept} == kept
    assert output.is_file()


def test_a_flipped_byte_in_the_first_output_reruns_everything(tmp_path: Path, model: Path) -> None:
    output, workdir = tmp_path / "m.neff", tmp_path / "m.ncc-work"
    compile_ok(model, output)
    flip_byte(workdir / "01_HLOToTensorizer" / "penguin.pb")
    compile_ok(model, output)
    assert runs_per_compile(workdir) == [ALL_JOBS, ALL_JOBS]


def test_a_flipped_byte_in_a_middle_output_reruns_its_producer_and_successors(
    tmp_path: Path, model: Path
) -> None:
    output, workdir = tmp_path / "m.neff", tmp_path / "m.ncc-work"
    compile_ok(model, output)
    flip_byte(workdir / "03_WalrusDriver" / "program.pb")
    compile_ok(model, output)
    assert runs_per_compile(workdir) == [ALL_JOBS, ["WalrusDriver", "Packager"]]


def test_a_deleted_or_corrupted_record_reruns_from_there(tmp_path: Path, model: Path) -> None:
    output, workdir = tmp_path / "m.neff", tmp_path / "m.ncc-work"
    compile_ok(model, output)
    (workdir / "02_Frontend" / "bir.pb").unlink()
    compile_ok(model, output)
    (workdir / "04_Packager" / "record.json").write_text("{ not json")
    compile_ok(model, output)
    assert runs_per_compile(workdir) == [ALL_JOBS, ALL_JOBS[1:], ["Packager"]]


def test_other_flags_rerun_only_the_jobs_they_change(tmp_path: Path, model: Path) -> None:
    """--optlevel reaches the Penguin optimizer (Frontend) and the backend: the jobs before them are
    reused, they and the packager (whose NEFF records the flags) rerun; limits change how jobs run,
    not what they compute."""
    output, workdir = tmp_path / "m.neff", tmp_path / "m.ncc-work"
    compile_ok(model, output)
    (workdir / "notes.txt").write_text("the user's own file")
    compile_ok(model, output, "--optlevel", "0")
    compile_ok(model, output, "--optlevel", "0", "--timeout", "100", "--mem-limit", "4000")
    assert runs_per_compile(workdir) == [ALL_JOBS, ["Frontend", "WalrusDriver", "Packager"], []]
    assert json.loads((workdir / "pipeline.json").read_text())["flags"] == ["--optlevel=0"]
    assert (workdir / "notes.txt").read_text() == "the user's own file"


def test_another_job_list_makes_the_work_dir_stale(tmp_path: Path, model: Path) -> None:
    output, workdir = tmp_path / "m.neff", tmp_path / "m.ncc-work"
    compile_ok(model, output)
    compile_ok(model, output, "--verify")  # two more jobs: every folder's number changes
    assert runs_per_compile(workdir)[1] == [
        "HLOToTensorizer", "GoldenEvaluator", "Frontend", "WalrusDriver", "Packager", "NeffVerifier"
    ]
    assert sorted(p.name for p in workdir.iterdir() if p.is_dir())[0] == "01_HLOToTensorizer"


def test_another_input_makes_the_work_dir_stale(tmp_path: Path, model: Path) -> None:
    output, workdir = tmp_path / "m.neff", tmp_path / "m.ncc-work"
    compile_ok(model, output)
    model.write_text(model.read_text() + "\n")  # same module, different bytes
    compile_ok(model, output)
    assert runs_per_compile(workdir) == [ALL_JOBS, ALL_JOBS]
    pipeline = json.loads((workdir / "pipeline.json").read_text())
    record = json.loads((workdir / "01_HLOToTensorizer" / "record.json").read_text())
    assert pipeline["input_sha256"] == record["inputs"][0]["sha256"]


def test_a_failed_compile_keeps_the_previous_output_untouched(tmp_path: Path, model: Path) -> None:
    output = tmp_path / "m.neff"
    compile_ok(model, output)
    before = output.read_bytes()
    result = ncc(
        "compile", model, "--output", output, "--optlevel", "3", env={"NCC_FAULT_INJECT": "packager:segv"}
    )
    assert_one_line_error(result, "F139")
    assert output.read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_verify_pipeline_runs_and_resumes(tmp_path: Path, model: Path) -> None:
    output, workdir = tmp_path / "m.neff", tmp_path / "m.ncc-work"
    compile_ok(model, output, "--verify")
    compile_ok(model, output, "--verify")
    jobs = ["HLOToTensorizer", "GoldenEvaluator", "Frontend", "WalrusDriver", "Packager", "NeffVerifier"]
    assert runs_per_compile(workdir) == [jobs, []]
    report = json.loads((workdir / "06_NeffVerifier" / "sim_report.json").read_text())
    assert report["simulated_ns"] > 0


def test_each_job_leaves_a_replayable_command_and_a_full_record(tmp_path: Path, model: Path) -> None:
    import subprocess

    output, workdir = tmp_path / "m.neff", tmp_path / "m.ncc-work"
    compile_ok(model, output)
    for folder in DEFAULT_JOB_DIRS:
        record = json.loads((workdir / folder / "record.json").read_text())
        assert record["status"] == "ok" and record["exit_code"] == 0
        assert float(record["wall_s"]) > 0 and int(record["peak_rss_bytes"]) > 0
        assert len(record["cache_key"]) == 64 and record["tool_version"]
        assert all(len(item["sha256"]) == 64 for item in record["inputs"] + record["outputs"])
    packager = workdir / "04_Packager"
    neff = (packager / "model.neff").read_bytes()
    (packager / "model.neff").unlink()
    replay = subprocess.run([str(packager / "cmd.sh")], capture_output=True, text=True)
    assert replay.returncode == 0, replay.stderr
    assert (packager / "model.neff").read_bytes() == neff


def test_a_failed_compile_rerun_later_reports_the_same_error(tmp_path: Path) -> None:
    """A compile error is deterministic: rerun in the same work dir, seconds later, the job reuses
    its failed record and the compile reports the same coded line (it was F134, a driver error:
    the reused record kept its first run's date, and the driver looks for records of this run)."""
    import time

    model = tmp_path / "bad.hlo"
    model.write_text("""HloModule bad
ENTRY main {
  x = f32[8] parameter(0)
  ROOT y = f32[8] custom-call(x), custom_call_target="SomeKernel"
}
""")
    first = ncc("compile", model, "--output", tmp_path / "m.neff")
    line = assert_one_line_error(first, "E201")
    time.sleep(2.5)  # past the driver's one second of slack around a run's start
    again = ncc("compile", model, "--output", tmp_path / "m.neff")
    assert assert_one_line_error(again, "E201") == line
    assert first.returncode == again.returncode == 1
