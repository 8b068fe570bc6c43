"""Loops in engine streams: their meaning (tools/common/loops.py), walrus's roll_loops pass, the
packager's and the simulator's checks, `ncc inspect`'s static and executed counts, and a planted
dropped rotation wait that the simulator reports and `ncc bisect` pins on roll_loops."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import hlo_gen
import numpy as np
import pytest
from orchestrator_support import assert_one_line_error, find_model, ncc
from walrus_builders import random_program, run_passes

from ncc.schemas import bir_pb2, common_pb2
from ncc.tools.common import loops
from ncc.tools.common.errors import CompileError
from ncc.tools.packager.neff import build_neff, decode_neff, encode_neff
from ncc.tools.sim.api import simulate_program
from ncc.tools.sim.program import streams_of_program
from ncc.tools.walrus_driver.pass_manager import default_pipeline
from ncc.tools.walrus_driver.passes.bir_sim import random_inputs

ACT = common_pb2.ACT
UNROLLED = ",".join(name for name in default_pipeline(2) if name != "roll_loops")


def _instr(name: str, **fields) -> bir_pb2.Instruction:
    return bir_pb2.Instruction(name=name, op="nop", engine=ACT, **fields)


def _loop(trip: int, body: int) -> bir_pb2.Instruction:
    return bir_pb2.Instruction(op="loop", engine=ACT, trip_count=trip, body_length=body, name="L")


def _stream(*entries: bir_pb2.Instruction) -> bir_pb2.Stream:
    return bir_pb2.Stream(engine=ACT, instructions=list(entries))


# ---- the meaning of a loop ------------------------------------------------------------------


def test_execution_counts_of_nested_loops():
    stream = _stream(_instr("a"), _loop(3, 3), _instr("b"), _loop(2, 1), _instr("c"), _instr("d"))
    assert loops.execution_counts(stream, "E603") == [1, 1, 3, 3, 6, 1]
    assert loops.check_stream(stream, "E603") == 1 + 3 + 6 + 1
    names = [i.name for i in loops.expand_streams([stream], "E603", 100)[0].instructions]
    assert names == ["a", "b@0", "c@0,0", "c@0,1", "b@1", "c@1,0", "c@1,1", "b@2", "c@2,0", "c@2,1", "d"]


def test_expansion_applies_rotations_steps_and_wait_growth():
    body = bir_pb2.Instruction(name="copy", op="tensor_copy", engine=ACT)
    out = body.outputs.add(memory=common_pb2.SBUF, tensor="@SBUF", offset=1000)
    out.loop.add(step=10, rotation=[0, 2048, 4096])
    source = body.inputs.add(memory=common_pb2.HBM, tensor="x", offset=7)
    source.loop.add(step=512)
    body.waits.add(semaphore=3, value=5, value_lo=5, value_hi=0, loop_steps=[4])
    expanded = loops.expand_streams([_stream(_loop(5, 1), body)], "E603", 100)[0].instructions
    assert [i.outputs[0].offset for i in expanded] == [1000, 3048, 5096, 1010, 3058]
    assert [i.inputs[0].offset for i in expanded] == [7, 519, 1031, 1543, 2055]
    assert [(i.waits[0].value, i.waits[0].value_lo) for i in expanded] == [
        (5, 5),
        (9, 9),
        (13, 13),
        (17, 17),
        (21, 21),
    ]
    assert not any(i.outputs[0].loop or i.waits[0].loop_steps for i in expanded)


def _with_variation(count: int, rotation=()) -> bir_pb2.Instruction:
    instr = _instr("x")
    ap = instr.outputs.add(memory=common_pb2.SBUF, tensor="@SBUF")
    for _ in range(count):
        ap.loop.add(step=1, rotation=list(rotation))
    return instr


MALFORMED = {
    "trip count 0": ([_loop(0, 1), _instr("a")], "loop trip count 0"),
    "negative trip count": ([_loop(-3, 1), _instr("a")], "loop trip count -3"),
    "empty body": ([_loop(2, 0), _instr("a")], "loop body of 0 entries"),
    "body past the stream": ([_loop(2, 5), _instr("a")], "runs past the end of the stream"),
    "body past its loop": ([_loop(2, 2), _loop(2, 3), _instr("a"), _instr("b")], "enclosing loop's body"),
    "nested too deep": ([*[_loop(1, 9 - k) for k in range(9)], _instr("a")], "nested 9 deep"),
    "variations of another depth": ([_loop(2, 1), _with_variation(2)], "2 loop variations inside 1 loops"),
    "rotation not from 0": ([_loop(2, 1), _with_variation(1, [4, 0])], "must start at 0"),
    "rotation too long": ([_loop(2, 1), _with_variation(1, [0] * 17)], "at most 16"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_loops_are_refused(case):
    entries, message = MALFORMED[case]
    with pytest.raises(CompileError) as err:
        loops.check_stream(_stream(*entries), "E503")
    assert err.value.code == "E503" and message in err.value.message, err.value.message


def test_step_limit_is_checked_before_anything_is_expanded():
    started = time.monotonic()
    with pytest.raises(CompileError) as err:
        loops.expand_streams([_stream(_loop(10**15, 1), _instr("a"))], "E603", 1_000_000, limit_code="E605")
    assert err.value.code == "E605" and "1,000,000,000,000,000 instructions" in err.value.message
    assert time.monotonic() - started < 1


# ---- roll_loops ------------------------------------------------------------------------------


def assert_rolled_exactly(program: bir_pb2.Program) -> tuple[int, int]:
    """The rolled streams expand to what codegen wrote (the global order split by engine);
    (static entries, executed instructions)."""
    addresses = {b.name: b.address for b in program.buffers}
    written = {
        s.engine: s.instructions
        for s in streams_of_program(bir_pb2.Program(instructions=program.instructions))
    }
    expanded = loops.expand_streams(list(program.streams), "E603", 10**7)
    assert sorted(s.engine for s in expanded) == sorted(written)
    for stream in expanded:
        original = written[stream.engine]
        assert len(stream.instructions) == len(original)
        for position, (got, want) in enumerate(zip(stream.instructions, original, strict=True)):
            same = loops.canonical(got, addresses) == loops.canonical(want, addresses)
            assert same, (stream.engine, position)
    return sum(len(s.instructions) for s in program.streams), sum(len(s.instructions) for s in expanded)


@pytest.mark.parametrize("seed", range(4))
def test_random_programs_roll_exactly_and_run_alike(seed):
    program = random_program(seed, steps=40)
    ctx = run_passes(program, ",".join(default_pipeline(2)), verify_each=False)
    assert ctx.stats["roll_loops"]["dynamic_instructions"] == len(program.instructions)
    assert_rolled_exactly(program)
    inputs = random_inputs(program, seed)
    unrolled = bir_pb2.Program()
    unrolled.CopyFrom(program)
    del unrolled.streams[:]
    rolled_run, unrolled_run = simulate_program(program, inputs), simulate_program(unrolled, inputs)
    assert not rolled_run.races and rolled_run.simulated_ns == unrolled_run.simulated_ns
    for name, value in unrolled_run.outputs.items():
        np.testing.assert_array_equal(rolled_run.outputs[name], value)


def test_birverifier_checks_a_rolled_stream_against_the_global_order():
    program = random_program(7, steps=45)
    run_passes(program, ",".join(default_pipeline(2)) + ",birverifier", verify_each=False)  # accepted
    loop = next(i for s in program.streams for i in s.instructions if i.op == "loop")
    loop.trip_count += 1
    with pytest.raises(CompileError) as err:
        run_passes(program, "birverifier", verify_each=False)
    assert err.value.code == "E410" and "streams" in err.value.message


@pytest.fixture(scope="module")
def chain_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 300-op elementwise chain: SBUF fills up, so the allocator's addresses rotate."""
    folder = tmp_path_factory.mktemp("chain")
    (folder / "chain.hlo").write_text(hlo_gen.hlo_text("chain", n=300, rows=256, cols=512))
    rng = np.random.default_rng(0)
    np.savez(folder / "chain.io.npz", arg0=rng.standard_normal((256, 512)).astype(np.float32))
    return folder / "chain.hlo"


def _program(workdir: Path) -> bir_pb2.Program:
    program = bir_pb2.Program()
    program.ParseFromString(next(workdir.glob("*_WalrusDriver/program.pb")).read_bytes())
    return program


@pytest.mark.slow
@pytest.mark.parametrize("model", ["chain", "mlp.hlo.pb", "cnn.hlo.pb", "rnn.hlo.pb", "gelu.hlo.pb"])
def test_real_models_roll_exactly(model, chain_model, tmp_path):
    path = chain_model if model == "chain" else find_model(model)
    result = ncc("compile", path, "-o", tmp_path / "m.neff", "--workdir", tmp_path / "wd")
    assert result.returncode == 0, result.stderr
    static, executed = assert_rolled_exactly(_program(tmp_path / "wd"))
    assert static < executed
    if model == "chain":  # every op a tile of the same shape: a few loops hold nearly all of it
        assert static < 0.35 * executed


@pytest.mark.slow
def test_rolled_and_unrolled_neffs_run_alike_from_the_cli(chain_model, tmp_path):
    inputs = chain_model.with_name("chain.io.npz")
    runs = {}
    for label, flags in (("rolled", []), ("unrolled", ["--walrus-passes", UNROLLED])):
        neff = tmp_path / f"{label}.neff"
        assert ncc("compile", chain_model, "-o", neff, "--verify", *flags).returncode == 0
        report = tmp_path / f"{label}.json"
        result = ncc(
            "run", neff, "--inputs", inputs, "--output", tmp_path / f"{label}.npz", "--inferences", "2",
            "--report", report,
        )
        assert result.returncode == 0, result.stderr
        runs[label] = (
            re.search(r"simulated time (\d+) ns", result.stdout).group(1),
            np.load(tmp_path / f"{label}.npz"),
            json.loads(report.read_text())["hbm_bytes"],
        )
        runs[label + " inspect"] = ncc("inspect", neff, "--json").stdout
    assert runs["rolled"][0] == runs["unrolled"][0]
    # every iteration's transfers are counted: the bytes moved are the unrolled program's
    with np.load(inputs) as io:
        least = sum(io[name].nbytes for name in io.files)  # each input read once, the output written once
    assert runs["rolled"][2] == runs["unrolled"][2] >= least
    np.testing.assert_array_equal(runs["rolled"][1]["out0"], runs["unrolled"][1]["out0"])
    rolled = decode_neff((tmp_path / "rolled.neff").read_bytes())
    unrolled = decode_neff((tmp_path / "unrolled.neff").read_bytes())
    rolled_count = sum(len(s.instructions) for s in rolled.streams)
    unrolled_count = sum(len(s.instructions) for s in unrolled.streams)
    assert rolled_count < 0.35 * unrolled_count and len(rolled.buffers) < len(unrolled.buffers)
    assert f'"executed": {unrolled_count}' in runs["rolled inspect"]
    assert f'"instructions": {rolled_count}' in runs["rolled inspect"]


# ---- hostile loops ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rolled_neff(chain_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rolled") / "chain.neff"
    assert ncc("compile", chain_model, "-o", path).returncode == 0
    return path


def _edited(neff_path: Path, tmp_path: Path, edit) -> Path:
    neff = decode_neff(neff_path.read_bytes())
    edit(next(i for s in neff.streams for i in s.instructions if i.op == "loop"))
    path = tmp_path / "edited.neff"
    path.write_bytes(encode_neff(neff))
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("trip_count", 0, "E603"),
        ("trip_count", -7, "E603"),
        ("body_length", 10**6, "E603"),
        ("trip_count", 10**15, "E605"),
    ],
)
def test_hostile_loops_are_one_line_errors(rolled_neff, chain_model, tmp_path, field, value, code):
    path = _edited(rolled_neff, tmp_path, lambda loop: setattr(loop, field, value))
    started = time.monotonic()
    result = ncc(
        "run", path, "--inputs", chain_model.with_name("chain.io.npz"), "--output", tmp_path / "o.npz"
    )
    assert_one_line_error(result, code)
    assert time.monotonic() - started < 30 and not (tmp_path / "o.npz").exists()
    if code == "E603":
        assert_one_line_error(ncc("inspect", path), "E502")


def test_packager_refuses_a_malformed_loop():
    program = random_program(0, steps=20)
    run_passes(program, ",".join(default_pipeline(2)), verify_each=False)
    program.streams[0].instructions.insert(0, _loop(0, 1))
    with pytest.raises(CompileError) as err:
        build_neff(program)
    assert err.value.code == "E503" and "loop trip count 0" in err.value.message


# ---- a planted dropped rotation wait ---------------------------------------------------------

FAULT = {"NCC_FAULT_INJECT": "walrus_driver:drop_rotation_wait@pass=roll_loops"}


@pytest.mark.slow
def test_a_dropped_rotation_wait_is_a_race_between_iterations_and_bisect_names_roll_loops(tmp_path):
    model = tmp_path / "chain.hlo"
    model.write_text(hlo_gen.hlo_text("chain", n=120, rows=256, cols=512))
    np.savez(tmp_path / "in.npz", arg0=np.ones((256, 512), np.float32))
    workdir = tmp_path / "wd"
    assert ncc("compile", model, "-o", tmp_path / "bad.neff", "--workdir", workdir, env=FAULT).returncode == 0
    log = next(workdir.glob("*_WalrusDriver/stderr.log")).read_text()
    assert "drop_rotation_wait: dropped rotation wait" in log
    result = ncc(
        "run", tmp_path / "bad.neff", "--inputs", tmp_path / "in.npz", "--output", tmp_path / "o.npz"
    )
    line = assert_one_line_error(result, "R001")
    racing = re.findall(r"'([^']+@\d+)' \((\w+)\)", line)
    assert len(racing) == 2, line  # both instructions, each with its iteration
    bisect = ncc("bisect", workdir, env=FAULT, timeout=600)
    assert bisect.returncode == 5, bisect.stdout + bisect.stderr
    assert "stops matching after pass roll_loops" in bisect.stdout
