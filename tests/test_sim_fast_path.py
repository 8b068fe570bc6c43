"""The simulator runs loops without expanding them (tools/sim/program.py): each test runs a rolled
program and the same program expanded by loops.expand_streams (the definition of what a loop
executes) and asks for the same everything: outputs bit for bit, simulated time, busy times,
the schedule, races (named `name@r,...`, in the same order, with the same count), deadlock text,
errors (code and message, named after the same first failing instance) and what an observer is
shown. Also: the step limit (E605, `--max-steps`), the analytic range search, and the coming
threshold clamp as the one-line change to loops.wait_value it is meant to be."""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
import re
import time
from collections.abc import Callable

import hlo_gen
import numpy as np
import pytest
import sim_gen
from orchestrator_support import assert_one_line_error, ncc
from walrus_builders import random_program, run_passes

from ncc.schemas import bir_pb2
from ncc.tools.common import loops
from ncc.tools.common.errors import CompileError
from ncc.tools.packager.neff import decode_neff, encode_neff
from ncc.tools.sim import effects
from ncc.tools.sim.api import SimResult, simulate_neff, simulate_program
from ncc.tools.walrus_driver.pass_manager import default_pipeline
from ncc.tools.walrus_driver.passes.bir_sim import random_inputs

SMALL = sim_gen.Shape(passes=3, tiles=8)


def _expanded(neff: bir_pb2.Neff) -> bir_pb2.Neff:
    flat = bir_pb2.Neff()
    flat.CopyFrom(neff)
    del flat.streams[:]
    flat.streams.extend(loops.expand_streams(list(neff.streams), "E603", 10**7))
    return flat


def _observed(result: SimResult) -> dict:
    schedule = result.schedule
    observed = {
        "outputs": {name: array.tobytes() for name, array in result.outputs.items()},
        "simulated_ns": result.simulated_ns,
        "inference_ns": result.inference_ns,
        "races": [race.describe() for race in result.races],
        "race_count": result.race_count,
        "capped": result.races_capped,
        "deadlock": result.deadlock,
        "busy": result.engine_busy_ns,
        "instructions": result.instruction_count,
        "unreset": result.unreset_semaphores,
    }
    if schedule is not None:
        observed["slices"] = [
            (s.op.name, s.op.uid, s.ready_ns, s.waits_met_ns, s.start_ns, s.end_ns) for s in schedule.slices
        ]
        observed["transfers"] = [(t.op.name, t.queued_ns, t.start_ns, t.end_ns) for t in schedule.transfers]
        observed["ids"] = schedule.ids
    return observed


def _outcome(run: Callable[[], SimResult]) -> dict | tuple[str, str]:
    try:
        return _observed(run())
    except CompileError as err:
        return err.code, err.message


def assert_runs_as_expanded(neff: bir_pb2.Neff, inputs: dict, **options) -> dict | tuple[str, str]:
    """Run `neff` rolled and expanded: the same observations; those of the rolled run."""
    rolled = _outcome(lambda: simulate_neff(neff, inputs, **options))
    expanded = _outcome(lambda: simulate_neff(_expanded(neff), inputs, **options))
    assert rolled == expanded
    return rolled


def _pipeline(drop: tuple[str, ...] = (), shape: sim_gen.Shape = SMALL) -> tuple[bir_pb2.Neff, dict]:
    return sim_gen.pipeline_neff(shape, drop), sim_gen.pipeline_inputs(shape)


def _body(neff: bir_pb2.Neff, name: str) -> bir_pb2.Instruction:
    return next(i for s in neff.streams for i in s.instructions if i.name == name)


# ---- runs ------------------------------------------------------------------------------------


def test_a_pipelined_nest_runs_as_its_expansion_and_computes_the_kernel():
    neff, inputs = _pipeline()
    observed = assert_runs_as_expanded(neff, inputs, record_schedule=True, inferences=2)
    assert not observed["races"] and not observed["deadlock"] and not observed["unreset"]
    assert observed["instructions"] == 2 * SMALL.executed
    out = np.frombuffer(observed["outputs"]["out0"], np.float32).reshape(SMALL.tiles * 128, SMALL.free)
    twice = dataclasses.replace(SMALL, passes=2 * SMALL.passes)  # out carries over: 2 inferences, 6 passes
    np.testing.assert_allclose(out, sim_gen.reference_output(twice, inputs), atol=1e-2)


@pytest.mark.parametrize("drop", [("free",), ("mm",), ("lda", "free")])
def test_races_between_iterations_are_the_expansions(drop):
    observed = assert_runs_as_expanded(*_pipeline(drop))
    assert observed["races"] and all("@" in race for race in observed["races"])


def test_a_race_count_past_the_cap_is_the_expansions():
    shape = sim_gen.Shape(passes=12, tiles=16)
    observed = assert_runs_as_expanded(*_pipeline(("ldx", "free", "lda", "mm", "act"), shape))
    assert observed["capped"] and observed["race_count"] == 10000


def _edit_waits(neff: bir_pb2.Neff, name: str, semaphore: int, value: int) -> bir_pb2.Neff:
    wait = _body(neff, name).waits[0]
    wait.semaphore, wait.value, wait.value_lo = semaphore, value, value
    return neff


def test_a_wait_cycle_inside_loops_is_diagnosed_as_expanded():
    neff, inputs = _pipeline()
    observed = assert_runs_as_expanded(_edit_waits(neff, "ldx", sim_gen.S_POOL, 1), inputs)
    assert observed["deadlock"].startswith("deadlock: wait cycle") and "@0,0" in observed["deadlock"]


def test_a_wait_nothing_satisfies_is_diagnosed_as_expanded():
    neff, inputs = _pipeline()
    observed = assert_runs_as_expanded(_edit_waits(neff, "st", sim_gen.S_POOL, 10**6), inputs)
    assert "'st@0,0' waits for semaphore" in observed["deadlock"]
    neff, inputs = _pipeline()
    observed = assert_runs_as_expanded(_edit_waits(neff, "drain3", sim_gen.S_W, 2), inputs)
    assert "waits forever on semaphore 0 >= 2 (count 1, no remaining update)" in observed["deadlock"]


def _observe_run(program: bir_pb2.Program, inputs: dict) -> tuple[dict, list]:
    """What a run shows, and what its observer is shown (instruction bytes, outputs), in order."""
    seen = []

    def observe(instruction: bir_pb2.Instruction, outputs: list[np.ndarray]) -> None:
        seen.append((instruction.SerializeToString(), [output.tobytes() for output in outputs]))

    return _observed(simulate_program(program, inputs, observe=observe, record_schedule=True)), seen


@pytest.mark.parametrize(("seed", "steps"), [(3, 40), (7, 80), (8, 80)])
def test_random_rolled_programs_run_and_are_observed_as_expanded(seed, steps):
    program = random_program(seed, steps=steps)
    run_passes(program, ",".join(default_pipeline(2)), verify_each=False)
    assert loops.has_loops(program.streams)
    inputs = random_inputs(program, seed)
    expanded = bir_pb2.Program()
    expanded.CopyFrom(program)
    del expanded.streams[:]
    expanded.streams.extend(loops.expand_streams(list(program.streams), "E603", 10**7))
    assert _observe_run(program, inputs) == _observe_run(expanded, inputs)


@pytest.fixture(scope="module")
def chains(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[bir_pb2.Neff, dict]]:
    """A compiled 120-op chain rolled by roll_loops, and the same with a rotation wait dropped."""
    folder = tmp_path_factory.mktemp("chains")
    (folder / "chain.hlo").write_text(hlo_gen.hlo_text("chain", n=120, rows=256, cols=512))
    inputs = {"arg0": np.random.default_rng(0).standard_normal((256, 512)).astype(np.float32)}
    compiled = {}
    fault = {"NCC_FAULT_INJECT": "walrus_driver:drop_rotation_wait@pass=roll_loops"}
    for label, env in (("rolled", None), ("dropped", fault)):
        result = ncc("compile", folder / "chain.hlo", "-o", folder / f"{label}.neff", env=env)
        assert result.returncode == 0, result.stderr
        compiled[label] = (decode_neff((folder / f"{label}.neff").read_bytes()), inputs)
    return compiled


@pytest.mark.slow
def test_a_compiled_chain_and_its_dropped_rotation_wait_run_as_expanded(chains):
    observed = assert_runs_as_expanded(*chains["rolled"], record_schedule=True, inferences=2)
    assert not observed["races"]
    observed = assert_runs_as_expanded(*chains["dropped"])
    assert observed["races"] and all(re.search(r"'[^']+@\d+' \(\w+\)", race) for race in observed["races"])


# ---- errors ----------------------------------------------------------------------------------


def _errors_as_expanded(neff: bir_pb2.Neff, inputs: dict, code: str) -> str:
    rolled = assert_runs_as_expanded(neff, inputs)
    assert isinstance(rolled, tuple) and rolled[0] == code, rolled
    return rolled[1]


def test_an_operand_leaving_its_memory_at_some_iteration_is_named_as_expanded():
    neff, inputs = _pipeline()
    _body(neff, "add").outputs[0].loop[0].step = 100000  # pass 2 is past SBUF's end
    assert "'add@2,0'" in _errors_as_expanded(neff, inputs, "E601")
    neff, _ = _pipeline()
    _body(neff, "scale").inputs[0].loop[1].step = -4000  # the rotation's first wrap is below 0
    assert "'scale@0,4'" in _errors_as_expanded(neff, inputs, "E601")


def test_the_first_failing_instance_of_all_entries_is_the_one_named():
    neff, inputs = _pipeline()
    _body(neff, "ldx").inputs[0].loop[0].step = 30000  # x[(1, 4)] is past x's end
    _body(neff, "st").outputs[0].loop[0].step = 40000  # later in the body, an earlier iteration
    assert "'st@1,3'" in _errors_as_expanded(neff, inputs, "E601")
    _body(neff, "free").waits[0].loop_steps[0] = (1 << 63) - 1  # a threshold past 2^63 from pass 1 on
    assert "'free@1,0'" in _errors_as_expanded(neff, inputs, "E603")  # checked before bounds


def test_offsets_and_thresholds_outside_their_ranges_are_refused_as_expanded():
    neff, inputs = _pipeline()
    _body(neff, "ldx").inputs[0].loop[1].step = 1 << 62
    assert "outside int64" in _errors_as_expanded(neff, inputs, "E603")
    neff, _ = _pipeline()
    _body(neff, "mm").waits[1].loop_steps[1] = 1 << 61
    assert "a wait threshold" in _errors_as_expanded(neff, inputs, "E603")


def test_an_operand_too_big_for_the_host_is_named_as_its_first_instance(monkeypatch):
    monkeypatch.setenv("NCC_SIM_MAX_BYTES", str(10**6))
    neff, inputs = _pipeline()
    _body(neff, "act").inputs[0].dims.add(stride=0, count=1 << 20)
    assert "'act@0,0' input 0 spans" in _errors_as_expanded(neff, inputs, "E604")


@pytest.mark.parametrize("value", ["1GB", "-1", "0", "1e9", "abc"])
def test_a_malformed_host_budget_is_e604_not_ignored(monkeypatch, value):
    monkeypatch.setenv("NCC_SIM_MAX_BYTES", value)
    neff, inputs = _pipeline()
    with pytest.raises(CompileError) as err:
        simulate_neff(neff, inputs)
    assert err.value.code == "E604" and repr(value) in err.value.message


_HOSTILE = [0, 1, -1, 7, 256, -256, 4096, -4096, 60000, -60000, 1 << 40, -(1 << 40), 1 << 62, -(1 << 62)]


def _mutant(rng: random.Random) -> bir_pb2.Neff:
    """The small pipeline with one loop field, threshold or operand size made random or hostile."""
    neff = sim_gen.pipeline_neff(SMALL)
    body = [i for s in neff.streams for i in s.instructions if i.op != "loop" and "@" not in i.name]
    instruction = rng.choice([i for i in body if any(ap.loop for ap in (*i.inputs, *i.outputs)) or i.waits])
    operands = [ap for ap in (*instruction.inputs, *instruction.outputs) if ap.loop]
    how = rng.choice(["step", "rotation", "wait", "trip", "count"])
    if how == "step" and operands:
        rng.choice(rng.choice(operands).loop).step = rng.choice(_HOSTILE)
    elif how == "rotation" and operands:
        variation = rng.choice(rng.choice(operands).loop)
        if len(variation.rotation) > 1:
            variation.rotation[rng.randrange(1, len(variation.rotation))] = rng.choice(_HOSTILE)
    elif how == "wait" and instruction.waits:
        wait = rng.choice(instruction.waits)
        if wait.loop_steps and rng.random() < 0.5:
            wait.loop_steps[rng.randrange(len(wait.loop_steps))] = rng.choice(_HOSTILE)
        else:
            wait.value = max(0, wait.value + rng.choice(_HOSTILE))
    elif how == "trip":
        loop = rng.choice([i for s in neff.streams for i in s.instructions if i.op == "loop"])
        loop.trip_count = rng.randint(1, 9)
    elif operands:
        dims = rng.choice(operands).dims
        dims[rng.randrange(len(dims))].count += rng.choice([1, 7, 300])
    return neff


def test_random_loop_mutants_fail_or_run_as_their_expansions():
    rng = random.Random(3)
    inputs = sim_gen.pipeline_inputs(SMALL)
    outcomes = [assert_runs_as_expanded(_mutant(rng), inputs) for _ in range(24)]
    codes = {outcome[0] if isinstance(outcome, tuple) else "ran" for outcome in outcomes}
    assert {"ran", "E601", "E603"} <= codes, codes


# ---- the step limit --------------------------------------------------------------------------


def test_the_step_limit_is_a_parameter_and_a_hostile_trip_count_is_refused_at_once():
    neff, inputs = _pipeline()
    with pytest.raises(CompileError) as err:
        simulate_neff(neff, inputs, max_steps=SMALL.executed - 1)
    assert err.value.code == "E605" and f"{SMALL.executed:,} instructions" in err.value.message
    assert simulate_neff(neff, inputs, max_steps=SMALL.executed).instruction_count == SMALL.executed
    with pytest.raises(CompileError) as err:  # without loops too
        simulate_neff(_expanded(neff), inputs, max_steps=SMALL.executed - 1)
    assert err.value.code == "E605" and f"execute {SMALL.executed:,} instructions" in err.value.message
    next(i for s in neff.streams for i in s.instructions if i.op == "loop").trip_count = 10**15
    started = time.monotonic()
    with pytest.raises(CompileError) as err:
        simulate_neff(neff, inputs)
    assert err.value.code == "E605" and time.monotonic() - started < 1


def test_ncc_run_takes_max_steps(tmp_path):
    neff, inputs = _pipeline()
    (tmp_path / "p.neff").write_bytes(encode_neff(neff))
    np.savez(tmp_path / "in.npz", **inputs)
    args = ("run", tmp_path / "p.neff", "--inputs", tmp_path / "in.npz", "--output", tmp_path / "o.npz")
    line = assert_one_line_error(ncc(*args, "--max-steps", "100"), "E605")
    assert "(at most 100)" in line and "--max-steps" in line
    assert ncc(*args, "--max-steps", str(SMALL.executed)).returncode == 0
    # The bound is on the whole run: every inference counts, and a huge count is refused at once.
    twice = ncc(*args, "--max-steps", str(SMALL.executed), "--inferences", "2")
    assert f"2 inferences of {SMALL.executed:,} instructions" in assert_one_line_error(twice, "E605")
    started = time.monotonic()
    assert_one_line_error(ncc(*args, "--inferences", str(10**11)), "E605")
    assert time.monotonic() - started < 30


# ---- the pieces ------------------------------------------------------------------------------


def _first_outside_by_search(trips, base, variations, low, high):
    for point in itertools.product(*map(range, trips)):
        value = base + sum(loops.rotated(r, s, p) for (r, s), p in zip(variations, point, strict=True))
        if not low <= value <= high:
            return point
    return None


def test_first_point_outside_is_the_first_failing_point_of_the_nest():
    rng = random.Random(5)
    for _ in range(2000):
        trips = [rng.randint(1, 6) for _ in range(rng.randint(1, 3))]
        variations = []
        for _ in trips:
            rotation = (0, *(rng.randint(-9, 9) for _ in range(rng.randint(0, 3))))
            variations.append((rotation if rng.random() < 0.5 else (), rng.randint(-5, 5)))
        base, low, high = rng.randint(-20, 20), rng.randint(-25, 0), rng.randint(0, 25)
        found = loops.first_point_outside(trips, base, variations, range(low, high + 1).__contains__)
        assert found == _first_outside_by_search(trips, base, variations, low, high)


def test_a_layout_enumerates_and_places_the_expansion():
    neff, _ = _pipeline()
    for stream, flat in zip(neff.streams, _expanded(neff).streams, strict=True):
        layout = loops.Layout.of(stream, "E603")
        names = [
            f"{stream.instructions[i].name}@{','.join(map(str, p))}" if p else stream.instructions[i].name
            for i, p in layout.instances()
        ]
        assert names == [i.name for i in flat.instructions] and layout.executed == len(names)
        for position, (index, point) in enumerate(layout.instances()):
            assert layout.position(index, point) == position
        assert list(layout.instances(len(names) // 2)) == list(layout.instances())[len(names) // 2 :]


def test_a_threshold_below_zero_inside_a_loop_holds_at_once():
    """loops.wait_value clamps a grown threshold below 0 to 0 (docs/ir.md, Loops); the expansion
    and the fast path agree on it: without their credits the waits hold at once, and the
    iterations they ordered race."""
    neff, inputs = _pipeline()
    for name in ("ldx", "free"):  # without their credits: thresholds start below 0
        _body(neff, name).waits[0].value -= SMALL.rotation
    observed = assert_runs_as_expanded(neff, inputs)
    assert isinstance(observed, dict) and observed["races"]  # the credits were what ordered them


def test_a_stream_without_loops_is_not_checked_for_loop_fields():
    """As expand_streams: with no loop anywhere, a stray variation or step is ignored, not refused."""
    flat, inputs = _expanded(sim_gen.pipeline_neff(SMALL)), sim_gen.pipeline_inputs(SMALL)
    instruction = next(i for s in flat.streams for i in s.instructions if i.inputs and len(i.waits) < 2)
    instruction.inputs[0].loop.add(step=1)
    instruction.waits.add(semaphore=0, value=0, loop_steps=[3])
    plain = _expanded(sim_gen.pipeline_neff(SMALL))
    assert _observed(simulate_neff(flat, inputs)) == _observed(simulate_neff(plain, inputs))


# ---- effects in a forked child ---------------------------------------------------------------


@pytest.fixture
def spied_effects(monkeypatch: pytest.MonkeyPatch) -> list[effects.Effects]:
    """Every Effects the runs make, and every run's effects forked however short it is."""
    made: list[effects.Effects] = []
    real = effects.Effects.__init__

    def init(self: effects.Effects, *args, **kwargs) -> None:
        real(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(effects.Effects, "__init__", init)
    monkeypatch.setattr(effects, "PARALLEL_MIN_INSTRUCTIONS", 0)
    return made


def _in_one_process(neff: bir_pb2.Neff, inputs: dict, **options) -> dict | tuple[str, str]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(effects, "PARALLEL_MIN_INSTRUCTIONS", 10**18)
        return _outcome(lambda: simulate_neff(neff, inputs, **options))


@pytest.mark.parametrize("drop", [(), ("free",)])
def test_effects_applied_by_a_forked_child_are_those_of_one_process(spied_effects, drop):
    neff, inputs = _pipeline(drop)
    forked_run = _outcome(lambda: simulate_neff(neff, inputs, inferences=2, record_schedule=True))
    assert forked_run == _in_one_process(neff, inputs, inferences=2, record_schedule=True)
    assert spied_effects[0]._worker.ran_in_child and spied_effects[1]._worker is None


def test_a_deadlocked_run_forks_and_names_the_deadlock_alike(spied_effects):
    neff, inputs = _pipeline()
    _edit_waits(neff, "ldx", sim_gen.S_POOL, 1)
    assert _outcome(lambda: simulate_neff(neff, inputs)) == _in_one_process(neff, inputs)


def test_when_the_child_dies_its_effects_are_applied_here(spied_effects, monkeypatch):
    monkeypatch.setattr(effects, "_read_uids", lambda fd: os._exit(3))  # in the child only
    neff, inputs = _pipeline()
    assert _outcome(lambda: simulate_neff(neff, inputs)) == _in_one_process(neff, inputs)
    assert spied_effects[0]._worker.started is False and not spied_effects[0]._worker.ran_in_child


def test_without_fork_the_effects_are_applied_here(spied_effects, monkeypatch):
    def no_fork() -> int:
        raise OSError("no process slot")

    monkeypatch.setattr(os, "fork", no_fork)
    neff, inputs = _pipeline()
    assert _outcome(lambda: simulate_neff(neff, inputs)) == _in_one_process(neff, inputs)


def test_an_observed_run_stays_in_one_process(spied_effects):
    neff, inputs = _pipeline()
    program = bir_pb2.Program(
        target=neff.target, num_semaphores=neff.num_semaphores, hbm=neff.hbm, buffers=neff.buffers,
        streams=neff.streams,
    )
    simulate_program(program, inputs, observe=lambda instruction, outputs: None)
    assert spied_effects[0]._worker is None
