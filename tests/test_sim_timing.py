"""Simulator timing: the cost model, engine overlap, queue FIFO and shared ports."""

from __future__ import annotations

import numpy as np
import pytest
from sim_builders import ACT, DVE, F32, PE, POOL, PSUM, SP, ProgramBuilder, hbm_2d, onchip, update, wait
from test_sim import elementwise_inputs, elementwise_program

from ncc.schemas import bir_pb2
from ncc.tools.sim import simulate_program
from ncc.tools.target import load_target

TARGET = load_target("trn1")


def test_simulated_time_is_positive_and_covers_busy_time() -> None:
    result = simulate_program(elementwise_program(), elementwise_inputs())
    assert result.simulated_ns > 0
    assert all(busy <= result.simulated_ns + 1e-9 for busy in result.engine_busy_ns.values())
    assert set(result.engine_busy_ns) >= {"PE", "ACT", "POOL", "DVE", "SP", "q0", "q1", "q2", "q3"}


def independent_work(engines: tuple[int, int]) -> bir_pb2.Program:
    b = ProgramBuilder()
    b.buffer("a", 2048)
    b.buffer("b", 2048)
    for i, (engine, buffer) in enumerate(zip(engines, ("a", "b"), strict=True)):
        op, func = ("activation", "exp") if engine == ACT else ("tensor_scalar", "add")
        scalars = [1.0, 0.0] if engine == ACT else [1.0]
        for j in range(4):
            b.add(
                op,
                engine,
                [onchip(buffer, 128, 512)],
                [onchip(buffer, 128, 512)],
                name=f"e{i}_{j}",
                func=func,
                scalars=scalars,
            )
    return b.build()


def test_independent_engines_overlap() -> None:
    result = simulate_program(independent_work((ACT, DVE)), {})
    busy = result.engine_busy_ns
    assert busy["ACT"] > 0 and busy["DVE"] > 0
    assert result.simulated_ns == pytest.approx(max(busy["ACT"], busy["DVE"]))
    assert result.simulated_ns < busy["ACT"] + busy["DVE"]


def test_dve_and_pool_share_the_sbuf_port() -> None:
    result = simulate_program(independent_work((POOL, DVE)), {})
    busy = result.engine_busy_ns
    assert result.simulated_ns == pytest.approx(busy["POOL"] + busy["DVE"])


def test_cost_model_numbers() -> None:
    """DVE: 2N cycles for two inputs + access; matmul fp32: max(N, 64)·4 + access at 2.8 GHz."""
    b = ProgramBuilder()
    b.buffer("x", 2048)
    b.buffer("y", 2048)
    b.buffer("ps", 2048, memory=PSUM)
    b.add(
        "tensor_tensor",
        DVE,
        [onchip("x", 128, 512)],
        [onchip("x", 128, 512), onchip("y", 128, 512)],
        name="add",
        func="add",
    )
    b.add(
        "matmul",
        PE,
        [onchip("ps", 128, 32, memory=PSUM)],
        [onchip("x", 128, 128), onchip("y", 128, 32)],
        name="mm",
    )
    result = simulate_program(b.build(), {})
    access = TARGET.costs["onchip_access_cycles"]
    dve_clock = TARGET.clock_ghz[DVE]
    assert result.engine_busy_ns["DVE"] == pytest.approx((2 * 512 + access) / dve_clock)
    pe_cycles = max(32, TARGET.costs["matmul_min_cycles"]) * TARGET.costs["fp32_matmul_factor"] + access
    assert result.engine_busy_ns["PE"] == pytest.approx(pe_cycles / TARGET.clock_ghz[PE])


def dma_program(queues: tuple[int, int]) -> bir_pb2.Program:
    b = ProgramBuilder()
    b.hbm("x", [256, 512], index=0)
    b.buffer("a", 2048)
    b.buffer("b", 2048)
    for i, (queue, buffer) in enumerate(zip(queues, ("a", "b"), strict=True)):
        b.add(
            "dma",
            SP,
            [onchip(buffer, 128, 512)],
            [hbm_2d("x", 128, 512, row0=128 * i)],
            name=f"d{i}",
            queue=queue,
        )
    return b.build()


def test_one_queue_is_fifo_and_two_queues_overlap() -> None:
    inputs = {"arg0": np.zeros((256, 512), np.float32)}
    transfer = TARGET.dma_ns(128 * 512 * 4)
    issue = TARGET.cycles_to_ns(SP, TARGET.dma_issue_cycles)
    same = simulate_program(dma_program((0, 0)), inputs)
    assert same.simulated_ns == pytest.approx(issue + 2 * transfer)
    assert same.engine_busy_ns["q0"] == pytest.approx(2 * transfer)
    apart = simulate_program(dma_program((0, 1)), inputs)
    assert apart.simulated_ns == pytest.approx(2 * issue + transfer)


def test_waits_delay_the_consumer_until_the_producer_completes() -> None:
    b = ProgramBuilder()
    b.buffer("a", 2048)
    b.add(
        "activation",
        ACT,
        [onchip("a", 128, 512)],
        [onchip("a", 128, 512)],
        name="produce",
        func="exp",
        updates=[update(0)],
    )
    b.add(
        "tensor_scalar",
        DVE,
        [onchip("a", 128, 512, F32)],
        [onchip("a", 128, 512)],
        name="consume",
        func="add",
        scalars=[1.0],
        waits=[wait(0, 1)],
    )
    result = simulate_program(b.build(), {})
    assert result.simulated_ns == pytest.approx(result.engine_busy_ns["ACT"] + result.engine_busy_ns["DVE"])
    assert result.races == []


def test_sixteen_busy_queues_share_the_aggregate_hbm_bandwidth() -> None:
    """16 queues x 27 GB/s would be 432 GB/s; the core's HBM gives 410, and the simulator holds
    to it: 128 loads of 256 KiB over all 16 queues take longer than the queues alone would."""
    loads, rows, cols = 128, 128, 512
    b = ProgramBuilder()
    b.hbm("x", [loads * rows, cols], index=0)
    for queue in range(16):
        b.buffer(f"b{queue}", cols * 4)
    for i in range(loads):
        queue = i % 16
        b.add(
            "dma",
            SP,
            [onchip(f"b{queue}", rows, cols)],
            [hbm_2d("x", rows, cols, row0=rows * i)],
            name=f"d{i}",
            queue=queue,
        )
    result = simulate_program(b.build(), {"arg0": np.zeros((loads * rows, cols), np.float32)})
    moved = loads * rows * cols * 4
    queues_alone = (loads // 16) * TARGET.dma_ns(rows * cols * 4)
    assert result.simulated_ns >= moved / TARGET.hbm_bandwidth_gbps > queues_alone


def test_a_transfer_behind_its_queues_backlog_does_not_hold_the_hbm_channel_for_others() -> None:
    """Four 1 MiB loads queued on q0 at once, and later a 4 KiB load on q1: q0 moves its loads one
    after another, so the last three start tens of microseconds later and take the HBM channel
    only then. The small load starts as soon as it is queued and shares the channel with q0's
    first load alone: it lands within microseconds, not after q0's backlog (as it did when each
    transfer reserved the channel when it was queued)."""
    rows, cols = 128, 2048
    b = ProgramBuilder()
    b.hbm("x", [4 * rows, cols], index=0)
    b.hbm("y", [rows, 8], index=1)
    for k in range(4):
        b.buffer(f"big{k}", cols * 4)
    b.buffer("busy", 2048)
    b.buffer("small", 32)
    for k in range(4):
        b.add("dma", SP, [onchip(f"big{k}", rows, cols)], [hbm_2d("x", rows, cols, row0=rows * k)],
              name=f"big{k}", queue=0)
    b.add("activation", ACT, [onchip("busy", 128, 512)], [onchip("busy", 128, 512)], name="first",
          func="exp", scalars=[1.0, 0.0])  # ACT queues the small load after SP queued the big ones
    b.add("dma", ACT, [onchip("small", rows, 8)], [hbm_2d("y", rows, 8)], name="small", queue=1)
    inputs = {"arg0": np.zeros((4 * rows, cols), np.float32), "arg1": np.ones((rows, 8), np.float32)}
    result = simulate_program(b.build(), inputs, record_schedule=True)
    assert result.races == [] and result.deadlock is None
    moved = {t.op.name: t for t in result.schedule.transfers}
    big = TARGET.dma_ns(rows * cols * 4)
    assert moved["big3"].start_ns >= 3 * big  # q0's loads moved one at a time
    small = moved["small"]
    assert small.start_ns == small.queued_ns  # q1 was idle
    # the channel holds big0's bytes for 2.6 us of its 39 us on q0, then the small load's
    assert small.end_ns < TARGET.dma_ns(rows * 8 * 4) + (rows * cols * 4) / TARGET.hbm_bandwidth_gbps + 500
    assert result.simulated_ns == pytest.approx(moved["big3"].end_ns)
