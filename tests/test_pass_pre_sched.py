"""pre_sched: a topological order that overlaps independent work, with a live-bytes pressure term."""

from __future__ import annotations

import json
import math

import networkx as nx
import numpy as np
import pytest
from sim_builders import onchip
from walrus_builders import (
    HBM,
    PSUM,
    SP,
    Bir,
    chain_program,
    loop_beside_a_held_tile,
    random_program,
    run_passes,
    tile,
)

from ncc.schemas import bir_pb2
from ncc.schemas.common_pb2 import ACT as ACT_ENGINE
from ncc.schemas.common_pb2 import DVE, F32, S32
from ncc.tools.common.alu import ACT_FUNCTIONS, ACT_OPERAND
from ncc.tools.common.errors import CompileError
from ncc.tools.sim import simulate_program
from ncc.tools.walrus_driver.analysis.engine_choice import act_equivalent
from ncc.tools.walrus_driver.pass_manager import default_pipeline


def positions(program):
    return {instr.name: index for index, instr in enumerate(program.instructions)}


def assert_topological(ctx):
    index = {instr.id: i for i, instr in enumerate(ctx.program.instructions)}
    assert all(index[a] < index[b] for a, b in ctx.deps.edges)


def test_order_is_topological_and_a_permutation():
    for seed in range(4):
        program = random_program(seed, steps=80)
        before = sorted(i.id for i in program.instructions)
        ctx = run_passes(program, "anti_dependency_analyzer,dep_reduction,pre_sched")
        assert sorted(i.id for i in program.instructions) == before
        full = run_passes(program, "anti_dependency_analyzer")  # the unreduced graph, on the new order
        assert_topological(full)
        assert ctx.stats["pre_sched"]["est_makespan_ns"] <= ctx.stats["pre_sched"]["est_makespan_before_ns"]


def test_interleaves_independent_tiles():
    """Input order: tile 0 completely, then tile 1. The scheduler starts tile 1's loads before tile 0's
    compute finishes, so the DMA latency of one tile hides behind the other's work."""
    program = chain_program(tiles=2)
    ctx = run_passes(program, "anti_dependency_analyzer,dep_reduction,pre_sched")
    at = positions(program)
    assert at["load_x1"] < at["add0"] and at["load_y1"] < at["add0"]
    stats = ctx.stats["pre_sched"]
    assert stats["est_makespan_ns"] < stats["est_makespan_before_ns"]
    ctx = run_passes(program, "allocation,anti_dependency_analyzer,alloc_semaphores,semaphore_reset,codegen")
    assert float(program.attributes["walrus.lower_bound_ns"]) <= stats["est_makespan_ns"]
    assert program.attributes["walrus.est_makespan_ns"]


def test_critical_path_goes_first():
    """Two independent DVE chains ready at once: the long one (3 ops) is started before the short one."""
    b = Bir()
    for name in ("a", "b", "c", "d", "s", "t"):
        b.buffer(name, 256)
    b.ts("s", "t", 128, 64, name="short")
    b.ts("a", "t", 128, 64, name="long1")
    b.ts("b", "a", 128, 64, name="long2")
    b.ts("c", "b", 128, 64, name="long3")
    program = b.build()
    run_passes(program, "anti_dependency_analyzer,pre_sched")
    assert [i.name for i in program.instructions][0] == "long1"


def big_tiles(tiles: int = 10, cols: int = 8192) -> bir_pb2.Program:
    """Each tile: load 32 KiB/partition, scale on DVE, store. All loads are ready at once."""
    b = Bir("big")
    b.hbm("x", [128 * tiles, cols])
    b.hbm("out", [128 * tiles, cols], role=bir_pb2.OUTPUT)
    for t in range(tiles):
        b.buffer(f"in{t}", cols * 4)
        b.buffer(f"o{t}", cols * 4)
        b.load(f"in{t}", "x", 128, cols, row0=128 * t, name=f"load{t}")
        b.ts(f"o{t}", f"in{t}", 128, cols, name=f"scale{t}")
        b.store("out", f"o{t}", 128, cols, row0=128 * t, name=f"store{t}")
    return b.build()


def test_pressure_keeps_the_live_set_allocatable():
    ctx = run_passes(big_tiles(), "anti_dependency_analyzer,pre_sched,allocation")
    assert ctx.stats["pre_sched"]["pressured_picks"] > 0
    assert ctx.stats["pre_sched"]["peak_live_sbuf_bytes"] <= ctx.target.sbuf_usable_bytes
    assert ctx.stats["allocation"]["spills"] == 0
    # Without the pressure term every load goes first: allocation must spill to fit the schedule
    # (unless it schedules the program again under a limit, which it may be told not to do)...
    ctx = run_passes(big_tiles(), "anti_dependency_analyzer,pre_sched{pressure_fraction=100},"
                                  "allocation{reschedule=0}")
    assert ctx.stats["allocation"]["spills"] > 0
    # ... and by default it does, and keeps the schedule that does not spill
    ctx = run_passes(big_tiles(), "anti_dependency_analyzer,pre_sched{pressure_fraction=100},allocation")
    assert ctx.stats["allocation"]["spills"] == 0 and ctx.stats["allocation"]["rescheduled_at"] == 0.5
    with pytest.raises(CompileError) as err:
        run_passes(
            big_tiles(), "anti_dependency_analyzer,pre_sched{pressure_fraction=100},allocation{spill=false}"
        )
    assert err.value.code == "E403"


def paired_tiles(tiles: int = 64, cols: int = 8192) -> bir_pb2.Program:
    """Per tile: load a and b (32 KiB a partition each), scale a in place, multiply, store. Every
    load is ready at once, and the a loads have the longer path behind them."""
    b = Bir("paired")
    b.hbm("a", [128 * tiles, cols])
    b.hbm("b", [128 * tiles, cols])
    b.hbm("out", [128 * tiles, cols], role=bir_pb2.OUTPUT)
    for t in range(tiles):
        for name in ("a", "b", "o"):
            b.buffer(f"{name}{t}", cols * 4)
        b.load(f"a{t}", "a", 128, cols, row0=128 * t, name=f"load_a{t}")
        b.load(f"b{t}", "b", 128, cols, row0=128 * t, name=f"load_b{t}")
        b.ts(f"a{t}", f"a{t}", 128, cols, name=f"scale{t}")
        b.tt(f"o{t}", f"a{t}", f"b{t}", 128, cols, func="multiply", name=f"mul{t}")
        b.store("out", f"o{t}", 128, cols, row0=128 * t, name=f"store{t}")
    return b.build()


def test_a_schedule_that_outgrows_sbuf_is_abandoned_for_the_program_order():
    # Under pressure, with no b loaded yet, every choice grows the live set: the list scheduler
    # takes a loads until it holds far more than SBUF; program order needs three tiles at once.
    # (Without the schedule whose loads wait for program order's time, which fits.)
    ctx = run_passes(paired_tiles(), "anti_dependency_analyzer,pre_sched{release_loads=0},allocation")
    assert ctx.stats["pre_sched"]["schedules_abandoned"] == 1
    assert ctx.stats["pre_sched"]["kept_input_order"] == 1
    assert ctx.stats["allocation"]["spills"] == 0
    # With the pressure term off the scheduler loads ahead freely: its schedule is faster in the
    # model, is kept, and must spill (allocation told not to schedule it again).
    ctx = run_passes(paired_tiles(), "anti_dependency_analyzer,pre_sched{pressure_fraction=100},"
                                     "allocation{reschedule=0}")
    assert ctx.stats["pre_sched"]["schedules_abandoned"] == 0
    assert ctx.stats["allocation"]["spills"] > 0


def accumulation_groups(groups: int = 12, rows: int = 4, steps: int = 4) -> bir_pb2.Program:
    """Per group: `rows` accumulators in PSUM (a bank each) summed over `steps` weight tiles, then
    scaled out of PSUM and again on DVE (both have an ACT form) and stored. Program order holds
    one group's accumulators; every weight load is ready at the start."""
    b = Bir("groups")
    b.hbm("x", [128, 128 * steps], index=0)
    b.hbm("w", [128 * steps * groups, 512], index=1)
    b.hbm("out", [128 * rows * groups, 512], role=bir_pb2.OUTPUT, index=0)
    for k in range(steps):
        b.buffer(f"x{k}", 512)
        b.load(f"x{k}", "x", 128, 128)
    for g in range(groups):
        for r in range(rows):
            b.buffer(f"p{g}_{r}", 2048, memory=PSUM)
        for k in range(steps):
            b.buffer(f"w{g}_{k}", 2048)
            b.load(f"w{g}_{k}", "w", 128, 512, row0=128 * (g * steps + k))
            for r in range(rows):
                b.matmul(f"p{g}_{r}", f"x{k}", f"w{g}_{k}", 128, 128, 512, accumulate=k > 0)
        for r in range(rows):
            b.buffer(f"o{g}_{r}", 2048)
            b.buffer(f"s{g}_{r}", 2048)
            psum_in = tile(f"p{g}_{r}", 128, 512, memory=PSUM)
            b.add(
                "tensor_scalar", DVE, [tile(f"o{g}_{r}", 128, 512)], [psum_in], func="multiply", scalars=[0.5]
            )
            b.ts(f"s{g}_{r}", f"o{g}_{r}", 128, 512)
            b.store("out", f"s{g}_{r}", 128, 512, row0=128 * (g * rows + r))
    return b.build()


def test_a_schedule_that_outgrows_psum_is_abandoned_and_the_program_order_still_uses_act():
    # The list scheduler starts a second group while the first waits for its weights, and passes
    # PSUM's eight banks; allocation, which cannot spill PSUM, would go back to program order.
    program = accumulation_groups()
    before = [instr.id for instr in program.instructions]
    ctx = run_passes(program, "anti_dependency_analyzer,pre_sched{release_loads=0},allocation")
    stats = ctx.stats["pre_sched"]
    assert stats["schedules_abandoned"] == 1 and stats["kept_input_order"] == 1
    assert [instr.id for instr in ctx.program.instructions] == before
    assert stats["moved_to_act"] > 0  # DVE's epilogues share ACT in program order too
    assert stats["est_makespan_ns"] < stats["est_makespan_before_ns"]
    assert "psum_fallback_to_program_order" not in ctx.stats["allocation"]
    # With the pressure term off the schedule runs to its end, and allocation goes back.
    ctx = run_passes(
        accumulation_groups(), "anti_dependency_analyzer,pre_sched{pressure_fraction=100},allocation"
    )
    assert ctx.stats["pre_sched"]["schedules_abandoned"] == 0
    assert ctx.stats["allocation"]["psum_fallback_to_program_order"] == 1


def test_loads_held_back_to_when_program_order_issues_them_give_a_schedule_that_fits():
    # The same groups: every weight load is ready at the start, the plain list schedule loads
    # ahead, starts a second group's accumulators and passes PSUM (abandoned, as above). With each
    # load released when program order's placement issues it, the schedule stays within PSUM, is
    # kept, and still overlaps the groups: faster in the model than program order.
    program = accumulation_groups()
    before = [instr.id for instr in program.instructions]
    ctx = run_passes(program, "anti_dependency_analyzer,pre_sched,allocation")
    stats = ctx.stats["pre_sched"]
    assert stats["schedules_tried"] == 2 and stats["schedules_abandoned"] == 1
    assert stats["loads_released"] == 4 + 12 * 4  # x's tiles and every group's weight tiles
    assert "kept_input_order" not in stats and [i.id for i in ctx.program.instructions] != before
    assert stats["est_makespan_ns"] < stats["est_makespan_before_ns"]
    assert stats["peak_live_psum_bytes"] <= ctx.target.psum_bytes_per_partition
    assert "psum_fallback_to_program_order" not in ctx.stats["allocation"]
    assert_topological(run_passes(program, "anti_dependency_analyzer"))


def test_needs_deps_and_refuses_after_semaphores():
    with pytest.raises(CompileError) as err:
        run_passes(chain_program(1), "pre_sched")
    assert err.value.code == "E402"
    program = chain_program(1)
    with pytest.raises(CompileError) as err:
        run_passes(
            program, "anti_dependency_analyzer,allocation,anti_dependency_analyzer,alloc_semaphores,pre_sched"
        )
    assert err.value.code == "E402" and "before alloc_semaphores" in err.value.message


def test_scheduling_keeps_the_dependence_graph_valid():
    ctx = run_passes(chain_program(2), "anti_dependency_analyzer,dep_reduction,pre_sched")
    assert ctx.deps_valid and nx.is_directed_acyclic_graph(ctx.deps.to_networkx())


def column_tile(tensor: str, t: int, cols: int, width: int) -> bir_pb2.AccessPattern:
    """Columns [t*cols, (t+1)*cols) of all 128 rows of a [128, width] HBM tensor (a strided box)."""
    return bir_pb2.AccessPattern(
        memory=HBM,
        tensor=tensor,
        dtype=F32,
        offset=t * cols,
        dims=[bir_pb2.Dim(stride=width, count=128), bir_pb2.Dim(stride=1, count=cols)],
    )


def two_nests(tiles: int = 32, cols: int = 2048) -> bir_pb2.Program:
    """The frontend's m = x*y; r = m + x on [128, 32 x 2048], one column tile at a time, through HBM.

    Nest 2's x loads are ready at once; its m loads wait for nest 1's stores (all of them: a column
    box's element hull spans the whole tensor). A scheduler that takes every ready load fills SBUF
    with first operands of tiles whose second operand cannot come yet; then every choice grows the
    live set, and only following program order (one tile at a time) stays within SBUF."""
    width = tiles * cols
    b = Bir("two_nests")
    roles = {"x": bir_pb2.INPUT, "y": bir_pb2.INPUT, "m": bir_pb2.INTERNAL, "r": bir_pb2.OUTPUT}
    for name, role in roles.items():
        b.hbm(name, [128, width], role=role)
    for t in range(tiles):
        for name in (f"x{t}", f"y{t}", f"m{t}"):
            b.buffer(name, cols * 4)
        b.add("dma", SP, [tile(f"x{t}", 128, cols)], [column_tile("x", t, cols, width)], name=f"load_x{t}")
        b.add("dma", SP, [tile(f"y{t}", 128, cols)], [column_tile("y", t, cols, width)], name=f"load_y{t}")
        b.tt(f"m{t}", f"x{t}", f"y{t}", 128, cols, func="multiply", name=f"mul{t}")
        b.add("dma", SP, [column_tile("m", t, cols, width)], [tile(f"m{t}", 128, cols)], name=f"store_m{t}")
    for t in range(tiles):
        for name in (f"mm{t}", f"xx{t}", f"r{t}"):
            b.buffer(name, cols * 4)
        b.add("dma", SP, [tile(f"mm{t}", 128, cols)], [column_tile("m", t, cols, width)], name=f"load_m{t}")
        b.add("dma", SP, [tile(f"xx{t}", 128, cols)], [column_tile("x", t, cols, width)], name=f"reload_x{t}")
        b.tt(f"r{t}", f"mm{t}", f"xx{t}", 128, cols, name=f"add{t}")
        b.add("dma", SP, [column_tile("r", t, cols, width)], [tile(f"r{t}", 128, cols)], name=f"store_r{t}")
    return b.build()


def test_pressure_falls_back_to_program_order_when_every_choice_grows():
    ctx = run_passes(two_nests(), "anti_dependency_analyzer,pre_sched,allocation")
    assert ctx.stats["pre_sched"]["peak_live_sbuf_bytes"] <= ctx.target.sbuf_usable_bytes
    assert_topological(run_passes(ctx.program, "anti_dependency_analyzer"))


def elementwise_tiles(tiles: int = 4, cols: int = 256) -> bir_pb2.Program:
    """Per tile, DVE work that has an exact ACT form (every tensor_scalar function it has, a
    square, a copy) and a tensor_tensor add that has none."""
    b = Bir("elementwise")
    b.hbm("x", [128 * tiles, cols], index=0)
    b.hbm("out", [128 * tiles, cols], role=bir_pb2.OUTPUT, index=0)
    for t in range(tiles):
        names = [b.buffer(f"{n}{t}", cols * 4) for n in ("x", "m", "a", "s", "r", "q", "c", "z", "o")]
        x, m, a, s, r, q, c, z, o = names
        b.load(x, "x", 128, cols, row0=128 * t, name=f"load{t}")
        b.ts(m, x, 128, cols, scalar=0.37, func="multiply", name=f"mul{t}")
        b.ts(a, m, 128, cols, scalar=-1.25, func="add", name=f"add{t}")
        b.ts(s, a, 128, cols, scalar=0.5, func="subtract", name=f"sub{t}")
        b.ts(r, s, 128, cols, scalar=3.0, func="subtract", name=f"rsub{t}").attributes["reverse"] = "1"
        b.ts(q, r, 128, cols, scalar=0.0, func="maximum", name=f"relu{t}")
        b.tt(c, q, q, 128, cols, func="multiply", name=f"square{t}")
        b.add("tensor_copy", DVE, [tile(z, 128, cols)], [tile(c, 128, cols)], name=f"copy{t}")
        b.tt(o, z, x, 128, cols, func="add", name=f"sum{t}")
        b.store("out", o, 128, cols, row0=128 * t, name=f"store{t}")
    return b.build()


def test_dve_work_spreads_onto_act_bit_for_bit():
    """DVE instructions with an exact ACT form run on whichever engine is free first: some move to
    ACT as activations, the outputs equal sequential execution of the input bit for bit, and the
    schedule is faster than with every one on DVE."""
    passes = ",".join(default_pipeline(2)) + ",bir_sim"
    spread = elementwise_tiles()
    ctx = run_passes(spread, passes, verify_each=False)
    assert ctx.stats["bir_sim"]["races"] == 0 and ctx.stats["bir_sim"]["outputs_compared"] == 1
    assert ctx.stats["pre_sched"]["moved_to_act"] > 0
    on_act = {i.name.rstrip("0123456789"): i for i in spread.instructions if i.engine == ACT_ENGINE}
    assert {"mul", "square"} <= on_act.keys()
    assert on_act["square"].func == "square" and len(on_act["square"].inputs) == 1
    assert all(i.op != "tensor_tensor" for i in on_act.values())  # the add has no ACT form

    kept = elementwise_tiles()
    alone = run_passes(kept, passes.replace("pre_sched", "pre_sched{spread_to_act=false}"), verify_each=False)
    assert alone.stats["pre_sched"]["moved_to_act"] == 0
    assert all(i.op in ("dma", "nop") for i in kept.instructions if i.engine == ACT_ENGINE)
    assert ctx.stats["bir_sim"]["simulated_ns"] < alone.stats["bir_sim"]["simulated_ns"]


def column_products(tiles: int = 4, cols: int = 256) -> bir_pb2.Program:
    """Per tile, x times a per-partition column (a norm's x·rstd), the column first in odd tiles."""
    b = Bir("column_products")
    b.hbm("x", [128 * tiles, cols], index=0)
    b.hbm("c", [128 * tiles, 1], index=1)
    b.hbm("out", [128 * tiles, cols], role=bir_pb2.OUTPUT, index=0)
    for t in range(tiles):
        x, c, o = (b.buffer(f"{n}{t}", cols * 4) for n in ("x", "c", "o"))
        b.load(x, "x", 128, cols, row0=128 * t, name=f"load{t}")
        b.load(c, "c", 128, 1, row0=128 * t, name=f"load_c{t}")
        operands = [tile(x, 128, cols), onchip(c, 128, cols, stride=0)]
        b.add("tensor_tensor", DVE, [tile(o, 128, cols)], operands[:: 1 - 2 * (t % 2)], func="multiply",
              name=f"scale{t}")
        b.store("out", o, 128, cols, row0=128 * t, name=f"store{t}")
    return b.build()


def test_a_product_with_a_column_moves_to_act_as_its_scale_operand_bit_for_bit():
    """x·s with s one element per partition is ACT's identity with s as its per-partition scale
    (act_operand = scale, the column as input 1 whichever side it was on): some of the products
    move there and the outputs equal sequential execution on DVE bit for bit."""
    program = column_products()
    ctx = run_passes(program, ",".join(default_pipeline(2)) + ",bir_sim", verify_each=False)
    assert ctx.stats["bir_sim"]["races"] == 0 and ctx.stats["bir_sim"]["outputs_compared"] == 1
    moved = [i for i in program.instructions if i.engine == ACT_ENGINE and i.op == "activation"]
    assert moved and ctx.stats["pre_sched"]["moved_to_act"] == len(moved)
    for instr in moved:
        assert instr.attributes[ACT_OPERAND] == "scale" and instr.inputs[1].tensor.startswith("c")
        assert (instr.func, list(instr.scalars)) == ("identity", [1.0, -0.0])
    both = next(i for i in column_products().instructions if i.name == "scale2")
    both.inputs[1].dims[0].stride = 1  # a product of two streamed tiles has no ACT form
    assert act_equivalent(both) is None


def test_an_activation_operand_of_no_known_role_is_refused():
    """A mutated NEFF's act_operand (neither bias nor scale, or a scale with no operand) gets a
    coded diagnostic from the verifier and the simulator, not a silent bias."""
    program = column_products()
    run_passes(program, ",".join(default_pipeline(2)), verify_each=False)
    scaled = next(i for i in program.instructions if i.attributes.get(ACT_OPERAND) == "scale")
    inputs = {"arg0": np.ones((512, 256), np.float32), "arg1": np.ones((512, 1), np.float32)}
    for mutate in ("shift", "scale-alone"):
        hostile = bir_pb2.Program()
        hostile.CopyFrom(program)
        for instr in [*hostile.instructions, *(i for s in hostile.streams for i in s.instructions)]:
            if instr.id != scaled.id:
                continue
            if mutate == "shift":
                instr.attributes[ACT_OPERAND] = "shift"
            else:
                del instr.inputs[1:]
        with pytest.raises(CompileError) as err:
            simulate_program(hostile, inputs, check_races=False)
        assert err.value.code == "E603" and "act_operand" in err.value.message
        with pytest.raises(CompileError) as err:
            run_passes(hostile, "birverifier", verify_each=False)
        assert err.value.code == "E410" and "act_operand" in err.value.message


def test_integer_and_semaphored_instructions_stay_on_dve():
    b = Bir()
    b.buffer("a", 256)
    b.buffer("b", 256)
    scaled = b.ts("b", "a", 128, 64, scalar=2.0)
    assert act_equivalent(scaled).op == "activation"
    integer = b.ts("b", "a", 128, 64, scalar=2.0)
    integer.inputs[0].dtype = integer.outputs[0].dtype = S32
    assert act_equivalent(integer) is None
    divide = b.ts("b", "a", 128, 64, scalar=3.0, func="divide")  # x / 3 is not x * (1 / 3)
    assert act_equivalent(divide) is None
    halve = act_equivalent(b.ts("b", "a", 128, 64, scalar=8.0, func="divide"))  # x / 8 is x * 0.125
    assert (halve.op, halve.func, list(halve.scalars)) == ("activation", "identity", [0.125, -0.0])
    assert np.signbit(halve.scalars[1])  # a bias of -0: x * 0.125 + (-0) keeps a -0 result -0
    x = np.random.default_rng(0).normal(0, 1e3, 10_000).astype(np.float32)
    x[:4] = [0.0, -0.0, 1e-40, -1e-40]
    as_act = ACT_FUNCTIONS["identity"](x * np.float32(halve.scalars[0]) + np.float32(halve.scalars[1]))
    assert np.array_equal((x / np.float32(8.0)).view(np.uint32), as_act.view(np.uint32))
    synced = b.ts("b", "a", 128, 64, scalar=2.0)
    synced.waits.add(semaphore=0, value=1)
    assert act_equivalent(synced) is None
    assert act_equivalent(b.tt("b", "a", "b", 128, 64, func="multiply")) is None  # not x * x


def test_a_store_is_triggered_by_the_engine_that_lets_it_finish_first():
    """assign_hwdge_engine puts every trigger on SP (and spreads stores to one other engine);
    pre_sched may move a store to any engine with a queue pool, when that finishes it sooner.
    Loads keep their engine. The result is still race-free and equal to sequential execution."""
    passes = ",".join(default_pipeline(2)) + ",bir_sim"
    program = elementwise_tiles(tiles=6)
    ctx = run_passes(program, passes, verify_each=False)
    assert ctx.stats["bir_sim"]["races"] == 0 and ctx.stats["bir_sim"]["outputs_compared"] == 1
    assert ctx.stats["pre_sched"]["triggers_moved"] > 0
    fixed = elementwise_tiles(tiles=6)
    fixed_passes = passes.replace("pre_sched", "pre_sched{choose_triggers=false}")
    alone = run_passes(fixed, fixed_passes, verify_each=False)
    assert alone.stats["pre_sched"]["triggers_moved"] == 0
    loads = {i.name: i.engine for i in program.instructions if i.name.startswith("load")}
    assert loads == {i.name: i.engine for i in fixed.instructions if i.name.startswith("load")}


def test_a_queue_timeline_finds_the_first_idle_stretch_that_holds_a_transfer():
    """Against a brute-force search over the busy intervals, for transfers short and long (the
    long ones are searched on the coarse list, which skips stretches too short for them)."""
    import random

    from ncc.tools.walrus_driver.passes.pre_sched import _QueueTimeline

    rng = random.Random(7)
    timeline, busy = _QueueTimeline(500.0), []
    for _ in range(1500):  # about 3 ms of transfers over 4 ms: stretches of every length stay idle
        t, length = rng.uniform(0, 4e6), rng.choice([500.0, 700.0, 1710.0, 2500.0, 5300.0])
        expected = t
        for start, end in sorted(busy):  # the first stretch from t on that holds `length`
            if start < expected + length and end > expected:
                expected = end
        got, index = timeline.slot(t, length)
        assert got == expected
        assert timeline.slot(t, length, bound=got - 1.0) == (math.inf, -1) or got <= t
        timeline.occupy(got, got + length, index)
        busy.append((got, got + length))
    assert len(timeline.coarse_starts) < len(timeline.starts)


def test_psum_buffers_count_the_bytes_the_bank_rule_keeps_from_others():
    """pre_sched's live-bytes model counts a PSUM buffer as allocation will place it: whole banks
    past one bank, else the power of two that holds it (a 1,536-byte group keeps a 2 KiB bank)."""
    from ncc.tools.walrus_driver.passes.pre_sched import psum_footprint

    bank = 2048
    sizes = (512, 1536, 2048, 3000, 4096)
    assert [psum_footprint(size, bank) for size in sizes] == [512, 2048, 2048, 4096, 4096]


def test_a_loop_body_is_scheduled_beside_what_stays_live_around_it():
    # Alone, the body's four tiles fit in SBUF side by side (160 KiB), and the scheduler would
    # load all four first; beside the 96 KiB tile the loop reads they do not, and a buffer used
    # in a loop is never spilled: allocation would send the whole program back to the frontend's
    # order. The body's limit leaves the held tile out, so its schedule is kept.
    program = loop_beside_a_held_tile()
    ctx = run_passes(program, "anti_dependency_analyzer,pre_sched,allocation")
    stats = ctx.stats["allocation"]
    assert stats["allocation_attempt"] <= 3 and "psum_fallback_to_program_order" not in stats
    names = [instr.name for instr in ctx.program.instructions]
    assert names.index("load1") < names.index("store0")  # tiles overlap: not the frontend's order


def test_the_gpt2_cut_runs_faster_with_its_weight_loads_held_back(models_dir, tmp_path):
    """GPT-2's one-layer cut from the CLI: with every weight tile ready at the start, the plain
    list schedule issued the MLP's and projections' weight loads before the attention's
    intermediates; the schedule with those loads released when program order issues them is
    kept, runs faster in the simulator, and computes the same bits."""
    from conftest import run_ncc

    model = models_dir / "suite" / "gpt2_cut.hlo.pb"
    inputs = models_dir / "suite" / "gpt2_cut.io.npz"
    plain = ",".join(default_pipeline(2)).replace("pre_sched", "pre_sched{release_loads=false}")
    simulated, outputs = {}, {}
    for label, extra in (("held back", []), ("plain", ["--walrus-passes", plain])):
        neff, out, report = (tmp_path / f"{label}.{ext}" for ext in ("neff", "npz", "json"))
        compiled = run_ncc("compile", str(model), "--output", str(neff), *extra, timeout=300)
        assert compiled.returncode == 0, compiled.stderr
        ran = run_ncc("run", str(neff), "--inputs", str(inputs), "--output", str(out), "--report",
                      str(report), timeout=300)
        assert ran.returncode == 0, ran.stderr
        facts = json.loads(report.read_text())
        assert facts["races"] == [] and not facts["deadlock"]
        simulated[label] = facts["simulated_ns"]
        with np.load(out) as arrays:
            outputs[label] = {name: arrays[name] for name in arrays.files}
    assert simulated["held back"] < 0.95 * simulated["plain"], simulated
    assert outputs["held back"].keys() == outputs["plain"].keys()
    for name, values in outputs["plain"].items():
        assert np.array_equal(outputs["held back"][name], values, equal_nan=True), name
