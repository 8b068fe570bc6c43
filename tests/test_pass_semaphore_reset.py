"""semaphore_reset: a synchronized program ends with one sem_reset on SP behind waits for every
semaphore's final count, so it runs inference after inference; without it the second inference
races (the simulator), the verifier refuses a reset that an update can outrun, and `ncc run
--inferences N` / `ncc-sim` report semaphores left above 0 (R003 / E613)."""

from __future__ import annotations

import numpy as np
import pytest
from walrus_builders import SP, chain_program, run_passes

from ncc.schemas import bir_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.sim.api import simulate_program
from ncc.tools.walrus_driver.passes.bir_sim import random_inputs

SYNCED = (
    "anti_dependency_analyzer,dep_reduction,pre_sched,allocation,assign_hwdge_engine,"
    "anti_dependency_analyzer,alloc_semaphores"
)


def _compiled(tiles: int, reset: bool) -> bir_pb2.Program:
    program = chain_program(tiles=tiles)
    run_passes(program, SYNCED + (",semaphore_reset,birverifier,codegen" if reset else ""))
    return program


def test_reset_is_last_on_sp_behind_few_waits():
    program = chain_program(tiles=4)
    ctx = run_passes(program, SYNCED + ",semaphore_reset,birverifier,codegen")  # the verifier's rule holds
    sp = [instr for instr in program.instructions if instr.engine == SP]
    assert sp[-1].op == "sem_reset" and sum(i.op == "sem_reset" for i in program.instructions) == 1
    assert all(len(instr.waits) <= 2 for instr in program.instructions)
    stats = ctx.stats["semaphore_reset"]
    used = ctx.stats["alloc_semaphores"]["semaphores"]
    assert 1 <= stats["reset_waits"] < used  # implied final counts are not waited for again
    assert program.num_semaphores == used + (stats["barrier_arrivals"] > 0)


@pytest.mark.parametrize("tiles", [2, 5])
def test_three_inferences_in_a_row_are_race_free_and_right(tiles: int):
    program = _compiled(tiles=tiles, reset=True)
    inputs = random_inputs(program, 1)
    result = simulate_program(program, inputs, inferences=3)
    assert not result.races and result.deadlock is None and not result.unreset_semaphores
    assert len(result.inference_ns or []) == 3
    np.testing.assert_allclose(result.outputs["out0"], np.exp(inputs["arg0"] + inputs["arg1"]), rtol=1e-6)


def test_without_the_reset_the_second_inference_races():
    program = _compiled(tiles=3, reset=False)
    inputs = random_inputs(program, 1)
    once = simulate_program(program, inputs)
    assert not once.races and once.unreset_semaphores  # one inference is fine but leaves counts
    twice = simulate_program(program, inputs, inferences=2)
    assert twice.races


def test_verifier_refuses_a_reset_an_update_can_outrun():
    program = _compiled(tiles=3, reset=True)
    reset_waits = [instr for instr in program.instructions if instr.engine == SP and instr.waits][-1]
    del reset_waits.waits[:]
    del program.streams[:]
    with pytest.raises(CompileError) as err:
        run_passes(program, "codegen,birverifier", verify_each=False)
    assert err.value.code == "E410" and "semaphore_reset" in err.value.message
    assert "not ordered before the reset" in err.value.message


def test_verifier_refuses_a_finished_program_without_a_reset():
    program = _compiled(tiles=2, reset=False)
    with pytest.raises(CompileError) as err:
        run_passes(program, "codegen,birverifier", verify_each=False)
    assert "0 sem_reset instructions" in err.value.message and "run semaphore_reset" in err.value.message


def test_a_second_reset_pass_is_refused():
    program = _compiled(tiles=2, reset=True)
    with pytest.raises(CompileError) as err:
        run_passes(program, "semaphore_reset", verify_each=False)
    assert err.value.code == "E402"
