"""`ncc triage`: planted crashes, kills and hangs in real compiles are explained, bucketed and
bundled into reproducers that replay from an empty folder.

Every failure is real: NCC_FAULT_INJECT makes walrus_driver segfault, eat memory, hang or raise
as a named pass starts, only in modules that hold a named opcode pattern. The expected set of
crashing models is computed from the models' own HLO text, independently of the BIR matcher
that plants the crash.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from orchestrator_support import assert_one_line_error, find_model, ncc
from walrus_builders import chain_program

from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.common.faults import FAULT_ENV, Fault, OpPattern, spec_problems
from ncc.tools.common.passlog import last_pass_start, pass_start_line
from ncc.tools.walrus_driver import op_patterns
from ncc.tools.walrus_driver.pass_manager import DEFAULT_PASSES

PLANTED = "walrus_driver:segv@pass=allocation@op=divide(exponential)"
FARM_MODELS = ("softmax.hlo", "attention.hlo", "gelu.hlo", "layernorm.hlo")
UNSUPPORTED = """HloModule bad, entry_computation_layout={(f32[128,512]{1,0})->f32[128,512]{1,0}}

ENTRY main.1 {
  x.1 = f32[128,512]{1,0} parameter(0)
  ROOT y.1 = f32[128,512]{1,0} cholesky(x.1)
}
"""
SECRET = {"NCC_TEST_TOKEN": "hunter2-secret", "AWS_SECRET_ACCESS_KEY": "hunter3-secret"}


def divide_consumes_exponential(hlo_text: str) -> bool:
    """From HLO text alone: does some `divide` take an `exponential`'s result as an operand?"""
    opcode: dict[str, str] = {}
    operands: dict[str, list[str]] = {}
    for line in hlo_text.splitlines():
        match = re.match(r"\s*(?:ROOT\s+)?([\w.\-]+)\s*=\s*\S+?(?:\{[^}]*\})?\s+([\w-]+)\(([^)]*)\)", line)
        if match:
            opcode[match[1]] = match[2]
            operands[match[1]] = [word.strip() for word in match[3].split(",")]
    return any(
        opcode[name] == "divide" and any(opcode.get(arg) == "exponential" for arg in operands[name])
        for name in opcode
    )


def triage_json(path: Path) -> dict:
    result = ncc("triage", path, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def tools_path() -> str:
    """PATH for a replay: the folder of the ncc console scripts, and the system's."""
    folder = Path(sys.executable).parent
    if not (folder / "ncc-walrus-driver").exists():
        pytest.skip(f"the ncc console scripts are not beside {sys.executable}")
    return f"{folder}:/usr/bin:/bin"


def replay_in_empty_folder(bundle: Path, folder: Path) -> tuple[subprocess.CompletedProcess, float]:
    """Unpack the bundle into an empty folder and run its replay.sh with nothing but PATH set."""
    folder.mkdir()
    with tarfile.open(bundle) as tar:
        tar.extractall(folder, filter="data")
    (script,) = folder.glob("*/replay.sh")
    started = time.monotonic()
    proc = subprocess.run(
        ["sh", str(script)],
        cwd=folder,
        env={"PATH": tools_path()},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc, time.monotonic() - started


# -- the planted crash in a farm -----------------------------------------------------------------


@pytest.mark.slow
def test_a_planted_crash_in_a_farm_is_one_bucket_of_exactly_the_affected_models(tmp_path: Path) -> None:
    inputs = tmp_path / "in"
    inputs.mkdir()
    for name in FARM_MODELS:
        shutil.copy(find_model(name), inputs / name)
    (inputs / "unsupported.hlo").write_text(UNSUPPORTED)
    affected = {name for name in FARM_MODELS if divide_consumes_exponential((inputs / name).read_text())}
    assert affected == {"softmax.hlo", "attention.hlo"}  # the HLO itself says so, not the matcher
    farm = tmp_path / "farm"
    result = ncc(
        "farm", inputs, "--farm-dir", farm, "--workers", "2", "--timeout", "120",
        env={"NCC_FAULT_INJECT": PLANTED, **SECRET},
    )
    assert result.returncode == 4, result.stderr  # the worst failure is a crash

    report = triage_json(farm)
    assert report["kind"] == "farm" and report["compiles"] == 5 and report["failed"] == 3
    buckets = report["buckets"]
    assert [bucket["count"] for bucket in buckets] == [2, 1]  # largest first
    crash = buckets[0]
    assert set(crash["models"]) == affected
    assert "WalrusDriver | F139 | pass allocation |" in crash["signature"]
    assert "E201" in buckets[1]["signature"] and buckets[1]["models"] == ["unsupported.hlo"]
    failures = {Path(f["model"]).name: f for f in report["failures"]}
    assert set(failures) == affected | {"unsupported.hlo"}
    for name in affected:
        failure = failures[name]
        assert failure["workdir"] in crash["members"]
        assert (failure["job"], failure["code"], failure["signal"], failure["pass"]) == (
            "WalrusDriver", "F139", "SIGSEGV", "allocation"
        )
        assert failure["peak_rss_mb"] > 0 and 0 < failure["wall_s"] < 120 and failure["timeout_s"] == 120
        assert failure["mem_limit_mb"] is None and failure["limits_known"]
        assert "ncc.tools.walrus_driver" in failure["replay"] and PLANTED in failure["replay"]
        assert "common/faults.py:misbehave" in failure["frames"]
    unsupported = failures["unsupported.hlo"]
    assert (unsupported["job"], unsupported["code"], unsupported["signal"]) == (
        "HLOToTensorizer", "E201", None
    )

    text = ncc("triage", farm)
    assert text.returncode == 0, text.stderr
    assert "5 compiles, 3 failed, 2 buckets" in text.stdout
    walrus = len(DEFAULT_PASSES)
    assert "bucket 1: 2 failures" in text.stdout and f"pass        allocation (6 of {walrus})" in text.stdout

    # The representative, bundled, replays from an empty folder with the farm gone.
    bundle = tmp_path / "repro.tar.gz"
    made = ncc("triage", crash["representative"], "--bundle", bundle)
    assert made.returncode == 0, made.stderr
    assert bundle.is_file() and not list(tmp_path.glob(".repro.tar.gz.*"))
    data = b""
    with tarfile.open(bundle) as tar:
        for member in tar.getmembers():
            if member.isfile():
                data += tar.extractfile(member).read()
        names = {Path(member.name).relative_to(Path(member.name).parts[0]).as_posix() for member in tar}
    expected = {"replay.sh", "README.txt", "environment.json", "versions.json", "work/02_Frontend/bir.pb"}
    assert expected <= names
    assert b"hunter2-secret" not in data and b"hunter3-secret" not in data  # an allow-list, no secrets
    farm.rename(tmp_path / "farm-gone")
    proc, _ = replay_in_empty_folder(bundle, tmp_path / "empty")
    assert proc.returncode == -11, proc.stderr  # killed by SIGSEGV, as the job was
    assert pass_start_line("walrus_driver", "allocation", 6, len(DEFAULT_PASSES)) in proc.stderr
    assert "as the job did" in proc.stderr


# -- limits and tracebacks -----------------------------------------------------------------------

# fault -> (compile flags, the pass it fires in, what the replay must exit with)
KILLS = {
    "oom": (["--mem-limit", "300"], "pre_sched", -9),
    "hang": (["--timeout", "2"], "allocation", -9),
    "raise": ([], "dep_reduction", 3),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(KILLS))
def test_triage_says_which_limit_killed_a_job_with_the_figures(tmp_path: Path, kind: str) -> None:
    flags, pass_name, replay_status = KILLS[kind]
    workdir = tmp_path / "m.ncc-work"
    result = ncc(
        "compile", find_model("add_mul.hlo"), "--output", tmp_path / "m.neff", *flags,
        env={"NCC_FAULT_INJECT": f"walrus_driver:{kind}@pass={pass_name}"},
    )
    assert result.returncode == 4, result.stderr
    (failure,) = triage_json(workdir)["failures"]
    assert (failure["job"], failure["pass"]) == ("WalrusDriver", pass_name)
    text = ncc("triage", workdir).stdout
    if kind == "oom":
        assert (failure["code"], failure["signal"], failure["killed_for"]) == ("F137", "SIGKILL", "memory")
        assert failure["mem_limit_mb"] == 300 and failure["peak_rss_mb"] >= 300
        assert failure["timeout_s"] is None
        assert re.search(r"peak RSS \d+ MB of a 300 MB --mem-limit \(\d+%\): killed by ncc", text)
    elif kind == "hang":
        assert (failure["code"], failure["signal"], failure["killed_for"]) == ("F137", "SIGKILL", "timeout")
        assert failure["timeout_s"] == 2 and failure["wall_s"] >= 2 and failure["mem_limit_mb"] is None
        assert re.search(r"wall 2\.\d s of a 2 s --timeout: killed by ncc for exceeding --timeout", text)
    else:
        assert (failure["code"], failure["signal"], failure["exit_code"]) == ("F134", None, 3)
        assert failure["exception"] == "RuntimeError" and failure["killed_for"] is None
        assert failure["frames"][:2] == ["common/faults.py:misbehave", "common/faults.py:inject_pass_fault"]
        assert "walrus_driver/pass_manager.py:run" in failure["frames"]
    assert f"pass        {pass_name}" in text

    bundle = tmp_path / "b.tar.gz"
    assert ncc("triage", workdir, "--bundle", bundle).returncode == 0
    shutil.rmtree(workdir)
    proc, wall = replay_in_empty_folder(bundle, tmp_path / "empty")
    assert proc.returncode == replay_status, proc.stderr
    assert "as the job did" in proc.stderr
    if kind == "hang":
        assert 2 <= wall < 60 and "time limit of 2 s" in proc.stderr
    if kind == "oom":
        assert "memory limit of 300 MB" in proc.stderr


# -- no failure, bad input ---------------------------------------------------------------------


def test_a_work_dir_without_failure_says_so(tmp_path: Path) -> None:
    result = ncc("compile", find_model("add_mul.hlo"), "--output", tmp_path / "m.neff")
    assert result.returncode == 0, result.stderr
    workdir = tmp_path / "m.ncc-work"
    text = ncc("triage", workdir)
    assert text.returncode == 0 and "has no failed job" in text.stdout
    report = triage_json(workdir)
    assert report["failures"] == [] and report["buckets"] == [] and report["compiles"] == 1
    bundle = ncc("triage", workdir, "--bundle", tmp_path / "b.tar.gz")
    assert bundle.returncode == 2 and "has no failed job" in assert_one_line_error(bundle, "U015")
    # A damaged record: neither "no failure" nor "did not finish", but the file at fault.
    record = workdir / "02_Frontend" / "record.json"
    record.write_text("garbage{")
    damaged = ncc("triage", workdir)
    assert damaged.returncode == 0 and f"the record of a job cannot be read ({record})" in damaged.stdout
    assert triage_json(workdir)["damaged_records"] == [str(record)]
    assert not (tmp_path / "b.tar.gz").exists()


def test_the_bundles_replay_line_quotes_a_path_with_spaces(tmp_path: Path) -> None:
    """The line printed after --bundle can be pasted into a shell whatever the bundle is called."""
    model = tmp_path / "m.hlo"
    model.write_text("HloModule m\nENTRY e {\n  x = f32[4] parameter(0)\n  ROOT f = f32[4] fft(x)\n}\n")
    assert ncc("compile", model, "--output", tmp_path / "m.neff").returncode == 1
    place = tmp_path / "a folder"
    place.mkdir()
    made = ncc("triage", tmp_path / "m.ncc-work", "--bundle", place / "my repro.tar.gz")
    assert made.returncode == 0, made.stderr
    assert "replay: tar xzf 'my repro.tar.gz' && sh " in made.stdout


def test_bad_input_is_one_line_with_a_u_code(tmp_path: Path) -> None:
    missing = ncc("triage", tmp_path / "nope")
    assert missing.returncode == 2 and "nope" in assert_one_line_error(missing, "U001")
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / "empty").mkdir()
    for path in (tmp_path / "file.txt", tmp_path / "empty"):
        result = ncc("triage", path)
        assert result.returncode == 2
        assert_one_line_error(result, "U014")
    farm = tmp_path / "farm" / "work"
    (farm / "a.ncc-work").mkdir(parents=True)
    (farm / "a.ncc-work" / "pipeline.json").write_text("{}")
    result = ncc("triage", tmp_path / "farm", "--bundle", tmp_path / "b.tar.gz")
    assert result.returncode == 2 and "one work dir" in assert_one_line_error(result, "U002")


# -- the pieces: fault syntax, the BIR matcher, the pass log ---------------------------------------


def test_fault_items_parse_into_conditions() -> None:
    fault = Fault.parse(PLANTED)
    assert (fault.tool, fault.kind, fault.pass_name) == ("walrus_driver", "segv", "allocation")
    assert fault.pattern == OpPattern("divide", "exponential") and fault.at_pass and not fault.texts
    farm_item = Fault.parse("hlo2penguin:segv@crashme")
    assert farm_item.texts == ("crashme",) and not farm_item.at_pass
    assert Fault.parse("walrus_driver:segv@op=divide(").malformed
    assert OpPattern.parse("divide") == OpPattern("divide") and OpPattern.parse("a(b)(c)") is None


@pytest.mark.parametrize(("spec", "words"), [
    ("garbage", "names no tool"),
    ("WALRUS_DRIVER:segv", "names no tool"),
    ("walrus_driver:SEGV", "no fault kind 'SEGV'"),
    ("walrus_driver:max_to_add", "needs pass=NAME"),
    ("walrus_driver:segv@pass=", "pass= names no pass"),
    ("walrus_driver:segv@op=divide(", "op= is not an opcode"),
    (f"{PLANTED},hlo2penguin:abort@crashme,driver:kill,walrus_driver:max_to_add@pass=pre_sched", ""),
])
def test_a_fault_that_would_never_fire_is_named_and_a_good_one_is_not(spec: str, words: str) -> None:
    problems = spec_problems(spec)
    assert (len(problems) == 1 and words in problems[0]) if words else problems == [], problems


def test_compile_warns_of_a_mistyped_fault(tmp_path: Path) -> None:
    model = find_model("add_mul.hlo")
    result = ncc("compile", model, "-o", tmp_path / "m.neff", env={FAULT_ENV: "walrus:segv"})
    assert result.returncode == 0
    assert "ncc: warning: NCC_FAULT_INJECT item 'walrus:segv' names no tool ncc runs" in result.stderr


def _access(memory: int, tensor: str) -> bir_pb2.AccessPattern:
    return bir_pb2.AccessPattern(memory=memory, tensor=tensor, dtype=common_pb2.F32)


def _program(divisor_from_reduce: bool) -> bir_pb2.Program:
    """exp -> store -> load -> divide, or exp -> reduce -> divide."""
    sbuf, hbm = common_pb2.SBUF, common_pb2.HBM
    program = bir_pb2.Program()
    add = program.instructions.add
    add(id=1, op="activation", func="exp", inputs=[_access(sbuf, "a")], outputs=[_access(sbuf, "e")])
    add(id=2, op="dma", inputs=[_access(sbuf, "e")], outputs=[_access(hbm, "E")])
    add(id=3, op="tensor_reduce", func="add", inputs=[_access(sbuf, "e")], outputs=[_access(sbuf, "s")])
    source = "s" if divisor_from_reduce else "x"
    add(id=4, op="dma", inputs=[_access(hbm, "E")], outputs=[_access(sbuf, "x")])
    add(id=5, op="tensor_tensor", func="divide", inputs=[_access(sbuf, source), _access(sbuf, source)],
        outputs=[_access(sbuf, "o")])
    return program


def test_the_bir_matcher_follows_data_through_moves_only() -> None:
    through_moves, through_reduce = _program(False), _program(True)
    assert op_patterns.holds(through_moves, OpPattern("divide", "exponential"))
    assert op_patterns.holds(through_moves, OpPattern("divide", "exp"))  # a BIR func name works too
    assert not op_patterns.holds(through_reduce, OpPattern("divide", "exponential"))
    assert op_patterns.holds(through_reduce, OpPattern("divide", "add"))
    assert op_patterns.holds(through_reduce, OpPattern("exponential"))
    assert not op_patterns.holds(through_moves, OpPattern("divide", "log"))
    assert not op_patterns.holds(through_moves, OpPattern("multiply"))


def test_the_last_pass_start_is_found_among_other_lines() -> None:
    log = "\n".join(
        [pass_start_line("walrus_driver", "split_dma", 1, 3), "noise",
         pass_start_line("walrus_driver", "anti_dependency_analyzer#2", 2, 3), "Fatal Python error: x"]
    )
    started = last_pass_start(log)
    assert started is not None and (started.label, started.index, started.total) == (
        "anti_dependency_analyzer#2", 2, 3
    )
    assert last_pass_start("nothing here\n") is None


def _walrus(bir: Path, out: Path, fault: str) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "NCC_FAULT_INJECT"}
    return subprocess.run(
        [sys.executable, "-m", "ncc.tools.walrus_driver", "--input", str(bir), "--output", str(out)],
        env={**env, "NCC_FAULT_INJECT": fault},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("fault", "returncode", "last_pass"),
    [
        ("walrus_driver:segv@pass=allocation@op=exponential(add)", -11, "allocation"),
        ("walrus_driver:abort@pass=anti_dependency_analyzer#2", -6, "anti_dependency_analyzer#2"),
        ("walrus_driver:segv@pass=allocation@op=divide(exponential)", 0, "roll_loops"),  # no divide
        ("walrus_driver:segv@pass=bir_sim", 0, "roll_loops"),  # a pass the pipeline does not run
        ("walrus_driver:segv@op=divide(", 0, "roll_loops"),  # a malformed pattern never fires
    ],
)
def test_walrus_driver_logs_each_pass_start_and_fires_pass_faults_only_where_asked(
    tmp_path: Path, fault: str, returncode: int, last_pass: str
) -> None:
    bir = tmp_path / "bir.pb"
    bir.write_bytes(chain_program(2).SerializeToString())
    result = _walrus(bir, tmp_path / "out.pb", fault)
    assert result.returncode == returncode, result.stderr
    started = last_pass_start(result.stderr)
    assert started is not None and started.label == last_pass
    if returncode == 0:
        logged = re.findall(r"^walrus_driver: pass ", result.stderr, re.M)
        assert started.index == started.total == len(logged)
