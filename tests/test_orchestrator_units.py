"""Unit tests of the driver's parts that need no stage tool: diagnostics table, exit-status
mapping, the process-tree supervisor (with real processes), digests, the work directory,
the pipeline list, Luigi config isolation and `ncc inspect`'s description of a NEFF."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from orchestrator_support import lock_held

from ncc.orchestrator import digests
from ncc.orchestrator.diagnostics import CODES, ExitCode, NccDiagnostic, NccError, exit_code_for
from ncc.orchestrator.options import CompileOptions, default_workdir
from ncc.orchestrator.pipeline.process_end import (
    KILLED_FOR_MEMORY,
    KILLED_FOR_TIMEOUT,
    MB,
    ProcessEnd,
    classify_abnormal_end,
)
from ncc.orchestrator.pipeline.supervisor import Limits, run_supervised
from ncc.orchestrator.pipeline.workdir import WorkDir

ROOT = Path(__file__).resolve().parents[1]

# -- diagnostics table ----------------------------------------------------------------------------


def test_every_driver_code_is_documented() -> None:
    doc = (ROOT / "docs" / "diagnostics.md").read_text()
    for code, row in CODES.items():
        assert re.search(rf"\| {code} \| {int(row.exit_code)} \|", doc), (
            f"{code} missing from docs/diagnostics.md"
        )
    assert "## Tool diagnostics (E-codes)" in doc


@pytest.mark.parametrize(
    ("code", "exit_code"),
    [
        ("U001", 2),
        ("U002", 2),
        ("U003", 3),
        ("U006", 3),
        ("U007", 130),
        ("R001", 5),
        ("R002", 5),
        ("F134", 4),
        ("F137", 4),
        ("F139", 4),
        ("E201", 1),
        ("E999", 1),
        ("E610", 5),  # --verify found the compiler's output wrong: not the user's input
        ("E411", 5),
        ("Z000", 4),
    ],
)
def test_exit_code_follows_from_the_code(code: str, exit_code: int) -> None:
    assert exit_code_for(code) == exit_code


def test_diagnostic_line_is_one_line_and_names_job_workdir_and_log(tmp_path: Path) -> None:
    diagnostic = NccDiagnostic(
        "E201",
        "unknown opcode\n'foo'",
        job="Frontend",
        workdir=tmp_path,
        log=tmp_path / "02_Frontend/stderr.log",
        location="%x.3",
    )
    line = diagnostic.line()
    assert "\n" not in line
    assert line == (
        f"ncc: error: [E201] job Frontend: unknown opcode 'foo' (at %x.3); work dir {tmp_path}; "
        f"see {tmp_path}/02_Frontend/stderr.log"
    )
    assert NccDiagnostic.from_json(diagnostic.to_json()) == diagnostic
    assert NccError(diagnostic).diagnostic.exit_code == ExitCode.COMPILE_ERROR


# -- exit status → F-code -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("returncode", "code", "words"),
    [
        (-signal.SIGKILL, "F137", "forcibly killed (SIGKILL), most often for running out of memory"),
        (137, "F137", "forcibly killed"),
        (-signal.SIGSEGV, "F139", "segmentation fault"),
        (139, "F139", "segmentation fault"),
        (-signal.SIGABRT, "F134", "SIGABRT"),
        (134, "F134", "SIGABRT"),
        (-signal.SIGTERM, "F134", "SIGTERM"),
        (3, "F134", "exit status 3"),
        (1, "F134", "without writing a diagnostic"),
        (2, "F134", "exit status 2"),
        (7, "F134", "exit status 7"),
    ],
)
def test_abnormal_ends_map_to_f_codes(returncode: int, code: str, words: str) -> None:
    got_code, message = classify_abnormal_end(
        "job X", ProcessEnd(returncode=returncode, peak_rss_bytes=812 * MB)
    )
    assert got_code == code
    assert message.startswith("job X ")
    assert words in message


def test_sigkill_messages_say_why() -> None:
    memory = ProcessEnd(-9, peak_rss_bytes=812 * MB, killed_for=KILLED_FOR_MEMORY, mem_limit_bytes=500 * MB)
    _, message = classify_abnormal_end("job WalrusDriver", memory)
    assert "memory limit" in message and "peak RSS 812 MB" in message and "limit 500 MB" in message
    timeout = ProcessEnd(
        -9, wall_s=2.01, peak_rss_bytes=40 * MB, killed_for=KILLED_FOR_TIMEOUT, timeout_s=2.0
    )
    _, message = classify_abnormal_end("job WalrusDriver", timeout)
    assert "time limit of 2 s (--timeout)" in message
    external = ProcessEnd(-9, peak_rss_bytes=812 * MB, mem_limit_bytes=None)
    _, message = classify_abnormal_end("job WalrusDriver", external)
    assert "out of memory" in message and "peak RSS 812 MB" in message and "no --mem-limit" in message


# -- the supervisor, with real processes -----------------------------------------------------------


def _supervise(tmp_path: Path, code: str, limits: Limits) -> ProcessEnd:
    return run_supervised(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=dict(os.environ),
        stdout_path=tmp_path / "out.log",
        stderr_path=tmp_path / "err.log",
        limits=limits,
    )


def test_supervisor_records_exit_and_resources(tmp_path: Path) -> None:
    end = _supervise(tmp_path, "import sys\nx = sum(range(3_000_000))\nprint('hi')\nsys.exit(5)", Limits())
    assert end.returncode == 5 and not end.killed_for
    assert end.wall_s > 0 and end.user_s > 0 and end.peak_rss_bytes > 1 * MB
    assert (tmp_path / "out.log").read_text() == "hi\n"


def test_supervisor_sees_a_real_segfault(tmp_path: Path) -> None:
    end = _supervise(tmp_path, "import ctypes; ctypes.string_at(0)", Limits())
    assert end.returncode == -signal.SIGSEGV


def test_supervisor_timeout_kills_the_whole_tree(tmp_path: Path) -> None:
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "open('grandchild.pid', 'w').write(str(child.pid))\n"
        "time.sleep(600)\n"
    )
    started = time.monotonic()
    end = _supervise(tmp_path, code, Limits(timeout_s=1.0))
    assert time.monotonic() - started < 120  # a hang catcher: the kill comes after 1 s
    assert end.returncode == -signal.SIGKILL and end.killed_for == KILLED_FOR_TIMEOUT
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    deadline = time.monotonic() + 5
    while psutil.pid_exists(grandchild) and psutil.Process(grandchild).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the tool's helper process survived the timeout"
        time.sleep(0.05)


def test_supervisor_memory_limit_counts_the_tree(tmp_path: Path) -> None:
    code = (
        "import subprocess, sys, time\n"
        "hog = 'b = bytearray(150 << 20); import time; time.sleep(600)'\n"
        "helper = subprocess.Popen([sys.executable, '-c', hog])\n"
        "a = bytearray(150 << 20)\n"
        "time.sleep(600)\n"
    )
    end = _supervise(tmp_path, code, Limits(timeout_s=60, mem_limit_bytes=200 * MB))
    assert end.returncode == -signal.SIGKILL and end.killed_for == KILLED_FOR_MEMORY
    assert end.peak_rss_bytes > 200 * MB


def test_supervisor_counts_pages_a_forked_helper_shares_once(tmp_path: Path) -> None:
    """A tool that forks a helper over 200 MB it has touched (tools/common/forked.py) uses 200 MB,
    not 400: under a 300 MB limit it ends normally."""
    code = (
        "import os, time\n"
        "a = bytearray(200 << 20)\n"
        "for page in range(0, len(a), 4096):\n"
        "    a[page] = 1\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    time.sleep(1.5)\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
    )
    end = _supervise(tmp_path, code, Limits(timeout_s=60, mem_limit_bytes=300 * MB))
    assert end.returncode == 0 and not end.killed_for
    assert end.peak_rss_bytes > 200 * MB


# -- digests and the work directory ------------------------------------------------------------------


def test_digest_memo_sees_an_in_place_byte_flip(tmp_path: Path) -> None:
    path = tmp_path / "a.pb"
    path.write_bytes(b"\x00" * 4096)
    before = digests.sha256_file(path)
    with open(path, "r+b") as handle:
        handle.seek(100)
        handle.write(b"\x01")
    assert digests.sha256_file(path) != before
    recorded = digests.file_digest(path, tmp_path)
    assert recorded.path == "a.pb" and digests.matches(recorded, path, tmp_path)


def test_remove_job_dirs_touches_only_job_folders(tmp_path: Path) -> None:
    workdir = WorkDir(tmp_path)
    for name in ("01_HLOToTensorizer", "02_Frontend"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "record.json").write_text("{}")
    (tmp_path / "notes").mkdir()
    (tmp_path / "01_notes.txt").write_text("mine")
    (tmp_path / "01_Thesis").mkdir()  # named like a job folder, but no job of ncc's and not made by ncc
    (tmp_path / "01_Thesis" / "chapter.txt").write_text("precious")
    (tmp_path / "03_WalrusDriver").mkdir()  # a known job's name, but nothing ncc writes in it
    (tmp_path / "03_WalrusDriver" / "mine.txt").write_text("precious")
    assert workdir.remove_job_dirs(["HLOToTensorizer", "Frontend", "WalrusDriver"]) == [
        "01_HLOToTensorizer",
        "02_Frontend",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "01_Thesis",
        "01_notes.txt",
        "03_WalrusDriver",
        "notes",
    ]


def test_work_dir_lock_is_exclusive(tmp_path: Path) -> None:
    workdir = WorkDir(tmp_path)
    with lock_held(tmp_path, "4242"), pytest.raises(NccError) as err, workdir.locked():
        pass
    assert err.value.diagnostic.code == "U006" and "4242" in err.value.diagnostic.message
    with workdir.locked():
        pass


def test_unusable_work_dirs_are_u003(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    for path in (Path("/proc/ncc-test-workdir"), tmp_path / "file" / "sub"):
        with pytest.raises(NccError) as err:
            WorkDir(path).ensure_usable()
        assert err.value.diagnostic.code == "U003"


# -- options and the pipeline list --------------------------------------------------------------------


def test_default_workdir_is_beside_the_output() -> None:
    assert default_workdir(Path("/x/out/model.neff")) == Path("/x/out/model.ncc-work")


def test_options_round_trip_and_canonical_flags(tmp_path: Path) -> None:
    options = CompileOptions(
        model=tmp_path / "m.hlo",
        output=tmp_path / "m.neff",
        workdir=tmp_path / "w",
        optlevel=3,
        verify=True,
        walrus_passes=("pre_sched", "allocation"),
        timeout_s=2.5,
        mem_limit_mb=300,
        verbose=2,
    )
    assert CompileOptions.from_json(options.to_json()) == options
    assert options.canonical_flags() == ["--optlevel=3", "--verify", "--walrus-passes=pre_sched,allocation"]


def test_build_pipeline_mirrors_the_production_driver(tmp_path: Path) -> None:
    from ncc.orchestrator.pipeline.compile_command import CompileCommand
    from ncc.orchestrator.pipeline.job import task_class_of

    plain = CompileOptions(model=tmp_path / "m.hlo", output=tmp_path / "m.neff", workdir=tmp_path / "w")
    command = CompileCommand(plain)
    assert command.collectWalrusPipeline() == ["WalrusDriver"]
    assert command.buildPipeline() == ["HLOToTensorizer", "Frontend", "WalrusDriver", "Packager"]
    verify = CompileCommand(CompileOptions(**{**plain.__dict__, "verify": True}))
    assert verify.buildPipeline() == [
        "HLOToTensorizer",
        "GoldenEvaluator",
        "Frontend",
        "WalrusDriver",
        "Packager",
        "NeffVerifier",
    ]
    for name in verify.buildPipeline():
        assert task_class_of(name).__name__ == name
    with pytest.raises(KeyError):
        task_class_of("NoSuchJob")


def test_job_identity_ignores_limits(tmp_path: Path) -> None:
    from ncc.orchestrator.pipeline.job import task_class_of

    params = {
        "workdir": str(tmp_path),
        "model": str(tmp_path / "m.hlo"),
        "pipeline": ["HLOToTensorizer"],
        "compile_flags": ["--optlevel=2"],
    }
    job = task_class_of("HLOToTensorizer")
    assert job(**params, timeout_s=1.0).task_id == job(**params, mem_limit_mb=5, run_id="x").task_id
    assert job(**params).task_id != job(**{**params, "optlevel": 1}).task_id


def test_luigi_cfg_in_the_current_directory_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "luigi.cfg").write_text("[worker]\ncheck_unfulfilled_deps = false\n[ncc_probe]\nx = 1\n")
    code = (
        "import luigi.configuration as c\n"
        "assert c.get_config().has_section('ncc_probe')\n"  # Luigi itself read it...
        "from ncc.orchestrator.pipeline import luigi_setup\n"
        "luigi_setup.isolate_config()\n"
        "cfg = c.get_config()\n"
        "assert not cfg.has_section('ncc_probe')\n"  # ...ncc dropped it
        "assert cfg.getboolean('worker', 'check_unfulfilled_deps')\n"
        "assert cfg.getboolean('core', 'no_configure_logging')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


# -- `ncc inspect` on a NEFF built here -----------------------------------------------------------------


def test_inspect_describes_engines_semaphores_and_tensors() -> None:
    from ncc.orchestrator.commands.inspect import describe, render
    from ncc.schemas import bir_pb2, common_pb2

    neff = bir_pb2.Neff(
        name="m", target="trn1", format_version=1, num_semaphores=2, metadata={"flags": "-O2"}
    )
    neff.hbm.add(name="x", dtype=common_pb2.F32, shape=[128, 4], role=bir_pb2.INPUT, index=0)
    neff.buffers.add(name="b", memory=common_pb2.SBUF, partitions=128, bytes_per_partition=16, address=0)
    sp = neff.streams.add(engine=common_pb2.SP)
    sp.instructions.add(op="dma", updates=[bir_pb2.SemaphoreUpdate(semaphore=0, increment=1)])
    sp.instructions.add(op="dma", updates=[bir_pb2.SemaphoreUpdate(semaphore=0, increment=1)])
    dve = neff.streams.add(engine=common_pb2.DVE)
    dve.instructions.add(op="tensor_tensor", waits=[bir_pb2.SemaphoreWait(semaphore=0, value=2)])
    info = describe(neff)
    assert info["instructions"] == 3
    assert info["engines"] == [
        {"engine": "SP", "instructions": 2, "executed": 2, "ops": {"dma": 2}},
        {"engine": "DVE", "instructions": 1, "executed": 1, "ops": {"tensor_tensor": 1}},
    ]
    assert info["semaphores"] == [
        {"semaphore": 0, "updated_by": ["SP"], "waited_by": ["DVE"], "final_count": 2}
    ]
    assert info["hbm"][0] == {
        "name": "x",
        "role": "INPUT",
        "index": 0,
        "dtype": "F32",
        "shape": [128, 4],
        "bytes": 2048,
    }
    text = render(info)
    assert "tensor_tensor 1" in text and "HBM tensors:" in text and "flags" in text
