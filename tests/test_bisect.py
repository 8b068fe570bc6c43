"""`ncc bisect` and planted miscompiles: a miscompile planted in a named pass is located at exactly
that pass, with the instruction it changed; a clean compile bisects to nothing.

The planted miscompiles are real (NCC_FAULT_INJECT=walrus_driver:KIND@pass=NAME makes the pass's
output wrong as it ends): `max_to_add` turns softmax's row maximum into a sum, `drop_wait` removes
one semaphore wait after alloc_semaphores. The end-to-end tests compile shared models with the
real CLI and run `ncc bisect` on the work dir; the pieces (fault syntax, the planters, bir_sim's
golden mode, where two states part) are tested in-process first.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from orchestrator_support import Result, assert_one_line_error, find_model, ncc
from walrus_builders import Bir, chain_program

from ncc.orchestrator.triage.bisect import locate
from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.common import dtypes
from ncc.tools.common.errors import CompileError
from ncc.tools.common.faults import FAULT_ENV, Fault, inject_fault, planted_miscompiles
from ncc.tools.common.pipeline_text import split_pipeline
from ncc.tools.common.protoio import write_proto
from ncc.tools.hlo_opt.optimizer import DEFAULT_PASSES as FRONTEND_PASSES
from ncc.tools.sim.api import simulate_program
from ncc.tools.target import load_target
from ncc.tools.walrus_driver.context import PassContext
from ncc.tools.walrus_driver.pass_manager import DEFAULT_PASSES, Instruments, PassManager
from ncc.tools.walrus_driver.passes.bir_sim import random_inputs, sequential_program

# A compile's bisect states at -O2: state k is the program after the k-th pass of the Frontend's
# Penguin passes followed by the WalrusDriver's.
FRONTEND = len(FRONTEND_PASSES)


def _labels(passes) -> list[str]:
    """Pass names as bisect reports them: a pass run again is `name#2`, `name#3`, ..."""
    seen: dict[str, int] = {}
    labels = []
    for name in passes:
        seen[name] = seen.get(name, 0) + 1
        labels.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return labels
ALL_PASSES = FRONTEND + len(DEFAULT_PASSES)

MAX_TO_ADD = "walrus_driver:max_to_add@pass=pre_sched"
DROP_WAIT = "walrus_driver:drop_wait@pass=alloc_semaphores"
# The -O2 pipeline of the Frontend (4 Penguin passes) and of the backend (10 walrus passes).
WALRUS_O2 = list(DEFAULT_PASSES)


# -- the pieces -----------------------------------------------------------------------------------


def test_miscompile_kinds_fire_only_after_their_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    fault = Fault.parse(MAX_TO_ADD)
    assert fault.miscompile and fault.at_pass and fault.pass_name == "pre_sched"
    assert not Fault.parse("walrus_driver:segv@pass=pre_sched").miscompile
    monkeypatch.setenv(FAULT_ENV, f"{MAX_TO_ADD},walrus_driver:drop_wait,walrus_driver:max_to_add@op=divide")
    inject_fault("walrus_driver")  # a miscompile never acts as the tool starts (this would not return)
    always = lambda pattern: True  # noqa: E731
    assert planted_miscompiles("walrus_driver", "pre_sched", "pre_sched", always) == ["max_to_add"]
    assert planted_miscompiles("walrus_driver", "allocation", "allocation", always) == []  # no pass=: never
    monkeypatch.setenv(FAULT_ENV, "walrus_driver:drop_wait@pass=anti_dependency_analyzer#2@op=divide")
    label = "anti_dependency_analyzer#2"
    assert planted_miscompiles("walrus_driver", "anti_dependency_analyzer", label, always) == ["drop_wait"]
    assert planted_miscompiles("walrus_driver", "anti_dependency_analyzer", label, lambda p: False) == []
    assert planted_miscompiles("hlo_opt", "anti_dependency_analyzer", label, always) == []


def max_chain_program(tiles: int = 2, cols: int = 64) -> bir_pb2.Program:
    """Per tile: load x, load y -> DVE maximum -> ACT exp -> store."""
    b = Bir("maxchain")
    b.hbm("x", [128 * tiles, cols], index=0)
    b.hbm("y", [128 * tiles, cols], index=1)
    b.hbm("out", [128 * tiles, cols], role=bir_pb2.OUTPUT, index=0)
    for t in range(tiles):
        for name in ("x", "y", "m", "e"):
            b.buffer(f"{name}{t}", cols * 4)
        b.load(f"x{t}", "x", 128, cols, row0=128 * t, name=f"load_x{t}")
        b.load(f"y{t}", "y", 128, cols, row0=128 * t, name=f"load_y{t}")
        b.tt(f"m{t}", f"x{t}", f"y{t}", 128, cols, func="maximum", name=f"max{t}")
        b.act(f"e{t}", f"m{t}", 128, cols, name=f"exp{t}")
        b.store("out", f"e{t}", 128, cols, row0=128 * t, name=f"store{t}")
    return b.build()


def _compile_as_tool(program: bir_pb2.Program, passes: str) -> tuple[PassContext, str]:
    """Run `passes` as the walrus_driver tool does (pass log, pass-level faults); its log."""
    log = io.StringIO()
    ctx = PassContext.for_program(program, load_target("trn1"))
    PassManager(passes, Instruments(stream=log, as_tool="walrus_driver")).run(ctx)
    return ctx, log.getvalue()


def _everywhere(program: bir_pb2.Program, name: str) -> list[bir_pb2.Instruction]:
    """Instruction `name` in the global list and in the streams."""
    copies = [i for i in program.instructions if i.name == name]
    return copies + [i for s in program.streams for i in s.instructions if i.name == name]


def test_max_to_add_rewrites_the_first_maximum_after_its_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULT_ENV, MAX_TO_ADD)
    program = max_chain_program()
    ctx, log = _compile_as_tool(program, ",".join(WALRUS_O2))
    assert "fault injected after pass pre_sched: max_to_add: maximum -> add in %" in log
    walrus = len(DEFAULT_PASSES)
    assert log.index(f"pass pre_sched (5 of {walrus}) started") < log.index("fault injected")
    assert log.index("fault injected") < log.index(f"pass allocation (6 of {walrus}) started")
    first = next(i for i in ctx.input_program.instructions if i.func == "maximum").name
    assert {i.func for i in _everywhere(program, first)} == {"add"}  # list and stream alike
    assert {i.func for i in program.instructions if i.name != first and i.op == "tensor_tensor"} == {
        "maximum"
    }
    with pytest.raises(CompileError) as err:  # the program computes something else now
        PassManager("bir_sim").run(ctx)
    assert err.value.code == "E412"


def test_drop_wait_removes_one_wait_and_the_simulator_sees_the_race(monkeypatch: pytest.MonkeyPatch) -> None:
    clean, _ = _compile_as_tool(chain_program(2), ",".join(WALRUS_O2))
    waits = sum(len(i.waits) for i in clean.program.instructions)
    monkeypatch.setenv(FAULT_ENV, "walrus_driver:drop_wait@pass=codegen")  # streams exist by then
    ctx, log = _compile_as_tool(chain_program(2), ",".join(WALRUS_O2))
    line = re.search(
        r"fault injected after pass codegen: drop_wait: dropped wait\(s\d+>=\d+\) of %\d+ (\S+)", log
    )
    assert line is not None, log
    assert sum(len(i.waits) for i in ctx.program.instructions) == waits - 1
    assert sum(len(i.waits) for s in ctx.program.streams for i in s.instructions) == waits - 1
    with pytest.raises(CompileError) as err:
        PassManager("bir_sim").run(ctx)
    assert err.value.code == "E411" and "race" in err.value.message
    monkeypatch.setenv(FAULT_ENV, "walrus_driver:drop_wait@pass=pre_sched")  # no waits yet: nothing
    _, log = _compile_as_tool(chain_program(2), ",".join(WALRUS_O2))
    assert "fault injected after pass pre_sched: drop_wait: nothing to change" in log


def _golden(program: bir_pb2.Program, path: Path) -> None:
    """A golden.pb for `program`: seeded inputs and its sequential result."""
    inputs = random_inputs(program, 0)
    outputs = simulate_program(sequential_program(program), inputs, check_races=False).outputs
    tensors = common_pb2.TensorSet()
    for name, array in [*inputs.items(), *outputs.items()]:
        tensors.tensors.append(
            dtypes.numpy_to_tensor(name, dtypes.user_array_to_storage(array, common_pb2.F32), common_pb2.F32)
        )
    write_proto(str(path), tensors)


def test_bir_sim_golden_mode_judges_the_program_after_any_prefix(tmp_path: Path) -> None:
    golden = tmp_path / "golden.pb"
    _golden(max_chain_program(), golden)
    for count in range(len(WALRUS_O2) + 1):
        report = tmp_path / f"report{count}.json"
        check = f"bir_sim{{golden={golden},report={report}}}"
        ctx = PassContext.for_program(max_chain_program(), load_target("trn1"))
        PassManager(",".join([*WALRUS_O2[:count], check])).run(ctx)
        data = json.loads(report.read_text())
        assert data["verdict"] == "ok", (count, data["message"])
        assert data["execution"] == (
            "parallel" if count > WALRUS_O2.index("alloc_semaphores") else "sequential"
        )
        assert {row[0] for row in data["trace"]} == {i.name for i in ctx.program.instructions}
        assert [row[1] for row in data["ir"]] == [i.name for i in ctx.program.instructions]
    program = max_chain_program()
    program.instructions[2].func = "add"
    ctx = PassContext.for_program(program, load_target("trn1"))
    with pytest.raises(CompileError) as err:
        PassManager(f"bir_sim{{golden={golden},report={tmp_path / 'bad.json'}}}").run(ctx)
    assert err.value.code == "E412" and "output out0 differs from the expected values" in err.value.message
    assert json.loads((tmp_path / "bad.json").read_text())["verdict"] == "mismatch"
    # A golden file without outputs would let every program match: refused instead.
    inputs_only = common_pb2.TensorSet()
    inputs_only.ParseFromString(golden.read_bytes())
    kept = [t for t in inputs_only.tensors if not t.name.startswith("out")]
    del inputs_only.tensors[:]
    inputs_only.tensors.extend(kept)
    write_proto(str(tmp_path / "no_outputs.pb"), inputs_only)
    ctx = PassContext.for_program(max_chain_program(), load_target("trn1"))
    with pytest.raises(CompileError) as err:
        PassManager(f"bir_sim{{golden={tmp_path / 'no_outputs.pb'}}}").run(ctx)
    assert err.value.code == "E602" and "holds no golden outputs" in err.value.message


def _row(instr_id: int, name: str, text: str) -> list:
    return [instr_id, name, f"%{instr_id} {name} {text}"]


def test_locate_names_the_first_result_that_differs_then_a_race_then_a_text_change() -> None:
    ir_before = [_row(1, "a", "load"), _row(2, "b", "maximum"), _row(3, "c", "exp")]
    ir_after = [_row(1, "a", "load q3"), _row(2, "b", "add"), _row(3, "c", "exp")]
    before = {
        "ir": ir_before,
        "trace": [["a", 1, "4:float32", "x"], ["b", 2, "4:float32", "y"], ["c", 3, "4:float32", "z"]],
    }
    after = {
        "ir": ir_after,
        "race_ids": [],
        "trace": [["a", 1, "4:float32", "x"], ["b", 2, "4:float32", "Y"], ["c", 3, "4:float32", "Z"]],
    }
    found = locate(before, after)
    assert found is not None and found.how == "value"
    assert found.instruction == "%2 b add" and found.before == "%2 b maximum"
    assert found.context == ["  %1 a load q3", "> %2 b add", "  %3 c exp"]
    raced = locate(before, {**after, "race_ids": [1, 3]})
    assert raced is not None and raced.how == "race" and raced.instruction == "%3 c exp"
    assert raced.context == ["* %1 a load q3", "  %2 b add", "> %3 c exp"]
    changed = locate(before, {**after, "trace": before["trace"]})
    assert changed is not None and changed.how == "text" and changed.instruction == "%1 a load q3"
    assert locate(before, {"ir": ir_before, "trace": before["trace"]}) is None
    assert locate(before, None) is None


def test_pipeline_text_splits_at_top_level_commas() -> None:
    assert split_pipeline("a, b{k=1,j=2},c{x=y}") == ["a", "b{k=1,j=2}", "c{x=y}"]
    assert split_pipeline("") == [""]  # an empty item stays, for the caller to refuse
    for unbalanced in ("a{k=1", "a}"):
        with pytest.raises(ValueError):
            split_pipeline(unbalanced)


# -- ncc bisect on real compiles ------------------------------------------------------------------


@pytest.fixture(scope="module")
def softmax_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean `ncc compile --verify` of softmax (a `maximum` in its row reduction)."""
    out = tmp_path_factory.mktemp("softmax") / "softmax.neff"
    result = ncc("compile", find_model("softmax.hlo.pb"), "--output", out, "--verify")
    assert result.returncode == 0, result.stderr
    return out.with_suffix(".ncc-work")


def _bisect_json(workdir: Path, *flags: str, fault: str | None = None) -> dict:
    result = ncc("bisect", workdir, "--json", *flags, env={FAULT_ENV: fault} if fault else None)
    assert "Traceback" not in result.stderr, result.stderr
    data = json.loads(result.stdout)
    assert result.returncode == (5 if data["culprit"] or data["baseline_differs"] else 0), result.stderr
    return data


@pytest.mark.slow
def test_a_planted_max_to_add_is_located_at_exactly_its_pass(tmp_path: Path) -> None:
    """The workflow: a compile with a planted miscompile fails --verify; bisect names the pass,
    and the instruction the planter changed as the first whose result differs."""
    out = tmp_path / "softmax.neff"
    compiled = ncc(
        "compile", find_model("softmax.hlo.pb"), "--output", out, "--verify", env={FAULT_ENV: MAX_TO_ADD}
    )
    assert compiled.returncode == 5 and "[E610] job NeffVerifier" in compiled.stderr, compiled.stderr
    workdir = tmp_path / "softmax.ncc-work"
    log = (workdir / "04_WalrusDriver" / "stderr.log").read_text()
    planted = re.search(r"max_to_add: maximum -> add in (%\d+ \S+) ", log)
    assert planted is not None, log

    result = ncc("bisect", workdir, env={FAULT_ENV: MAX_TO_ADD})
    assert result.returncode == 5 and "Traceback" not in result.stderr, result.stderr
    text = result.stdout
    assert (
        "ncc bisect: the result stops matching after pass pre_sched "
        f"(WalrusDriver pass 5 of {len(DEFAULT_PASSES)}; pass {FRONTEND + 5} of {ALL_PASSES} in all)" in text
    ), text
    before_it = f"before it: matches, state {FRONTEND + 4}: after assign_hwdge_engine (WalrusDriver pass 4 of"
    assert before_it in text
    assert "after it:  differs: [E412] bir_sim: output out0 differs from the expected values" in text
    assert "first differing instruction (its result differs from the one it had before the pass):" in text
    marked = [line.strip() for line in text.splitlines() if line.strip().startswith("> ")]
    assert len(marked) == 1 and marked[0].startswith(f"> {planted[1]} DVE tensor_reduce add "), marked
    before = text.splitlines()[text.splitlines().index("  before the pass it read:") + 1]
    assert before.strip().startswith(f"{planted[1]} DVE tensor_reduce maximum ")
    assert f"replay: cd {workdir / 'bisect'} && {FAULT_ENV}={MAX_TO_ADD} " in text
    assert (workdir / "bisect" / f"state{FRONTEND + 5}" / "report.json").is_file()


@pytest.mark.slow
def test_a_planted_miscompile_in_a_second_run_of_a_pass_is_found_by_its_label(
    softmax_workdir: Path, tmp_path: Path
) -> None:
    """--linear checks every state in order: all before the pass match, the one after it does not."""
    workdir = tmp_path / "w"
    shutil.copytree(softmax_workdir, workdir)
    data = _bisect_json(workdir, "--linear", fault="walrus_driver:max_to_add@pass=anti_dependency_analyzer#2")
    culprit = data["culprit"]
    assert (culprit["job"], culprit["pass"], culprit["position"], culprit["step"]) == (
        "WalrusDriver",
        "anti_dependency_analyzer#2",
        7,
        FRONTEND + 7,
    )
    assert [p["state"] for p in data["probes"]] == list(range(FRONTEND + 8))
    assert all(p["verdict"] == "matches" for p in data["probes"][:-1])
    assert data["probes"][-1]["code"] == "E412"
    assert data["difference"]["how"] == "value" and " tensor_reduce add " in data["difference"]["instruction"]
    assert [s["pass"] for s in data["steps"]][:FRONTEND] == _labels(FRONTEND_PASSES)


@pytest.mark.slow
def test_a_dropped_wait_is_located_at_alloc_semaphores(tmp_path: Path) -> None:
    """Without --verify (bisect evaluates the golden outputs itself); the compile fails in the
    backend (birverifier sees the missing wait), bisect names the pass that lost it."""
    out = tmp_path / "gelu.neff"
    compiled = ncc("compile", find_model("gelu.hlo.pb"), "--output", out, env={FAULT_ENV: DROP_WAIT})
    assert compiled.returncode == 5 and "[E410] job WalrusDriver" in compiled.stderr, compiled.stderr
    workdir = tmp_path / "gelu.ncc-work"
    data = _bisect_json(workdir, fault=DROP_WAIT)
    culprit = data["culprit"]
    assert (culprit["job"], culprit["pass"], culprit["position"], culprit["total"]) == (
        "WalrusDriver",
        "alloc_semaphores",
        DEFAULT_PASSES.index("alloc_semaphores") + 1,
        len(DEFAULT_PASSES),
    )
    assert culprit["verdict"] == "differs" and culprit["code"] == "E411" and "race" in culprit["message"]
    assert data["golden"] == str(workdir / "bisect" / "golden.pb")
    difference = data["difference"]
    assert difference["how"] == "race"
    assert sum(line.startswith(("> ", "* ")) for line in difference["context"]) >= 1
    assert difference["instruction"] in [line[2:] for line in difference["context"]]


@pytest.mark.slow
def test_a_clean_compile_bisects_to_nothing(softmax_workdir: Path, tmp_path: Path) -> None:
    workdir = tmp_path / "w"
    shutil.copytree(softmax_workdir, workdir)
    result = ncc("bisect", workdir)
    assert result.returncode == 0, result.stderr
    assert (
        "ncc bisect: nothing differs: the program matches the golden outputs after each of the "
        f"{ALL_PASSES} passes" in result.stdout
    )
    assert "state  0 before any pass" in result.stdout
    assert f"state {ALL_PASSES} after roll_loops" in result.stdout
    # The Frontend's own flags: an explicit Penguin pass list, and the backend at -O1.
    out = tmp_path / "add_mul.neff"
    compiled = ncc(
        "compile",
        find_model("add_mul.hlo.pb"),
        "--output",
        out,
        "--optlevel",
        "1",
        "--penguin-passes",
        "fusion,dce",
    )
    assert compiled.returncode == 0, compiled.stderr
    data = _bisect_json(out.with_suffix(".ncc-work"))
    assert data["culprit"] is None and not data["baseline_differs"]
    steps = [(s["job"], s["pass"]) for s in data["steps"]]
    assert steps[:2] == [("Frontend", "fusion"), ("Frontend", "dce")]
    assert "split_dma" not in [p for _, p in steps] and ("WalrusDriver", "pre_sched") in steps


def test_bad_input_is_one_line_with_a_u_code(tmp_path: Path) -> None:
    missing = ncc("bisect", tmp_path / "nowhere")
    assert missing.returncode == 2 and "no such work directory" in assert_one_line_error(missing, "U001")
    (tmp_path / "file").write_text("x")
    for path in (tmp_path / "file", tmp_path):
        result = ncc("bisect", path)
        assert result.returncode == 2 and "not an ncc work directory" in assert_one_line_error(result, "U019")
    for timeout in ("0", "nan"):
        bad = ncc("bisect", tmp_path, "--timeout", timeout)
        assert bad.returncode == 2 and "must be greater than 0" in assert_one_line_error(bad, "U002")


def test_a_compile_that_never_reached_the_backend_has_nothing_to_bisect(tmp_path: Path) -> None:
    model = tmp_path / "bad.hlo"
    model.write_text(
        "HloModule bad, entry_computation_layout={(f32[128,512]{1,0})->f32[128,512]{1,0}}\n\n"
        "ENTRY main.1 {\n  x.1 = f32[128,512]{1,0} parameter(0)\n"
        "  ROOT y.1 = f32[128,512]{1,0} cholesky(x.1)\n}\n"
    )
    compiled = ncc("compile", model, "--output", tmp_path / "bad.neff")
    assert compiled.returncode == 1, compiled.stderr
    result = ncc("bisect", tmp_path / "bad.ncc-work")
    assert result.returncode == 2
    assert "has not lowered its model" in assert_one_line_error(result, "U019")
    np.testing.assert_equal(list((tmp_path / "bad.ncc-work").glob("bisect")), [])


def test_sigterm_stops_a_bisection_as_ctrl_c_does_and_leaves_no_process(
    softmax_workdir: Path, tmp_path: Path
) -> None:
    workdir = tmp_path / "w"
    shutil.copytree(softmax_workdir, workdir)
    proc = subprocess.Popen(
        [sys.executable, "-m", "ncc.orchestrator", "bisect", str(workdir), "--linear"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, FAULT_ENV: "walrus_driver:max_to_add@pass=pre_sched"},
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not proc.stdout.readline().lstrip().startswith("state"):
        pass
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    line = assert_one_line_error(Result(proc.returncode, stdout, stderr), "U007")
    assert proc.returncode == 130 and "stopped by SIGTERM" in line
    time.sleep(0.5)
    leftover = subprocess.run(["pgrep", "-f", str(workdir)], capture_output=True, text=True).stdout.split()
    assert not leftover, "a probe outlived ncc bisect"
