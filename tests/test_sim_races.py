"""Simulator happens-before: races, deadlocks, and speed on a few thousand instructions."""

from __future__ import annotations

import numpy as np
from sim_builders import ACT, DVE, PE, POOL, SP, ProgramBuilder, find, hbm_2d, onchip, update, wait
from test_sim import elementwise_inputs, elementwise_program

from ncc.schemas import bir_pb2
from ncc.tools.sim import simulate_program


def test_correct_program_has_no_race() -> None:
    result = simulate_program(elementwise_program(), elementwise_inputs())
    assert result.races == [] and result.deadlock is None


def test_deleted_wait_is_a_race_naming_both_instructions() -> None:
    program = elementwise_program()
    add = find(program, "add")
    del add.waits[1]  # no longer waits for load_y
    result = simulate_program(program, elementwise_inputs())
    assert len(result.races) == 1
    race = result.races[0]
    assert "'load_y' (q1)" in race.first and race.first_access == "write"
    assert "'add' (DVE)" in race.second and race.second_access == "read"
    assert race.memory.startswith("SBUF partitions 0-127 bytes ")
    text = race.describe()
    assert "load_y" in text and "add" in text
    assert result.report()["races"] == [text]


def test_write_after_read_race_is_found() -> None:
    """DVE overwrites what a dma is still reading: a WAR race between a queue and an engine."""
    program = elementwise_program()
    b = ProgramBuilder()
    program.instructions.add().CopyFrom(
        b.add(
            "tensor_scalar",
            DVE,
            [onchip("sexp", 128, 64)],
            [onchip("ssum", 128, 64)],
            name="clobber",
            func="multiply",
            scalars=[2.0],
        )
    )
    result = simulate_program(program, elementwise_inputs())
    names = {(r.first.split()[0], r.second.split()[0]) for r in result.races}
    assert ("'store_z'", "'clobber'") in names
    assert ("'rowsum'", "'clobber'") not in names  # same engine: ordered by program order


def test_disjoint_partitions_and_interleaved_bytes_do_not_race() -> None:
    """Unordered writes to disjoint partitions, or to interleaved columns, are not races."""
    b = ProgramBuilder()
    b.buffer("sb", 256)
    b.add("iota", POOL, [onchip("sb", 64, 32)], [], name="top", scalars=[0, 1, 1])
    b.add(
        "tensor_scalar",
        DVE,
        [onchip("sb", 64, 32, partition_start=64)],
        [onchip("sb", 64, 32, partition_start=64)],
        name="bottom",
        func="add",
        scalars=[1],
    )
    b.add(
        "tensor_copy",
        ACT,
        [onchip("sb", 64, 16, offset=128, stride=2)],
        [onchip("sb", 64, 16, offset=128, stride=2)],
        name="even",
    )
    b.add(
        "tensor_scalar",
        DVE,
        [onchip("sb", 64, 16, offset=132, stride=2)],
        [onchip("sb", 64, 16, offset=132, stride=2)],
        name="odd",
        func="add",
        scalars=[1],
    )
    program = b.build()
    result = simulate_program(program, {})
    assert result.races == []
    find(program, "odd").outputs[0].offset = 128  # now even and odd collide
    find(program, "odd").inputs[0].offset = 128
    result = simulate_program(program, {})
    assert [(r.first, r.second) for r in result.races] == [("'even' (ACT)", "'odd' (DVE)")]


def test_semaphore_joins_only_the_updates_that_reached_the_value() -> None:
    """A wait for count >= 1 is ordered after the first update only, not a later one."""
    b = ProgramBuilder()
    b.buffer("a", 64)
    b.buffer("c", 64)
    b.add("iota", POOL, [onchip("a", 128, 16)], [], name="first", scalars=[0, 1, 1], updates=[update(0)])
    b.add("iota", POOL, [onchip("c", 128, 16)], [], name="second", scalars=[0, 1, 1], updates=[update(0)])
    b.add(
        "tensor_copy", DVE, [onchip("a", 128, 16)], [onchip("c", 128, 16)], name="reader", waits=[wait(0, 1)]
    )
    program = b.build()
    result = simulate_program(program, {})
    assert [(r.first, r.second) for r in result.races] == [("'second' (POOL)", "'reader' (DVE)")]
    find(program, "reader").waits[0].value = 2
    assert simulate_program(program, {}).races == []


def test_two_engine_wait_cycle_is_a_deadlock_naming_the_cycle() -> None:
    b = ProgramBuilder()
    b.add("nop", ACT, name="act_waits", waits=[wait(0, 1)])
    b.add("nop", ACT, name="act_signals", updates=[update(1)])
    b.add("nop", DVE, name="dve_waits", waits=[wait(1, 1)])
    b.add("nop", DVE, name="dve_signals", updates=[update(0)])
    result = simulate_program(b.build(), {})
    assert result.deadlock is not None
    text = result.deadlock
    assert "cycle" in text and "ACT" in text and "DVE" in text
    assert (
        "'act_waits'" in text
        and "'dve_waits'" in text
        and "'act_signals'" in text
        and "'dve_signals'" in text
    )
    assert "semaphore 0 >= 1" in text and "semaphore 1 >= 1" in text
    assert result.instruction_count == 0


def test_wait_with_no_remaining_update_deadlocks() -> None:
    b = ProgramBuilder()
    b.add("nop", PE, name="lonely", waits=[wait(3, 2)])
    b.add("nop", ACT, name="once", updates=[update(3)])
    result = simulate_program(b.build(), {})
    assert result.deadlock is not None
    assert "waits forever on semaphore 3 >= 2" in result.deadlock and "'lonely'" in result.deadlock
    assert result.instruction_count == 1


def pipelined_program(tiles: int, cols: int = 16, ring: int = 4) -> bir_pb2.Program:
    """tiles × (dma in → DVE add → ACT exp → dma out), software pipelined over a ring of slots."""
    b = ProgramBuilder("pipeline", num_semaphores=4)
    b.hbm("x", [tiles * 128, cols], index=0)
    b.hbm("y", [tiles * 128, cols], role=bir_pb2.OUTPUT, index=0)
    slot = cols * 4
    for name in ("in", "mid", "out"):
        b.buffer(name, ring * slot)
    for i in range(tiles):
        s = (i % ring) * slot
        free = max(0, i - ring + 1)
        b.add(
            "dma",
            POOL,
            [onchip("in", 128, cols, offset=s)],
            [hbm_2d("x", 128, cols, row0=128 * i)],
            name=f"in{i}",
            queue=i % 8,
            waits=[wait(1, free)],
            updates=[update(0)],
        )
        b.add(
            "tensor_scalar",
            DVE,
            [onchip("mid", 128, cols, offset=s)],
            [onchip("in", 128, cols, offset=s)],
            name=f"add{i}",
            func="add",
            scalars=[1.0],
            waits=[wait(0, i + 1), wait(2, free)],
            updates=[update(1)],
        )
        b.add(
            "activation",
            ACT,
            [onchip("out", 128, cols, offset=s)],
            [onchip("mid", 128, cols, offset=s)],
            name=f"exp{i}",
            func="exp",
            waits=[wait(1, i + 1), wait(3, free)],
            updates=[update(2)],
        )
        b.add(
            "dma",
            SP,
            [hbm_2d("y", 128, cols, row0=128 * i)],
            [onchip("out", 128, cols, offset=s)],
            name=f"out{i}",
            queue=8 + i % 8,
            waits=[wait(2, i + 1)],
            updates=[update(3)],
        )
    return b.build()


def test_5000_instructions_with_race_check() -> None:
    tiles = 1250
    program = pipelined_program(tiles)
    x = np.random.default_rng(1).standard_normal((tiles * 128, 16)).astype(np.float32)
    result = simulate_program(program, {"arg0": x})
    assert result.instruction_count == 5000
    assert result.races == [] and result.deadlock is None
    np.testing.assert_allclose(result.outputs["out0"], np.exp(x + np.float32(1)), rtol=1e-6)


def test_racy_pipeline_reports_each_pair_once() -> None:
    tiles = 300
    program = pipelined_program(tiles)
    for i in range(tiles):
        del find(program, f"exp{i}").waits[1]  # ACT no longer waits for the store of the slot's last tile
    result = simulate_program(program, {"arg0": np.zeros((tiles * 128, 16), np.float32)})
    pairs = [(r.first, r.second) for r in result.races]
    assert len(pairs) == len(set(pairs)) > 0
    assert all("exp" in first + second and "out" in first + second for first, second in pairs)


def test_two_engines_transfers_on_one_queue_are_not_ordered_by_its_fifo() -> None:
    """A store issued by ACT without waiting for the DVE result it sends goes onto queue 0 ahead of
    SP's load, which DVE waits for before it computes that result: the queue's FIFO happened to
    put the read before the write, but which engine's transfer goes first is the run's choice, not
    a synchronization. The store read stale data; it is reported as a race."""
    b = ProgramBuilder("fifo")
    b.hbm("x", [128, 64], index=0)
    b.hbm("w", [128, 64], index=1)
    b.hbm("out", [128, 64], role=bir_pb2.OUTPUT, index=0)
    for name in ("sw", "sx", "acc"):
        b.buffer(name, 256)
    b.add("dma", SP, [onchip("sw", 128, 64)], [hbm_2d("w", 128, 64)], name="load_w", queue=1)
    b.add("dma", SP, [onchip("sx", 128, 64)], [hbm_2d("x", 128, 64)], name="load_x", queue=0,
          updates=[update(0)])
    b.add("tensor_scalar", DVE, [onchip("acc", 128, 64)], [onchip("sx", 128, 64)], name="scale",
          func="multiply", scalars=[2.0], waits=[wait(0, 1)])
    b.add("dma", ACT, [hbm_2d("out", 128, 64)], [onchip("acc", 128, 64)], name="store", queue=0)
    data = {"arg0": np.ones((128, 64), np.float32), "arg1": np.ones((128, 64), np.float32)}
    result = simulate_program(b.build(), data)
    pairs = {(r.first.split()[0], r.second.split()[0]) for r in result.races}
    assert ("'store'", "'scale'") in pairs
