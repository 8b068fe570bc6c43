"""alloc_semaphores: every cross-thread dependence waits on its producer; no race in the simulator;
<= 2 waits per instruction (extra waits on nops); implied and same-thread waits dropped; E404."""

from __future__ import annotations

import dataclasses

import pytest
from walrus_builders import ACT, DVE, SP, Bir, by_name, chain_program, random_program, run_passes, tile

from ncc.schemas import bir_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.sim.api import simulate_program
from ncc.tools.target import load_target
from ncc.tools.walrus_driver.context import PassContext
from ncc.tools.walrus_driver.pass_manager import PassManager
from ncc.tools.walrus_driver.passes.bir_sim import random_inputs

BEFORE = (
    "anti_dependency_analyzer,dep_reduction,pre_sched,allocation,assign_hwdge_engine,anti_dependency_analyzer"
)
PIPE = BEFORE + ",alloc_semaphores,sync_dve_pool"


def simulate(program: bir_pb2.Program):
    return simulate_program(program, random_inputs(program, 0))


def test_chain_runs_without_races_and_computes_the_right_values():
    program = chain_program(tiles=3)
    ctx = run_passes(program, PIPE)
    assert program.num_semaphores == ctx.stats["alloc_semaphores"]["semaphores"] > 0
    inputs = random_inputs(program, 0)
    result = simulate_program(program, inputs)
    assert not result.races and result.deadlock is None
    import numpy as np

    np.testing.assert_allclose(result.outputs["out0"], np.exp(inputs["arg0"] + inputs["arg1"]), rtol=1e-6)


def test_deleting_any_wait_makes_a_race():
    program = chain_program(tiles=2)
    run_passes(program, PIPE)
    waits = [(i, k) for i, instr in enumerate(program.instructions) for k in range(len(instr.waits))]
    assert waits
    for i, k in waits:
        broken = bir_pb2.Program()
        broken.CopyFrom(program)
        del broken.instructions[i].waits[k]
        assert simulate(broken).races, f"wait {k} of {program.instructions[i].name} was redundant"


def test_three_producer_join_gets_a_nop():
    """Three loads on three queues feed one DVE select: 3 waits > 2, so one goes on a nop before it."""
    b = Bir()
    b.hbm("x", [384, 64])
    for name in ("a", "c", "d", "s"):
        b.buffer(name, 256)
    for q, name in enumerate(("a", "c", "d")):
        b.load(name, "x", 128, 64, row0=128 * q, name=f"load_{name}").dma_queue = q
    b.add("select", DVE, [tile("s", 128, 64)], [tile(n, 128, 64) for n in ("a", "c", "d")], name="join")
    program = b.build()
    ctx = run_passes(program, "anti_dependency_analyzer,allocation,anti_dependency_analyzer,alloc_semaphores")
    assert ctx.stats["alloc_semaphores"]["nops_inserted"] == 1
    assert all(len(i.waits) <= 2 and len(i.updates) <= 1 for i in program.instructions)
    names = [i.name for i in program.instructions]
    nop = program.instructions[names.index("join.wait0")]
    assert names[names.index("join.wait0") + 1] == "join" and nop.engine == DVE and nop.op == "nop"
    assert len(nop.waits) + len(by_name(program)["join"].waits) == 3
    assert program.num_semaphores == 3
    assert not simulate(program).races


def test_same_engine_chain_needs_no_semaphores():
    b = Bir()
    for name in ("a", "c", "d"):
        b.buffer(name, 256)
    b.ts("c", "a", 128, 64, name="one")
    b.ts("d", "c", 128, 64, name="two")
    b.ts("a", "d", 128, 64, name="three")
    program = b.build()
    ctx = run_passes(program, "anti_dependency_analyzer,allocation,anti_dependency_analyzer,alloc_semaphores")
    assert program.num_semaphores == 0 and not any(i.waits for i in program.instructions)
    assert (
        ctx.stats["alloc_semaphores"]["edges_same_thread"]
        == ctx.stats["alloc_semaphores"]["dependence_edges"]
    )


def test_dma_triggered_on_its_producer_engine_needs_no_wait():
    b = Bir()
    b.hbm("out", [128, 64], role=bir_pb2.OUTPUT)
    b.buffer("a", 256)
    b.buffer("c", 256)
    b.ts("c", "a", 128, 64, name="produce")
    b.store("out", "c", 128, 64, name="store")
    program = b.build()
    by_name(program)["store"].engine = DVE
    run_passes(program, "anti_dependency_analyzer,allocation,anti_dependency_analyzer,alloc_semaphores")
    assert not by_name(program)["store"].waits
    assert not simulate(program).races


def test_compute_after_a_dma_on_its_trigger_engine_must_wait_for_the_queue():
    """A dma's issue precedes later instructions of its trigger engine, but its transfer does not."""
    b = Bir()
    b.hbm("x", [128, 64])
    b.buffer("a", 256)
    b.buffer("c", 256)
    b.load("a", "x", 128, 64, name="load")
    b.ts("c", "a", 128, 64, name="use")
    program = b.build()
    by_name(program)["load"].engine = DVE
    run_passes(program, "anti_dependency_analyzer,allocation,anti_dependency_analyzer,alloc_semaphores")
    load, use = by_name(program)["load"], by_name(program)["use"]
    assert len(load.updates) == 1 and len(use.waits) == 1
    assert use.waits[0].semaphore == load.updates[0].semaphore
    assert not simulate(program).races


def test_same_queue_dmas_are_ordered_by_the_queue():
    """A store reading what a load wrote, on the same queue and trigger: FIFO orders them."""
    b = Bir()
    b.hbm("x", [128, 64])
    b.hbm("out", [128, 64], role=bir_pb2.OUTPUT)
    b.buffer("a", 256)
    b.load("a", "x", 128, 64, name="load")
    b.store("out", "a", 128, 64, name="store")
    program = b.build()
    run_passes(program, "anti_dependency_analyzer,allocation,anti_dependency_analyzer,alloc_semaphores")
    assert program.num_semaphores == 0
    assert not simulate(program).races


def test_implied_waits_are_dropped():
    """ACT waits for load_a; a later ACT instruction that also depends on load_a needs no new wait."""
    b = Bir()
    b.hbm("x", [128, 64])
    for name in ("a", "c", "d"):
        b.buffer(name, 256)
    b.load("a", "x", 128, 64, name="load")
    b.act("c", "a", 128, 64, name="first")
    b.act("d", "a", 128, 64, name="second")
    program = b.build()
    ctx = run_passes(program, "anti_dependency_analyzer,allocation,anti_dependency_analyzer,alloc_semaphores")
    named = by_name(program)
    assert len(named["first"].waits) == 1 and not named["second"].waits
    assert ctx.stats["alloc_semaphores"]["edges_cross_thread_already_ordered"] == 1


def test_random_programs_are_race_free_with_at_most_two_waits():
    for seed in range(6):
        program = random_program(seed, steps=60)
        run_passes(program, PIPE)
        assert all(len(i.waits) <= 2 and len(i.updates) <= 1 for i in program.instructions)
        result = simulate(program)
        assert not result.races and result.deadlock is None, seed


def test_too_many_threads_is_E404():
    program = chain_program(tiles=3)
    small = dataclasses.replace(load_target("trn1"), num_semaphores=1)
    ctx = PassContext.for_program(program, small)
    with pytest.raises(CompileError) as err:
        PassManager(PIPE).run(ctx)
    assert err.value.code == "E404" and "but target trn1 has 1" in err.value.message


def test_more_transfer_threads_than_semaphores_are_merged():
    """48 (queue, trigger engine) threads, 32 of them loads that compute waits for, as hand-made
    BIR or a pass list without assign_hwdge_engine can hold: queues are merged per engine until
    the semaphores fit (one left for semaphore_reset), and the program still runs race-free and
    right (without the merge this is E404)."""
    program = chain_program(tiles=16)
    dmas = [instr for instr in program.instructions if instr.op == "dma"]
    for number, instr in enumerate(dmas):
        instr.engine = (SP, ACT, DVE)[number % 3]
        instr.dma_queue = number // 3 % 16
    threads = {(instr.engine, instr.dma_queue) for instr in dmas}
    assert len(threads) + 5 > 32
    ctx = run_passes(program, "anti_dependency_analyzer,allocation,anti_dependency_analyzer,alloc_semaphores")
    assert ctx.stats["alloc_semaphores"]["transfer_threads_merged"] > 0
    assert program.num_semaphores <= 31
    run_passes(program, "semaphore_reset,birverifier,codegen")
    inputs = random_inputs(program, 0)
    result = simulate_program(program, inputs, inferences=2)
    assert not result.races and result.deadlock is None
    import numpy as np

    np.testing.assert_allclose(result.outputs["out0"], np.exp(inputs["arg0"] + inputs["arg1"]), rtol=1e-6)


def test_queue_pools_fit_the_semaphores():
    """With few semaphores assign_hwdge_engine narrows the queue pools instead of failing."""
    program = chain_program(tiles=3)
    small = dataclasses.replace(load_target("trn1"), num_semaphores=4)
    ctx = PassContext.for_program(program, small)
    PassManager(PIPE).run(ctx)
    assert program.num_semaphores <= 4


def test_prerequisites():
    with pytest.raises(CompileError) as err:
        run_passes(chain_program(1), "anti_dependency_analyzer,alloc_semaphores")
    assert err.value.code == "E402" and "allocation" in err.value.message
    program = chain_program(1)
    run_passes(program, PIPE)
    with pytest.raises(CompileError) as err:
        run_passes(program, "anti_dependency_analyzer,alloc_semaphores")
    assert err.value.code == "E402" and "already has semaphores" in err.value.message


def test_engines_used():
    program = chain_program(tiles=2)
    run_passes(program, PIPE)
    assert {i.engine for i in program.instructions} >= {SP, ACT, DVE}
