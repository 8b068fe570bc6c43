"""assign_hwdge_engine: dmas spread over queues by bytes within the semaphore budget; >= 2 trigger engines."""

from __future__ import annotations

from collections import defaultdict

import pytest
from walrus_builders import ACT, DVE, SP, Bir, by_name, chain_program, random_program, run_passes

from ncc.schemas import bir_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.walrus_driver import birutil

PIPE = "anti_dependency_analyzer,assign_hwdge_engine"


def test_queues_spread_by_bytes():
    program = chain_program(tiles=4)
    ctx = run_passes(program, PIPE)
    dmas = [i for i in program.instructions if i.op == "dma"]
    load_queues = {d.dma_queue for d in dmas if birutil.dma_direction(d) == "load"}
    store_queues = {d.dma_queue for d in dmas if birutil.dma_direction(d) == "store"}
    assert len(load_queues) == 8 and len(store_queues) == 4  # 8 loads, 4 stores: no queue twice
    assert all(0 <= d.dma_queue < ctx.target.dma_queues for d in dmas)
    assert ctx.stats["assign_hwdge_engine"]["queues_used"] == len(load_queues | store_queues)
    pools = ctx.queue_pools
    assert sum(len(queues) for queues in pools.values()) <= 26
    assert all(d.dma_queue in pools[d.engine] for d in dmas)


def test_store_is_triggered_by_its_producer_engine():
    program = chain_program(tiles=2)
    run_passes(program, PIPE)
    named = by_name(program)
    assert named["store0"].engine == ACT  # exp0 (ACT) produced what it sends
    assert named["load_x0"].engine == SP


def test_transfer_threads_within_budget_and_at_least_two_engines():
    """Each (queue, trigger engine) pair needs a semaphore: at most 26 of them, with the engines'
    own 5 and the reset barrier's 1 the target's 32."""
    program = random_program(3, steps=200)
    run_passes(program, PIPE, verify_each=False)
    triggers = defaultdict(set)
    for instr in program.instructions:
        if instr.op == "dma":
            triggers[instr.dma_queue].add(instr.engine)
    assert sum(len(engines) for engines in triggers.values()) <= 26
    assert len(set().union(*triggers.values())) >= 2


def test_loads_only_still_use_two_engines():
    b = Bir()
    b.hbm("x", [512, 64])
    for t in range(4):
        b.buffer(f"b{t}", 256)
        b.load(f"b{t}", "x", 128, 64, row0=128 * t)
    program = b.build()
    ctx = run_passes(program, PIPE)
    assert {i.engine for i in program.instructions} == {SP, ACT}
    assert ctx.stats["assign_hwdge_engine"]["triggers_moved_to_spread"] == 2
    assert len({i.dma_queue for i in program.instructions}) == 4  # two queues per engine


def test_options_restrict_engines():
    program = chain_program(tiles=2)
    run_passes(
        program, "anti_dependency_analyzer,assign_hwdge_engine{trigger_engines=SP,min_trigger_engines=1}"
    )
    assert {i.engine for i in program.instructions if i.op == "dma"} == {SP}
    with pytest.raises(CompileError) as err:
        run_passes(chain_program(1), "anti_dependency_analyzer,assign_hwdge_engine{trigger_engines=XYZ}")
    assert err.value.code == "E400"


def test_follow_producer_can_be_disabled():
    program = chain_program(tiles=2)
    run_passes(program, "anti_dependency_analyzer,assign_hwdge_engine{follow_producer=false}")
    named = by_name(program)
    assert named["store0"].engine in (ACT, DVE)  # moved only to spread the issue work
    assert named["load_x0"].engine == SP


def test_needs_deps_and_must_precede_semaphores():
    with pytest.raises(CompileError) as err:
        run_passes(chain_program(1), "assign_hwdge_engine")
    assert err.value.code == "E402"
    with pytest.raises(CompileError) as err:
        run_passes(
            chain_program(1),
            "anti_dependency_analyzer,allocation,anti_dependency_analyzer,alloc_semaphores,assign_hwdge_engine",
        )
    assert err.value.code == "E402"


def test_compiled_program_still_races_free():
    from ncc.tools.walrus_driver.pass_manager import DEFAULT_PASSES

    program = chain_program(tiles=3)
    ctx = run_passes(program, ",".join(DEFAULT_PASSES) + ",bir_sim")
    assert ctx.stats["bir_sim"]["races"] == 0
    assert isinstance(program, bir_pb2.Program)
