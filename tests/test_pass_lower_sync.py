"""lower_sync: every wait's threshold encoded as the wait instruction's two 32-bit words, executed
from those words by the simulator, checked by birverifier's rule `wait_value`."""

from __future__ import annotations

import pytest
from walrus_builders import chain_program, run_passes

from ncc.schemas import bir_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.sim.api import simulate_program
from ncc.tools.walrus_driver.passes.bir_sim import random_inputs

SYNC = (
    "anti_dependency_analyzer,dep_reduction,assign_hwdge_engine,pre_sched,allocation,"
    "anti_dependency_analyzer,alloc_semaphores,sync_dve_pool,semaphore_reset"
)


def lowered_chain(tiles: int = 2) -> tuple[bir_pb2.Program, dict]:
    program = chain_program(tiles=tiles)
    ctx = run_passes(program, SYNC + ",lower_sync")
    return program, ctx.stats["lower_sync"]


def waits_of(program: bir_pb2.Program) -> list[bir_pb2.SemaphoreWait]:
    return [wait for instr in program.instructions for wait in instr.waits]


def test_every_wait_gets_the_words_of_its_threshold():
    program, stats = lowered_chain()
    waits = waits_of(program)
    assert waits and stats["waits_lowered"] == len(waits)
    for wait in waits:
        assert wait.HasField("value_lo") and wait.HasField("value_hi")
        assert (wait.value_lo, wait.value_hi) == (wait.value, 0)
    assert stats["largest_wait_value"] == max(wait.value for wait in waits)
    assert stats["waits_with_high_word"] == 0
    assert program.attributes["walrus.sync_lowered"] == "1"


def test_a_threshold_of_2_to_the_32_or_more_uses_the_high_word():
    program = chain_program(tiles=2)
    run_passes(program, SYNC)
    wait = waits_of(program)[0]
    wait.value = (5 << 32) + 7  # no thread counts that far: only the encoding is under test
    ctx = run_passes(program, "lower_sync", verify_each=False)
    assert (wait.value_lo, wait.value_hi) == (7, 5)
    assert ctx.stats["lower_sync"]["waits_with_high_word"] == 1


def test_the_simulator_runs_a_lowered_wait_from_its_words():
    """Words that say 0 let the consumer run before its producer: a race, though `value` is right."""
    program, _ = lowered_chain()
    assert not simulate_program(program, random_inputs(program, 0)).races
    for wait in waits_of(program):
        wait.value_lo = 0
    assert simulate_program(program, random_inputs(program, 0)).races


def test_the_verifier_refuses_words_that_disagree_with_the_threshold():
    program, _ = lowered_chain()
    victim = next(instr for instr in program.instructions if instr.waits)
    victim.waits[0].value_lo += 1
    with pytest.raises(CompileError) as err:
        run_passes(program, "birverifier", verify_each=False)
    message = err.value.message
    assert err.value.code == "E410" and "wait_value" in message and victim.name in message
    assert f"is encoded as {victim.waits[0].value + 1} (value_lo" in message


def test_the_verifier_refuses_a_wait_without_words_in_a_lowered_program():
    program, _ = lowered_chain()
    victim = next(instr for instr in program.instructions if instr.waits)
    victim.waits[0].ClearField("value_lo")
    with pytest.raises(CompileError) as err:
        run_passes(program, "birverifier", verify_each=False)
    assert "wait_value" in err.value.message and "no encoded words in a lowered program" in err.value.message


def test_a_negative_threshold_is_refused():
    program = chain_program(tiles=2)
    run_passes(program, SYNC)
    victim = next(instr for instr in program.instructions if instr.waits)
    victim.waits[0].value = -1
    with pytest.raises(CompileError) as err:
        run_passes(program, "birverifier", verify_each=False)
    assert "wait_value" in err.value.message and "outside 0 .. 2^64 - 1" in err.value.message
    with pytest.raises(CompileError) as err:
        run_passes(program, "lower_sync", verify_each=False)
    assert err.value.code == "E405" and "outside 0 .. 2^64 - 1" in err.value.message


@pytest.mark.parametrize("late", ["semaphore_reset", "sync_dve_pool"])
def test_no_pass_adds_waits_after_lowering(late: str):
    program = chain_program(tiles=2)
    passes = SYNC.replace(",semaphore_reset", "") if late == "semaphore_reset" else SYNC
    with pytest.raises(CompileError) as err:
        run_passes(program, passes + ",lower_sync," + late, verify_each=False)
    assert err.value.code == "E402" and "must run before lower_sync" in err.value.message


def test_lowering_after_codegen_is_refused():
    program = chain_program(tiles=2)
    with pytest.raises(CompileError) as err:
        run_passes(program, SYNC + ",codegen,lower_sync", verify_each=False)
    assert err.value.code == "E402" and "codegen" in err.value.message
