"""HLO while loops kept as loops (hlo2penguin/repeat.py, hlo_opt/segments.py, bir_codegen's region
loop): a long scan lowers to one Repeat region and a BIR loop; every kept loop of real JAX code
(tests/data/loops, scripts/make_loop_fixtures.py) computes what its unrolled compile computes,
race-free; a loop that does not fit a region, or is too small to pay, unrolls as before."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from conftest import MODELS_DIR
from orchestrator_support import ncc

from ncc.schemas import penguin_pb2
from ncc.tools.common import loops
from ncc.tools.common.errors import CompileError
from ncc.tools.hlo.hlo_reader import parse_module_text
from ncc.tools.hlo2penguin.lower import lower_module
from ncc.tools.hlo2penguin.trip_fold import steps_evenly
from ncc.tools.hlo_opt import bir_codegen
from ncc.tools.hlo_opt.bir_codegen import lower_to_bir
from ncc.tools.hlo_opt.golden.evaluator import evaluate
from ncc.tools.hlo_opt.optimizer import optimize, pass_list
from ncc.tools.packager.neff import build_neff
from ncc.tools.sim.api import simulate_neff
from ncc.tools.walrus_driver.__main__ import compile_program
from ncc.tools.walrus_driver.pass_manager import default_pipeline

LOOPS = Path(__file__).parent / "data" / "loops"
RNN = (MODELS_DIR / "rnn.hlo").read_text()  # lax.scan over 10 steps of a [4, 32] tanh RNN


def _rnn(steps: int) -> str:
    return RNN.replace("f32[10,4,32]", f"f32[{steps},4,32]").replace("constant(10)", f"constant({steps})")


def _lower(text: str, mode: str = "rolled", repeat_above: int | None = None) -> penguin_pb2.Program:
    module = parse_module_text(text.encode())
    if repeat_above is None:
        return lower_module(module, mode)
    return lower_module(module, mode, repeat_above)


def _inputs(program: penguin_pb2.Program) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    shapes = sorted((t.index, tuple(t.shape)) for t in program.tensors if t.role == penguin_pb2.INPUT)
    return {f"arg{k}": (0.5 * rng.standard_normal(shape)).astype(np.float32) for k, shape in shapes}


def _run(program: penguin_pb2.Program, mode: str, inputs: dict[str, np.ndarray]):
    optimize(program, pass_list("", 2), num_stages=0)
    bir = lower_to_bir(program, loops=mode)
    compile_program(bir, default_pipeline(2))
    neff = build_neff(bir)
    return neff, simulate_neff(neff, inputs)


def test_a_2000_step_scan_lowers_to_one_region():
    program = _lower(_rnn(2000))
    (repeat,) = program.repeats
    assert repeat.trips == 2000 and repeat.source == "while.6"
    # xs[t] is read and ys[t] written in place, a [4, 32] row further at every trip
    assert dict(repeat.steps) == {"xs.1": 128, "while.6.carry2": 128}
    kept = [n for n in program.nests if n.attributes.get("repeat") == repeat.name]
    assert 2 <= len(kept) <= len(program.nests) < 12  # two dots, add, tanh, ys[t] = h, h written back
    assert not _lower(_rnn(2000), "unrolled").repeats


def test_loops_too_small_to_pay_unroll():
    # unrolled, 10 steps are ~200 instructions: a kept loop would send h through HBM every step
    assert not _lower(RNN).repeats
    assert _lower(RNN, repeat_above=0).repeats
    assert not _lower(RNN, "unrolled", repeat_above=0).repeats


def test_a_region_is_a_bir_loop_whose_hbm_offsets_move_by_the_trip():
    program = _lower(_rnn(300), repeat_above=0)
    optimize(program, pass_list("", 2), num_stages=0)
    bir = lower_to_bir(program, loops="auto")  # a program with a region is emitted with its loops
    (entry,) = [i for i in bir.instructions if i.op == loops.LOOP_OP and not i.HasField("in_loop")]
    assert entry.trip_count == 300
    xs_loads = [i for i in bir.instructions if i.in_loop == entry.id and i.op == "dma"
                and i.inputs[0].tensor == "xs.1"]
    assert xs_loads and all(i.inputs[0].loop[0].step == 128 for i in xs_loads)


FIXTURES = sorted(path.stem for path in LOOPS.glob("*.hlo"))


@pytest.mark.parametrize("name", [*FIXTURES, "rnn"])
def test_a_kept_loop_computes_what_its_unrolled_compile_computes(name):
    text = RNN if name == "rnn" else (LOOPS / f"{name}.hlo").read_text()
    kept = _lower(text, repeat_above=0)
    assert kept.repeats, "the loop was not kept"
    inputs = _inputs(kept)
    neff, result = _run(kept, "rolled", inputs)
    _, reference = _run(_lower(text, "unrolled"), "unrolled", inputs)
    assert not result.races and result.deadlock is None
    for out in reference.outputs:
        np.testing.assert_allclose(result.outputs[out], reference.outputs[out], rtol=2e-6, atol=1e-6)
    static = sum(len(s.instructions) for s in neff.streams)
    executed = sum(loops.check_stream(s, "E603") for s in neff.streams)
    assert static < executed


@pytest.mark.parametrize("name", ["decoder_scan", "running_stats", "swap_carry"])
def test_a_kept_loop_synchronized_as_a_barrier_computes_the_same(monkeypatch, name):
    # every region a barrier loop (a 1,000-instruction body is one by default: a decoder layer)
    monkeypatch.setattr(bir_codegen, "BARRIER_BODY", 1)
    text = (LOOPS / f"{name}.hlo").read_text()
    kept = _lower(text, repeat_above=0)
    inputs = _inputs(kept)
    neff, result = _run(kept, "rolled", inputs)
    entries = [i for s in neff.streams for i in s.instructions if i.op == loops.LOOP_OP]
    assert any(i.trip_count == kept.repeats[0].trips for i in entries)
    _, reference = _run(_lower(text, "unrolled"), "unrolled", inputs)
    assert not result.races and result.deadlock is None
    for out in reference.outputs:
        np.testing.assert_allclose(result.outputs[out], reference.outputs[out], rtol=2e-6, atol=1e-6)


def test_a_carry_nothing_reads_after_the_loop_is_still_handed_from_trip_to_trip():
    # only ys leaves the loop: h's write-back at the end of a trip is read by the next trip alone
    text = RNN.replace("ROOT tuple.5 = (f32[4,32]{1,0}, f32[10,4,32]{2,1,0}) tuple(while.8, while.9)",
                       "ROOT tuple.5 = (f32[10,4,32]{2,1,0}) tuple(while.9)")
    text = text.replace("->(f32[4,32]{1,0}, f32[10,4,32]{2,1,0})", "->(f32[10,4,32]{2,1,0})")
    assert "tuple(while.9)" in text
    kept = _lower(text, repeat_above=0)
    assert kept.repeats
    inputs = _inputs(kept)
    _, result = _run(kept, "rolled", inputs)
    expected = evaluate(parse_module_text(text.encode()), [inputs[f"arg{k}"] for k in range(len(inputs))])
    np.testing.assert_allclose(result.outputs["out0"], expected[0], rtol=1e-5, atol=1e-5)


def test_a_carry_read_after_its_update_in_place_unrolls():
    # h + ys_old[0] read after ys = ys.at[t].set(h): the update cannot write ys in place
    text = RNN.replace(
        "  ROOT tuple.3 = (s32[], f32[4,32]{1,0}, f32[10,4,32]{2,1,0}, f32[10,4,32]{2,1,0}, f32[32,32]{1,0}, "
        "/*index=5*/f32[32,32]{1,0}) tuple(add.3, closed_call.4,",
        "  old.1 = f32[1,4,32]{2,1,0} slice(get-tuple-element.8), slice={[0:1], [0:4], [0:32]}\n"
        "  old.2 = f32[4,32]{1,0} reshape(old.1)\n"
        "  next.1 = f32[4,32]{1,0} add(closed_call.4, old.2)\n"
        "  ROOT tuple.3 = (s32[], f32[4,32]{1,0}, f32[10,4,32]{2,1,0}, f32[10,4,32]{2,1,0}, f32[32,32]{1,0}, "
        "/*index=5*/f32[32,32]{1,0}) tuple(add.3, next.1,")
    assert "next.1" in text
    program = _lower(text, repeat_above=0)
    assert not program.repeats
    inputs = _inputs(program)
    _, result = _run(program, "rolled", inputs)
    module = parse_module_text(text.encode())
    expected = evaluate(module, [inputs[f"arg{k}"] for k in range(len(inputs))])
    for k, want in enumerate(expected):
        np.testing.assert_allclose(result.outputs[f"out{k}"], want, rtol=1e-5, atol=1e-5)


def test_a_malformed_region_is_refused():
    program = _lower(_rnn(300), repeat_above=0)
    program.repeats[0].trips = 0
    with pytest.raises(CompileError, match="E301.*runs 0 times"):
        lower_to_bir(program, loops="rolled")
    split = _lower(_rnn(300), repeat_above=0)  # the region's nests with one of its own in between
    kept = [k for k, nest in enumerate(split.nests) if nest.attributes.get("repeat")]
    del split.nests[kept[1]].attributes["repeat"]
    with pytest.raises(CompileError, match="E301.*not one run of nests"):
        lower_to_bir(split, loops="rolled")
    split.nests[kept[1]].attributes["repeat"] = "nowhere"
    with pytest.raises(CompileError, match="E301.*not declared"):
        lower_to_bir(split, loops="rolled")


@pytest.mark.slow
def test_the_1000_step_scan_of_the_zoo_compiles_to_a_loop(tmp_path):
    neff = tmp_path / "rnn_long.neff"
    result = ncc("compile", MODELS_DIR / "rnn_long.hlo.pb", "-o", neff, "--workdir", tmp_path / "w")
    assert result.returncode == 0, result.stderr
    shown = ncc("inspect", neff)
    static, executed = (int(n.replace(",", "")) for n in
                        re.search(r"([\d,]+) instructions \(([\d,]+) executed\)", shown.stdout).groups())
    assert static < 100 and executed > 1000 * 10  # 1,000 trips of the loop, each ten or more


def test_a_scan_past_the_unrollers_limit_stays_one_loop_and_computes():
    # 12,000 trips: more than a loop may unroll (10,000), folded for all trips at once
    program = _lower(_rnn(12_000))
    assert [repeat.trips for repeat in program.repeats] == [12_000]
    inputs = _inputs(program)
    inputs["arg3"] *= 0.1  # h @ u contracts: rounding does not grow over 12,000 steps
    _, result = _run(program, "rolled", inputs)
    assert not result.races and result.deadlock is None
    xs, h, w, u = (inputs[f"arg{k}"].astype(np.float64) for k in range(4))
    ys = np.empty_like(xs)
    for t in range(len(xs)):
        h = ys[t] = np.tanh(xs[t] @ w + h @ u)
    last, all_ys = (result.outputs[name] for name in sorted(result.outputs))
    np.testing.assert_allclose(last, h, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(all_ys, ys, rtol=1e-4, atol=1e-5)


def _counted_loop(start: int, step: str, stop: str, extra: str = "") -> str:
    """A loop over an f32[8] carry whose s32 counter starts at `start`, steps by `step` (an HLO
    instruction on i and one or two) and runs while `stop` (one on i and n = 100 or z = 0) holds;
    `extra`: more of the body."""
    return f"""HloModule m
body {{
  s = (s32[], f32[8]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  x = f32[8] get-tuple-element(s), index=1
  one = s32[] constant(1)
  two = s32[] constant(2)
  {extra}
  y = f32[8] exponential(x)
  j = s32[] {step}
  ROOT t = (s32[], f32[8]) tuple(j, y)
}}
cond {{
  s = (s32[], f32[8]) parameter(0)
  i = s32[] get-tuple-element(s), index=0
  n = s32[] constant(100)
  z = s32[] constant(0)
  ROOT c = pred[] {stop}
}}
ENTRY main {{
  x = f32[8] parameter(0)
  c = s32[] constant({start})
  init = (s32[], f32[8]) tuple(c, x)
  ROOT w = (s32[], f32[8]) while(init), condition=cond, body=body
}}
"""


def _fold_all_at_once(text: str, start: int):
    """trip_fold.fold_trips on the module's loop, its counter starting at `start`."""
    from ncc.tools.hlo2penguin.control import ControlOps
    from ncc.tools.hlo2penguin.trip_fold import fold_trips

    module = parse_module_text(text.encode())
    body, condition = (c for c in module.computations if c.name in ("body", "cond"))
    return fold_trips(ControlOps._fold_values, body, condition, (np.asarray([start], np.int32), None), 1_000)


@pytest.mark.parametrize("start, step, stop, trips, stride", [
    (5, "add(i, two)", "compare(i, n), direction=LT", 48, 2),  # 5, 7, ..., 99
    (100, "subtract(i, one)", "compare(i, z), direction=GT", 100, -1),  # counting down to 1
    (1, "multiply(i, two)", "compare(i, n), direction=LT", 7, None),  # doubling: trip by trip
    (0, "add(i, one)", "compare(i, n), direction=GT", 0, 1),  # never runs
])
def test_the_trip_count_folds_for_all_trips_at_once_or_trip_by_trip(start, step, stop, trips, stride):
    text = _counted_loop(start, step, stop)
    closed = _fold_all_at_once(text, start)
    if stride is None:
        assert closed is None  # not affine in the trip
    else:
        assert closed.count == trips and closed.evenly
        assert list(closed.series[0]) == [start + k * stride for k in range(trips + 1)]
    # the unrolled compile agrees, whichever way the count was found
    assert sum(nest.source == "y" for nest in _lower(text, "unrolled").nests) == trips


def test_a_body_scalar_that_does_not_step_evenly_keeps_the_loop_unrolled():
    # `i == 50` is true at one trip only: that trip would lower differently from those compared
    extra = "fifty = s32[] constant(50)\n  at = pred[] compare(i, fifty), direction=EQ"
    closed = _fold_all_at_once(_counted_loop(0, "add(i, one)", "compare(i, n), direction=LT", extra), 0)
    assert closed.count == 100 and not closed.evenly


def test_a_loop_that_never_ends_by_its_counter_is_refused_at_once():
    text = _counted_loop(0, "add(i, two)", "compare(i, n), direction=NE")  # 0, 2, 4, ... never 7
    with pytest.raises(CompileError) as info:
        _lower(text.replace("constant(100)", "constant(7)"))
    assert info.value.code == "E207" and "1,000,000" in str(info.value)


def test_a_value_the_same_at_every_trip_steps_evenly_even_when_infinite():
    """A max's -inf written in the body is the same at every trip: the trips lower alike (it kept
    a rolled stack of softmax layers unrolled); an infinity that changes, or a NaN next to a
    number, does not step evenly."""
    assert steps_evenly(np.array([-np.inf] * 5)) and steps_evenly(np.array([np.nan] * 3))
    assert steps_evenly(np.array([3.0, 5.0, 7.0]))
    assert not steps_evenly(np.array([1.0, np.inf, np.inf])) and not steps_evenly(np.array([1.0, np.nan]))
