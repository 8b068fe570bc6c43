"""assign_hwdge_engine: dmas spread over queues by bytes within the semaphore budget; >= 2 trigger engines."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest
from walrus_builders import ACT, DVE, SP, Bir, by_name, chain_program, random_program, run_passes

from ncc.schemas import bir_pb2
from ncc.tools.common.errors import CompileError
from ncc.tools.sim.api import simulate_program
from ncc.tools.target import load_target
from ncc.tools.walrus_driver.analysis import birutil
from ncc.tools.walrus_driver.context import PassContext
from ncc.tools.walrus_driver.pass_manager import PassManager
from ncc.tools.walrus_driver.passes.bir_sim import random_inputs

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
    waited_for = [d for d in dmas if ctx.deps.out_degree(d.id)]
    assert waited_for and all(d.dma_queue in pools[d.engine] for d in waited_for)


def test_a_dma_nothing_waits_for_takes_any_queue_and_no_semaphore():
    """A (queue, trigger engine) pair needs a semaphore only if something waits for a dma on it.
    Final stores wait for nobody, so they may use every queue whatever their engine's pool: with 8
    semaphores (2 left for transfer threads) the loads share 2 queues, the 6 stores take 6 others,
    and alloc_semaphores merges nothing."""
    program = chain_program(tiles=6)
    small = dataclasses.replace(load_target("trn1"), num_semaphores=8)
    ctx = PassContext.for_program(program, small)
    PassManager(PIPE + ",pre_sched,allocation,anti_dependency_analyzer,alloc_semaphores").run(ctx)
    dmas = [i for i in program.instructions if i.op == "dma"]
    loads = [d for d in dmas if birutil.dma_direction(d) == "load"]
    stores = [d for d in dmas if birutil.dma_direction(d) == "store"]
    assert len({d.dma_queue for d in loads}) <= 2
    assert len({d.dma_queue for d in stores}) == 6
    assert not {d.dma_queue for d in stores} <= set().union(*ctx.queue_pools.values())
    assert ctx.stats["alloc_semaphores"]["transfer_threads_merged"] == 0
    assert program.num_semaphores <= 8
    result = simulate_program(program, random_inputs(program, 0))
    assert not result.races and result.deadlock is None


def test_final_stores_stay_in_the_pools_when_allocation_must_reuse_space():
    """When the SBUF buffers do not all fit at once, allocation reuses space, and the next writer
    of a store's buffer waits for that store: its thread then needs a semaphore like any other."""
    program = chain_program(tiles=12, cols=4096)  # 48 buffers of 16 KiB per partition
    ctx = run_passes(program, PIPE)
    assert ctx.unpooled_dmas == set() and ctx.stats["assign_hwdge_engine"]["unpooled_dmas"] == 0
    dmas = [i for i in program.instructions if i.op == "dma"]
    assert all(d.dma_queue in ctx.queue_pools[d.engine] for d in dmas)


def test_store_can_follow_its_producer_engine():
    program = chain_program(tiles=2)
    run_passes(program, "anti_dependency_analyzer,assign_hwdge_engine{follow_producer=true}")
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


def test_triggers_are_on_sp_and_spread_by_default():
    program = chain_program(tiles=2)
    ctx = run_passes(program, PIPE)
    assert ctx.stats["assign_hwdge_engine"]["triggers_following_producer"] == 0
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


def _bursts_program(accumulate: bool) -> bir_pb2.Program:
    """Eight 1 MiB loads on SP; DVE sums them (accumulate) or scales each (less work than the
    loads' transfer time: DMA-bound); ACT and DVE each store a 1 MiB result."""
    cols = 2048  # 128 partitions x 8 KiB: 1 MiB per tile, 8 pieces of 128 KiB
    b = Bir("bursts")
    b.hbm("x", [128 * 8, cols], index=0)
    b.hbm("out", [256, cols], role=bir_pb2.OUTPUT, index=0)
    for t in range(8):
        b.buffer(f"x{t}", cols * 4)
        b.load(f"x{t}", "x", 128, cols, row0=128 * t, name=f"load{t}")
        b.buffer(f"s{t}", cols * 4)
        if accumulate:
            b.tt(f"s{t}", f"x{t}", f"s{t - 1}" if t else f"x{t}", 128, cols, name=f"add{t}")
        else:
            b.ts(f"s{t}", f"x{t}", 128, cols, name=f"scale{t}")
    b.buffer("e", cols * 4)
    b.act("e", "s7", 128, cols, name="exp")
    b.store("out", "e", 128, cols, row0=0, name="store_act")
    b.store("out", "s7", 128, cols, row0=128, name="store_dve")
    return b.build()


def test_a_store_cut_in_pieces_gets_a_queue_per_piece():
    """Both stores are cut in 8 by split_dma, but by bytes ACT and DVE would share 10 of the 26
    transfer threads, so some pieces of each would wait for a second round. In a program not bound
    by DMA throughput, every engine's pool is as wide as its widest burst of adjacent dmas when
    others can spare queues (SP's widest burst is 8 pieces: it keeps 10 of 16)."""
    program = _bursts_program(accumulate=True)  # each store triggered by its producer's engine
    ctx = run_passes(program, "split_dma,anti_dependency_analyzer,assign_hwdge_engine{follow_producer=true}")
    assert ctx.stats["assign_hwdge_engine"]["dma_bound"] == 0
    for name, engine in (("store_act/", ACT), ("store_dve/", DVE)):
        pieces = [i for i in program.instructions if i.name.startswith(name)]
        assert len(pieces) == 8 and {p.engine for p in pieces} == {engine}
        assert len({p.dma_queue for p in pieces}) == 8, name
    assert sum(len(queues) for queues in ctx.queue_pools.values()) <= 26


def test_a_dma_bound_program_keeps_the_queues_by_bytes():
    """When the transfers take longer than any engine's work, the loads need every queue they
    have: SP keeps all 16 (in a 1024-wide MLP giving 6 away cost 25 %)."""
    program = _bursts_program(accumulate=False)
    ctx = run_passes(program, "split_dma," + PIPE)
    assert ctx.stats["assign_hwdge_engine"]["dma_bound"] == 1
    assert len(ctx.queue_pools[SP]) == 16
