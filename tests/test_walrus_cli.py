"""ncc-walrus-driver as a process: exit codes, diagnostics, output, stats, instruments."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from walrus_builders import chain_program

from ncc.schemas import bir_pb2, diagnostic_pb2
from ncc.tools.common.protoio import read_proto, write_proto


def driver(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ncc.tools.walrus_driver", *args], capture_output=True, text=True, timeout=120
    )


def bir_file(tmp_path: Path, tiles: int = 2) -> Path:
    path = tmp_path / "bir.pb"
    write_proto(path, chain_program(tiles))
    return path


def test_compiles_with_the_default_pipeline_and_writes_stats(tmp_path):
    out, stats = tmp_path / "program.pb", tmp_path / "stats.json"
    result = driver(
        "--input",
        str(bir_file(tmp_path)),
        "--output",
        str(out),
        "--stats",
        str(stats),
        "--diagnostics",
        str(tmp_path / "d.pb"),
    )
    assert result.returncode == 0, result.stderr
    program = read_proto(out, bir_pb2.Program, "program")
    assert program.streams and program.num_semaphores > 0 and all(b.address >= 0 for b in program.buffers)
    assert program.attributes["walrus.pipeline"].startswith(
        "split_dma,anti_dependency_analyzer,dep_reduction,assign_hwdge_engine,pre_sched"
    )
    report = json.loads(stats.read_text())
    assert [p["name"] for p in report["passes"]][-2:] == ["codegen", "roll_loops"]
    assert report["passes"][4]["stats"]["est_makespan_ns"] > 0
    assert not (tmp_path / "d.pb").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_unknown_pass_exits_1_with_E401(tmp_path):
    diagnostics = tmp_path / "d.pb"
    result = driver(
        "--input",
        str(bir_file(tmp_path)),
        "--output",
        str(tmp_path / "o.pb"),
        "--walrus-passes",
        "anti_dependency_analyzer,alocation",
        "--diagnostics",
        str(diagnostics),
    )
    assert result.returncode == 1
    diagnostic = read_proto(diagnostics, diagnostic_pb2.Diagnostic, "diagnostic")
    assert diagnostic.code == "E401" and diagnostic.tool == "walrus_driver"
    assert (
        "unknown walrus pass 'alocation'" in diagnostic.message
        and "did you mean 'allocation'" in diagnostic.message
    )
    assert not (tmp_path / "o.pb").exists()


def test_pass_prerequisite_error_and_partial_stats(tmp_path):
    diagnostics, stats = tmp_path / "d.pb", tmp_path / "s.json"
    result = driver(
        "--input",
        str(bir_file(tmp_path)),
        "--output",
        str(tmp_path / "o.pb"),
        "--walrus-passes",
        "allocation,alloc_semaphores",
        "--stats",
        str(stats),
        "--diagnostics",
        str(diagnostics),
    )
    assert result.returncode == 1
    diagnostic = read_proto(diagnostics, diagnostic_pb2.Diagnostic, "diagnostic")
    assert diagnostic.code == "E402" and diagnostic.location == "alloc_semaphores"
    report = json.loads(stats.read_text())
    assert report["failed"].startswith("[E402]") and report["passes"][0]["name"] == "allocation"


def test_instruments_and_optlevel(tmp_path):
    result = driver(
        "--input",
        str(bir_file(tmp_path, 1)),
        "--output",
        str(tmp_path / "o.pb"),
        "--optlevel",
        "0",
        "--print-ir-after",
        "allocation",
        "--timing",
        "--verify-each",
    )
    assert result.returncode == 0, result.stderr
    assert "// ----- IR after allocation -----" in result.stderr
    assert "walrus pass timing report" in result.stderr and "pre_sched" not in result.stderr


def test_missing_input_is_E101(tmp_path):
    diagnostics = tmp_path / "d.pb"
    result = driver(
        "--input",
        str(tmp_path / "nope.pb"),
        "--output",
        str(tmp_path / "o.pb"),
        "--diagnostics",
        str(diagnostics),
    )
    assert result.returncode == 1
    assert read_proto(diagnostics, diagnostic_pb2.Diagnostic, "d").code == "E101"


def test_usage_errors_exit_2(tmp_path):
    assert driver("--output", str(tmp_path / "o.pb")).returncode == 2
    assert driver("--input", "x", "--output", "y", "--optlevel", "9").returncode == 2


def test_list_passes():
    result = driver("--list-passes")
    assert result.returncode == 0
    assert "alloc_semaphores" in result.stdout and "Insert semaphore waits" in result.stdout


def test_crash_reproducer(tmp_path):
    repro = tmp_path / "repro.pb"
    result = driver(
        "--input",
        str(bir_file(tmp_path)),
        "--output",
        str(tmp_path / "o.pb"),
        "--walrus-passes",
        "codegen",
        "--crash-reproducer",
        str(repro),
    )
    assert result.returncode == 1
    assert read_proto(repro, bir_pb2.Program, "repro").instructions
    text = (tmp_path / "repro.pb.txt").read_text()
    assert "[E402]" in text and "--walrus-passes 'codegen'" in text


def test_bad_target_is_E400(tmp_path):
    diagnostics = tmp_path / "d.pb"
    result = driver(
        "--input",
        str(bir_file(tmp_path)),
        "--output",
        str(tmp_path / "o.pb"),
        "--target",
        "trn9",
        "--diagnostics",
        str(diagnostics),
    )
    assert result.returncode == 1
    assert read_proto(diagnostics, diagnostic_pb2.Diagnostic, "d").code == "E400"


def test_console_script_entry_point():
    from ncc.tools.walrus_driver.__main__ import main

    assert callable(main)
