"""sync_dve_pool: DVE and POOL share the SBUF port, claimed when an instruction is dispatched, so a
wait that may need the other engine moves onto a `drain` just before its instruction. Without
the pass such programs deadlock in the simulator (naming the port); with it they run right and
race-free, and waits that cannot need the other engine keep their place. birverifier's rule
`dve_pool_port` refuses a synchronized program that lacks a needed drain."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from walrus_builders import DVE, POOL, SP, Bir, by_name, run_passes

from ncc.schemas import bir_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.sim.api import simulate_program
from ncc.tools.target import load_target
from ncc.tools.walrus_driver.context import PassContext
from ncc.tools.walrus_driver.pass_manager import PassManager, default_pipeline
from ncc.tools.walrus_driver.passes.bir_sim import random_inputs

SYNC = "anti_dependency_analyzer,allocation,anti_dependency_analyzer,alloc_semaphores"
MODELS = Path(__file__).resolve().parents[1] / "models"


def ping_pong() -> bir_pb2.Program:
    """POOL doubles a loaded tile, DVE adds 1, POOL triples the sum: each waits for the other."""
    b = Bir()
    b.hbm("x", [128, 64])
    b.hbm("out", [128, 64], role=bir_pb2.OUTPUT)
    for name in ("a", "p", "d", "q"):
        b.buffer(name, 256)
    b.load("a", "x", 128, 64, name="load")
    b.ts("p", "a", 128, 64, scalar=2.0, engine=POOL, name="pool_double")
    b.ts("d", "p", 128, 64, scalar=1.0, func="add", engine=DVE, name="dve_add")
    b.ts("q", "d", 128, 64, scalar=3.0, engine=POOL, name="pool_triple")
    b.store("out", "q", 128, 64, name="store")
    return b.build()


def through_sp() -> bir_pb2.Program:
    """POOL waits only for an SP load, but that load sits behind an SP store of DVE's result: POOL,
    dispatched first, would hold the port DVE needs to let SP reach the load."""
    b = Bir()
    b.hbm("x", [128, 64])
    b.hbm("y", [128, 64])
    b.hbm("out0", [128, 64], role=bir_pb2.OUTPUT, index=0)
    b.hbm("out1", [128, 64], role=bir_pb2.OUTPUT, index=1)
    for name in ("a", "c", "e", "f"):
        b.buffer(name, 256)
    b.load("a", "x", 128, 64, name="load_x")
    b.ts("c", "a", 128, 64, scalar=2.0, engine=DVE, name="dve_double")
    b.store("out0", "c", 128, 64, name="store_c")
    b.load("e", "y", 128, 64, name="load_y")
    b.ts("f", "e", 128, 64, scalar=3.0, engine=POOL, name="pool_triple")
    b.store("out1", "f", 128, 64, name="store_f")
    return b.build()


def test_without_drains_a_dve_pool_ping_pong_deadlocks_on_the_port():
    program = ping_pong()
    run_passes(program, SYNC)
    result = simulate_program(program, random_inputs(program, 0))
    assert result.deadlock is not None and "needs the SBUF port (DVE/POOL)" in result.deadlock


@pytest.mark.parametrize("build", [ping_pong, through_sp])
def test_drains_carry_the_waits_that_could_need_the_other_engine(build):
    program = build()
    run_passes(program, SYNC)
    assert simulate_program(program, random_inputs(program, 0)).deadlock is not None
    program = build()
    ctx = run_passes(program, SYNC + ",sync_dve_pool,semaphore_reset,birverifier,codegen")
    drains = [i for i in program.instructions if i.op == "drain"]
    assert drains and ctx.stats["sync_dve_pool"]["drains"] == len(drains)
    order = [i.name for i in program.instructions]
    for drain in drains:  # each just before its instruction, on its engine, with the moved waits
        owner = by_name(program)[drain.name.removesuffix(".drain")]
        assert order.index(drain.name) + 1 == order.index(owner.name)
        assert drain.engine == owner.engine and drain.waits and not drain.inputs and not drain.outputs
    inputs = random_inputs(program, 0)
    result = simulate_program(program, inputs)
    assert result.deadlock is None and not result.races


def test_ping_pong_computes_the_right_values_and_drains_only_what_needs_it():
    program = ping_pong()
    ctx = run_passes(program, SYNC + ",sync_dve_pool,semaphore_reset")
    # pool_double waits only for the load (no DVE work behind it): it keeps its wait
    assert {i.name for i in program.instructions if i.op == "drain"} == {"dve_add.drain", "pool_triple.drain"}
    assert by_name(program)["pool_double"].waits
    assert ctx.stats["sync_dve_pool"]["waits_moved"] == 2
    inputs = random_inputs(program, 0)
    result = simulate_program(program, inputs)
    np.testing.assert_allclose(result.outputs["out0"], (inputs["arg0"] * 2 + 1) * 3, rtol=1e-6)


def test_a_program_without_pool_gets_no_drain():
    b = Bir()
    b.hbm("x", [128, 64])
    b.hbm("out", [128, 64], role=bir_pb2.OUTPUT)
    for name in ("a", "c"):
        b.buffer(name, 256)
    b.load("a", "x", 128, 64, name="load")
    b.ts("c", "a", 128, 64, name="dve")
    b.store("out", "c", 128, 64, name="store")
    program = b.build()
    ctx = run_passes(program, SYNC + ",sync_dve_pool")
    assert ctx.stats["sync_dve_pool"] == {"port_instructions_waiting": 0, "drains": 0, "waits_moved": 0}
    assert program.num_semaphores and by_name(program)["dve"].waits  # its wait stays on it


def test_verifier_refuses_synchronized_bir_missing_a_drain():
    """Hand-made BIR handed to the backend already synchronized, its waits on the port holders."""
    program = ping_pong()
    run_passes(program, SYNC + ",semaphore_reset")
    received = bir_pb2.Program.FromString(program.SerializeToString())
    ctx = PassContext.for_program(received, load_target("trn1"))
    with pytest.raises(CompileError) as err:
        PassManager("birverifier").run(ctx)
    assert err.value.code == "E410"
    message = err.value.message
    assert "birverifier: dve_pool_port: dve_add: holds the SBUF port (DVE/POOL) from dispatch" in message


def test_a_real_model_needs_its_drains():
    """The bundled cnn_train (POOL selects and integer ops beside DVE): compiled by the default
    pipeline it runs right and race-free; without sync_dve_pool it deadlocks on the port."""
    from ncc.tools.hlo.hlo_reader import load_module
    from ncc.tools.hlo2penguin.lower import lower_module
    from ncc.tools.hlo_opt.bir_codegen import lower_to_bir

    frontend = lower_to_bir(lower_module(load_module(str(MODELS / "cnn_train.hlo.pb"))))
    io = np.load(MODELS / "cnn_train.io.npz")
    inputs = {key: value for key, value in io.items() if key.startswith("arg")}
    program = bir_pb2.Program()
    program.CopyFrom(frontend)
    ctx = run_passes(program, ",".join(default_pipeline(2)), verify_each=False)
    assert ctx.stats["sync_dve_pool"]["drains"] > 0
    result = simulate_program(program, inputs)
    assert result.deadlock is None and not result.races
    for key, expected in io.items():
        if key.startswith("out"):
            np.testing.assert_allclose(result.outputs[key], expected, rtol=1e-4, atol=1e-4)
    without = [p for p in default_pipeline(2) if p not in ("sync_dve_pool", "birverifier")]
    run_passes(frontend, ",".join(without), verify_each=False)
    deadlock = simulate_program(frontend, inputs).deadlock
    assert deadlock is not None and "SBUF port" in deadlock


def test_drain_runs_on_sp_is_refused():
    program = ping_pong()
    run_passes(program, SYNC + ",sync_dve_pool")
    next(i for i in program.instructions if i.op == "drain").engine = SP
    received = bir_pb2.Program.FromString(program.SerializeToString())
    with pytest.raises(CompileError) as err:
        PassManager("birverifier").run(PassContext.for_program(received, load_target("trn1")))
    assert err.value.code == "E410" and "drain" in err.value.message
