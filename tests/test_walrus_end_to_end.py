"""The whole backend on random programs: race-free, deadlock-free, equal to sequential execution;
and every wait it inserts is necessary (deleting any one makes both the simulator and the
verifier report the race)."""

from __future__ import annotations

import pytest
from walrus_builders import random_program, run_passes

from ncc.schemas import bir_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.sim.api import simulate_program
from ncc.tools.walrus_driver.pass_manager import PassManager, default_pipeline
from ncc.tools.walrus_driver.passes.bir_sim import random_inputs


@pytest.mark.parametrize("optlevel", [0, 2])
@pytest.mark.parametrize("seed", range(8))
def test_random_program_compiles_to_an_equivalent_race_free_program(seed, optlevel):
    program = random_program(seed, steps=45)
    ctx = run_passes(program, ",".join(default_pipeline(optlevel) + ["bir_sim"]), verify_each=optlevel == 0)
    stats = ctx.stats["bir_sim"]
    assert stats["races"] == 0 and stats["deadlock"] == 0 and stats["outputs_compared"] == 1


@pytest.mark.parametrize("seed", [0, 5])
def test_every_inserted_wait_is_necessary(seed):
    program = random_program(seed, steps=30)
    ctx = run_passes(program, ",".join(default_pipeline(2)), verify_each=False)
    inputs = random_inputs(program, 0)
    waits = [(i, k) for i, instr in enumerate(program.instructions) for k in range(len(instr.waits))]
    assert len(waits) > 10
    for i, k in waits:
        broken = bir_pb2.Program()
        broken.CopyFrom(program)
        del broken.streams[:]
        del broken.instructions[i].waits[k]
        at_reset = _inserted_by_reset(program.instructions[i])
        if not at_reset:  # a reset's wait orders the end of the inference, not data
            assert simulate_program(broken, inputs).races, (program.instructions[i].name, k)
        ctx.program, ctx.codegen_done = broken, False
        with pytest.raises(CompileError) as err:
            PassManager("birverifier").run(ctx)
        assert ("semaphore_reset" if at_reset else "unsynchronized_dependence") in err.value.message


def _inserted_by_reset(instr: bir_pb2.Instruction) -> bool:
    return instr.attributes.get("inserted_by") == "semaphore_reset"


def test_large_program_compiles():
    program = random_program(11, steps=1500)
    ctx = run_passes(program, ",".join(default_pipeline(2)), verify_each=False)
    assert ctx.stats["birverifier"]["sync_coverage_checked"] == 1


def test_every_wait_of_a_real_model_is_necessary():
    """The JAX softmax model, compiled by the default pipeline: deleting any single one of its
    waits makes the simulator report a race (every wait orders a real conflict of bytes)."""
    from pathlib import Path

    import numpy as np

    from ncc.tools.hlo.hlo_reader import load_module
    from ncc.tools.hlo.hlo_verify import verify_module
    from ncc.tools.hlo2penguin.lower import lower_module
    from ncc.tools.hlo_opt.bir_codegen import lower_to_bir

    models = Path(__file__).resolve().parents[1] / "models"
    module = load_module(str(models / "softmax.hlo.pb"))
    verify_module(module)
    program = lower_to_bir(lower_module(module))
    run_passes(program, ",".join(default_pipeline(2)), verify_each=False)
    inputs = {
        key: value for key, value in np.load(models / "softmax.io.npz").items() if key.startswith("arg")
    }
    assert not simulate_program(program, inputs).races
    waits = [
        (i, k)
        for i, instr in enumerate(program.instructions)
        for k in range(len(instr.waits))
        if not _inserted_by_reset(instr)  # test_every_inserted_wait_is_necessary covers those
    ]
    assert len(waits) > 10
    missed = []
    for i, k in waits:
        broken = bir_pb2.Program()
        broken.CopyFrom(program)
        del broken.streams[:]
        del broken.instructions[i].waits[k]
        if not simulate_program(broken, inputs).races:
            missed.append((program.instructions[i].name, k))
    assert not missed, f"{len(missed)} of {len(waits)} waits are not needed: {missed[:5]}"
